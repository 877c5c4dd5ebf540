// The end-to-end exactness check of speculative sampling, shared by every drafter kind: the
// joint law of the first two generated tokens against target-alone sampling, enumerated exactly
// over a target with a tiny vocabulary. Power: with 40000 runs over 64 cells (df ≈ 63, critical
// ≈ 125), a shift of 0.01 of probability mass between two cells of probability ~0.05 adds
// ≈ 2·40000·0.01²/0.05 = 160 to the statistic, so it is caught.
#pragma once

#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/generate.h"
#include "cpu/proposers.h"
#include "models/qwen3.h"
#include "specdec/sampling.h"
#include "stats.h"

namespace flashmap::testing {

// Exact p(t1, t2) of the target's filtered sampling after `prompt`: [V * V].
inline std::vector<double> exact_two_tokens(const Qwen3Model& target,
                                            const std::vector<int32_t>& prompt,
                                            const SamplingParams& sp) {
  const int64_t V = target.config().vocab_size;
  std::vector<double> exact(size_t(V * V), 0.0);
  std::vector<float> p1(static_cast<size_t>(V)), p2(static_cast<size_t>(V));
  KVCache c = target.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, prompt};
  target.forward({&s, 1}, Qwen3Model::Logits::Last, {}, out);
  filtered_probs(out.logits.data(), V, sp, p1.data());
  for (int32_t t1 = 0; t1 < V; ++t1) {
    if (p1[size_t(t1)] == 0) continue;
    KVCache c2 = c;
    Qwen3Model::SeqInput s2{&c2, {&t1, 1}};
    target.forward({&s2, 1}, Qwen3Model::Logits::Last, {}, out);
    filtered_probs(out.logits.data(), V, sp, p2.data());
    for (int32_t t2 = 0; t2 < V; ++t2)
      exact[size_t(t1 * V + t2)] = double(p1[size_t(t1)]) * p2[size_t(t2)];
  }
  return exact;
}

// n runs of three tokens (the round after the first verifies a draft for the second: a round
// verifies no draft it could not emit) with rejection sampling (unseeded) and keyed draws
// (seeded, over many seeds): the chi-square test against exact_two_tokens, and first-slot drafts
// accepted in more than `min_accept` of the runs so that the accept path is exercised.
inline void expect_joint_two(const Qwen3Model& target, const BlockProposer& d,
                             const std::vector<int32_t>& prompt, const SamplingParams& sp,
                             double min_accept, int n = 40000,
                             const std::string& draft_cut = "off") {
  // draft_cut "random": each run's rounds verify a random share of their drafts (its own seed).
  const int64_t V = target.config().vocab_size;
  const auto exact = exact_two_tokens(target, prompt, sp);
  for (bool seeded : {false, true}) {
    std::vector<double> counts(size_t(V * V), 0.0);
    GenerateOptions o;
    o.max_new_tokens = 3;
    o.sampling = sp;
    o.seeded = seeded;
    o.draft_cut = draft_cut;
    double accepted = 0;
    for (int i = 0; i < n; ++i) {
      o.seed = uint64_t(i) * 7919 + 1;
      // A random cut draws from a seed of its own per run (each run is a new engine).
      if (draft_cut == "random") o.draft_cut = "random:" + std::to_string(i + 1);
      const auto r = generate(target, &d, prompt, o);
      counts[size_t(r.ids[0] * V + r.ids[1])] += 1;
      accepted += r.accepted_at[0] > 0;
    }
    const auto chi = chi_square(counts, exact);
    EXPECT_TRUE(chi.pass()) << "seeded=" << seeded << " T=" << sp.temperature
                            << " top_k=" << sp.top_k << " chi2 " << chi.statistic << " > "
                            << chi.critical << " " << chi.impossible;
    EXPECT_GT(accepted, n * min_accept) << "seeded=" << seeded;
  }
}

// The target's next-token logits after `prefix`, by one full forward (no cache reuse).
inline std::vector<float> next_logits(const Qwen3Model& target,
                                      const std::vector<int32_t>& prefix) {
  KVCache c = target.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, prefix};
  target.forward({&s, 1}, Qwen3Model::Logits::Last, {}, out);
  return out.logits;
}

// The exact joint law of a run's first three tokens over a V-token vocabulary, from `next`: the
// target's (controlled, masked) distribution after a given output. A run that stops at its
// second token (stop id) has a third "token" V of its own: cell (t1 · V + t2) · (V + 1) + t3.
inline std::vector<double> exact_three(
    int64_t V, int32_t stop,
    const std::function<std::vector<double>(const std::vector<int32_t>&)>& next) {
  auto cell = [&](int32_t t1, int32_t t2, int32_t t3) {
    return size_t((t1 * V + t2) * (V + 1) + t3);
  };
  std::vector<double> exact(size_t(V * V * (V + 1)), 0.0);
  const auto p1 = next({});
  for (int32_t t1 = 0; t1 < V; ++t1) {
    if (p1[size_t(t1)] == 0 || t1 == stop) continue;
    const auto p2 = next({t1});
    for (int32_t t2 = 0; t2 < V; ++t2) {
      if (p2[size_t(t2)] == 0) continue;
      if (t2 == stop) {
        exact[cell(t1, t2, int32_t(V))] = p1[size_t(t1)] * p2[size_t(t2)];
        continue;
      }
      const auto p3 = next({t1, t2});
      for (int32_t t3 = 0; t3 < V; ++t3)
        exact[cell(t1, t2, t3)] = p1[size_t(t1)] * p2[size_t(t2)] * p3[size_t(t3)];
    }
  }
  return exact;
}

// exact_three for the target's filtered sampling after `prompt`, without a stop id (the third
// dimension keeps its V + 1 cells, the last never reached).
inline std::vector<double> exact_three_tokens(const Qwen3Model& target,
                                              const std::vector<int32_t>& prompt,
                                              const SamplingParams& sp) {
  const int64_t V = target.config().vocab_size;
  return exact_three(V, -1, [&](const std::vector<int32_t>& out) {
    auto prefix = prompt;
    prefix.insert(prefix.end(), out.begin(), out.end());
    const auto logits = next_logits(target, prefix);
    std::vector<float> p(static_cast<size_t>(V));
    filtered_probs(logits.data(), V, sp, p.data());
    return std::vector<double>(p.begin(), p.end());
  });
}

// n runs of four tokens with the draft tree `shape`: the first round after the prefill verifies
// a tree at most 2 deep (no draft is verified that could not be emitted), so tokens 2 and 3 both
// come from its walk. In rejection and keyed mode, the chi-square test of (t1, t2, t3) against
// `exact` (exact_three_tokens), and the walk must descend (first-level acceptance) in more than
// `min_descend` of the runs.
inline void expect_tree_joint_three(const Qwen3Model& target, const BlockProposer& d,
                                    const std::vector<int32_t>& prompt, const SamplingParams& sp,
                                    const std::vector<double>& exact, const std::string& shape,
                                    double min_descend, int n = 30000,
                                    const std::string& draft_cut = "off") {
  const int64_t V = target.config().vocab_size;
  for (bool seeded : {false, true}) {
    std::vector<double> counts(exact.size(), 0.0);
    GenerateOptions o;
    o.max_new_tokens = 4;
    o.draft_tree = shape;
    o.draft_cut = draft_cut;
    o.sampling = sp;
    o.seeded = seeded;
    double descended = 0;
    for (int i = 0; i < n; ++i) {
      o.seed = uint64_t(i) * 7919 + 1;
      if (draft_cut == "random") o.draft_cut = "random:" + std::to_string(i + 1);
      const auto r = generate(target, &d, prompt, o);
      ASSERT_EQ(r.ids.size(), 4u);
      counts[size_t((r.ids[0] * V + r.ids[1]) * (V + 1) + r.ids[2])] += 1;
      descended += r.accepted_at[0] > 0;
    }
    const auto chi = chi_square(counts, exact);
    EXPECT_TRUE(chi.pass()) << shape << " seeded=" << seeded << " chi2 " << chi.statistic << " > "
                            << chi.critical << " " << chi.impossible;
    EXPECT_GT(descended, n * min_descend) << shape << " seeded=" << seeded;
  }
}

}  // namespace flashmap::testing
