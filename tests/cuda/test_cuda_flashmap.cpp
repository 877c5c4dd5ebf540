// The FlashMap drafter on the GPU (src/cuda/flashmap_cuda.*) against the CPU
// flashmap::FlashMapModel (the reference, itself checked against flashmap==0.1.0 by `flashmap
// parity`) on the committed fixtures, with the same given noise; the device Philox normal generator
// against its host copy and N(0, 1); CUDA-graph replays against eager drafts; and a smoke run with
// timings at the default drafter shape. Without a usable GPU every device test skips; the
// generator's host tests run.
//
// Tolerances. The device rounds every GEMM operand to bf16 (weights, activations, the state read
// through E, E and lm_head themselves) and accumulates in fp32; the CPU computes in fp32 from the
// fixtures' fp32 weights. One bf16 rounding is a relative error of at most 2⁻⁹ (NMSE ~1e-6 per
// operand); through the ~20 GEMMs of a draft it adds up to NMSE ~3e-5 on the fixtures' logits
// (tools/emulate_bf16_draft.py emulates exactly these roundings on the reference: 2.3e-5…3.4e-5
// for every fixture, step count and noise kind). kNmse = 1e-3 leaves 30× margin and still fails on
// any real bug (a wrong index, norm or time gives NMSE ~1). The same emulation flips the argmax of
// 1 slot in 145 whose top-2 logits are 2e-3 apart, so an argmax may differ only where the CPU's
// top-2 gap is within twice the row's largest |Δ| (the only way the error can flip it), and at
// least 3/4 of the slots of every draft must agree exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/device.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/philox.h"
#include "gpu_test.h"
#include "io/safetensors.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "paged/block_pool.h"
#include "paged/draft_plan.h"

namespace flashmap::cuda {
namespace {

constexpr double kNmse = 1e-3;
const char* const kFixtures[] = {"tests/fixtures/tiny-a", "tests/fixtures/tiny-b",
                                 "tests/fixtures/tiny-c"};

using test::Gpu;  // one context per binary (gpu_test.h)
using test::nmse;

class CudaFlashMap : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Gpu::get().ctx) GTEST_SKIP() << "no usable CUDA GPU: " << Gpu::get().why;
    gpu = Gpu::get().ctx.get();
  }
  Context* gpu = nullptr;
};

// GPU draft logits [rows, V] against the CPU's: NMSE, then per-slot argmax as explained on top.
void expect_logits_match(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t V,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  const double e = nmse(gpu, cpu);
  EXPECT_LE(e, kNmse) << what;
  const int64_t rows = int64_t(cpu.size()) / V;
  int64_t exact = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cpu.data() + r * V;
    const float* g = gpu.data() + r * V;
    float max_abs = 0;
    for (int64_t i = 0; i < V; ++i) max_abs = std::max(max_abs, std::abs(g[i] - c[i]));
    EXPECT_TRUE(std::isfinite(max_abs)) << what << " slot " << r;
    const int64_t ac = std::max_element(c, c + V) - c, ag = std::max_element(g, g + V) - g;
    if (ac == ag) {
      ++exact;
    } else {
      EXPECT_LE(c[ac] - c[ag], 2.0f * max_abs)
          << what << " slot " << r << ": GPU argmax " << ag << " is not a CPU near-tie of " << ac;
    }
  }
  EXPECT_GE(exact, rows - rows / 4) << what << ": argmax agreement " << exact << "/" << rows;
  std::printf("  %-40s NMSE %.2e, argmax %lld/%lld\n", what.c_str(), e, (long long)exact,
              (long long)rows);
}

std::vector<uint16_t> bf16_of(const Weight& w) {
  std::vector<uint16_t> out(size_t(w.rows * w.cols));
  std::vector<float> row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_f32(r, row.data());
    for (int64_t c = 0; c < w.cols; ++c)
      out[size_t(r * w.cols + c)] = ::flashmap::f32_to_bf16(row[size_t(c)]);
  }
  return out;
}

// A fixture on both backends: the CPU target and drafter, the target's embedding and lm_head in
// bf16 on the device (what Qwen3Model holds), the device drafter, and the reference's prompt,
// features and noise from expected.safetensors.
struct Pair {
  std::string dir;
  std::unique_ptr<::flashmap::Qwen3Model> target;
  std::unique_ptr<::flashmap::FlashMapModel> cpu;
  std::unique_ptr<SafetensorsFile> ref;
  DeviceBuffer<uint16_t> E, lm;
  std::unique_ptr<FlashMapModel> dev;
  std::vector<int32_t> prompt;
  std::vector<float> features;  // [P, F]
  DeviceBuffer<float> d_features;
  int64_t V = 0, TH = 0, K = 0, F = 0, P = 0;

  Pair(Context& gpu, const std::string& d) : dir(d) {
    target = std::make_unique<::flashmap::Qwen3Model>(dir + "/target");
    cpu = std::make_unique<::flashmap::FlashMapModel>(dir + "/draft", *target);
    ref = std::make_unique<SafetensorsFile>(dir + "/expected.safetensors");
    V = target->config().vocab_size;
    TH = target->config().hidden_size;
    K = cpu->block_size();
    E = DeviceBuffer<uint16_t>(gpu, bf16_of(target->embedding()));
    lm = DeviceBuffer<uint16_t>(gpu, bf16_of(target->lm_head()));
    dev = std::make_unique<FlashMapModel>(gpu, *cpu, E.data(), lm.data(), V, TH);
    for (auto id : ref->get("prompt_ids").to_i64()) prompt.push_back(int32_t(id));
    P = int64_t(prompt.size());
    features = ref->get("target_features").to_f32();
    F = dev->feature_dim();
    EXPECT_EQ(int64_t(features.size()), P * F);
    d_features = DeviceBuffer<float>(gpu, features);
  }

  std::vector<float> noise(const std::string& name) const { return ref->get(name).to_f32(); }

  std::vector<float> cpu_draft(FlashMapContext& ctx, int32_t anchor, int steps,
                               ::flashmap::FlashMapModel::Noise noise) const {
    std::vector<float> logits(size_t(K * V));
    ::flashmap::FlashMapModel::Request req{&ctx, anchor, noise};
    cpu->draft({&req, 1}, steps, logits.data());
    return logits;
  }
  std::vector<float> gpu_draft(Context& gpu, FlashMapDeviceContext& ctx, int32_t anchor, int steps,
                               FlashMapModel::Noise noise,
                               FlashMapModel::Exec exec = FlashMapModel::Exec::Eager) const {
    DeviceBuffer<float> logits(size_t(K * V));
    dev->draft(ctx, anchor, steps, noise, logits.data(), exec);
    return logits.download(gpu);  // waits for the stream
  }
};

// --- the normal generator (host; runs everywhere) ----------------------------------------------

TEST(Philox, KnownAnswerVectors) {
  // Random123's kat_vectors for philox4x32_10.
  using philox::U4;
  const U4 a = philox::philox4x32_10(U4{0, 0, 0, 0}, 0, 0);
  EXPECT_EQ(a.x, 0x6627e8d5u);
  EXPECT_EQ(a.y, 0xe169c58du);
  EXPECT_EQ(a.z, 0xbc57ac4cu);
  EXPECT_EQ(a.w, 0x9b00dbd8u);
  const U4 b = philox::philox4x32_10(U4{~0u, ~0u, ~0u, ~0u}, ~0u, ~0u);
  EXPECT_EQ(b.x, 0x408f276du);
  EXPECT_EQ(b.y, 0x41c83b0eu);
  EXPECT_EQ(b.z, 0xa20bc7c6u);
  EXPECT_EQ(b.w, 0x6d5451fdu);
  const U4 c = philox::philox4x32_10(U4{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                     0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.x, 0xd16cfe09u);
  EXPECT_EQ(c.y, 0x94fdccebu);
  EXPECT_EQ(c.z, 0x5001e420u);
  EXPECT_EQ(c.w, 0x24126ea1u);
}

// Moments and the Kolmogorov–Smirnov distance of n draws against N(0, 1), with bounds of 5
// standard errors (mean 1/√n, variance √(2/n), skewness √(6/n), excess kurtosis √(24/n)) and the
// KS critical value at α = 0.001 (1.95/√n): a sound generator fails none of them with these fixed
// seeds (checked on the host copy, which the device must equal), a biased one fails clearly.
void expect_standard_normal(std::vector<float> x, const std::string& what) {
  const double n = double(x.size());
  double m = 0;
  for (float v : x) m += v;
  m /= n;
  double m2 = 0, m3 = 0, m4 = 0;
  for (float v : x) {
    const double d = v - m;
    m2 += d * d;
    m3 += d * d * d;
    m4 += d * d * d * d;
  }
  m2 /= n;
  m3 /= n;
  m4 /= n;
  const double skew = m3 / std::pow(m2, 1.5), kurt = m4 / (m2 * m2) - 3.0;
  EXPECT_LT(std::abs(m), 5.0 / std::sqrt(n)) << what << " mean";
  EXPECT_LT(std::abs(m2 - 1.0), 5.0 * std::sqrt(2.0 / n)) << what << " variance";
  EXPECT_LT(std::abs(skew), 5.0 * std::sqrt(6.0 / n)) << what << " skewness";
  EXPECT_LT(std::abs(kurt), 5.0 * std::sqrt(24.0 / n)) << what << " excess kurtosis";
  std::sort(x.begin(), x.end());
  double ks = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double F = 0.5 * std::erfc(-double(x[i]) / std::sqrt(2.0));
    ks = std::max({ks, double(i + 1) / n - F, F - double(i) / n});
  }
  EXPECT_LT(ks, 1.95 / std::sqrt(n)) << what << " KS distance";
  EXPECT_TRUE(std::isfinite(x.front()) && std::isfinite(x.back())) << what;
}

std::vector<float> host_normals(uint64_t seed, uint64_t counter, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = philox::normal(seed, counter, uint64_t(i));
  return x;
}

TEST(Philox, HostStreamIsStandardNormal) {
  const int64_t n = (int64_t(1) << 20) + 3;
  expect_standard_normal(host_normals(1234, 0, n), "seed 1234 counter 0");
  expect_standard_normal(host_normals(1234, 1, n), "seed 1234 counter 1");
  expect_standard_normal(host_normals(~0ull, 1ull << 40, n), "seed ~0 counter 2^40");
  // Streams of neighbouring counters (successive drafts) and seeds are uncorrelated.
  const auto a = host_normals(7, 0, n), b = host_normals(7, 1, n), c = host_normals(8, 0, n);
  double ab = 0, ac = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[size_t(i)]) * b[size_t(i)];
    ac += double(a[size_t(i)]) * c[size_t(i)];
  }
  EXPECT_LT(std::abs(ab / double(n)), 5.0 / std::sqrt(double(n)));
  EXPECT_LT(std::abs(ac / double(n)), 5.0 / std::sqrt(double(n)));
}

// --- the generator on the device ----------------------------------------------------------------

TEST_F(CudaFlashMap, DeviceNormalsEqualHostAndAreStandardNormal) {
  const int64_t n = (int64_t(1) << 20) + 3;  // a partial last Philox block
  DeviceBuffer<float> d(static_cast<size_t>(n));
  DeviceBuffer<uint64_t> sc(2);
  for (auto [seed, counter] :
       {std::pair<uint64_t, uint64_t>{1234, 0}, {1234, 1}, {~0ull, 1ull << 40}}) {
    const auto want = host_normals(seed, counter, n);
    // By value, and read from device memory (the path a captured draft uses).
    for (bool from_device : {false, true}) {
      if (from_device) {
        drafter::set_pair(sc.data(), seed, counter, gpu->stream());
        drafter::philox_normal(d.data(), n, sc.data(), 0, 0, gpu->stream());
      } else {
        drafter::philox_normal(d.data(), n, nullptr, seed, counter, gpu->stream());
      }
      const auto got = d.download(*gpu);
      // Same bits from Philox, same float Box-Muller; only logf/sinf/cosf may differ by an ulp or
      // two between libm and CUDA's (max |z| ≈ 5.9, so 1e-5 absolute is ~100 ulps of headroom).
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < n; ++i)
        if (!(std::abs(got[size_t(i)] - want[size_t(i)]) <= 1e-5f)) {
          if (first < 0) first = i;
          ++bad;
        }
      EXPECT_EQ(bad, 0) << "seed " << seed << " counter " << counter << " first at " << first
                        << ": " << (first >= 0 ? got[size_t(first)] : 0.f) << " vs "
                        << (first >= 0 ? want[size_t(first)] : 0.f);
      expect_standard_normal(
          got, "device seed " + std::to_string(seed) + " counter " + std::to_string(counter));
    }
  }
}

// --- parity with the CPU drafter ----------------------------------------------------------------

TEST_F(CudaFlashMap, GivenNoiseMatchesCpuOnFixtures) {
  for (const char* dir : kFixtures) {
    SCOPED_TRACE(dir);
    Pair p(*gpu, dir);
    const int32_t anchor = p.prompt.back();
    auto run = [&](::flashmap::FlashMapModel::Noise cn, FlashMapModel::Noise gn, int steps) {
      FlashMapContext c = p.cpu->new_context();
      p.cpu->extend_context(c, p.features.data(), p.P - 1);
      FlashMapDeviceContext g = p.dev->new_context(p.P + 1);
      p.dev->extend_context(g, p.d_features.data(), p.P - 1);
      return std::make_pair(p.gpu_draft(*gpu, g, anchor, steps, gn),
                            p.cpu_draft(c, anchor, steps, cn));
    };
    for (const auto& [steps, grid] : p.cpu->config().jump_grids) {
      const std::string name = "noise_x0_steps" + std::to_string(steps);
      if (!p.ref->contains(name)) continue;
      const auto x0 = p.noise(name);
      DeviceBuffer<float> d_x0(*gpu, x0);
      const auto [got, want] = run({::flashmap::FlashMapModel::Noise::Vocab, x0.data(), nullptr},
                                   {FlashMapModel::Noise::Vocab, d_x0.data()}, steps);
      expect_logits_match(got, want, p.V,
                          std::string(dir) + " x0, " + std::to_string(steps) + " step(s)");
    }
    const auto z = p.noise("noise_z");
    DeviceBuffer<float> d_z(*gpu, z);
    const auto [got, want] = run({::flashmap::FlashMapModel::Noise::Embed, z.data(), nullptr},
                                 {FlashMapModel::Noise::Embed, d_z.data()}, 1);
    expect_logits_match(got, want, p.V, std::string(dir) + " z·Lᵀ, 1 step");
  }
}

TEST_F(CudaFlashMap, ExtendContextInRoundsThenDraftMatchesCpu) {
  // Like the decoding loop: the context grows by the accepted tokens of each round, every draft
  // writes the anchor's slot and the next extension overwrites it.
  for (const char* dir : {kFixtures[0], kFixtures[1]}) {
    SCOPED_TRACE(dir);
    Pair p(*gpu, dir);
    FlashMapContext c = p.cpu->new_context();
    FlashMapDeviceContext g = p.dev->new_context(p.P + 1);
    const std::vector<int64_t> rounds = {1, 3, 2, 4, p.P - 1 - 10};
    ASSERT_GT(rounds.back(), 0);
    int64_t done = 0;
    int steps = 1;
    for (int64_t n : rounds) {
      p.cpu->extend_context(c, p.features.data() + done * p.F, n);
      p.dev->extend_context(g, p.d_features.data() + done * p.F, n);
      done += n;
      ASSERT_EQ(g.length(), done);
      const int32_t anchor = p.prompt[size_t(done)];
      if (!p.cpu->config().jump_grids.count(steps)) steps = 1;
      const auto x0 = p.noise("noise_x0_steps" + std::to_string(steps));
      DeviceBuffer<float> d_x0(*gpu, x0);
      const auto got =
          p.gpu_draft(*gpu, g, anchor, steps, {FlashMapModel::Noise::Vocab, d_x0.data()});
      const auto want = p.cpu_draft(c, anchor, steps,
                                    {::flashmap::FlashMapModel::Noise::Vocab, x0.data(), nullptr});
      expect_logits_match(got, want, p.V,
                          std::string(dir) + " after " + std::to_string(done) + " positions, " +
                              std::to_string(steps) + " step(s)");
      steps = steps % 4 + 1;
    }
  }
}

TEST_F(CudaFlashMap, DrawnNoiseIsTheGeneratorsStream) {
  // A drawn draft equals the CPU drafter given the device stream (seed, counter) as noise: z
  // [K, TH] for one step (EᵀE has a Cholesky factor on these fixtures), x0 [K, V] otherwise.
  for (const char* dir : {kFixtures[0], kFixtures[2]}) {
    SCOPED_TRACE(dir);
    Pair p(*gpu, dir);
    ASSERT_TRUE(p.cpu->has_noise_factor());
    for (const auto& [steps, grid] : p.cpu->config().jump_grids) {
      const uint64_t seed = 99, counter = uint64_t(steps) + 5;
      const bool embed = steps == 1;
      const int64_t n = embed ? p.K * p.TH : p.K * p.V;
      DeviceBuffer<float> noise{size_t(n)};
      drafter::philox_normal(noise.data(), n, nullptr, seed, counter, gpu->stream());
      const auto host_noise = noise.download(*gpu);

      FlashMapContext c = p.cpu->new_context();
      p.cpu->extend_context(c, p.features.data(), p.P - 1);
      FlashMapDeviceContext g = p.dev->new_context(p.P + 1);
      p.dev->extend_context(g, p.d_features.data(), p.P - 1);
      FlashMapModel::Noise drawn;
      drawn.seed = seed;
      drawn.counter = counter;
      const auto got = p.gpu_draft(*gpu, g, p.prompt.back(), steps, drawn);
      using CN = ::flashmap::FlashMapModel::Noise;
      const auto want = p.cpu_draft(c, p.prompt.back(), steps,
                                    {embed ? CN::Embed : CN::Vocab, host_noise.data(), nullptr});
      expect_logits_match(got, want, p.V,
                          std::string(dir) + " drawn, " + std::to_string(steps) + " step(s)");
      // The same noise given on the device takes the same kernels: identical up to rounding.
      const auto given = p.gpu_draft(
          *gpu, g, p.prompt.back(), steps,
          {embed ? FlashMapModel::Noise::Embed : FlashMapModel::Noise::Vocab, noise.data()});
      EXPECT_LE(nmse(given, got), 1e-12);
    }
  }
}

TEST_F(CudaFlashMap, GraphReplayEqualsEagerAsTheContextGrows) {
  Pair p(*gpu, kFixtures[1]);  // block 16, 3 layers, noise_gate constant
  FlashMapDeviceContext g = p.dev->new_context(p.P + 1);
  DeviceBuffer<int32_t> d_anchor(1);
  DeviceBuffer<float> eager(size_t(p.K * p.V)), graph(size_t(p.K * p.V));
  const auto x0 = p.noise("noise_x0_steps2");
  DeviceBuffer<float> d_x0(*gpu, x0);
  std::vector<float> before;
  int64_t done = 0;
  for (int64_t n : {int64_t(4), int64_t(3), p.P - 1 - 7}) {
    p.dev->extend_context(g, p.d_features.data() + done * p.F, n);
    done += n;
    const std::vector<int32_t> anchor = {p.prompt[size_t(done)]};
    d_anchor.upload(*gpu, anchor.data(), 1);
    for (int steps : {1, 3, 2}) {
      FlashMapModel::Noise noise;  // drawn, a new counter per round and step count
      noise.seed = 5;
      noise.counter = uint64_t(done * 10 + steps);
      if (steps == 2) noise = {FlashMapModel::Noise::Vocab, d_x0.data()};
      p.dev->draft(g, d_anchor.data(), steps, noise, eager.data(), FlashMapModel::Exec::Eager);
      p.dev->draft(g, d_anchor.data(), steps, noise, graph.data(), FlashMapModel::Exec::Graph);
      const auto e = eager.download(*gpu), r = graph.download(*gpu);
      // The same kernels and GEMM algorithms on the same data: equal (bitwise in practice).
      EXPECT_LE(nmse(r, e), 1e-12) << "after " << done << ", " << steps << " step(s)";
      if (steps == 3) {
        // The replay followed the new length, anchor and counter rather than the captured ones.
        if (!before.empty()) {
          EXPECT_GT(nmse(r, before), 1e-6) << "after " << done;
        }
        before = r;
      }
    }
  }
  // And the last one is the CPU's.
  FlashMapContext c = p.cpu->new_context();
  p.cpu->extend_context(c, p.features.data(), done);
  const auto want = p.cpu_draft(c, p.prompt[size_t(done)], 2,
                                {::flashmap::FlashMapModel::Noise::Vocab, x0.data(), nullptr});
  expect_logits_match(graph.download(*gpu), want, p.V, "graph replay, 2 steps");
}

TEST_F(CudaFlashMap, ClearErrors) {
  Pair p(*gpu, kFixtures[0]);
  FlashMapDeviceContext g = p.dev->new_context(4);
  DeviceBuffer<float> logits(size_t(p.K * p.V));
  EXPECT_THROW(p.dev->extend_context(g, p.d_features.data(), 4), Error);  // no room for the anchor
  p.dev->extend_context(g, p.d_features.data(), 3);
  EXPECT_THROW(p.dev->draft(g, int32_t(p.V), 1, {}, logits.data()), Error);  // anchor past V
  EXPECT_THROW(p.dev->draft(g, 1, 7, {}, logits.data()), Error);             // no such grid
  DeviceBuffer<float> z(size_t(p.K * p.TH));
  EXPECT_THROW(p.dev->draft(g, 1, 2, {FlashMapModel::Noise::Embed, z.data()}, logits.data()),
               Error);  // embedding-space noise is for one step
  EXPECT_THROW(p.dev->draft(g, 1, 2, {FlashMapModel::Noise::Vocab, nullptr}, logits.data()), Error);
  p.dev->draft(g, 1, 1, {}, logits.data());  // still usable
  gpu->sync();
}

// --- batched drafts over a paged context (what the CUDA backend runs) ---------------------------

// Three sequences of different context lengths in one pool, their blocks interleaved (scattered
// tables, as sequences growing side by side get them), committed in two parts each as rounds do,
// then drafted in one batch (a padding sequence in the bucket): each sequence's rows against the
// CPU drafter on its own context with the same noise (the device stream of its (seed, counter)).
// The context is bf16 here (the CPU's fp32): one more rounding of the keys, values, queries and
// attention outputs, NMSE ~1e-6 each, inside kNmse. tiny-a's heads (12 wide) do not page.
TEST_F(CudaFlashMap, BatchedPagedDraftsMatchCpu) {
  for (const char* dir : {kFixtures[1], kFixtures[2]}) {
    SCOPED_TRACE(dir);
    Pair p(*gpu, dir);
    ASSERT_TRUE(p.dev->pages());
    constexpr int32_t bt = 16;
    paged::BlockPool blocks(64, bt);
    const std::vector<int64_t> lengths = {p.P - 1, p.P / 2, 5};
    const int n = int(lengths.size());
    std::vector<int> seqs;
    for (int64_t len : lengths) seqs.push_back(blocks.open(len + 1));
    std::vector<paged::BlockCopy> copies;
    for (int64_t at = bt;; at += bt) {  // round-robin growth: every table's blocks interleave
      bool grew = false;
      for (int i = 0; i < n; ++i) {
        const int64_t want = std::min(at, lengths[size_t(i)] + 1);
        if (want > blocks.length(seqs[size_t(i)])) {
          blocks.grow(seqs[size_t(i)], want, copies);
          grew = true;
        }
      }
      if (!grew) break;
    }
    auto pool = p.dev->new_paged(blocks.num_blocks(), bt);
    // Two commits per sequence: the first half, then the rest (source rows = positions here).
    for (int part = 0; part < 2; ++part) {
      std::vector<paged::CommitSeq> cs;
      for (int i = 0; i < n; ++i) {
        const int64_t half = lengths[size_t(i)] / 2, from = part ? half : 0;
        const int count = int(part ? lengths[size_t(i)] - half : half);
        cs.push_back({blocks.table(seqs[size_t(i)]), from, from, count});
      }
      const paged::CommitPlan plan = paged::plan_commit(cs, bt, p.P);
      DeviceBuffer<int32_t> image(*gpu, plan.image());
      p.dev->commit_paged(*pool, p.d_features.data(), image.data(), plan.n);
      gpu->sync();
    }
    std::vector<paged::DraftSeq> ds;
    for (int i = 0; i < n; ++i)
      ds.push_back({blocks.table(seqs[size_t(i)]), lengths[size_t(i)] + 1});
    const std::vector<int32_t> buckets = {1, 2, 4};
    const paged::StepPlan plan = paged::plan_draft(ds, int(p.K), bt, buckets);
    ASSERT_EQ(plan.bucket, 4);
    DeviceBuffer<int32_t> image(*gpu, plan.image());
    std::vector<int32_t> anchors(4, 0);
    std::vector<uint64_t> rng(8, 0);
    for (int i = 0; i < n; ++i) {
      anchors[size_t(i)] = p.prompt[size_t(lengths[size_t(i)])];
      rng[size_t(2 * i)] = 70 + uint64_t(i);
      rng[size_t(2 * i + 1)] = 3 + uint64_t(i);
    }
    DeviceBuffer<int32_t> d_anchors(*gpu, anchors);
    DeviceBuffer<uint64_t> d_rng(*gpu, rng);
    DeviceBuffer<float> eager(size_t(4 * p.K * p.V)), graph(size_t(4 * p.K * p.V));
    for (const auto& [steps, grid] : p.cpu->config().jump_grids) {
      p.dev->draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), d_rng.data(), steps,
                         eager.data(), FlashMapModel::Exec::Eager);
      p.dev->draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), d_rng.data(), steps,
                         graph.data(), FlashMapModel::Exec::Graph);
      const auto e = eager.download(*gpu), g = graph.download(*gpu);
      EXPECT_LE(nmse(g, e), 1e-12) << steps << " step(s): a graph replay differs";
      const bool embed = steps == 1 && p.cpu->has_noise_factor();
      for (int i = 0; i < n; ++i) {
        const int64_t per = p.K * (embed ? p.TH : p.V);
        DeviceBuffer<float> noise{size_t(per)};
        drafter::philox_normal(noise.data(), per, nullptr, rng[size_t(2 * i)],
                               rng[size_t(2 * i + 1)], gpu->stream());
        const auto host_noise = noise.download(*gpu);
        FlashMapContext c = p.cpu->new_context();
        p.cpu->extend_context(c, p.features.data(), lengths[size_t(i)]);
        using CN = ::flashmap::FlashMapModel::Noise;
        const auto want = p.cpu_draft(c, anchors[size_t(i)], steps,
                                      {embed ? CN::Embed : CN::Vocab, host_noise.data(), nullptr});
        const std::vector<float> got(e.begin() + int64_t(i) * p.K * p.V,
                                     e.begin() + int64_t(i + 1) * p.K * p.V);
        expect_logits_match(got, want, p.V,
                            std::string(dir) + " batch row " + std::to_string(i) + ", " +
                                std::to_string(steps) + " step(s)");
      }
    }
    // A replay follows new anchors and noise (read from device memory), as an eager run does.
    std::swap(anchors[0], anchors[2]);
    rng[1] += 100;
    d_anchors.upload(*gpu, anchors.data(), anchors.size());
    d_rng.upload(*gpu, rng.data(), rng.size());
    p.dev->draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), d_rng.data(), 1,
                       eager.data(), FlashMapModel::Exec::Eager);
    const auto e = eager.download(*gpu);
    p.dev->draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), d_rng.data(), 1,
                       graph.data(), FlashMapModel::Exec::Graph);
    EXPECT_LE(nmse(graph.download(*gpu), e), 1e-12);
  }
}

// The noise draws of one sequence's draft tree: entries of one batch with the same table and
// context, so the same anchor slot. The anchor's context row is written once (by the first) and
// every draw reads it, as the CPU's draws over one context do: each draw's rows match the CPU
// drafter with its own noise.
TEST_F(CudaFlashMap, DrawsOfOneSequenceShareItsAnchorRow) {
  Pair p(*gpu, kFixtures[2]);
  ASSERT_TRUE(p.dev->pages());
  constexpr int32_t bt = 16;
  const int64_t len = p.P / 2;
  paged::BlockPool blocks(16, bt);
  const int seq = blocks.open(len + 1);
  std::vector<paged::BlockCopy> copies;
  blocks.grow(seq, len + 1, copies);
  auto pool = p.dev->new_paged(blocks.num_blocks(), bt);
  const paged::CommitSeq cs{blocks.table(seq), 0, 0, int(len)};
  const paged::CommitPlan commit = paged::plan_commit({&cs, 1}, bt, p.P);
  DeviceBuffer<int32_t> commit_image(*gpu, commit.image());
  p.dev->commit_paged(*pool, p.d_features.data(), commit_image.data(), commit.n);
  const int draws = 3;
  const std::vector<paged::DraftSeq> ds(size_t(draws), {blocks.table(seq), len + 1});
  const paged::StepPlan plan = paged::plan_draft(ds, int(p.K), bt, std::vector<int32_t>{1, 2, 4});
  ASSERT_EQ(plan.bucket, 4);
  DeviceBuffer<int32_t> image(*gpu, plan.image());
  std::vector<int32_t> anchors(4, 0);
  std::vector<uint64_t> rng(8, 0);
  for (int d = 0; d < draws; ++d) {
    anchors[size_t(d)] = p.prompt[size_t(len)];
    rng[size_t(2 * d)] = 91;
    rng[size_t(2 * d + 1)] = 1 + uint64_t(d);  // the sequence's draft counter, one per draw
  }
  DeviceBuffer<int32_t> d_anchors(*gpu, anchors);
  DeviceBuffer<uint64_t> d_rng(*gpu, rng);
  DeviceBuffer<float> logits(size_t(4 * p.K * p.V));
  for (const auto& [steps, grid] : p.cpu->config().jump_grids) {
    p.dev->draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), d_rng.data(), steps,
                       logits.data(), FlashMapModel::Exec::Eager);
    const auto got = logits.download(*gpu);
    const bool embed = steps == 1 && p.cpu->has_noise_factor();
    for (int d = 0; d < draws; ++d) {
      const int64_t per = p.K * (embed ? p.TH : p.V);
      DeviceBuffer<float> noise{size_t(per)};
      drafter::philox_normal(noise.data(), per, nullptr, rng[size_t(2 * d)], rng[size_t(2 * d + 1)],
                             gpu->stream());
      const auto host_noise = noise.download(*gpu);
      FlashMapContext c = p.cpu->new_context();
      p.cpu->extend_context(c, p.features.data(), len);
      using CN = ::flashmap::FlashMapModel::Noise;
      const auto want = p.cpu_draft(c, anchors[size_t(d)], steps,
                                    {embed ? CN::Embed : CN::Vocab, host_noise.data(), nullptr});
      const std::vector<float> rows(got.begin() + int64_t(d) * p.K * p.V,
                                    got.begin() + int64_t(d + 1) * p.K * p.V);
      expect_logits_match(rows, want, p.V,
                          "draw " + std::to_string(d) + ", " + std::to_string(steps) + " step(s)");
    }
  }
}

TEST_F(CudaFlashMap, PagedContextRefusals) {
  Pair a(*gpu, kFixtures[0]);
  EXPECT_FALSE(a.dev->pages());  // head_dim 12
  EXPECT_THROW(a.dev->new_paged(4, 16), Error);
  Pair b(*gpu, kFixtures[1]);
  EXPECT_THROW(b.dev->new_paged(0, 16), Error);
  auto pool = b.dev->new_paged(4, 16);
  DeviceBuffer<float> logits(size_t(b.K * b.V));
  DeviceBuffer<int32_t> image(64);
  EXPECT_THROW(b.dev->draft_batch(*pool, image.data(), 1, nullptr, nullptr, 1, logits.data()),
               Error);
  EXPECT_THROW(a.dev->draft_batch(*pool, image.data(), 1, image.data(), nullptr, 1, logits.data()),
               Error);  // another drafter's pool
}

// --- the default shape (Qwen3-8B target, 2048-wide 6-layer drafter, block 16) ------------------

// The drafter at the reference's default shape (hidden 2048, 6 layers, block 16, Qwen3-8B's
// vocabulary) runs eagerly and from graphs, 1-4 steps, with finite logits, and graph replays equal
// eager runs. Its speed is measured by `flashmap bench --device cuda --shape qwen3-8b`.
TEST_F(CudaFlashMap, RandomDrafterAtDefaultShapeRuns) {
  FlashMapConfig c;
  c.jump_grids = FlashMapConfig::default_jump_grids();
  const int64_t V = c.vocab_size, TH = c.target_hidden_size, K = c.block_size;
  DeviceBuffer<uint16_t> E(size_t(V * TH)), lm(size_t(V * TH));
  drafter::philox_normal_bf16(E.data(), V * TH, 0.02f, 1, gpu->stream());
  drafter::philox_normal_bf16(lm.data(), V * TH, 0.02f, 2, gpu->stream());
  auto fm = FlashMapModel::random(*gpu, c, E.data(), lm.data(), V, TH, 42);
  const int64_t context = 512;
  FlashMapDeviceContext ctx = fm->new_context(2048);
  DeviceBuffer<float> feats(size_t(context * fm->feature_dim()));
  drafter::philox_normal(feats.data(), context * fm->feature_dim(), nullptr, 3, 0, gpu->stream());
  fm->extend_context(ctx, feats.data(), context);
  DeviceBuffer<float> logits(size_t(K * V));
  DeviceBuffer<int32_t> anchor(1);
  drafter::set_value(anchor.data(), int32_t(1234), gpu->stream());
  for (int steps = 1; steps <= 4; ++steps) {
    std::vector<float> eager;
    for (auto exec : {FlashMapModel::Exec::Eager, FlashMapModel::Exec::Graph}) {
      FlashMapModel::Noise noise;
      noise.seed = 11;
      fm->draft(ctx, anchor.data(), steps, noise, logits.data(), exec);
      const auto out = logits.download(*gpu);
      int64_t finite = 0;
      for (float v : out) finite += std::isfinite(v);
      EXPECT_EQ(finite, int64_t(out.size())) << steps << " step(s)";
      if (exec == FlashMapModel::Exec::Eager)
        eager = out;
      else
        EXPECT_EQ(out, eager) << steps << " step(s): a graph replay differs from the eager run";
    }
  }
}

}  // namespace
}  // namespace flashmap::cuda
