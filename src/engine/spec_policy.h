// When a round speculates. Drafting pays only if the tokens a speculative round commits per
// second beat the one token per sequence a plain round commits per second, and both sides of
// that comparison depend on things the engine cannot know in advance: the drafter's acceptance
// on the live traffic, the batch size, the machine (and what else runs on it). So the default
// policy measures: per batch-size bucket it keeps exponentially weighted moving averages of the
// wall time and the committed tokens of speculative and of plain rounds, exploits the mode with
// the higher tokens/s and now and then explores the other one so that the estimates follow a
// drafter or a load that changes.
//
// Not thread-safe: the engine thread decides and observes; the scheduler copies snapshot()
// under its own lock for /metrics.
#pragma once

#include <flashmap/request.h>  // SpecPolicyKind, parse_spec_policy, spec_policy_name
#include <flashmap/stats.h>    // SpecPolicyBucket, SpecPolicyEstimate, spec_bucket_label

#include <cstdint>
#include <string>
#include <vector>

namespace flashmap::engine {

using ::flashmap::parse_spec_policy;
using ::flashmap::spec_policy_name;
using ::flashmap::SpecPolicyKind;

struct SpecPolicyOptions {
  SpecPolicyKind kind = SpecPolicyKind::Adaptive;
  int max_batch = 0;  // Batch only
  // Adaptive: rounds of a bucket between explorations of the mode that is losing. The interval
  // starts at explore_min, doubles each time an exploration confirms the choice (a drafter
  // that loses by far costs ~1/explore_max of the rounds) and falls back to explore_min when
  // one flips it (the estimates are moving, so look more often).
  int explore_min = 16;
  int explore_max = 256;
  double alpha = 0.25;  // EWMA weight of the newest round
};

class SpecPolicy {
 public:
  explicit SpecPolicy(SpecPolicyOptions options);

  struct Decision {
    bool speculate = false;  // this round
    bool explore = false;    // it is an exploration (or a bucket without an estimate yet)
    // What the estimates prefer, exploration aside: sampled sequences keep the mode of the
    // round they join (their output then equals generate() with or without the drafter for
    // their seed) and should not inherit a one-round exploration.
    bool preferred = false;
  };
  // For a round of `batch` sequences of which at least one can draft.
  Decision decide(int batch);
  // A round that followed `d` took `seconds` and committed `tokens` (all its sequences).
  void observe(int batch, const Decision& d, double seconds, int tokens);

  // Buckets: batch 1, 2, 3-4, 5-8, ... (powers of two): one index per bucket.
  static int bucket_of(int batch);
  static std::string bucket_label(int bucket) { return spec_bucket_label(bucket); }

  using Estimate = SpecPolicyEstimate;
  using Bucket = SpecPolicyBucket;
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const SpecPolicyOptions& options() const { return options_; }

 private:
  Bucket& bucket(int batch);
  SpecPolicyOptions options_;
  std::vector<Bucket> buckets_;
};

}  // namespace flashmap::engine
