#include "engine/spec_policy.h"

#include <algorithm>

#include "core/check.h"

namespace flashmap {

SpecPolicyKind parse_spec_policy(const std::string& name) {
  if (name == "adaptive") return SpecPolicyKind::Adaptive;
  if (name == "always") return SpecPolicyKind::Always;
  if (name == "never") return SpecPolicyKind::Never;
  if (name == "batch") return SpecPolicyKind::Batch;
  throw Error(
      fmt::format("unknown speculation policy '{}' (adaptive, always, never, batch)", name));
}

const char* spec_policy_name(SpecPolicyKind kind) {
  switch (kind) {
    case SpecPolicyKind::Adaptive:
      return "adaptive";
    case SpecPolicyKind::Always:
      return "always";
    case SpecPolicyKind::Never:
      return "never";
    case SpecPolicyKind::Batch:
      return "batch";
  }
  return "?";
}

std::string spec_bucket_label(int bucket) {
  if (bucket <= 1) return std::to_string(bucket + 1);
  return fmt::format("{}-{}", (1 << (bucket - 1)) + 1, 1 << bucket);
}

}  // namespace flashmap

namespace flashmap::engine {

SpecPolicy::SpecPolicy(SpecPolicyOptions options) : options_(options) {
  FLASHMAP_CHECK(options_.max_batch >= 0, "spec_max_batch must be >= 0, got {}",
                 options_.max_batch);
  FLASHMAP_CHECK(options_.explore_min >= 1 && options_.explore_max >= options_.explore_min,
                 "speculation policy: need 1 <= explore_min <= explore_max, got {} and {}",
                 options_.explore_min, options_.explore_max);
  FLASHMAP_CHECK(options_.alpha > 0 && options_.alpha <= 1,
                 "speculation policy: alpha must be in (0, 1], got {}", options_.alpha);
}

int SpecPolicy::bucket_of(int batch) {
  int b = 0;
  while ((1 << b) < batch) ++b;
  return b;
}

SpecPolicy::Bucket& SpecPolicy::bucket(int batch) {
  const size_t b = size_t(bucket_of(std::max(batch, 1)));
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  return buckets_[b];
}

SpecPolicy::Decision SpecPolicy::decide(int batch) {
  Decision d;
  switch (options_.kind) {
    case SpecPolicyKind::Always:
      d.speculate = true;
      break;
    case SpecPolicyKind::Never:
      d.speculate = false;
      break;
    case SpecPolicyKind::Batch:
      d.speculate = options_.max_batch == 0 || batch <= options_.max_batch;
      break;
    case SpecPolicyKind::Adaptive: {
      Bucket& b = bucket(batch);
      if (b.interval == 0) b.interval = options_.explore_min;
      // A bucket measures speculation first: it is what generate() does, so sampled requests
      // on a fresh server behave as before.
      if (b.spec.samples == 0) {
        d.speculate = d.preferred = true;
        d.explore = true;
        return d;
      }
      if (b.plain.samples == 0) {
        d.speculate = d.preferred = false;
        d.explore = true;
        return d;
      }
      d.preferred = b.prefers_spec();
      d.speculate = d.preferred;
      if (++b.since_explore >= b.interval) {
        b.since_explore = 0;
        d.explore = true;
        d.speculate = !d.preferred;
      }
      return d;
    }
  }
  d.preferred = d.speculate;
  return d;
}

void SpecPolicy::observe(int batch, const Decision& d, double seconds, int tokens) {
  if (options_.kind != SpecPolicyKind::Adaptive || seconds < 0 || tokens <= 0) return;
  Bucket& b = bucket(batch);
  const bool had_choice = b.has_choice();
  Estimate& e = d.speculate ? b.spec : b.plain;
  // The first sample stands alone; averaging it with the zero start would halve it.
  const double a = e.samples == 0 ? 1.0 : options_.alpha;
  e.seconds += a * (seconds - e.seconds);
  e.tokens += a * (double(tokens) - e.tokens);
  ++e.samples;
  if (d.explore && had_choice) {
    if (b.prefers_spec() != d.preferred)
      b.interval = options_.explore_min;
    else
      b.interval = std::min(b.interval * 2, options_.explore_max);
  }
}

}  // namespace flashmap::engine
