#include "engine/tree_policy.h"

#include <algorithm>

#include "core/check.h"
#include "engine/spec_policy.h"

namespace flashmap::engine {

MeasuredChoice::MeasuredChoice(int choices, int explore_min, int explore_max, double alpha)
    : choices_(choices),
      explore_min_(explore_min),
      explore_max_(std::max(explore_min, explore_max)),
      alpha_(alpha),
      rounds_(size_t(std::max(choices, 0)), 0) {
  FLASHMAP_CHECK(choices >= 1, "measured choice: no candidates");
  FLASHMAP_CHECK(explore_min >= 1, "measured choice: explore_min must be >= 1");
}

TreePolicy::TreePolicy(std::vector<TreeShape> candidates, int explore_min, int explore_max,
                       double alpha)
    : MeasuredChoice(int(candidates.size()), explore_min, explore_max, alpha),
      candidates_(std::move(candidates)) {}

std::vector<TreeShape> TreePolicy::auto_candidates(int K, bool noise) {
  // Top-k trees only: in the offline measurement (bench/TREES.md) N noise draws of a one-step map
  // gain far less per node than top-k expansion, and each candidate costs warm-up rounds. `noise`
  // is kept for drafters whose draws are diverse (the two-step map's are: +25% at N = 4).
  (void)noise;
  std::vector<TreeShape> c{TreeShape{}};
  for (int nodes : {K + K / 2, 2 * K, 4 * K})
    if (nodes > K && nodes <= kMaxTreeNodes) c.push_back(TreeShape{0, nodes});
  return c;
}

MeasuredChoice::Bucket& MeasuredChoice::bucket(int batch) {
  const size_t b = size_t(SpecPolicy::bucket_of(std::max(batch, 1)));
  while (buckets_.size() <= b) {
    Bucket nb;
    nb.est.resize(size_t(choices_));
    nb.interval = explore_min_;
    buckets_.push_back(nb);
  }
  return buckets_[b];
}

int MeasuredChoice::decide(int batch) {
  Bucket& b = bucket(batch);
  // A round's committed tokens vary from 1 to K + 1, so one round says little: every candidate
  // gets kMinSamples rounds before it may be chosen, taken every other round while the fallback
  // (candidate 0, measured first) or the best so far runs in between.
  if (b.est[0].samples == 0) return 0;
  for (size_t i = 1; i < b.est.size(); ++i)
    if (b.est[i].samples < kMinSamples) return (++b.warmup % 2 == 0) ? int(i) : b.best;
  if (b.est.size() > 1 && ++b.since_explore >= b.interval) {
    // Explore the candidates other than the best in turn.
    b.since_explore = 0;
    if (b.next_probe == b.best) b.next_probe = (b.next_probe + 1) % int(b.est.size());
    const int probe = b.next_probe;
    b.next_probe = (b.next_probe + 1) % int(b.est.size());
    return probe;
  }
  return b.best;
}

void MeasuredChoice::observe(int batch, int choice, double seconds, int tokens) {
  Bucket& b = bucket(batch);
  FLASHMAP_ASSERT(choice >= 0 && size_t(choice) < b.est.size());
  ++rounds_[size_t(choice)];
  Estimate& e = b.est[size_t(choice)];
  // Running means, then EWMAs: a round's time is steady and follows the load quickly (alpha); its
  // committed tokens swing from 1 to K + 1 with the text, so they are averaged over 64 rounds.
  ++e.samples;
  const double ws = std::max(alpha_, 1.0 / double(e.samples));
  const double wt = std::max(1.0 / 64, 1.0 / double(e.samples));
  e.seconds += ws * (seconds - e.seconds);
  e.tokens += wt * (tokens - e.tokens);
  // Another candidate takes over only when it is ahead by kMargin: near-ties would otherwise flip
  // back and forth on noise, and every flip resets the exploration interval.
  int best = b.best;
  double best_tps = b.est[size_t(best)].tokens_per_second() * (1 + kMargin);
  for (size_t i = 0; i < b.est.size(); ++i)
    if (int(i) != b.best && b.est[i].samples >= kMinSamples &&
        b.est[i].tokens_per_second() > best_tps) {
      best = int(i);
      best_tps = b.est[i].tokens_per_second();
    }
  if (choice != b.best) {
    // An exploration: it confirmed the choice (explore less often) or flipped it (look again
    // soon, the estimates are moving).
    b.interval = best == b.best ? std::min(b.interval * 2, explore_max_) : explore_min_;
  }
  b.best = best;
}

}  // namespace flashmap::engine
