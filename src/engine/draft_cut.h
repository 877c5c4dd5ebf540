// How many of a round's drafts to verify. Each draft costs a row of the verify forward; it pays
// only if the tokens it is expected to add are worth more than the time its row adds. Both sides
// are measured, so there is no knob:
//
//   - a draft's worth: the chance that it is accepted, which is the product, along its path from
//     the anchor, of each draft's chance given the ones before it; that chance is the drafter's
//     own confidence in the drafted token (its probability under the drafter's distribution;
//     for prompt lookup, a function of the match length) mapped through a calibration learnt
//     from every verified draft's outcome (per confidence bin, drafter and lookup apart);
//   - a row's cost: the verify forward's time by total rows, learnt from every round (an EWMA
//     per row count; between measured counts, linear; below the smallest, flat), plus the
//     round's other time (drafting, acceptance), which every row count shares.
//
// The round then verifies the M drafts of largest worth (over all its sequences) that maximise
// (rows' expected tokens) / (round time): expected committed tokens per second. A draft's worth
// never exceeds its parent's, so every sequence keeps a prefix of its block, or a subtree of its
// draft tree containing the anchor's side of every kept node. Lossless by construction: what is
// verified is chosen from the drafter's outputs alone, before the target's, and is verified
// exactly as a shorter block or a smaller tree would be.
//
// Not thread-safe: the engine thread decides and observes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashmap::engine {

class DraftCut {
 public:
  // random_seed != 0: each round verifies a random number of its drafts (the most worth first),
  // drawn from this seed: for tests, which must see every cut to check that each is lossless.
  explicit DraftCut(uint64_t random_seed = 0) : random_(random_seed) {}

  // One drafting sequence's drafts as the proposer made them: each draft's confidence (its
  // probability under the drafter, given the drafts before it on its path) and its parent (−1:
  // the anchor; a block's draft k has parent k − 1).
  struct Drafts {
    std::span<const float> confidence;
    std::span<const int32_t> parents;
    bool lookup = false;  // drafted by prompt lookup (its own calibration)
  };
  // For each sequence, the drafts to verify: their indices, ascending (a prefix for a block).
  // `plain_rows`: rows of the round's sequences that verify no drafts (one each).
  std::vector<std::vector<int32_t>> decide(std::span<const Drafts> seqs, int plain_rows);

  // The verify forward of `rows` rows took `seconds`; the rest of a round that drafted (drafting,
  // acceptance) `other_seconds` (negative: the round did not draft).
  void observe_time(int rows, double seconds, double other_seconds);
  // A sequence's verified drafts (`kept`, as decide() gave them) and the accepted path: the
  // number of drafts accepted along it, `path` their indices (a block: 0, 1, ...).
  void observe_outcome(const Drafts& d, std::span<const int32_t> kept,
                       std::span<const int32_t> path);

  // The calibrated chance of a draft of confidence `c` (lookup or drafter).
  double chance(float c, bool lookup) const;
  // The verify forward's estimated time at `rows` rows (0 while nothing is measured).
  double verify_seconds(int rows) const;

  static constexpr int kBins = 20;
  // A probe every this many rounds while fewer than two row counts are measured in reach of the
  // round: without a second point the cost of fewer rows is unknown, and it is never learnt if
  // the round always verifies everything.
  static constexpr int kProbeEvery = 16;
  // How far ahead (relative tokens/s) a cut must be of verifying every draft, and the weight of
  // the newest round in the time averages: one slow round must not cut the next.
  static constexpr double kMargin = 0.03, kAlpha = 0.1;

 private:
  struct Cell {
    double accepted = 0, seen = 0;
  };
  struct Cost {
    double seconds = 0;
    uint64_t samples = 0;
  };
  std::vector<Cell> calibration_[2] = {std::vector<Cell>(kBins), std::vector<Cell>(kBins)};
  std::vector<Cost> cost_;  // by rows
  double other_ = 0;
  uint64_t other_samples_ = 0, rounds_ = 0;
  uint64_t random_;  // the random mode's counter (0: measured)
};

}  // namespace flashmap::engine
