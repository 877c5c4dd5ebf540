#include "engine/draft_cut.h"

#include <algorithm>
#include <cmath>

#include "core/splitmix.h"

namespace flashmap::engine {

namespace {

int bin_of(float c) {
  if (!(c > 0)) return 0;  // NaN and non-positive confidences: the lowest bin
  return std::min(DraftCut::kBins - 1, int(double(c) * DraftCut::kBins));
}

// Prior weight of a bin's own confidence (its centre) before outcomes are seen, and the most
// outcomes a bin remembers (older ones fade, so the calibration follows a drifting text).
constexpr double kPriorWeight = 4;
constexpr double kMemory = 1024;

}  // namespace

double DraftCut::chance(float c, bool lookup) const {
  const int b = bin_of(c);
  const Cell& cell = calibration_[lookup ? 1 : 0][size_t(b)];
  const double centre = (b + 0.5) / kBins;
  return (cell.accepted + kPriorWeight * centre) / (cell.seen + kPriorWeight);
}

double DraftCut::verify_seconds(int rows) const {
  if (rows < 0) return 0;
  int lo = -1, hi = -1;
  for (int r = std::min(rows, int(cost_.size()) - 1); r >= 0; --r)
    if (cost_[size_t(r)].samples > 0) {
      lo = r;
      break;
    }
  for (int r = rows; r < int(cost_.size()); ++r)
    if (cost_[size_t(r)].samples > 0) {
      hi = r;
      break;
    }
  if (lo == rows) return cost_[size_t(lo)].seconds;
  if (lo < 0 && hi < 0) return 0;
  if (lo < 0) return cost_[size_t(hi)].seconds;  // below every measured count: no cheaper
  if (hi < 0) {
    // Above every measured count: the slope of the two highest measured counts, else flat.
    int lo2 = -1;
    for (int r = lo - 1; r >= 0; --r)
      if (cost_[size_t(r)].samples > 0) {
        lo2 = r;
        break;
      }
    const double t = cost_[size_t(lo)].seconds;
    if (lo2 < 0) return t;
    const double slope = (t - cost_[size_t(lo2)].seconds) / double(lo - lo2);
    return t + std::max(0.0, slope) * double(rows - lo);
  }
  const double a = cost_[size_t(lo)].seconds, b = cost_[size_t(hi)].seconds;
  return a + (b - a) * double(rows - lo) / double(hi - lo);
}

std::vector<std::vector<int32_t>> DraftCut::decide(std::span<const Drafts> seqs, int plain_rows) {
  ++rounds_;
  struct Item {
    double gain;
    int depth;
    int32_t seq, index;
  };
  std::vector<Item> items;
  std::vector<std::vector<int32_t>> keep(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Drafts& d = seqs[s];
    std::vector<double> gain(d.confidence.size());
    std::vector<int> depth(d.confidence.size());
    for (size_t j = 0; j < d.confidence.size(); ++j) {
      const int32_t p = d.parents[j];
      const double up = p < 0 ? 1.0 : gain[size_t(p)];
      gain[j] = up * chance(d.confidence[j], d.lookup);
      depth[j] = p < 0 ? 1 : depth[size_t(p)] + 1;
      items.push_back({gain[j], depth[j], int32_t(s), int32_t(j)});
    }
  }
  const int base = plain_rows + int(seqs.size());  // every sequence's anchor row
  const int n = int(items.size());
  // A parent before its children (its worth is never below theirs; equal worth: the shallower).
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.seq != b.seq ? a.seq < b.seq : a.index < b.index;
  });
  int measured = 0;
  for (int r = base; r <= base + n && r < int(cost_.size()); ++r)
    measured += cost_[size_t(r)].samples > 0;
  int take = n;
  if (random_ != 0) {
    random_ += 0x9e3779b97f4a7c15ull;
    take = int(splitmix64(random_) % uint64_t(n + 1));
  } else if (measured < 2) {
    // Too little is known of the cost of fewer rows to cut; now and then a round verifies half
    // of its drafts (the most likely half) to learn it.
    if (n > 1 && rounds_ % kProbeEvery == 0) take = n / 2;
  } else {
    double expected = base, best = -1;
    std::vector<double> rates(size_t(n) + 1);
    for (int m = 0; m <= n; ++m) {
      if (m > 0) expected += items[size_t(m - 1)].gain;
      const double t = other_ + verify_seconds(base + m);
      rates[size_t(m)] = t > 0 ? expected / t : expected;
      if (rates[size_t(m)] >= best) {  // a tie takes more drafts: more tokens for the same time
        best = rates[size_t(m)];
        take = m;
      }
    }
    // Measured times are noisy: a cut must beat verifying everything by a margin to be made.
    if (best < rates[size_t(n)] * (1 + kMargin)) take = n;
  }
  for (int m = 0; m < take; ++m)
    keep[size_t(items[size_t(m)].seq)].push_back(items[size_t(m)].index);
  for (auto& k : keep) std::sort(k.begin(), k.end());
  return keep;
}

void DraftCut::observe_time(int rows, double seconds, double other_seconds) {
  if (rows <= 0 || !(seconds >= 0)) return;
  if (size_t(rows) >= cost_.size()) cost_.resize(size_t(rows) + 1);
  Cost& c = cost_[size_t(rows)];
  ++c.samples;
  const double w = std::max(kAlpha, 1.0 / double(c.samples));
  c.seconds += w * (seconds - c.seconds);
  if (other_seconds < 0) return;
  ++other_samples_;
  const double wo = std::max(kAlpha, 1.0 / double(other_samples_));
  other_ += wo * (other_seconds - other_);
}

void DraftCut::observe_outcome(const Drafts& d, std::span<const int32_t> kept,
                               std::span<const int32_t> path) {
  std::vector<uint8_t> on_path(d.confidence.size(), 0), verified(d.confidence.size(), 0);
  for (int32_t j : path)
    if (j >= 0 && size_t(j) < on_path.size()) on_path[size_t(j)] = 1;
  for (int32_t j : kept)
    if (j >= 0 && size_t(j) < verified.size()) verified[size_t(j)] = 1;
  auto& table = calibration_[d.lookup ? 1 : 0];
  // A verified draft whose parent was accepted (or is the anchor) had its own chance: accepted
  // when it is on the path.
  for (size_t j = 0; j < d.confidence.size(); ++j) {
    if (!verified[j]) continue;
    const int32_t p = d.parents[j];
    if (p >= 0 && !on_path[size_t(p)]) continue;
    Cell& cell = table[size_t(bin_of(d.confidence[j]))];
    cell.seen += 1;
    cell.accepted += on_path[j];
    if (cell.seen > kMemory) {
      cell.accepted *= kMemory / cell.seen;
      cell.seen = kMemory;
    }
  }
}

}  // namespace flashmap::engine
