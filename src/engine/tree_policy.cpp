#include "engine/tree_policy.h"

#include <algorithm>

#include "core/check.h"
#include "engine/spec_policy.h"

namespace flashmap::engine {

TreePolicy::TreePolicy(std::vector<TreeShape> candidates, int explore_min, int explore_max,
                       double alpha)
    : candidates_(std::move(candidates)),
      explore_min_(explore_min),
      explore_max_(std::max(explore_min, explore_max)),
      alpha_(alpha),
      rounds_(candidates_.size(), 0) {
  FLASHMAP_CHECK(!candidates_.empty(), "tree policy: no candidates");
  FLASHMAP_CHECK(explore_min >= 1, "tree policy: explore_min must be >= 1");
}

std::vector<TreeShape> TreePolicy::auto_candidates(int K, bool noise) {
  std::vector<TreeShape> c{TreeShape{}};
  for (int nodes : {K + K / 2, 2 * K, 4 * K})
    if (nodes > K && nodes <= kMaxTreeNodes) c.push_back(TreeShape{0, nodes});
  if (noise) c.push_back(TreeShape{4, 0});
  return c;
}

TreePolicy::Bucket& TreePolicy::bucket(int batch) {
  const size_t b = size_t(SpecPolicy::bucket_of(std::max(batch, 1)));
  while (buckets_.size() <= b) {
    Bucket nb;
    nb.est.resize(candidates_.size());
    nb.interval = explore_min_;
    buckets_.push_back(nb);
  }
  return buckets_[b];
}

int TreePolicy::decide(int batch) {
  Bucket& b = bucket(batch);
  // Every candidate is measured once first (the fallback, candidate 0, before the others).
  for (size_t i = 0; i < b.est.size(); ++i)
    if (b.est[i].samples == 0) return int(i);
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

void TreePolicy::observe(int batch, int choice, double seconds, int tokens) {
  Bucket& b = bucket(batch);
  FLASHMAP_ASSERT(choice >= 0 && size_t(choice) < b.est.size());
  ++rounds_[size_t(choice)];
  Estimate& e = b.est[size_t(choice)];
  if (e.samples++ == 0) {
    e.seconds = seconds;
    e.tokens = tokens;
  } else {
    e.seconds += alpha_ * (seconds - e.seconds);
    e.tokens += alpha_ * (tokens - e.tokens);
  }
  int best = b.best;
  for (size_t i = 0; i < b.est.size(); ++i)
    if (b.est[i].samples > 0 &&
        b.est[i].tokens_per_second() > b.est[size_t(best)].tokens_per_second())
      best = int(i);
  if (choice != b.best) {
    // An exploration: it confirmed the choice (explore less often) or flipped it (look again
    // soon, the estimates are moving).
    b.interval = best == b.best ? std::min(b.interval * 2, explore_max_) : explore_min_;
  }
  b.best = best;
}

}  // namespace flashmap::engine
