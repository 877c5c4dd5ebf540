// Choices a speculative round makes by measured tokens/s: --draft-tree auto's draft tree (or none)
// and hybrid rounds' prompt lookup (or the drafter alone). A tree pays only if the extra tokens it
// commits outweigh what its extra verified rows cost; a lookup only if its drafts, free to make,
// are accepted about as well as the drafter's. Both depend on the machine (a CPU verify pass
// costs about linearly in its rows once past a handful; a GPU's is flat up to tens of rows), the
// target, the drafter and the traffic. So, like SpecPolicy, MeasuredChoice measures: per
// batch-size bucket an EWMA of each candidate's round time and committed tokens, exploits the
// best tokens/s and now and then explores the others, one at a time, with an interval that
// doubles while explorations confirm the choice and resets when one flips it.
//
// Not thread-safe: the engine thread decides and observes.
#pragma once

#include <cstdint>
#include <vector>

#include "specdec/tree.h"

namespace flashmap::engine {

class MeasuredChoice {
 public:
  // Rounds a candidate is measured before it may be chosen.
  static constexpr uint64_t kMinSamples = 8;
  // How far ahead (relative tokens/s) a candidate must be to replace the current choice.
  static constexpr double kMargin = 0.03;
  // Candidates 0..choices-1; 0 is the fallback while nothing is measured.
  explicit MeasuredChoice(int choices, int explore_min = 16, int explore_max = 256,
                          double alpha = 0.25);

  // The candidate for a speculative round of `batch` sequences.
  int decide(int batch);
  // That round took `seconds` and committed `tokens` (all its sequences).
  void observe(int batch, int choice, double seconds, int tokens);

  int choices() const { return choices_; }
  struct Estimate {
    uint64_t samples = 0;
    double seconds = 0, tokens = 0;  // EWMA per round
    double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
  };
  struct Bucket {
    std::vector<Estimate> est;
    int best = 0, since_explore = 0, interval = 0, next_probe = 1, warmup = 0;
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Rounds that drafted each candidate (all buckets).
  const std::vector<uint64_t>& rounds() const { return rounds_; }

 private:
  Bucket& bucket(int batch);
  int choices_;
  int explore_min_, explore_max_;
  double alpha_;
  std::vector<Bucket> buckets_;
  std::vector<uint64_t> rounds_;
};

// --draft-tree auto: the candidates are tree shapes, candidates[0] the single block (off).
class TreePolicy : public MeasuredChoice {
 public:
  explicit TreePolicy(std::vector<TreeShape> candidates, int explore_min = 16,
                      int explore_max = 256, double alpha = 0.25);
  // auto's candidates for a drafter of block size K: off and top-k trees of 1.5K, 2K and 4K
  // nodes (`noise`: whether the drafter's draws differ; unused while paths are not candidates).
  static std::vector<TreeShape> auto_candidates(int K, bool noise);
  const std::vector<TreeShape>& candidates() const { return candidates_; }

 private:
  std::vector<TreeShape> candidates_;
};

}  // namespace flashmap::engine
