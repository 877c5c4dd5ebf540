// Device sampling against the CPU reference (src/specdec/sampling.cpp, verify.cpp): filtered
// distributions by NMSE with the same support, and — given the same uniforms, through the
// sampler's table mode fed with a CPU Rng's draws — the same sampled ids and the same
// accept/resample decisions as flashmap::sample and flashmap::verify_sampled. The device
// generator's draws pass chi-square tests. Without a usable GPU every device test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../specdec/stats.h"
#include "core/rng.h"
#include "cuda/device.h"
#include "cuda/sampling.h"
#include "gpu_test.h"
#include "specdec/sampling.h"
#include "specdec/tree.h"
#include "specdec/verify.h"

namespace flashmap::cuda {
namespace {

using ::flashmap::testing::chi_square;

// Filtered probabilities differ from the CPU's only by expf ulps (CUDA's expf is within 2 ulp,
// glibc's correctly rounded) and the order of the double sums: ~1e-7 relative per entry, NMSE
// ~1e-14. 1e-7 is the fp32 bound of the op harness (tests/cuda/test_cuda_ops.cpp).
constexpr double kF32 = 1e-7;

// Logits on a shuffled grid: distinct values spaced `step` apart, so that neighbouring
// probabilities differ by a factor e^(step/T) − 1 ≥ 1e-4 — far above the ~1e-7 ulp-level
// differences between device and CPU — and a cut-off never hinges on a near-tie the two could
// order differently. Exact ties are planted separately (equal logits stay equal on both sides).
std::vector<float> grid_logits(int64_t V, uint64_t seed, float span) {
  std::vector<float> x(static_cast<size_t>(V));
  const float step = span / float(V);
  for (int64_t i = 0; i < V; ++i) x[size_t(i)] = (float(i) - float(V) / 2) * step;
  std::mt19937_64 g(seed);
  std::shuffle(x.begin(), x.end(), g);
  return x;
}

using test::Gpu;  // one context per binary (gpu_test.h)
using test::nmse;

class CudaSampling : public test::GpuTest {
 protected:
  // A device table of the first n uniforms of Rng(seed): with it the sampler draws exactly what
  // a CPU function handed a fresh Rng(seed) draws, in the same order.
  DeviceBuffer<double> uniform_table(uint64_t seed, size_t n) {
    Rng rng(seed);
    std::vector<double> u(n);
    for (auto& x : u) x = rng.uniform();
    return up(u);
  }
};

std::vector<float> cpu_filtered(const std::vector<float>& logits, int64_t V,
                                const SamplingParams& p) {
  const int64_t rows = int64_t(logits.size()) / V;
  std::vector<float> out(logits.size());
  for (int64_t r = 0; r < rows; ++r)
    filtered_probs(logits.data() + r * V, V, p, out.data() + r * V);
  return out;
}

// Whether a cut-off of filtered_probs on this row hinges on a comparison closer than 1e-6
// relative (a top-p running mass at its threshold, a probability at the min-p floor or at the
// top-k boundary): there fp32 results on two machines may legitimately keep different supports,
// so only NMSE is compared. The grid logits make this rare; the test counts it.
bool cut_is_fragile(const float* logits, int64_t V, const SamplingParams& p) {
  std::vector<float> probs(static_cast<size_t>(V));
  filtered_probs(logits, V, SamplingParams{p.temperature, 0, 1.0f, 0.0f}, probs.data());
  std::vector<float> s = probs;
  std::sort(s.begin(), s.end(), std::greater<>());
  const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); };
  int64_t keep = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  if (keep < V && s[size_t(keep - 1)] != s[size_t(keep)] &&
      close(s[size_t(keep - 1)], s[size_t(keep)]))
    return true;
  if (p.top_p < 1.0f) {
    double kept = 0, mass = 0;
    for (int64_t i = 0; i < keep; ++i) kept += s[size_t(i)];
    const double threshold = double(p.top_p) * kept;
    for (int64_t i = 0; i < keep; ++i) {
      const double before = mass;
      mass += s[size_t(i)];
      if (close(mass, threshold) || close(before, threshold)) return true;
      if (mass >= threshold) break;
    }
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * s[0];
    for (int64_t i = 1; i < keep; ++i)
      if (close(s[size_t(i)], floor) && s[size_t(i)] != s[0]) return true;
  }
  return false;
}

// The host formula runs everywhere: uniform in [0, 1), distinct seeds give distinct streams.
TEST(CudaSamplingHost, CounterUniformsAreUniform) {
  const int n = 200000, bins = 20;
  std::vector<double> counts(bins, 0.0);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(12345, uint64_t(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    counts[size_t(u * bins)] += 1;
  }
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  const auto r = chi_square(counts, std::vector<double>(bins, 1.0 / bins));
  EXPECT_TRUE(r.pass()) << r.statistic << " > " << r.critical;
  int same = 0;
  for (int i = 0; i < 1000; ++i)
    same += counter_uniform(1, uint64_t(i)) == counter_uniform(2, uint64_t(i));
  EXPECT_EQ(same, 0);
}

TEST_F(CudaSampling, DeviceGeneratorIsTheHostFormula) {
  Sampler s(*ctx, 16, 1);
  s.seed(42);
  DeviceBuffer<double> out(1000);
  s.draw_uniforms(600, out.data());
  s.draw_uniforms(400, out.data() + 600);  // continues at 600
  const auto got = down(out);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(got[i], counter_uniform(42, i)) << i;
  EXPECT_EQ(s.counter(), 1000u);
  s.seed(42);  // restarts
  s.draw_uniforms(1, out.data());
  EXPECT_EQ(down(out)[0], counter_uniform(42, 0));
}

TEST_F(CudaSampling, TableModeReadsTheTableThenNaN) {
  Sampler s(*ctx, 16, 1);
  auto table = uniform_table(3, 10);
  s.use_table(table.data(), 10);
  DeviceBuffer<double> out(12);
  s.draw_uniforms(12, out.data());
  const auto got = down(out);
  Rng rng(3);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[size_t(i)], rng.uniform()) << i;
  EXPECT_TRUE(std::isnan(got[10]) && std::isnan(got[11]));
  EXPECT_EQ(s.counter(), 12u);
}

// Parameter sets: each filter alone and combined, k = 1, k ≥ V, min_p = 1 (only the top), a
// nucleus that keeps one token.
std::vector<SamplingParams> param_sets(int64_t V) {
  return {{1.0f, 0, 1.0f, 0.0f},          {0.7f, 50, 1.0f, 0.0f},  {1.3f, 0, 0.9f, 0.0f},
          {0.5f, 0, 1.0f, 0.1f},          {0.8f, 20, 0.95f, 0.0f}, {1.0f, 10, 0.8f, 0.05f},
          {2.0f, 0, 0.5f, 0.0f},          {0.6f, 3, 0.99f, 0.2f},  {1.0f, 1, 1.0f, 0.0f},
          {1.0f, int(V) + 5, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 1.0f},   {0.3f, 0, 1e-6f, 0.0f},
          {1.0f, 5, 1.0f, 0.0f},          {0.9f, 6, 0.97f, 0.0f}};
}

TEST_F(CudaSampling, FilteredProbsMatchCpu) {
  int cases = 0, fragile = 0;
  for (int64_t V : {1000, 32003, 151936}) {
    const int rows = 5;
    Sampler s(*ctx, V, rows);
    std::vector<float> logits;
    for (int r = 0; r < rows; ++r) {
      auto row = grid_logits(V, uint64_t(V + r), r == 0 ? 8.0f : 20.0f);
      if (r >= 3) {
        // Exact ties near the top: the 4th–8th largest logits all equal the 4th, so top-k with
        // k = 5, 6 (and top-p, min-p) cut inside a tie where only the lower ids may survive.
        std::vector<int32_t> order(static_cast<size_t>(V));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                          [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
        for (int j = 4; j < 8; ++j) row[size_t(order[size_t(j)])] = row[size_t(order[3])];
      }
      logits.insert(logits.end(), row.begin(), row.end());
    }
    auto dl = up(logits);
    DeviceBuffer<float> dp(logits.size());
    for (const auto& p : param_sets(V)) {
      const auto want = cpu_filtered(logits, V, p);
      s.filtered_probs(dl.data(), rows, p, dp.data());
      const auto got = down(dp);
      const std::string what =
          fmt::format("V {} T {} k {} p {} min_p {}", V, p.temperature, p.top_k, p.top_p, p.min_p);
      for (int r = 0; r < rows; ++r) {
        const std::span<const float> g(got.data() + r * V, size_t(V)),
            w(want.data() + r * V, size_t(V));
        EXPECT_LT(nmse(g, w), kF32) << what << " row " << r;
        ++cases;
        if (cut_is_fragile(logits.data() + r * V, V, p)) {
          ++fragile;
          continue;
        }
        int64_t differ = 0, kept = 0;
        for (int64_t i = 0; i < V; ++i) {
          differ += (g[size_t(i)] == 0.0f) != (w[size_t(i)] == 0.0f);
          kept += w[size_t(i)] > 0.0f;
        }
        EXPECT_EQ(differ, 0) << what << " row " << r << ": support differs (CPU keeps " << kept
                             << ")";
      }
    }
  }
  // The support comparison must keep its power: only a few rows may sit on a knife edge.
  EXPECT_LE(fragile * 10, cases) << fragile << " of " << cases << " cut-offs within 1e-6";
  if (fragile)
    std::cout << "[ note ] " << fragile << " of " << cases
              << " cut-offs within 1e-6 relative: support not compared\n";
}

// transformers' logits warpers (tests/data/sampling_golden.json, also checked on the CPU by
// tests/specdec/test_sampling.cpp with the same 2e-6 tolerance).
TEST_F(CudaSampling, FilteredProbsMatchGolden) {
  auto golden = nlohmann::json::parse(std::ifstream("tests/data/sampling_golden.json"));
  ASSERT_FALSE(golden["cases"].empty());
  for (auto& c : golden["cases"]) {
    std::vector<float> logits = c["logits"];
    std::vector<double> want = c["probs"];
    const SamplingParams p{c["temperature"], c["top_k"], c["top_p"], c["min_p"]};
    const int64_t V = int64_t(logits.size());
    Sampler s(*ctx, V, 1);
    auto dl = up(logits);
    DeviceBuffer<float> dp(logits.size());
    s.filtered_probs(dl.data(), 1, p, dp.data());
    const auto got = down(dp);
    for (int64_t i = 0; i < V; ++i) {
      ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 2e-6) << c.dump().substr(0, 80) << " " << i;
      ASSERT_EQ(got[size_t(i)] == 0.0f, want[size_t(i)] == 0.0) << "support differs at " << i;
    }
  }
}

// Inverse-CDF draws on the CPU's own distributions with the CPU's uniforms: identical ids.
TEST_F(CudaSampling, SampleEqualsCpuGivenUniforms) {
  const int64_t V = 1000;
  const int rows = 64;
  std::vector<float> probs;
  const auto sets = param_sets(V);
  for (int r = 0; r < rows; ++r) {
    const auto row =
        cpu_filtered(grid_logits(V, uint64_t(r), 12.0f), V, sets[size_t(r) % sets.size()]);
    probs.insert(probs.end(), row.begin(), row.end());
  }
  // Edge rows: one positive entry at the end; nothing positive (the CPU returns 0).
  std::fill(probs.begin() + 60 * V, probs.begin() + 61 * V, 0.0f);
  probs[size_t(61 * V - 1)] = 1.0f;
  std::fill(probs.begin() + 61 * V, probs.begin() + 62 * V, 0.0f);
  Sampler s(*ctx, V, rows);
  auto table = uniform_table(7, rows);
  s.use_table(table.data(), rows);
  auto dp = up(probs);
  DeviceBuffer<int32_t> ids(rows);
  s.sample(dp.data(), rows, ids.data());
  const auto got = down(ids);
  Rng rng(7);
  for (int r = 0; r < rows; ++r)
    EXPECT_EQ(got[size_t(r)], sample({probs.data() + r * V, size_t(V)}, rng)) << "row " << r;
  EXPECT_EQ(got[60], V - 1);
  EXPECT_EQ(got[61], 0);
  EXPECT_EQ(s.counter(), uint64_t(rows));

  // Hand-made uniforms: u = 0 takes the first positive entry, u just below 1 the last one.
  std::vector<float> row(size_t(V), 0.0f);
  row[5] = 0.25f;
  row[500] = 0.5f;
  row[900] = 0.25f;
  auto dr = up(row);
  auto edge = up(std::vector<double>{0.0, 1.0 - 0x1.0p-53});
  s.use_table(edge.data(), 2);
  s.sample(dr.data(), 1, ids.data());
  s.sample(dr.data(), 1, ids.data() + 1);
  const auto e = down(ids);
  EXPECT_EQ(e[0], 5);
  EXPECT_EQ(e[1], 900);
}

// pick(): greedy is argmax (first of equal maxima); sampled is the CPU decoder's
// filtered_probs + sample with the same uniform.
TEST_F(CudaSampling, PickMatchesCpu) {
  const int64_t V = 32003;
  Sampler s(*ctx, V, 1);
  auto logits = grid_logits(V, 11, 16.0f);
  const int32_t top = argmax(logits.data(), V);
  logits[100] = logits[size_t(top)];  // a tie: the lower id wins
  auto dl = up(logits);
  DeviceBuffer<int32_t> id(1);
  s.pick(dl.data(), SamplingParams{}, id.data());
  EXPECT_EQ(down(id)[0], argmax(logits.data(), V));
  auto table = uniform_table(21, 40);
  s.use_table(table.data(), 40);
  Rng rng(21);
  std::vector<float> probs(static_cast<size_t>(V));
  for (const auto& p : param_sets(V)) {
    s.pick(dl.data(), p, id.data());
    filtered_probs(logits.data(), V, p, probs.data());
    EXPECT_EQ(down(id)[0], sample(probs, rng))
        << "T " << p.temperature << " k " << p.top_k << " p " << p.top_p;
  }
}

// One verification case on the CPU's distributions.
struct VerifyCase {
  int K;
  std::vector<float> p, q;  // [K + 1, V], [K, V]
  std::vector<int32_t> draft;
};

// Rounds of every kind: q close to p (long accepted prefixes), q unrelated to p (early
// rejections), q one-hot on a token (the scripted drafter), a draft token with p = 0 (never
// accepted) and q = p with such a token (the residual is empty: the token comes from p).
std::vector<VerifyCase> verify_cases(int64_t V, int K, int n, uint64_t seed) {
  std::vector<VerifyCase> cases;
  Rng draft_rng(seed);
  std::mt19937_64 g(seed);
  const SamplingParams sets[] = {
      {1.0f, 0, 1.0f, 0.0f}, {0.8f, 40, 0.95f, 0.0f}, {1.2f, 0, 0.9f, 0.02f}};
  for (int t = 0; t < n; ++t) {
    const SamplingParams& sp = sets[t % 3];
    const int kind = t % 5;
    VerifyCase c{K, {}, {}, {}};
    for (int k = 0; k <= K; ++k) {
      const auto lp = grid_logits(V, g(), 12.0f);
      const auto pk = cpu_filtered(lp, V, sp);
      c.p.insert(c.p.end(), pk.begin(), pk.end());
      if (k == K) break;
      std::vector<float> qk;
      if (kind == 0 || kind == 4) {
        qk = pk;
      } else if (kind == 1) {
        auto lq = lp;
        std::normal_distribution<float> d(0.0f, 0.3f);
        for (auto& x : lq) x += d(g);
        qk = cpu_filtered(lq, V, sp);
      } else if (kind == 2) {
        qk = cpu_filtered(grid_logits(V, g(), 12.0f), V, sp);
      } else {
        qk.assign(size_t(V), 0.0f);
      }
      int32_t tok;
      if (kind == 3) {
        tok = int32_t(g() % uint64_t(V));
        qk[size_t(tok)] = 1.0f;
      } else {
        tok = sample(qk, draft_rng);
      }
      if (kind == 4 && k == K / 2) {
        // A token the target filtered out (p = 0 = q): rejected, and q = p leaves no residual.
        tok = int32_t(std::find(pk.begin(), pk.end(), 0.0f) - pk.begin());
        if (tok == V) tok = 0;
      }
      c.q.insert(c.q.end(), qk.begin(), qk.end());
      c.draft.push_back(tok);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST_F(CudaSampling, VerifySampledEqualsCpuGivenUniforms) {
  const int64_t V = 1000;
  for (int K : {1, 4, 16}) {
    const auto cases = verify_cases(V, K, 60, uint64_t(K));
    Sampler s(*ctx, V, K + 1);
    const size_t n_uniforms = cases.size() * size_t(K + 2);
    auto table = uniform_table(100 + uint64_t(K), n_uniforms);
    s.use_table(table.data(), n_uniforms);
    DeviceBuffer<RoundResult> results(cases.size());
    for (size_t t = 0; t < cases.size(); ++t) {
      auto dp = up(cases[t].p), dq = up(cases[t].q);
      auto dd = up(cases[t].draft);
      s.verify_sampled(dp.data(), dq.data(), dd.data(), K, results.data() + t);
      ctx->sync();  // dp/dq/dd are freed at the end of the iteration
    }
    const auto got = down(results);
    Rng rng(100 + uint64_t(K));
    uint64_t consumed = 0;
    int kinds_seen[3] = {0, 0, 0};  // full block, partial, none accepted
    for (size_t t = 0; t < cases.size(); ++t) {
      const auto& c = cases[t];
      int32_t bonus = -1;
      const int a = verify_sampled(c.draft, c.p.data(), c.q.data(), V, rng, bonus);
      EXPECT_EQ(got[t].accepted, a) << "K " << K << " case " << t;
      EXPECT_EQ(got[t].token, bonus) << "K " << K << " case " << t;
      consumed += uint64_t(std::min(a + 1, K) + 1);
      ++kinds_seen[a == K ? 0 : (a > 0 ? 1 : 2)];
    }
    EXPECT_EQ(s.counter(), consumed) << "K " << K;
    EXPECT_GT(kinds_seen[0], 0) << "K " << K << ": no full block";
    EXPECT_GT(kinds_seen[2], 0) << "K " << K << ": no rejection at slot 0";
    if (K > 1) {
      EXPECT_GT(kinds_seen[1], 0) << "K " << K << ": no partial block";
    }
  }
}

// End to end from logits at a real vocabulary: device-filtered p and q, device verification, the
// CPU's filtered_probs + verify_sampled. Decisions compare u·q with p, whose device and CPU values
// differ by ~1e-7 relative, so a mismatch needs a uniform within ~1e-7 of p/q: with ~250 draws,
// a false alarm has probability ~1e-5.
TEST_F(CudaSampling, VerifyFromLogitsEqualsCpu) {
  const int64_t V = 32003;
  const int K = 8, rounds = 30;
  Sampler s(*ctx, V, K + 1);
  const SamplingParams sp{0.9f, 0, 0.95f, 0.0f};
  std::mt19937_64 g(77);
  Rng draft_rng(78);
  auto table = uniform_table(79, size_t(rounds * (K + 2)));
  s.use_table(table.data(), size_t(rounds * (K + 2)));
  Rng rng(79);
  DeviceBuffer<float> dp(size_t((K + 1) * V)), dq(size_t(K * V));
  DeviceBuffer<RoundResult> res(1);
  int accepted_total = 0;
  for (int t = 0; t < rounds; ++t) {
    std::vector<float> lp, lq;
    for (int k = 0; k <= K; ++k) {
      const auto row = grid_logits(V, g(), 14.0f);
      lp.insert(lp.end(), row.begin(), row.end());
      if (k == K) break;
      auto r2 = row;
      std::normal_distribution<float> d(0.0f, 0.5f);
      for (auto& x : r2) x += d(g);
      lq.insert(lq.end(), r2.begin(), r2.end());
    }
    const auto p = cpu_filtered(lp, V, sp), q = cpu_filtered(lq, V, sp);
    std::vector<int32_t> draft(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) draft[size_t(k)] = sample({q.data() + k * V, size_t(V)}, draft_rng);
    auto dlp = up(lp), dlq = up(lq);
    auto dd = up(draft);
    s.filtered_probs(dlp.data(), K + 1, sp, dp.data());
    s.filtered_probs(dlq.data(), K, sp, dq.data());
    s.verify_sampled(dp.data(), dq.data(), dd.data(), K, res.data());
    const RoundResult r = down(res)[0];
    int32_t bonus;
    const int a = verify_sampled(draft, p.data(), q.data(), V, rng, bonus);
    EXPECT_EQ(r.accepted, a) << "round " << t;
    EXPECT_EQ(r.token, bonus) << "round " << t;
    accepted_total += a;
  }
  EXPECT_GT(accepted_total, 0);
}

TEST_F(CudaSampling, VerifyGreedyWritesTheRoundResult) {
  const int64_t V = 5000;
  const int K = 6;
  std::vector<float> logits;
  for (int k = 0; k <= K; ++k) {
    const auto row = grid_logits(V, uint64_t(k), 10.0f);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<int32_t> draft(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) draft[size_t(k)] = argmax(logits.data() + k * V, V);
  draft[3] = (draft[3] + 1) % int32_t(V);  // accepts 3
  Sampler s(*ctx, V, K + 1);
  auto dl = up(logits);
  auto dd = up(draft);
  DeviceBuffer<RoundResult> res(1);
  s.verify_greedy(dl.data(), dd.data(), K, res.data());
  const RoundResult r = down(res)[0];
  int32_t bonus;
  EXPECT_EQ(r.accepted, ::flashmap::verify_greedy(draft, logits.data(), V, bonus));
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(r.token, bonus);
}

// The device generator's draws: inverse CDF over 204 800 draws (the CPU test's power: a bias of
// 0.01 in one probability is caught), including a zero-probability cell.
TEST_F(CudaSampling, ChiSquareOfDeviceDraws) {
  const int64_t V = 6;
  const std::vector<float> p = {0.3f, 0.25f, 0.2f, 0.15f, 0.1f, 0.0f};
  const int rows = 4096;
  Sampler s(*ctx, V, rows);
  s.seed(2024);
  std::vector<float> many;
  for (int r = 0; r < rows; ++r) many.insert(many.end(), p.begin(), p.end());
  auto dp = up(many);
  DeviceBuffer<int32_t> ids(rows);
  std::vector<double> counts(size_t(V), 0.0);
  for (int rep = 0; rep < 50; ++rep) {
    s.sample(dp.data(), rows, ids.data());
    for (int32_t x : down(ids)) counts[size_t(x)] += 1;
  }
  const auto r = chi_square(counts, std::vector<double>(p.begin(), p.end()));
  EXPECT_TRUE(r.pass()) << "chi2 " << r.statistic << " > " << r.critical << " " << r.impossible;
  EXPECT_EQ(s.counter(), uint64_t(50 * rows));
}

// Rejection sampling on the device turns draws from q into draws from p (tests/spec's
// RejectionSampler.OutputIsDistributedAsTarget, with device draws and device verification).
TEST_F(CudaSampling, ChiSquareOfDeviceRejectionSampling) {
  const int64_t V = 6;
  const std::vector<std::vector<float>> ps = {{0.3f, 0.25f, 0.2f, 0.15f, 0.1f, 0.0f},
                                              {0.0f, 0.0f, 0.5f, 0.5f, 0.0f, 0.0f}};
  const std::vector<std::vector<float>> qs = {{0.05f, 0.4f, 0.0f, 0.25f, 0.1f, 0.2f},
                                              {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f}};
  const int batch = 4096, reps = 25;  // 102 400 rounds per pair
  Sampler s(*ctx, V, batch);
  s.seed(77);
  DeviceBuffer<int32_t> drafts(batch);
  DeviceBuffer<RoundResult> results(batch);
  for (const auto& p : ps)
    for (const auto& q : qs) {
      std::vector<float> p2(p), qs_rep;
      p2.insert(p2.end(), p.begin(), p.end());  // [K + 1, V] with K = 1
      for (int r = 0; r < batch; ++r) qs_rep.insert(qs_rep.end(), q.begin(), q.end());
      auto dp = up(p2), dq = up(qs_rep);
      std::vector<double> counts(size_t(V), 0.0);
      for (int rep = 0; rep < reps; ++rep) {
        s.sample(dq.data(), batch, drafts.data());  // one draft token per round, from q
        for (int i = 0; i < batch; ++i)
          s.verify_sampled(dp.data(), dq.data(), drafts.data() + i, 1, results.data() + i);
        const auto d = down(drafts);
        const auto res = down(results);
        for (int i = 0; i < batch; ++i)
          counts[size_t(res[size_t(i)].accepted ? d[size_t(i)] : res[size_t(i)].token)] += 1;
      }
      const auto r = chi_square(counts, std::vector<double>(p.begin(), p.end()));
      EXPECT_TRUE(r.pass()) << "chi2 " << r.statistic << " > " << r.critical << " " << r.impossible;
    }
}

// Keyed draws (seeded sampling) against flashmap::sample_keyed and verify_keyed on the same
// probabilities: the same ids (the keys differ at most by an ulp of log, which cannot reorder
// keys that far apart on these rows).
TEST_F(CudaSampling, KeyedDrawsEqualCpu) {
  const int64_t V = 5000;
  const int rows = 9;
  std::vector<float> probs(size_t(rows) * V);
  std::mt19937_64 g(12);
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) {
      // Some zeros (never drawn), the rest spread over four orders of magnitude.
      const float x = (g() % 7 == 0) ? 0.0f : std::exp(float(g() % 10000) / 1000.0f);
      probs[size_t(r * V + i)] = x;
      sum += x;
    }
    for (int64_t i = 0; i < V; ++i)
      probs[size_t(r * V + i)] = float(probs[size_t(r * V + i)] / sum);
  }
  auto d_probs = up(probs);
  DeviceBuffer<int32_t> d_ids(static_cast<size_t>(rows));
  Sampler sampler(*ctx, V, rows);
  for (uint64_t seed : {1ull, 77ull, 123456789ull}) {
    sampler.sample_keyed(d_probs.data(), rows, seed, 40, d_ids.data());
    const auto got = down(d_ids);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(got[size_t(r)], sample_keyed({probs.data() + r * V, size_t(V)}, seed, 40 + r))
          << "row " << r << " seed " << seed;
    // verify_keyed: a draft equal to the CPU's draws for the first 5 slots, then wrong.
    const int K = rows - 1;
    std::vector<int32_t> draft(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k)
      draft[size_t(k)] = sample_keyed({probs.data() + k * V, size_t(V)}, seed, 40 + k);
    draft[5] = (draft[5] + 1) % int32_t(V);
    auto d_draft = up(draft);
    DeviceBuffer<int32_t> d_result(2);
    sampler.verify_keyed(d_probs.data(), d_draft.data(), K, seed, 40,
                         reinterpret_cast<RoundResult*>(d_result.data()));
    const auto res = down(d_result);
    std::vector<float> scratch;
    int32_t bonus = -1;
    // The CPU function takes logits; log(probs) filtered at T = 1 gives back probs.
    std::vector<float> logits(probs.size());
    for (size_t i = 0; i < probs.size(); ++i)
      logits[i] = probs[i] > 0 ? std::log(probs[i]) : -INFINITY;
    const int want = verify_keyed(draft, logits.data(), V, SamplingParams{1.0f, 0, 1.0f, 0.0f},
                                  seed, 40, scratch, bonus);
    EXPECT_EQ(want, 5);
    EXPECT_EQ(res[0], want);
    EXPECT_EQ(res[1], bonus);
  }
}

// --- a batch in one launch per phase ------------------------------------------------------------

// Uploads a vector of plain structs as bytes.
template <typename T>
DeviceBuffer<T> up_items(Context& ctx, const std::vector<T>& items) {
  DeviceBuffer<T> d(items.size());
  check(cudaMemcpyAsync(d.data(), items.data(), items.size() * sizeof(T), cudaMemcpyHostToDevice,
                        ctx.stream()),
        "H2D items");
  ctx.sync();
  return d;
}

// Three sequences' rows with their own parameters (one without a cut), scattered through the
// logits and filtered in one launch (sorted a few rows at a time): each row is the CPU's
// filtered_probs (the bound of FilteredProbsMatchCpu) and bit for bit the single call on that
// sequence's rows alone.
TEST_F(CudaSampling, BatchedFilteredRowsEqualSingleCalls) {
  const int64_t V = 4099;
  const SamplingParams params[] = {
      {0.7f, 0, 0.9f, 0.0f}, {1.0f, 0, 1.0f, 0.0f}, {1.3f, 20, 1.0f, 0.05f}};
  const int counts[] = {3, 5, 2};
  const int total_logits = 12;
  std::vector<float> logits;
  for (int r = 0; r < total_logits; ++r) {
    const auto row = grid_logits(V, 500 + uint64_t(r), 14.0f);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  auto d_logits = up(logits);
  // Sequence i's rows start at logits row src0[i] and go to probs rows dst0[i] …
  const int src0[] = {7, 0, 10}, dst0[] = {4, 8, 0};
  std::vector<FilterRow> rows;
  for (int i = 0; i < 3; ++i)
    for (int r = 0; r < counts[i]; ++r)
      rows.push_back(Sampler::filter_row(src0[i] + r, dst0[i] + r, params[i], V));
  const auto mid = std::stable_partition(rows.begin(), rows.end(),
                                         [&](const FilterRow& r) { return Sampler::cuts(r, V); });
  const int cuts = int(mid - rows.begin());
  EXPECT_EQ(cuts, 5);  // sequences 0 and 2
  // The batch sorts 2 rows at a time (3 sorts for its 5 rows that cut).
  Sampler s(*ctx, V, 5), batched(*ctx, V, 2);
  auto d_rows = up_items(*ctx, rows);
  DeviceBuffer<float> batch(size_t(10) * V);
  batched.filtered_probs_rows(d_logits.data(), d_rows.data(), int(rows.size()), cuts, batch.data());
  const auto got = down(batch);
  for (int i = 0; i < 3; ++i) {
    DeviceBuffer<float> alone(size_t(counts[i]) * V);
    s.filtered_probs(d_logits.data() + int64_t(src0[i]) * V, counts[i], params[i], alone.data());
    const auto want = down(alone);
    const std::vector<float> mine(got.begin() + int64_t(dst0[i]) * V,
                                  got.begin() + int64_t(dst0[i] + counts[i]) * V);
    EXPECT_EQ(mine, want) << "sequence " << i << ": batched rows differ from its single call";
    const std::vector<float> src(logits.begin() + int64_t(src0[i]) * V,
                                 logits.begin() + int64_t(src0[i] + counts[i]) * V);
    EXPECT_LE(nmse(mine, cpu_filtered(src, V, params[i])), kF32) << "sequence " << i;
  }
  EXPECT_THROW(batched.filtered_probs_rows(d_logits.data(), d_rows.data(), 3, 4, batch.data()),
               Error);  // more rows that cut than rows
}

// Verifications of sequences with their own generators (and a keyed one) in one launch: each
// result and each generator's counter equal the single calls from the same state; the keyed one
// equals the CPU's verify_keyed.
TEST_F(CudaSampling, BatchedVerifyAndDrawsEqualSingleCalls) {
  const int64_t V = 1000;
  const int K = 4;
  const auto cases = verify_cases(V, K, 6, 31);
  const int n = int(cases.size());
  std::vector<float> p, q;
  std::vector<int32_t> drafts;
  for (const auto& c : cases) {
    p.insert(p.end(), c.p.begin(), c.p.end());
    q.insert(q.end(), c.q.begin(), c.q.end());
    drafts.insert(drafts.end(), c.draft.begin(), c.draft.end());
  }
  auto dp = up(p), dq = up(q);
  auto dd = up(drafts);
  // Two copies of every generator state: one for the batch, one for the single calls.
  std::vector<uint64_t> states;
  for (int i = 0; i < n; ++i) states.insert(states.end(), {uint64_t(900 + i), uint64_t(i)});
  auto batch_states = up(states), single_states = up(states);
  DeviceBuffer<int32_t> batch_results(size_t(2 * n)), single_results(size_t(2 * n));
  const int keyed = 2;  // case 2 verifies keyed
  std::vector<VerifyItem> items;
  for (int i = 0; i < n; ++i) {
    VerifyItem it;
    it.q = dq.data() + int64_t(i) * K * V;
    it.draft = dd.data() + i * K;
    it.result = batch_results.data() + 2 * i;
    it.state = i == keyed ? nullptr : batch_states.data() + 2 * i;
    it.seed = 77;
    it.first_position = 40;
    it.p_row = i * (K + 1);
    it.room = K;
    it.keyed = i == keyed;
    items.push_back(it);
  }
  Sampler s(*ctx, V, K + 1);
  auto d_items = up_items(*ctx, items);
  s.verify_items(dp.data(), d_items.data(), n);
  for (int i = 0; i < n; ++i) {
    auto* res = reinterpret_cast<RoundResult*>(single_results.data() + 2 * i);
    const float* pi = dp.data() + int64_t(i) * (K + 1) * V;
    if (i == keyed) {
      s.verify_keyed(pi, dd.data() + i * K, K, 77, 40, res);
    } else {
      s.bind(single_states.data() + 2 * i);
      s.verify_sampled(pi, dq.data() + int64_t(i) * K * V, dd.data() + i * K, K, res);
      s.bind(nullptr);
    }
  }
  EXPECT_EQ(down(batch_results), down(single_results));
  EXPECT_EQ(down(batch_states), down(single_states));
  {
    // The keyed case against the CPU (its p rows are filtered already: log p at T = 1 gives p).
    const auto& c = cases[size_t(keyed)];
    std::vector<float> logits(c.p.size());
    for (size_t j = 0; j < c.p.size(); ++j) logits[j] = c.p[j] > 0 ? std::log(c.p[j]) : -INFINITY;
    std::vector<float> scratch;
    int32_t bonus = -1;
    const int want = verify_keyed(c.draft, logits.data(), V, SamplingParams{1.0f, 0, 1.0f, 0.0f},
                                  77, 40, scratch, bonus);
    const auto got = down(batch_results);
    EXPECT_EQ(got[size_t(2 * keyed)], want);
    EXPECT_EQ(got[size_t(2 * keyed + 1)], bonus);
  }

  // Draws: every case's p rows 0 … K − 1 (sequence 1 only its first 2), case `keyed` keyed.
  std::vector<SampleItem> draws;
  DeviceBuffer<int32_t> batch_ids(size_t(n * K)), single_ids(size_t(n * K));
  std::vector<int32_t> minus(size_t(n * K), -1);
  batch_ids.upload(*ctx, minus.data(), minus.size());
  single_ids.upload(*ctx, minus.data(), minus.size());
  for (int i = 0; i < n; ++i) {
    SampleItem it;
    it.out = batch_ids.data() + i * K;
    it.state = i == keyed ? nullptr : batch_states.data() + 2 * i;
    it.seed = 5;
    it.first_position = 100;
    it.p_row = i * (K + 1);
    it.rows = i == 1 ? 2 : K;
    it.keyed = i == keyed;
    draws.push_back(it);
  }
  auto d_draws = up_items(*ctx, draws);
  s.sample_items(dp.data(), d_draws.data(), n, K);
  for (int i = 0; i < n; ++i) {
    const float* pi = dp.data() + int64_t(i) * (K + 1) * V;
    const int rows = i == 1 ? 2 : K;
    if (i == keyed) {
      s.sample_keyed(pi, rows, 5, 100, single_ids.data() + i * K);
    } else {
      s.bind(single_states.data() + 2 * i);
      s.sample(pi, rows, single_ids.data() + i * K);
      s.bind(nullptr);
    }
  }
  const auto got_ids = down(batch_ids);
  EXPECT_EQ(got_ids, down(single_ids));
  EXPECT_EQ(down(batch_states), down(single_states));
  for (int r = 0; r < K; ++r)  // the keyed rows against the CPU
    EXPECT_EQ(got_ids[size_t(keyed * K + r)],
              sample_keyed({cases[size_t(keyed)].p.data() + r * V, size_t(V)}, 5, 100 + r));
  EXPECT_EQ(got_ids[size_t(1 * K + 2)], -1);  // sequence 1 drew 2 rows only
}

// --- draft trees -------------------------------------------------------------------------------

// A random trie over `nodes` nodes whose children of a node often hold the target's likely
// tokens (so walks go deep): node i's parent is a random earlier node (or the anchor) and its
// token the argmax of its parent's row, or another id.
struct Trie {
  std::vector<int32_t> tokens, parents;
};
Trie random_trie(const std::vector<float>& logits, int64_t V, int nodes, std::mt19937_64& g) {
  Trie t;
  for (int i = 0; i < nodes; ++i) {
    const int parent = int(g() % uint64_t(i + 1)) - 1;
    const float* row = logits.data() + int64_t(parent + 1) * V;
    int32_t tok = int32_t(std::max_element(row, row + V) - row);
    if (g() % 3 == 0) tok = int32_t(g() % uint64_t(V));
    // A trie: siblings hold distinct tokens.
    auto taken = [&](int32_t x) {
      for (int k = 0; k < i; ++k)
        if (t.parents[size_t(k)] == parent && t.tokens[size_t(k)] == x) return true;
      return false;
    };
    while (taken(tok)) tok = int32_t((tok + 1) % V);
    t.parents.push_back(parent);
    t.tokens.push_back(tok);
  }
  return t;
}

// Tree walks on the device against flashmap::verify_tree: greedy (the rows' argmaxes) and keyed
// (keyed draws of the filtered rows) exactly; sampled ones walk a valid path, take one uniform
// per visited node and end on a token no child of the last node holds.
TEST_F(CudaSampling, TreeWalksEqualVerifyTree) {
  const int64_t V = 3001;
  std::mt19937_64 g(8);
  const SamplingParams sp{1.0f, 0, 0.95f, 0.0f};
  for (int trial = 0; trial < 12; ++trial) {
    const int nodes = 1 + int(g() % 40);
    std::vector<float> logits;
    for (int r = 0; r <= nodes; ++r) {
      const auto row = grid_logits(V, g(), 16.0f);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    Trie trie = random_trie(logits, V, nodes, g);
    std::vector<int32_t> argmax;
    for (int r = 0; r <= nodes; ++r) {
      const float* row = logits.data() + int64_t(r) * V;
      argmax.push_back(int32_t(std::max_element(row, row + V) - row));
    }
    const auto p = cpu_filtered(logits, V, sp);
    auto d_p = up(p);
    auto d_argmax = up(argmax), d_tokens = up(trie.tokens), d_parents = up(trie.parents);
    DeviceBuffer<int32_t> out(size_t(3 * (2 + nodes)));
    auto d_state = up(std::vector<uint64_t>{uint64_t(60 + trial), 5});
    std::vector<TreeItem> items(3);
    for (int m = 0; m < 3; ++m) {
      TreeItem& t = items[size_t(m)];
      t.rows = m == kTreeGreedy ? nullptr : d_p.data();
      t.argmax = d_argmax.data();
      t.tokens = d_tokens.data();
      t.parents = d_parents.data();
      t.result = out.data() + m * (2 + nodes);
      t.path_tokens = t.result + 2;
      t.path_nodes = nullptr;
      t.seed = 99;
      t.first_position = 17;
      t.nodes = nodes;
      t.mode = m;
      t.state = m == kTreeSampled ? d_state.data() : nullptr;
    }
    DeviceBuffer<int32_t> path_nodes(size_t(3 * nodes + 3));
    for (int m = 0; m < 3; ++m) items[size_t(m)].path_nodes = path_nodes.data() + m * (nodes + 1);
    DeviceBuffer<TreeItem> d_items(items.size());
    check(cudaMemcpyAsync(d_items.data(), items.data(), items.size() * sizeof(TreeItem),
                          cudaMemcpyHostToDevice, ctx->stream()),
          "H2D");
    Sampler s(*ctx, V, 4);
    s.verify_trees(d_items.data(), 3);
    const auto got = down(out), got_nodes = down(path_nodes);
    const auto state = down(d_state);
    for (int m = 0; m < 3; ++m) {
      const int32_t* r = got.data() + m * (2 + nodes);
      const int depth = r[0];
      ASSERT_GE(depth, 0);
      ASSERT_LE(depth, nodes);
      // A valid path: each node the child of the one before, its token the one recorded.
      int node = -1;
      for (int j = 0; j < depth; ++j) {
        const int32_t next = got_nodes[size_t(m * (nodes + 1) + j)];
        ASSERT_GE(next, 0);
        ASSERT_LT(next, nodes);
        EXPECT_EQ(trie.parents[size_t(next)], node) << "mode " << m;
        EXPECT_EQ(trie.tokens[size_t(next)], r[2 + j]) << "mode " << m;
        node = next;
      }
      for (int i = 0; i < nodes; ++i)
        EXPECT_FALSE(trie.parents[size_t(i)] == node && trie.tokens[size_t(i)] == r[1])
            << "mode " << m << ": the walk stopped although a child holds its token";
      if (m == kTreeSampled) {
        EXPECT_EQ(state[1], uint64_t(5 + depth + 1)) << "one uniform per visited node";
        continue;
      }
      SeqSampler cpu(m == kTreeGreedy ? SamplingParams{} : sp, 99, m == kTreeKeyed);
      std::vector<int> path;
      int32_t bonus = -1;
      const int want =
          verify_tree(cpu, trie.tokens, trie.parents, logits.data(), V, 17, path, bonus);
      EXPECT_EQ(depth, want) << "mode " << m << " trial " << trial;
      EXPECT_EQ(r[1], bonus) << "mode " << m << " trial " << trial;
      for (int j = 0; j < std::min(depth, want); ++j)
        EXPECT_EQ(got_nodes[size_t(m * (nodes + 1) + j)], path[size_t(j)]);
    }
  }
}

// The ranked lists of top-k expansion against the CPU's log_softmax_row ranked as DraftTrie
// ranks it (log-probability descending, the lower id first among equals; planted ties).
TEST_F(CudaSampling, RankedLogprobsEqualTheCpuRanking) {
  const int64_t V = 2048;
  const int rows = 5, keep = 40;
  std::vector<float> logits;
  std::mt19937_64 g(2);
  for (int r = 0; r < rows; ++r) {
    auto row = grid_logits(V, g(), 20.0f);
    for (int i = 0; i < 30; ++i) row[size_t(g() % uint64_t(V))] = row[0];  // ties
    logits.insert(logits.end(), row.begin(), row.end());
  }
  auto d_logits = up(logits);
  const std::vector<int32_t> src = {4, 0, 2, 3, 1};
  auto d_src = up(src);
  DeviceBuffer<int32_t> ids(size_t(rows * keep));
  DeviceBuffer<float> lps(size_t(rows * keep));
  Sampler s(*ctx, V, 2);  // three sorts of at most 2 rows
  s.ranked_logprobs(d_logits.data(), d_src.data(), rows, keep, ids.data(), lps.data());
  const auto got_ids = down(ids);
  const auto got_lps = down(lps);
  for (int r = 0; r < rows; ++r) {
    const auto lp = log_softmax_row(logits.data() + int64_t(src[size_t(r)]) * V, V);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return lp[size_t(a)] > lp[size_t(b)]; });
    for (int j = 0; j < keep; ++j) {
      EXPECT_EQ(got_ids[size_t(r * keep + j)], order[size_t(j)]) << "row " << r << " rank " << j;
      EXPECT_NEAR(got_lps[size_t(r * keep + j)], lp[size_t(order[size_t(j)])], 1e-5)
          << "row " << r << " rank " << j;
    }
  }
}

}  // namespace
}  // namespace flashmap::cuda
