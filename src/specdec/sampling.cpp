#include "specdec/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/splitmix.h"

namespace flashmap {

void SamplingParams::validate() const {
  FLASHMAP_CHECK_PARAM(std::isfinite(temperature) && temperature >= 0.0f, "temperature",
                       "temperature must be >= 0, got {}", temperature);
  FLASHMAP_CHECK_PARAM(top_k >= 0, "top_k", "top_k must be >= 0 (0 turns it off), got {}", top_k);
  FLASHMAP_CHECK_PARAM(top_p > 0.0f && top_p <= 1.0f, "top_p", "top_p must be in (0, 1], got {}",
                       top_p);
  FLASHMAP_CHECK_PARAM(min_p >= 0.0f && min_p <= 1.0f, "min_p", "min_p must be in [0, 1], got {}",
                       min_p);
}

int32_t argmax(const float* x, int64_t n) {
  return int32_t(std::max_element(x, x + n) - x);
}

void filtered_probs(const float* logits, int64_t V, const SamplingParams& p, float* probs) {
  const float inv_t = 1.0f / p.temperature;
  const float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) {
    probs[i] = std::exp((logits[i] - mx) * inv_t);
    sum += probs[i];
  }
  for (int64_t i = 0; i < V; ++i) probs[i] = float(probs[i] / sum);
  const bool top_k = p.top_k > 0 && p.top_k < V;
  if (!top_k && p.top_p >= 1.0f && p.min_p <= 0.0f) return;

  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  int64_t keep = top_k ? p.top_k : V;
  if (p.top_p < 1.0f) {
    double mass = 0, kept_mass = 0;
    for (int64_t i = 0; i < keep; ++i) kept_mass += probs[order[size_t(i)]];
    int64_t n = 0;
    while (n < keep) {
      mass += probs[order[size_t(n++)]];
      if (mass >= double(p.top_p) * kept_mass) break;
    }
    keep = n;
  }
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * probs[order[0]];
    int64_t n = 1;
    while (n < keep && probs[order[size_t(n)]] >= floor) ++n;
    keep = n;
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += probs[order[size_t(i)]];
  for (int64_t i = keep; i < V; ++i) probs[order[size_t(i)]] = 0.0f;
  for (int64_t i = 0; i < keep; ++i)
    probs[order[size_t(i)]] = float(probs[order[size_t(i)]] / kept);
}

int32_t sample(std::span<const float> probs, Rng& rng) {
  double total = 0;
  for (float x : probs) total += x;
  const double u = rng.uniform() * total;
  double acc = 0;
  int32_t last_positive = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last_positive = int32_t(i);
    if (u < acc) return int32_t(i);
  }
  return last_positive;  // rounding left u just past the total
}

int32_t sample_keyed(std::span<const float> probs, uint64_t seed, int64_t position) {
  const uint64_t key = position_key(seed, position);
  int32_t best = -1;
  double best_key = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0f)) continue;
    const double k = -std::log(keyed_uniform(key, int64_t(i))) / double(probs[i]);
    if (best < 0 || k < best_key) {
      best = int32_t(i);
      best_key = k;
    }
  }
  FLASHMAP_CHECK(best >= 0, "sample_keyed: the distribution has no positive entry");
  return best;
}

int32_t SeqSampler::pick(const float* logits, int64_t V, int64_t position) {
  if (params.greedy()) return argmax(logits, V);
  scratch.resize(size_t(V));
  filtered_probs(logits, V, params, scratch.data());
  return keyed() ? sample_keyed(scratch, seed, position) : sample(scratch, rng);
}

namespace {
// e^x for x <= 0: x = n ln 2 + r with |r| <= ln 2 / 2 (Cody-Waite), e^r by Cephes' expf
// polynomial, 2^n into the exponent; below −87.3 (where e^x is subnormal) it gives e^−87.3,
// negligible beside the top term's 1. No calls and no branches, so a loop of it vectorizes.
inline float exp_nonpositive(float x) {
  x = x < -87.3f ? -87.3f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (int32_t(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}
}  // namespace

float top_probability(const float* x, int64_t n, float top) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += exp_nonpositive(x[i + j] - top);
  double sum = 0;
  for (; i < n; ++i) sum += exp_nonpositive(x[i] - top);
  for (float a : acc) sum += a;
  return sum > 0 ? float(1.0 / sum) : 0.0f;
}

}  // namespace flashmap
