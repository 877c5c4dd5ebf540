#include "specdec/verify.h"

#include <algorithm>

#include "core/check.h"

namespace flashmap {

int verify_greedy(std::span<const int32_t> draft, const float* logits, int64_t V, int32_t& bonus) {
  int accepted = 0;
  while (accepted < int(draft.size()) &&
         argmax(logits + accepted * V, V) == draft[size_t(accepted)])
    ++accepted;
  bonus = argmax(logits + accepted * V, V);
  return accepted;
}

int verify_sampled(std::span<const int32_t> draft, const float* p, const float* q, int64_t V,
                   Rng& rng, int32_t& bonus) {
  const int K = int(draft.size());
  int accepted = 0;
  // u·q < p accepts with probability min(1, p/q), as the reference writes it; a slot whose
  // target probability is zero is never accepted.
  while (accepted < K) {
    const int32_t tok = draft[size_t(accepted)];
    const float pk = p[accepted * V + tok], qk = q[accepted * V + tok];
    if (!(rng.uniform() * qk < pk)) break;
    ++accepted;
  }
  const float* target = p + accepted * V;
  if (accepted == K) {
    bonus = sample({target, size_t(V)}, rng);
    return accepted;
  }
  std::vector<float> residual(static_cast<size_t>(V));
  const float* qk = q + accepted * V;
  double mass = 0;
  for (int64_t i = 0; i < V; ++i) {
    residual[size_t(i)] = std::max(target[i] - qk[i], 0.0f);
    mass += residual[size_t(i)];
  }
  bonus = mass > 0 ? sample(residual, rng) : sample({target, size_t(V)}, rng);
  return accepted;
}

int verify_keyed(std::span<const int32_t> draft, const float* logits, int64_t V,
                 const SamplingParams& sp, uint64_t seed, int64_t first_position,
                 std::vector<float>& probs, int32_t& bonus) {
  probs.resize(size_t(V));
  for (int k = 0;; ++k) {
    filtered_probs(logits + k * V, V, sp, probs.data());
    const int32_t t = sample_keyed(probs, seed, first_position + k);
    if (k == int(draft.size()) || draft[size_t(k)] != t) {
      bonus = t;
      return k;
    }
  }
}

int verify_block(SeqSampler& s, std::span<const int32_t> draft, const float* logits, const float* q,
                 int64_t V, int64_t first_position, int32_t& bonus) {
  if (s.params.greedy()) return verify_greedy(draft, logits, V, bonus);
  if (s.keyed())
    return verify_keyed(draft, logits, V, s.params, s.seed, first_position, s.scratch, bonus);
  const size_t n = draft.size();
  s.scratch.resize((n + 1) * size_t(V));
  for (size_t k = 0; k <= n; ++k)
    filtered_probs(logits + int64_t(k) * V, V, s.params, s.scratch.data() + int64_t(k) * V);
  return verify_sampled(draft, s.scratch.data(), q, V, s.rng, bonus);
}

int verify_tree(SeqSampler& s, std::span<const int32_t> tokens, std::span<const int32_t> parents,
                const float* logits, int64_t V, int64_t first_position, std::vector<int>& path,
                int32_t& bonus) {
  FLASHMAP_ASSERT(tokens.size() == parents.size());
  path.clear();
  int node = -1;  // the anchor
  for (;;) {
    const int64_t row = node + 1;
    const int32_t t = s.pick(logits + row * V, V, first_position + int64_t(path.size()));
    int next = -1;
    for (size_t i = size_t(node + 1); i < tokens.size(); ++i)  // children come after their parent
      if (parents[i] == node && tokens[i] == t) {
        next = int(i);
        break;
      }
    if (next < 0) {
      bonus = t;
      return int(path.size());
    }
    path.push_back(next);
    node = next;
  }
}

int block_room(int K, int64_t cache_length, int64_t max_positions, int64_t remaining) {
  const int64_t by_context = max_positions - cache_length - 1;
  return int(std::max<int64_t>(0, std::min({int64_t(K), by_context, remaining - 1})));
}

}  // namespace flashmap
