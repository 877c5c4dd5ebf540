// CUDA op parity, in the spirit of ggml's test-backend-ops: every device kernel against the float64
// reference of the op it mirrors (tests/ops/reference_ops.h, the same reference the CPU kernels of
// src/ops are checked against in tests/ops) on random inputs at odd shapes, compared by
// NMSE = Σ(gpu − ref)² / Σ ref² with a threshold per op; indices (argmax, greedy verify) must match
// exactly. On a machine without a usable GPU every op test skips, so ctest passes in CI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../ops/reference_ops.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda/device.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "gpu_test.h"
#include "ops/ops.h"
#include "specdec/sampling.h"
#include "specdec/verify.h"

namespace flashmap::cuda {
namespace {

// Thresholds. fp32 kernels differ from the float64 reference only by fp32 rounding (sums of n
// terms: ~√n·2⁻²⁴ relative in practice, at most n·2⁻²⁴; libm's ulps), NMSE ~1e-13; 1e-7 is
// ggml's fp32 default and still catches any real bug (a wrong index or formula gives NMSE ~1).
// bf16 inputs justify the looser bound: the GEMMs round x to bf16 (8 significant bits, relative
// error up to 2⁻⁹) and the bf16 KV cache rounds k and v, NMSE ~1e-6 per rounded operand, while
// the reference reads the unrounded fp32 values; 5e-4 is ggml's bf16 GEMM bound.
constexpr double kF32 = 1e-7;
constexpr double kBF16 = 5e-4;
const std::vector<int64_t> kRows = {1, 17, 769};

using test::Gpu;  // one context per binary (gpu_test.h)
using test::nmse;
using test::randn;
using test::to_bf16;
using test::widen;
namespace ref = ::flashmap::reference;

class CudaOps : public test::GpuTest {
 protected:
  cudaStream_t s() { return ctx->stream(); }
};

// --- the device context (runs everywhere) -----------------------------------------------------

TEST(CudaDevice, ParsesDeviceSpecs) {
  EXPECT_EQ(parse_device("cuda"), 0);
  EXPECT_EQ(parse_device("cuda:3"), 3);
  for (const char* bad : {"cpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "gpu:0"})
    EXPECT_THROW(parse_device(bad), Error) << bad;
}

TEST(CudaDevice, ClearErrorWithoutUsableGpu) {
  std::string why;
  const int n = device_count(&why);
  if (n == 0) {
    // This is the dev/CI machine's case: constructing a context must say why, not crash.
    try {
      Context ctx("cuda");
      FAIL() << "Context constructed without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no usable CUDA GPU"), std::string::npos) << e.what();
    }
  } else {
    try {
      Context ctx("cuda:" + std::to_string(n));
      FAIL() << "Context constructed for a GPU index past the last one";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
}

// --- the GEMM plans' choice (host; runs everywhere) -----------------------------------------

// pick_candidate: the first candidate, in the heuristic's order, that runs at every n it is
// checked at within the budget; a candidate refused at one n, or needing more workspace than the
// budget there, is passed over, and none left is -1.
TEST(CudaGemm, PickCandidateIsTheFirstThatRunsAtEveryCheckedN) {
  // Candidate 0 is refused at n = 1, candidate 1 needs workspace at n = 4096, candidate 2 runs
  // everywhere without, candidate 3 too (never reached).
  std::vector<std::pair<int, int64_t>> asked;
  auto runs = [&](int c, int64_t n) -> std::optional<size_t> {
    asked.emplace_back(c, n);
    if (c == 0 && n == 1) return std::nullopt;
    if (c == 1 && n == 4096) return size_t(1) << 20;
    return size_t(0);
  };
  EXPECT_EQ(pick_candidate(4, kInvariantCheckN, 0, runs), 2);
  for (const auto& [c, n] : asked) EXPECT_LE(c, 2);
  // With a workspace budget candidate 1 runs everywhere.
  EXPECT_EQ(pick_candidate(4, kInvariantCheckN, size_t(32) << 20, runs), 1);
  EXPECT_EQ(pick_candidate(2, kInvariantCheckN, 0, runs), -1);
  EXPECT_EQ(pick_candidate(0, kInvariantCheckN, 0, runs), -1);
  // The row-invariant checks are at fixed n: one row, the heuristic's n, a wide batch.
  EXPECT_EQ(std::vector<int64_t>(std::begin(kInvariantCheckN), std::end(kInvariantCheckN)),
            (std::vector<int64_t>{1, kInvariantN, 4096}));
}

TEST(CudaGemm, RowInvariantProductsGetNoWorkspace) {
  LtShape s{.trans_a = true, .m = 4096, .n = 17, .k = 4096, .lda = 4096, .ldb = 4096, .ldc = 4096};
  EXPECT_EQ(lt_workspace_budget(s, size_t(32) << 20), size_t(32) << 20);
  s.invariant = true;
  EXPECT_EQ(lt_workspace_budget(s, size_t(32) << 20), 0u);
}

// --- ops ----------------------------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingBf16IsExact) {
  const int64_t V = 1000, H = 200;
  const auto table = to_bf16(randn(size_t(V * H), 1));
  for (int64_t n : kRows) {
    std::vector<int32_t> tok(static_cast<size_t>(n));
    std::mt19937 g(static_cast<unsigned>(n));
    for (auto& t : tok) t = int32_t(g() % V);
    std::vector<double> want(size_t(n * H));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < H; ++c)
        want[size_t(i * H + c)] = ref::bf16_value(table[size_t(tok[size_t(i)] * H + c)]);
    auto dt = up(table);
    auto dtok = up(tok);
    DeviceBuffer<float> out(size_t(n * H));
    embedding(dt.data(), Elem::BF16, H, dtok.data(), n, out.data(), s());
    EXPECT_EQ(nmse(down(out), want), 0.0) << "rows " << n;  // widening bf16 is exact
  }
}

TEST_F(CudaOps, RmsNormBothOrders) {
  for (int64_t dim : {128, 2049}) {
    for (int64_t rows : kRows) {
      const auto x = randn(size_t(rows * dim), 2, 3.0f);
      const auto w = randn(size_t(dim), 3, 0.5f, 1.0f);
      auto dx = up(x), dw = up(w);
      DeviceBuffer<float> dy(x.size());
      // Both orders of the products compute the same function: one reference.
      const auto want = ref::rms_norm(ref::of(x), ref::of(w), double(1e-6f), rows, dim);
      rms_norm(dx.data(), dw.data(), 1e-6f, rows, dim, dy.data(), s());
      EXPECT_LT(nmse(down(dy), want), kF32) << "qwen3 order " << rows << "x" << dim;
      rms_norm_scale_first(dx.data(), dw.data(), 1e-6f, rows, dim, dx.data(), s());  // in place
      EXPECT_LT(nmse(down(dx), want), kF32) << "scale first " << rows << "x" << dim;
    }
  }
}

TEST_F(CudaOps, LayerNormWithAdaLN) {
  const int64_t dim = 2048 + 33;
  for (int64_t rows : kRows) {
    const auto x = randn(size_t(rows * dim), 4, 2.0f, 0.7f);
    const auto sc = randn(size_t(dim), 5, 0.3f), sh = randn(size_t(dim), 6, 0.3f);
    const auto want = ref::layer_norm(ref::of(x), double(1e-6f), rows, dim);
    auto dx = up(x), dsc = up(sc), dsh = up(sh);
    DeviceBuffer<float> dy(x.size());
    layer_norm_modulate(dx.data(), 1e-6f, rows, dim, nullptr, nullptr, dy.data(), s());
    EXPECT_LT(nmse(down(dy), want), kF32) << "plain " << rows;
    // The drafter's modulation, as flashmap::FlashMapModel::forward's adaln lambda writes it.
    const auto modulated =
        ref::layer_norm(ref::of(x), double(1e-6f), rows, dim, ref::of(sc), ref::of(sh));
    layer_norm_modulate(dx.data(), 1e-6f, rows, dim, dsc.data(), dsh.data(), dy.data(), s());
    EXPECT_LT(nmse(down(dy), modulated), kF32) << "adaln " << rows;
  }
}

TEST_F(CudaOps, RopeBothConventions) {
  for (int hd : {64, 96, 128}) {
    for (int64_t rows : kRows) {
      const int heads = 3;
      const auto x = randn(size_t(rows * heads * hd), 7);
      std::vector<int64_t> pos(static_cast<size_t>(rows));
      std::mt19937 g(static_cast<unsigned>(rows));
      for (auto& p : pos) p = int64_t(g() % 4096);
      auto dpos = up(pos);
      for (bool inter : {false, true}) {
        const double theta = inter ? 10000.0 : 1000000.0;
        const auto want = ref::rope(ref::of(x), rows, heads, hd, pos, theta, inter);
        auto dx = up(x);
        if (inter)
          rope_interleaved(dx.data(), rows, heads, hd, dpos.data(), theta, s());
        else
          rope_half(dx.data(), rows, heads, hd, dpos.data(), theta, s());
        EXPECT_LT(nmse(down(dx), want), kF32) << (inter ? "interleaved " : "half ") << rows;
      }
    }
  }
}

TEST_F(CudaOps, PointwiseSwigluGeluResiduals) {
  const int64_t dim = 3072 + 5;
  for (int64_t rows : kRows) {
    const int64_t n = rows * dim;
    const auto g = randn(size_t(n), 8, 3.0f), u = randn(size_t(n), 9), y = randn(size_t(n), 10);
    const auto gate = randn(size_t(dim), 11);
    auto dg = up(g), du = up(u), dy = up(y), dgate = up(gate);
    DeviceBuffer<float> out(static_cast<size_t>(n));
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = ref::swiglu(g[size_t(i)], u[size_t(i)]);
    swiglu(dg.data(), du.data(), n, out.data(), s());
    EXPECT_LT(nmse(down(out), want), kF32) << "swiglu " << rows;
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = ref::gelu(g[size_t(i)]);
    gelu(dg.data(), n, out.data(), s());
    EXPECT_LT(nmse(down(out), want), kF32) << "gelu " << rows;
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = double(g[size_t(i)]) + y[size_t(i)];
    auto dx = up(g);
    add(dx.data(), dy.data(), n, s());
    EXPECT_LT(nmse(down(dx), want), kF32) << "add " << rows;
    for (int64_t i = 0; i < n; ++i)
      want[size_t(i)] = g[size_t(i)] + double(gate[size_t(i % dim)]) * y[size_t(i)];
    dx = up(g);
    gated_add(dx.data(), dgate.data(), dy.data(), rows, dim, s());
    EXPECT_LT(nmse(down(dx), want), kF32) << "gated add " << rows;
  }
}

TEST_F(CudaOps, SoftmaxRows) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 151936}, {17, 32003}, {769, 4099}}) {
    const auto x = randn(size_t(rows * dim), 12, 4.0f);
    const auto want = ref::softmax_rows(ref::of(x), rows, dim);
    auto dx = up(x);
    softmax_rows(dx.data(), rows, dim, s());
    EXPECT_LT(nmse(down(dx), want), kF32) << rows << "x" << dim;
  }
}

TEST_F(CudaOps, ArgmaxRowsLowestIndexOnTies) {
  const int64_t dim = 151936 + 7;
  for (int64_t rows : kRows) {
    auto x = randn(size_t(rows * dim), 13);
    std::mt19937 g(unsigned(rows) + 1);
    for (int64_t r = 0; r < rows; ++r) {
      // Plant the row maximum twice (and in some rows three times): ties must pick the first.
      const float big = 100.0f + float(r % 3);
      for (int t = 0; t < 2 + int(r % 2); ++t) x[size_t(r * dim + int64_t(g() % dim))] = big;
    }
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      want[size_t(r)] = int32_t(ref::argmax({x.data() + r * dim, size_t(dim)}));
    auto dx = up(x);
    DeviceBuffer<int32_t> out(static_cast<size_t>(rows));
    argmax_rows(dx.data(), rows, dim, out.data(), s());
    EXPECT_EQ(down(out), want) << rows;
  }
}

TEST_F(CudaOps, GemmBf16Weights) {
  // K multiple of 8 (16-byte rows for bf16 tensor-core kernels, as all real shapes are); odd N
  // and M from 1 up. x fp32 (rounded to bf16 on the device), x bf16, y bf16, and a bias.
  for (auto [K, N] : {std::pair<int64_t, int64_t>{1024, 1003}, {72, 4096}}) {
    const auto w = to_bf16(randn(size_t(N * K), 14, 0.05f));
    std::vector<double> W(w.size());
    for (size_t i = 0; i < w.size(); ++i) W[i] = ref::bf16_value(w[i]);
    const auto bias = randn(size_t(N), 15);
    auto dw = up(w);
    auto db = up(bias);
    for (int64_t M : kRows) {
      // The reference reads x unrounded: the device's rounding of x to bf16 is part of the error.
      const auto x = randn(size_t(M * K), 16);
      auto want = ref::linear(ref::of(x), M, W, N, K);
      auto dx = up(x);
      DeviceBuffer<float> dy(size_t(M * N));
      linear(*ctx, dx.data(), Elem::F32, M, K, dw.data(), N, nullptr, dy.data(), Elem::F32);
      EXPECT_LT(nmse(down(dy), want), kBF16) << "x f32 M=" << M << " N=" << N << " K=" << K;

      const auto xb = to_bf16(x);
      const auto xw = ref::of(widen(xb));
      want = ref::linear(xw, M, W, N, K, ref::of(bias));
      auto dxb = up(xb);
      linear(*ctx, dxb.data(), Elem::BF16, M, K, dw.data(), N, db.data(), dy.data(), Elem::F32);
      EXPECT_LT(nmse(down(dy), want), kBF16) << "x bf16 + bias M=" << M;

      want = ref::linear(xw, M, W, N, K);
      DeviceBuffer<uint16_t> dyb(size_t(M * N));
      linear(*ctx, dxb.data(), Elem::BF16, M, K, dw.data(), N, nullptr, dyb.data(), Elem::BF16);
      EXPECT_LT(nmse(widen(down(dyb)), want), kBF16) << "y bf16 M=" << M;
    }
  }
}

// A row-invariant weight shape runs one algorithm without workspace at every n, whichever n is
// planned first; its rows are then the same bits alone and in a batch. A shape of its own (no
// other test plans it), planned first at a wide n, then at one row. The per-shape product keeps
// the context's workspace.
TEST_F(CudaOps, RowInvariantGemmPlansUseNoWorkspaceAndOneAlgorithm) {
  const int64_t K = 136, N = 520;
  auto shape = [&](int64_t M, bool invariant) {
    return LtShape{.trans_a = true,
                   .m = N,
                   .n = M,
                   .k = K,
                   .lda = K,
                   .ldb = K,
                   .ldc = N,
                   .c_type = Elem::F32,
                   .invariant = invariant};
  };
  const LtPlanInfo wide = lt_plan_info(*ctx, shape(200, true));
  EXPECT_EQ(wide.workspace_bytes, 0u);
  for (int64_t M : {int64_t(1), int64_t(5), kInvariantN, int64_t(769), int64_t(4096)}) {
    const LtPlanInfo at = lt_plan_info(*ctx, shape(M, true));
    EXPECT_EQ(at.workspace_bytes, 0u) << "M=" << M;
    EXPECT_EQ(at.algo, wide.algo) << "M=" << M << ": another algorithm than at M=200";
  }
  EXPECT_EQ(lt_plan_info(*ctx, shape(200, false)).workspace_bytes, ctx->workspace_bytes());

  // The rows of a 200-row product equal each row's product alone, bit for bit.
  const int64_t M = 200;
  const auto w = to_bf16(randn(size_t(N * K), 31, 0.05f));
  const auto x = to_bf16(randn(size_t(M * K), 32));
  auto dw = up(w);
  auto dx = up(x);
  DeviceBuffer<float> all(size_t(M * N)), one{size_t(N)};
  linear(*ctx, dx.data(), Elem::BF16, M, K, dw.data(), N, nullptr, all.data(), Elem::F32, -1, -1,
         true);
  const auto batch = down(all);
  for (int64_t r : {int64_t(0), int64_t(77), M - 1}) {
    linear(*ctx, dx.data() + r * K, Elem::BF16, 1, K, dw.data(), N, nullptr, one.data(), Elem::F32,
           -1, -1, true);
    const auto alone = down(one);
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + r * N, size_t(N) * 4)) << "row " << r;
  }
}

// One attention case: nq queries, keys per query from key_count, KV in fp32 or bf16.
void attention_case(CudaOps& t, Context& ctx, int64_t nq, int nh, int nkv, int hd,
                    const std::vector<int64_t>& key_count, Elem kv, double tol,
                    const std::string& what) {
  const int64_t n_keys = *std::max_element(key_count.begin(), key_count.end());
  const auto q = randn(size_t(nq * nh * hd), 17, 1.0f);
  const auto k = randn(size_t(n_keys * nkv * hd), 18, 1.0f);
  const auto v = randn(size_t(n_keys * nkv * hd), 19, 1.0f);
  const float scale = 1.0f / std::sqrt(float(hd));
  // The reference reads k and v in fp32, as the CPU's cache holds them: with a bf16 cache on the
  // device their rounding is part of the error (tol = kBF16).
  const auto want =
      ref::attention(ref::of(q), nq, nh, nkv, hd, ref::of(k), ref::of(v), key_count, double(scale));
  DeviceBuffer<float> dq(ctx, q), dout(q.size());
  DeviceBuffer<int64_t> dkc(ctx, key_count);
  DeviceBuffer<float> dk(ctx, k), dv(ctx, v);
  DeviceBuffer<uint16_t> dkb(ctx, to_bf16(k)), dvb(ctx, to_bf16(v));
  const void* kp = kv == Elem::BF16 ? static_cast<const void*>(dkb.data()) : dk.data();
  const void* vp = kv == Elem::BF16 ? static_cast<const void*>(dvb.data()) : dv.data();
  attention(dq.data(), nq, nh, nkv, hd, kp, vp, kv, dkc.data(), scale, dout.data(), ctx.stream());
  ctx.sync();
  EXPECT_LT(nmse(dout.download(ctx), want), tol) << what;
  (void)t;
}

TEST_F(CudaOps, AttentionCausalOverKvCache) {
  // Decode (1 query) and verify (17 queries) at the end of a cache of `past` positions; GQA 8/2.
  for (int64_t past : {0, 16, 768}) {
    for (int64_t nq : {1, 17}) {
      std::vector<int64_t> kc(static_cast<size_t>(nq));
      for (int64_t i = 0; i < nq; ++i) kc[size_t(i)] = past + i + 1;
      const std::string what = "past " + std::to_string(past) + " nq " + std::to_string(nq);
      // fp32 KV: only the summation order differs. bf16 KV (the device cache) vs the CPU's fp32.
      attention_case(*this, *ctx, nq, 8, 2, 128, kc, Elem::F32, kF32, what + " f32");
      attention_case(*this, *ctx, nq, 8, 2, 128, kc, Elem::BF16, kBF16, what + " bf16");
    }
  }
}

TEST_F(CudaOps, AttentionGqaRatiosAndHeadSizes) {
  // GQA ratios 1, 2, 4, 8 and head sizes 32 to 128 (96: not a power of two), decode and verify at
  // the start of a cache and after 300 positions; fp32 KV, so only rounding differs.
  for (int hd : {32, 64, 96, 128})
    for (int ratio : {1, 2, 4, 8})
      for (int64_t nq : {1, 17})
        for (int64_t past : {0, 300}) {
          std::vector<int64_t> kc(static_cast<size_t>(nq));
          for (int64_t i = 0; i < nq; ++i) kc[size_t(i)] = past + i + 1;
          attention_case(*this, *ctx, nq, 2 * ratio, 2, hd, kc, Elem::F32, kF32,
                         "hd " + std::to_string(hd) + " heads " + std::to_string(2 * ratio) +
                             "/2 nq " + std::to_string(nq) + " past " + std::to_string(past));
        }
}

TEST_F(CudaOps, AttentionDrafterSelfAndCross) {
  // Bidirectional self-attention over a block of 16 slots, and cross-attention of the 16 slots to
  // contexts of 1, 17 and 769 positions (n_heads = n_kv_heads, as in
  // flashmap::FlashMapModel::forward).
  const int64_t K = 16;
  attention_case(*this, *ctx, K, 16, 16, 128, std::vector<int64_t>(size_t(K), K), Elem::F32, kF32,
                 "self f32");
  attention_case(*this, *ctx, K, 16, 16, 128, std::vector<int64_t>(size_t(K), K), Elem::BF16, kBF16,
                 "self bf16");
  for (int64_t ctx_len : kRows) {
    attention_case(*this, *ctx, K, 16, 16, 64, std::vector<int64_t>(size_t(K), ctx_len), Elem::F32,
                   kF32, "cross f32 " + std::to_string(ctx_len));
    attention_case(*this, *ctx, K, 16, 16, 128, std::vector<int64_t>(size_t(K), ctx_len),
                   Elem::BF16, kBF16, "cross bf16 " + std::to_string(ctx_len));
  }
}

// Queries without keys (a key count of 0) get zeros, as ops::attention gives them, never NaN;
// the rows beside them still match the CPU.
TEST_F(CudaOps, AttentionRowsWithoutKeysAreZeros) {
  const int nh = 4, nkv = 2, hd = 64;
  const std::vector<int64_t> kc = {0, 5, 0, 33, 1, 0};
  const int64_t nq = int64_t(kc.size()), n_keys = 33;
  const auto q = randn(size_t(nq * nh * hd), 41);
  const auto k = randn(size_t(n_keys * nkv * hd), 42);
  const auto v = randn(size_t(n_keys * nkv * hd), 43);
  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> want(q.size());
  ops::attention(q.data(), nq, nh, nkv, hd, k.data(), v.data(), kc.data(), scale, want.data(),
                 ThreadPool::global());
  auto dq = up(q);
  auto dkc = up(kc);
  auto dk = up(k), dv = up(v);
  auto dkb = up(to_bf16(k)), dvb = up(to_bf16(v));
  for (const Elem kv : {Elem::F32, Elem::BF16}) {
    const bool bf16 = kv == Elem::BF16;
    DeviceBuffer<float> out(q.size());
    attention(dq.data(), nq, nh, nkv, hd, bf16 ? static_cast<const void*>(dkb.data()) : dk.data(),
              bf16 ? static_cast<const void*>(dvb.data()) : dv.data(), kv, dkc.data(), scale,
              out.data(), s());
    const auto got = down(out);
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t e = 0; e < int64_t(nh) * hd; ++e) {
        const size_t at = size_t(i * nh * hd + e);
        ASSERT_TRUE(std::isfinite(got[at])) << "query " << i << " bf16 KV " << bf16;
        if (kc[size_t(i)] == 0) {
          ASSERT_EQ(want[at], 0.0f) << "the CPU's query " << i;
          ASSERT_EQ(got[at], 0.0f) << "query " << i << " has no keys, bf16 KV " << bf16;
        }
      }
    EXPECT_LT(nmse(got, want), bf16 ? kBF16 : kF32) << "bf16 KV " << bf16;
  }
}

TEST_F(CudaOps, VerifyGreedyMatchesCpu) {
  const int K = 16;
  const int64_t V = 32003;
  for (int agree = 0; agree <= K; ++agree) {
    auto logits = randn(size_t((K + 1) * V), 20 + uint64_t(agree));
    // A tie in the bonus row: the lowest index must win on both backends.
    logits[size_t(int64_t(agree) * V + 5)] = 50.0f;
    logits[size_t(int64_t(agree) * V + 9)] = 50.0f;
    std::vector<int32_t> draft(static_cast<size_t>(K));
    for (int i = 0; i < K; ++i) {
      const int32_t am = argmax(logits.data() + int64_t(i) * V, V);
      draft[size_t(i)] = i < agree ? am : (am + 1) % int32_t(V);
    }
    int32_t bonus = -1;
    const int accepted = ::flashmap::verify_greedy(draft, logits.data(), V, bonus);
    auto dl = up(logits);
    auto dd = up(draft);
    DeviceBuffer<int32_t> scratch(size_t(K + 1)), result(2);
    verify_greedy(dl.data(), V, dd.data(), K, scratch.data(), result.data(), s());
    const auto got = down(result);
    EXPECT_EQ(got[0], accepted) << "agree " << agree;
    EXPECT_EQ(got[1], bonus) << "agree " << agree;
  }
}

}  // namespace
}  // namespace flashmap::cuda

namespace flashmap::cuda {
namespace {

// Which CUDA errors fault the device (host only: runs without a GPU). A sticky error (the
// context cannot compute again) is a DeviceFault, which ends serving; anything else fails only
// the call's request (flashmap::Error).
TEST(CudaCheck, StickyErrorsAreDeviceFaults) {
  for (cudaError_t e :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorECCUncorrectable}) {
    EXPECT_TRUE(is_sticky(e)) << cudaGetErrorName(e);
    EXPECT_THROW(check(e, "a kernel"), DeviceFault) << cudaGetErrorName(e);
  }
  for (cudaError_t e : {cudaErrorMemoryAllocation, cudaErrorInvalidValue, cudaErrorNoDevice}) {
    EXPECT_FALSE(is_sticky(e)) << cudaGetErrorName(e);
    try {
      check(e, "cudaMalloc");
      ADD_FAILURE() << "no error thrown for " << cudaGetErrorName(e);
    } catch (const DeviceFault&) {
      ADD_FAILURE() << cudaGetErrorName(e) << " is not a device fault";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(cudaGetErrorName(e)), std::string::npos);
    }
  }
  EXPECT_NO_THROW(check(cudaSuccess, "nothing"));
}

}  // namespace
}  // namespace flashmap::cuda
