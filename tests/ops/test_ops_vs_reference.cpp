// Every CPU op of src/ops/ops.h against the float64 reference (reference_ops.h), in the spirit of
// ggml's test-backend-ops, at odd shapes (1, 3, 7, 17, 33, 65, 127 rows and columns, the SIMD
// tiles' edges 4/5 and 15/16/17), f32, bf16 and f16 weights, head_dim 17/24/32/48/64/80/128, GQA
// ratios 1/2/4/8, and positions from 0 to 131071.
//
// Tolerances. An op returns fp32 values; each of its fp32 operations rounds with relative error at
// most u = 2⁻²⁴. A sum of n terms accumulated in fp32, in any order and however blocked, is within
// γ_n·Σ|terms| of the exact sum, γ_n = n·u/(1 − n·u) (Higham, Accuracy and Stability of Numerical
// Algorithms, §3.1): that is where every bound below comes from, each being the worst case of the
// op's roundings (not an estimate of their typical size, ~√n·u), so it holds on any CPU, vector
// width and summation order, and still sits far below what a wrong index, a missing term, a wrong
// formula or a wrong conversion gives (errors of the size of the terms themselves). The tests print
// the worst error seen as a fraction of its bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/ops.h"
#include "reference_ops.h"

namespace flashmap {
namespace {

namespace ref = reference;
using ref::Vec;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.0f, float mean = 0.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = mean + sd * rng.normal();
  return v;
}

// Fails (once per call, with the first offending element) unless |got[i] − want[i]| ≤ bound[i]
// for every i; NaN never passes. Returns the largest |got − want| / bound.
double expect_within(std::span<const float> got, const Vec& want, const Vec& bound,
                     const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= bound[i])) {
      if (bad++ == 0) first = int64_t(i);
      continue;
    }
    if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
  }
  if (bad > 0) {
    const size_t i = size_t(first);
    ADD_FAILURE() << what << ": " << bad << " of " << want.size() << " elements past the bound; "
                  << "first at " << i << ": got " << got[i] << ", want " << want[i] << " ± "
                  << bound[i];
  }
  return worst;
}

void info(const std::string& op, double worst, int64_t cases) {
  std::cout << "[ info ] " << op << ": worst error " << worst * 100 << "% of its bound over "
            << cases << " cases\n";
}

// A weight matrix in its storage dtype, with the values the reference reads decoded from the
// stored bits by the reference's own decoders.
struct TestWeight {
  DType dtype;
  int64_t rows, cols;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  Vec values;
  Weight view() const {
    return Weight{dtype, dtype == DType::F32 ? static_cast<const void*>(f32.data()) : half.data(),
                  rows, cols};
  }
};

TestWeight make_weight(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  TestWeight w{dtype, rows, cols, normal(size_t(rows * cols), seed, 0.5f), {}, {}};
  w.values = ref::of(w.f32);
  if (dtype == DType::F32) return w;
  w.half.resize(w.f32.size());
  for (size_t i = 0; i < w.f32.size(); ++i) {
    if (dtype == DType::BF16) {
      w.half[i] = f32_to_bf16(w.f32[i]);
      w.values[i] = ref::bf16_value(w.half[i]);
    } else {
      // Every 13th entry an f16 subnormal (normal once widened, so the products stay exact).
      w.half[i] = i % 13 == 5 ? uint16_t(((i * 977) & 0x83ff) | 1) : f32_to_f16(w.f32[i]);
      w.values[i] = ref::f16_value(w.half[i]);
    }
  }
  return w;
}

const char* name(DType d) {
  return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "f16";
}

// --- conversions ------------------------------------------------------------------------------

// All 65536 bf16 and f16 bit patterns, through Weight::at and Weight::row_f32.
TEST(OpsVsReference, WeightDecodesEveryBf16AndF16Pattern) {
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint16_t(i);
  for (const DType d : {DType::BF16, DType::F16}) {
    const Weight w{d, bits.data(), 256, 256};
    std::vector<float> row(256);
    for (int64_t r = 0; r < 256; ++r) {
      w.row_f32(r, row.data());
      for (int64_t c = 0; c < 256; ++c) {
        const uint16_t b = bits[size_t(r * 256 + c)];
        const double want = d == DType::BF16 ? ref::bf16_value(b) : ref::f16_value(b);
        for (const float got : {w.at(r, c), row[size_t(c)]}) {
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << name(d) << " bits " << b;
          } else {
            ASSERT_EQ(double(got), want) << name(d) << " bits " << b;
            ASSERT_EQ(std::signbit(got), std::signbit(want)) << name(d) << " bits " << b;
          }
        }
      }
    }
  }
}

// Every finite bf16 and f16 pattern through the kernels' own (vector) widening: one-hot rows of x
// pick single weights, and the products with 0 and 1 and the sums of zeros are exact. K = 19 takes
// the 16-lane loads and the tail; one row at a time is the direct path, 19 rows the path that
// widens each weight tile once.
TEST(OpsVsReference, LinearAndMatmulRowsWidenEveryFinitePattern) {
  ThreadPool pool(2);
  for (const DType d : {DType::BF16, DType::F16}) {
    const auto value = [&](uint16_t b) {
      return d == DType::BF16 ? ref::bf16_value(b) : ref::f16_value(b);
    };
    const int64_t K = 19, N = (65536 + K - 1) / K;
    std::vector<uint16_t> w(size_t(N * K));
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = uint16_t(i);
      w[i] = std::isfinite(value(b)) ? b : 0;
    }
    const Weight W{d, w.data(), N, K};
    std::vector<float> eye(size_t(K * K), 0.0f), y(size_t(K * N));
    for (int64_t k = 0; k < K; ++k) eye[size_t(k * K + k)] = 1.0f;
    for (int64_t k = 0; k < K; ++k) {
      ops::linear(&eye[size_t(k * K)], 1, W, nullptr, y.data(), pool);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(double(y[size_t(n)]), value(w[size_t(n * K + k)]))
            << name(d) << " one row, k " << k;
    }
    ops::linear(eye.data(), K, W, nullptr, y.data(), pool);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(double(y[size_t(k * N + n)]), value(w[size_t(n * K + k)]))
            << name(d) << " k " << k;
    // matmul_rows reads E [V, H] by rows: the same bits as a [19, 3450] table; 3450 = 16·215 + 10
    // columns also take the scalar tail.
    const Weight E{d, w.data(), K, N};
    ops::matmul_rows(eye.data(), K, E, y.data(), pool);
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_EQ(double(y[i]), value(w[i])) << name(d) << " matmul_rows entry " << i;
  }
}

// --- sums -------------------------------------------------------------------------------------

// dot: n products and n − 1 additions: |error| ≤ γ_n·Σ|a_i b_i| ≤ (n + 1)·u·Σ|a_i b_i|.
TEST(OpsVsReference, Dot) {
  double worst = 0;
  int64_t cases = 0;
  for (const int64_t n : {0, 1, 3, 7, 15, 16, 17, 33, 65, 127, 1000, 4099}) {
    const auto a = normal(size_t(n), uint64_t(n) + 1), b = normal(size_t(n), uint64_t(n) + 2, 3.0f);
    const float got = ops::dot(a.data(), b.data(), n);
    const Vec want{ref::dot(ref::of(a), ref::of(b))};
    const Vec bound{double(n + 1) * kU * ref::dot(ref::abs(ref::of(a)), ref::abs(ref::of(b)))};
    worst = std::max(worst, expect_within({&got, 1}, want, bound, "dot n " + std::to_string(n)));
    ++cases;
  }
  info("dot", worst, cases);
}

// linear: y[m, n] sums K products and the bias: |error| ≤ γ_{K+1}·(Σ_k |x_k w_k| + |b|) ≤
// (K + 2)·u·(Σ_k |x_k w_k| + |b|), the right side being the reference applied to |x|, |W|, |b|.
// The weights are exact in their dtype, so bf16 and f16 add no error of their own.
double linear_case(ThreadPool& pool, int64_t M, int64_t N, int64_t K, DType d, bool bias,
                   uint64_t seed) {
  const TestWeight W = make_weight(N, K, d, seed);
  const auto x = normal(size_t(M * K), seed + 1), b = normal(size_t(N), seed + 2);
  std::vector<float> y(size_t(M * N));
  ops::linear(x.data(), M, W.view(), bias ? b.data() : nullptr, y.data(), pool);
  const Vec xb = ref::of(x), bb = bias ? ref::of(b) : Vec{};
  const Vec want = ref::linear(xb, M, W.values, N, K, bb);
  Vec bound = ref::linear(ref::abs(xb), M, ref::abs(W.values), N, K, ref::abs(bb));
  for (auto& e : bound) e *= double(K + 2) * kU;
  return expect_within(y, want, bound,
                       "linear " + std::string(name(d)) + " M " + std::to_string(M) + " N " +
                           std::to_string(N) + " K " + std::to_string(K) + (bias ? " + bias" : ""));
}

TEST(OpsVsReference, Linear) {
  ThreadPool pool(3);
  double worst = 0;
  int64_t cases = 0;
  for (const DType d : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t K : {1, 3, 7, 16, 17, 33, 65, 127})
      for (const int64_t N : {1, 3, 7, 17, 33, 65, 127})
        for (const int64_t M : {1, 3, 4, 5, 7, 17, 33}) {
          worst = std::max(worst, linear_case(pool, M, N, K, d, (M + N + K) % 2 == 1,
                                              uint64_t(M * 100000 + N * 1000 + K)));
          ++cases;
        }
  // Shapes of real layers (K in the thousands, N split across threads in blocks of 16, weight
  // rows prefetched ahead).
  for (const DType d : {DType::F32, DType::BF16, DType::F16})
    for (const auto& [M, N, K] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 1003, 1024}, {9, 67, 2051}, {17, 257, 1536}}) {
      worst = std::max(worst, linear_case(pool, M, N, K, d, true, uint64_t(N + K)));
      ++cases;
    }
  info("linear", worst, cases);
}

// Row strides ldx > K and ldy > N: the gaps of x are NaN (never read), those of y must stay as
// they are.
TEST(OpsVsReference, LinearWithRowStrides) {
  ThreadPool pool(2);
  const int64_t M = 5, N = 19, K = 37, ldx = K + 3, ldy = N + 2;
  for (const DType d : {DType::F32, DType::BF16}) {
    const TestWeight W = make_weight(N, K, d, 11);
    const auto x = normal(size_t(M * K), 12);
    std::vector<float> xs(size_t(M * ldx), NAN), ys(size_t(M * ldy), 1234.5f), y(size_t(M * N));
    for (int64_t m = 0; m < M; ++m) std::copy_n(&x[size_t(m * K)], K, &xs[size_t(m * ldx)]);
    ops::linear(xs.data(), M, W.view(), nullptr, ys.data(), pool, ldx, ldy);
    for (int64_t m = 0; m < M; ++m) {
      std::copy_n(&ys[size_t(m * ldy)], N, &y[size_t(m * N)]);
      for (int64_t n = N; n < ldy; ++n) EXPECT_EQ(ys[size_t(m * ldy + n)], 1234.5f) << m;
    }
    Vec bound = ref::linear(ref::abs(ref::of(x)), M, ref::abs(W.values), N, K);
    for (auto& e : bound) e *= double(K + 2) * kU;
    expect_within(y, ref::linear(ref::of(x), M, W.values, N, K), bound,
                  std::string("strided linear ") + name(d));
  }
}

// matmul_rows: y[m, h] sums V products: |error| ≤ (V + 1)·u·Σ_v |x_v E_vh|.
TEST(OpsVsReference, MatmulRows) {
  ThreadPool pool(3);
  double worst = 0;
  int64_t cases = 0;
  for (const DType d : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t V : {1, 3, 17, 65, 127, 1031})
      // H past one strip of 256 columns and M past one block of 16 rows, with tails of both.
      for (const int64_t H : {1, 15, 16, 17, 33, 65, 127, 129, 300, 529})
        for (const int64_t M : {1, 3, 7, 8, 9, 17, 33}) {
          const uint64_t seed = uint64_t(M * 100000 + H * 1000 + V);
          const TestWeight E = make_weight(V, H, d, seed);
          const auto x = normal(size_t(M * V), seed + 1);
          std::vector<float> y(size_t(M * H));
          ops::matmul_rows(x.data(), M, E.view(), y.data(), pool);
          Vec bound = ref::matmul_rows(ref::abs(ref::of(x)), M, ref::abs(E.values), V, H);
          for (auto& e : bound) e *= double(V + 1) * kU;
          worst = std::max(
              worst,
              expect_within(y, ref::matmul_rows(ref::of(x), M, E.values, V, H), bound,
                            "matmul_rows " + std::string(name(d)) + " M " + std::to_string(M) +
                                " V " + std::to_string(V) + " H " + std::to_string(H)));
          ++cases;
        }
  info("matmul_rows", worst, cases);
}

// --- norms ------------------------------------------------------------------------------------

const std::vector<int64_t> kDims = {1, 3, 7, 16, 17, 33, 65, 127, 128, 2049};

// rms_norm: mean(x²) is a sum of dim positive terms (relative error ≤ γ_dim) and one division;
// + eps, sqrt (which halves the relative error and adds u), 1/·, and the two products with x and
// w add u each: relative error ≤ (dim/2 + 5)·u; the bound is (dim/2 + 6)·u·|y|. Both orders of
// the products (Qwen3RMSNorm, FlashMapRMSNorm) against the one reference; a zero row included.
TEST(OpsVsReference, RmsNormBothOrders) {
  double worst = 0;
  int64_t cases = 0;
  for (const int64_t dim : kDims)
    for (const int64_t rows : {1, 3, 7}) {
      auto x = normal(size_t(rows * dim), uint64_t(dim * 10 + rows), 3.0f);
      std::fill_n(x.begin(), dim, 0.0f);
      const auto w = normal(size_t(dim), uint64_t(dim), 0.5f, 1.0f);
      const float eps = 1e-6f;
      const Vec want = ref::rms_norm(ref::of(x), ref::of(w), double(eps), rows, dim);
      Vec bound = ref::abs(want);
      for (auto& e : bound) e *= (double(dim) / 2 + 6) * kU;
      std::vector<float> y(x.size());
      const std::string what = std::to_string(rows) + "x" + std::to_string(dim);
      ops::rms_norm(x.data(), w.data(), eps, rows, dim, y.data());
      worst = std::max(worst, expect_within(y, want, bound, "rms_norm " + what));
      ops::rms_norm_scale_first(x.data(), w.data(), eps, rows, dim, y.data());
      worst = std::max(worst, expect_within(y, want, bound, "rms_norm_scale_first " + what));
      cases += 2;
    }
  info("rms_norm", worst, cases);
}

// layer_norm: mean and variance are summed in double (their error is negligible); the fp32 part
// rounds mean to mu (u·|mean|), x − mu (u·|x − mean|), 1/sqrt(var + eps) to inv (u) and the
// product (u): |error| ≤ u·(|mean|·inv + 3|y|); the bound is 4u·(|y| + |mean|·inv). The inputs
// have a mean of 0.7 against a deviation of 2 (the cancellation the mean's rounding matters for),
// and one row is constant.
TEST(OpsVsReference, LayerNorm) {
  double worst = 0;
  int64_t cases = 0;
  for (const int64_t dim : kDims)
    for (const int64_t rows : {1, 3, 7}) {
      auto x = normal(size_t(rows * dim), uint64_t(dim * 10 + rows), 2.0f, 0.7f);
      std::fill_n(x.begin(), dim, 0.1f);
      const float eps = 1e-6f;
      const Vec xd = ref::of(x);
      const Vec want = ref::layer_norm(xd, double(eps), rows, dim);
      Vec bound(want.size());
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < dim; ++i) mean += xd[size_t(r * dim + i)] / double(dim);
        for (int64_t i = 0; i < dim; ++i)
          var += (xd[size_t(r * dim + i)] - mean) * (xd[size_t(r * dim + i)] - mean) / double(dim);
        const double inv = 1 / std::sqrt(var + double(eps));
        for (int64_t i = 0; i < dim; ++i)
          bound[size_t(r * dim + i)] =
              4 * kU * (std::fabs(want[size_t(r * dim + i)]) + std::fabs(mean) * inv);
      }
      std::vector<float> y(x.size());
      ops::layer_norm(x.data(), eps, rows, dim, y.data());
      worst = std::max(
          worst, expect_within(y, want, bound,
                               "layer_norm " + std::to_string(rows) + "x" + std::to_string(dim)));
      ++cases;
    }
  info("layer_norm", worst, cases);
}

// --- RoPE -------------------------------------------------------------------------------------

// Both conventions at positions from 0 to 131071 (the angle is the model's fp32 one, see
// ref::rope_angle). With cos and sin within 1 ulp (2u relative; glibc's cosf/sinf) and one
// rounding for each product and for the sum, a rotated pair (a, b) is within 4u·(|a| + |b|) ≤
// 8u·max|x| of the reference; the bound is twice that per head, 16u·max_c |x_c|.
TEST(OpsVsReference, RopeBothConventions) {
  double worst = 0;
  int64_t cases = 0;
  const std::vector<int64_t> kPositions = {0,    1,    2,     3,     7,     17,    127,
                                           4095, 4096, 32767, 40959, 65535, 131071};
  for (const int hd : {2, 6, 32, 64, 96, 128})
    for (const int heads : {1, 3})
      for (const int64_t rows : {1, 3, 7, 17})
        for (const double theta : {10000.0, 1000000.0})
          for (const bool interleaved : {false, true}) {
            const uint64_t seed = uint64_t(hd * 1000 + heads * 100 + rows);
            const auto x = normal(size_t(rows * heads * hd), seed);
            std::vector<int64_t> pos(static_cast<size_t>(rows));
            Rng rng(seed);
            for (int64_t r = 0; r < rows; ++r)
              pos[size_t(r)] = r % 2 ? kPositions[size_t(r / 2) % kPositions.size()]
                                     : int64_t(rng.next() % 131072);
            if (rows == 17) std::copy(kPositions.begin(), kPositions.end(), pos.begin());
            const Vec want = ref::rope(ref::of(x), rows, heads, hd, pos, theta, interleaved);
            Vec bound(want.size());
            for (size_t h = 0; h < size_t(rows * heads); ++h) {
              double mx = 0;
              for (size_t c = 0; c < size_t(hd); ++c)
                mx = std::max(mx, std::fabs(double(x[h * hd + c])));
              for (size_t c = 0; c < size_t(hd); ++c) bound[h * hd + c] = 16 * kU * mx;
            }
            std::vector<float> y = x;
            if (interleaved)
              ops::rope_interleaved(y.data(), rows, heads, hd, pos.data(), theta);
            else
              ops::rope_half(y.data(), rows, heads, hd, pos.data(), theta);
            worst = std::max(
                worst, expect_within(y, want, bound,
                                     std::string(interleaved ? "rope_interleaved" : "rope_half") +
                                         " hd " + std::to_string(hd) + " heads " +
                                         std::to_string(heads) + " rows " + std::to_string(rows) +
                                         " theta " + std::to_string(theta)));
            ++cases;
          }
  info("rope", worst, cases);
}

// --- attention --------------------------------------------------------------------------------

// One attention case against the reference. Per (query, head), with A = max_j Σ_c |q_c k_jc| over
// its n keys and Vc = max_j |v_jc|:
//   each score is an fp32 dot of hd terms times scale: |Δs| ≤ (hd + 2)·u·scale·A;
//   each exp(s_j − s_max) then moves by a factor 1 ± ε, ε = 2|Δs| + u·|s_j − s_max| + 4u (both
//   scores' errors, the difference's rounding ≤ u·2·scale·A, expf's ulp), and that moves
//   o = Σ p_j v_j / Σ p_j by at most 2ε·Vc;
//   the two sums of n terms and the final product round at most 2n + 1 times: (2n + 1)·u·Vc.
// Bound: (2ε + (2n + 6)·u)·Vc with ε = (2hd + 6)·u·scale·A + 4u.
double attention_case(ThreadPool& pool, int64_t nq, int heads, int kv_heads, int hd,
                      const std::vector<int64_t>& key_count, uint64_t seed,
                      const std::string& what) {
  const int64_t n_keys = *std::max_element(key_count.begin(), key_count.end());
  const auto q = normal(size_t(nq * heads * hd), seed),
             k = normal(size_t(n_keys * kv_heads * hd), seed + 1),
             v = normal(size_t(n_keys * kv_heads * hd), seed + 2);
  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> out(q.size());
  ops::attention(q.data(), nq, heads, kv_heads, hd, k.data(), v.data(), key_count.data(), scale,
                 out.data(), pool);
  const Vec want = ref::attention(ref::of(q), nq, heads, kv_heads, hd, ref::of(k), ref::of(v),
                                  key_count, double(scale));
  Vec bound(want.size());
  const int group = heads / kv_heads;
  for (int64_t i = 0; i < nq; ++i)
    for (int h = 0; h < heads; ++h) {
      const int64_t n = key_count[size_t(i)];
      const int kv = h / group;
      double A = 0;
      std::vector<double> vmax(size_t(hd), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int c = 0; c < hd; ++c) {
          const size_t kvi = size_t((j * kv_heads + kv) * hd + c);
          a += std::fabs(double(q[size_t((i * heads + h) * hd + c)]) * k[kvi]);
          vmax[size_t(c)] = std::max(vmax[size_t(c)], std::fabs(double(v[kvi])));
        }
        A = std::max(A, a);
      }
      const double eps = double(2 * hd + 6) * kU * scale * A + 4 * kU;
      for (int c = 0; c < hd; ++c)
        bound[size_t((i * heads + h) * hd + c)] =
            (2 * eps + double(2 * n + 6) * kU) * vmax[size_t(c)];
    }
  return expect_within(out, want, bound, what);
}

// Decode (1 query) and verify passes (3 and 17 queries) at the end of caches of 0, 5 and 300
// positions, causal; GQA ratios 1, 2, 4, 8; the register-resident head sizes (32, 64, 128) and the
// generic path (17, 24, 48, 80). Then the drafter's forms: every query over the same keys (its
// bidirectional self-attention over the block and its cross-attention to the context).
TEST(OpsVsReference, Attention) {
  ThreadPool pool(3);
  double worst = 0;
  int64_t cases = 0;
  for (const int hd : {17, 24, 32, 48, 64, 80, 128})
    for (const int ratio : {1, 2, 4, 8})
      for (const int64_t nq : {1, 3, 17})
        for (const int64_t past : {0, 5, 300}) {
          const int kv_heads = 2, heads = kv_heads * ratio;
          std::vector<int64_t> counts(static_cast<size_t>(nq));
          for (int64_t i = 0; i < nq; ++i) counts[size_t(i)] = past + i + 1;
          worst = std::max(
              worst,
              attention_case(pool, nq, heads, kv_heads, hd, counts,
                             uint64_t(hd * 1000 + ratio * 100 + nq + past),
                             "causal hd " + std::to_string(hd) + " heads " + std::to_string(heads) +
                                 "/" + std::to_string(kv_heads) + " nq " + std::to_string(nq) +
                                 " past " + std::to_string(past)));
          ++cases;
        }
  for (const int hd : {32, 64, 80, 128})
    for (const int64_t n : {1, 16, 17, 769}) {
      worst = std::max(
          worst, attention_case(pool, 16, 4, 4, hd, std::vector<int64_t>(16, n), uint64_t(hd + n),
                                "same keys hd " + std::to_string(hd) + " n " + std::to_string(n)));
      ++cases;
    }
  info("attention", worst, cases);
}

// --- softmax and activations ------------------------------------------------------------------

// softmax_rows: with R = max_j |x_j − max|, each exp(x_j − max) is within a factor 1 ± (u·R + 2u)
// (the difference's rounding, expf's ulp), the sum of dim terms adds (dim − 1)·u, 1/sum and the
// product u each: |error_i| ≤ y_i·u·(|x_i − max| + R + dim + 5); the bound adds u·y_i and 1e-38
// for entries whose exp underflows (the reference's y_i is then below 1e-38 itself). Rows of
// scale 4 and 100 (without the max shift, exp would overflow), and constant rows.
TEST(OpsVsReference, Softmax) {
  double worst = 0;
  int64_t cases = 0;
  for (const int64_t dim : {1, 2, 3, 17, 127, 1000, 32003})
    for (const float sd : {4.0f, 100.0f})
      for (const int64_t rows : {1, 3}) {
        auto x = normal(size_t(rows * dim), uint64_t(dim) + uint64_t(sd), sd);
        if (rows == 3) std::fill_n(x.begin() + dim, dim, 2.5f);
        const Vec xd = ref::of(x);
        const Vec want = ref::softmax_rows(xd, rows, dim);
        Vec bound(want.size());
        for (int64_t r = 0; r < rows; ++r) {
          const double mx = *std::max_element(xd.begin() + r * dim, xd.begin() + (r + 1) * dim);
          const double R = mx - *std::min_element(xd.begin() + r * dim, xd.begin() + (r + 1) * dim);
          for (int64_t i = 0; i < dim; ++i) {
            const size_t e = size_t(r * dim + i);
            bound[e] = want[e] * kU * (mx - xd[e] + R + double(dim) + 6) + 1e-38;
          }
        }
        ops::softmax_rows(x.data(), rows, dim);
        worst =
            std::max(worst, expect_within(x, want, bound,
                                          "softmax " + std::to_string(rows) + "x" +
                                              std::to_string(dim) + " sd " + std::to_string(sd)));
        ++cases;
      }
  info("softmax_rows", worst, cases);
}

// silu = x / (1 + e^−x): the polynomial e^x's 1.3 units in the last place (≤ 1.3u relative
// after the + 1), the sum and the division: |error| ≤ 4u·|y|; plus 1e-36 below x ≈ −88.7, where
// e^−x overflows and silu returns −0 for |x|·eˣ < 3e-37.
// gelu = x/2 · (1 + erf(x·(1/√2))): the argument's two roundings move erf by at most
// 2u·|t|·erf'(t) ≤ u, the polynomial erf is within 1.5e-7 = 2.5u of erf, the sum u·|1 + erf| ≤
// 2u, so 1 + erf is within 5.5u absolute (not relative: for x ≪ 0 it cancels, as in F.gelu's
// fp32 form) and y within 0.5·|x|·5.5u + u·|y|; the bound is 4u·(|x| + |y|).
TEST(OpsVsReference, SiluAndGelu) {
  std::vector<float> xs = {0.0f,  -0.0f,  1e-30f, -1e-30f, 1e-3f,  -1e-3f,  0.5f, -0.5f,
                           88.5f, -88.5f, 89.0f,  -89.0f,  100.0f, -100.0f, 1e4f, -1e4f};
  for (float x = -30.0f; x <= 30.0f; x += 0.0625f) xs.push_back(x);
  for (const float x : normal(4096, 5, 3.0f)) xs.push_back(x);
  Vec silu_want(xs.size()), gelu_want(xs.size()), silu_bound(xs.size()), gelu_bound(xs.size());
  std::vector<float> silu_got(xs.size()), gelu_got(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    silu_want[i] = ref::silu(x);
    gelu_want[i] = ref::gelu(x);
    silu_bound[i] = 4 * kU * std::fabs(silu_want[i]) + 1e-36;
    gelu_bound[i] = 4 * kU * (std::fabs(x) + std::fabs(gelu_want[i]));
    silu_got[i] = ops::silu(xs[i]);
    gelu_got[i] = ops::gelu(xs[i]);
  }
  info("silu", expect_within(silu_got, silu_want, silu_bound, "silu"), int64_t(xs.size()));
  info("gelu", expect_within(gelu_got, gelu_want, gelu_bound, "gelu"), int64_t(xs.size()));
}

// The array form over a dense sweep (2^20 + 3 values: a tail of 3 past the 16-lane groups),
// every edge of erf's polynomial pieces (x = √2·k) with its float neighbours (around 0 the
// smallest subnormals, where y is x/2 rounded to a multiple of 2^-149: the bound adds it), and
// the non-finite values; the scalar form gives the same bits as the array, in place too.
TEST(OpsVsReference, GeluArrays) {
  std::vector<float> xs;
  const int64_t n = (1 << 20) + 3;
  for (int64_t i = 0; i < n - 48; ++i) xs.push_back(-8.0f + 16.0f * float(i) / float(n));
  for (int k = -4; k <= 4; ++k) {
    const float edge = float(std::sqrt(2.0) * k);
    float x = edge;
    for (int j = 0; j < 2; ++j) x = std::nextafter(x, -100.0f);
    for (int j = 0; j < 5; ++j, x = std::nextafter(x, 100.0f)) xs.push_back(x);
  }
  while (int64_t(xs.size()) < n) xs.push_back(float(xs.size() % 7) - 3.5f);
  std::vector<float> got(xs.size());
  ops::gelu(xs.data(), int64_t(xs.size()), got.data());
  Vec want(xs.size()), bound(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    want[i] = ref::gelu(xs[i]);
    bound[i] = 4 * kU * (std::fabs(double(xs[i])) + std::fabs(want[i])) + 0x1p-149;
  }
  info("gelu arrays", expect_within(got, want, bound, "gelu"), int64_t(xs.size()));
  std::vector<float> in_place = xs;
  ops::gelu(in_place.data(), int64_t(in_place.size()), in_place.data());
  for (size_t i = 0; i < xs.size(); i += 997) {
    EXPECT_EQ(std::bit_cast<uint32_t>(ops::gelu(xs[i])), std::bit_cast<uint32_t>(got[i])) << xs[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(in_place[i]), std::bit_cast<uint32_t>(got[i])) << xs[i];
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(ops::gelu(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(ops::gelu(inf), inf);
  EXPECT_TRUE(std::isnan(ops::gelu(-inf)));  // −inf · (1 + erf(−inf)) = −inf · 0, as in F.gelu
  EXPECT_EQ(ops::gelu(100.0f), 100.0f);
  EXPECT_EQ(ops::gelu(-100.0f), 0.0f);
}

// silu and swiglu over a dense sweep of [−100, 100] (2^20 + 5 values, a tail of 5), the edges of
// e^x's clamp (±86, 88.72) with their neighbours and the non-finite values; scalar, array, in
// place and swiglu's product agree bit for bit.
TEST(OpsVsReference, SiluArrays) {
  std::vector<float> xs;
  const int64_t n = (1 << 20) + 5;
  for (int64_t i = 0; i < n - 40; ++i) xs.push_back(-100.0f + 200.0f * float(i) / float(n));
  for (const float edge : {-88.72f, 88.72f, -86.0f, 86.0f, 0.0f}) {
    float x = edge;
    for (int j = 0; j < 3; ++j) x = std::nextafter(x, -1000.0f);
    for (int j = 0; j < 7; ++j, x = std::nextafter(x, 1000.0f)) xs.push_back(x);
  }
  while (int64_t(xs.size()) < n) xs.push_back(float(xs.size() % 5) - 2.0f);
  std::vector<float> got(xs.size()), up(xs.size()), product(xs.size());
  ops::silu(xs.data(), int64_t(xs.size()), got.data());
  for (size_t i = 0; i < xs.size(); ++i) up[i] = 1.0f + float(i % 3);
  ops::swiglu(xs.data(), up.data(), int64_t(xs.size()), product.data());
  Vec want(xs.size()), bound(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    want[i] = ref::silu(xs[i]);
    bound[i] = 4 * kU * std::fabs(want[i]) + 1e-36;
  }
  info("silu arrays", expect_within(got, want, bound, "silu"), int64_t(xs.size()));
  for (size_t i = 0; i < xs.size(); i += 331) {
    EXPECT_EQ(std::bit_cast<uint32_t>(ops::silu(xs[i])), std::bit_cast<uint32_t>(got[i])) << xs[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(product[i]), std::bit_cast<uint32_t>(got[i] * up[i]))
        << xs[i];
  }
  std::vector<float> in_place = xs;
  ops::swiglu(in_place.data(), up.data(), int64_t(in_place.size()), in_place.data());
  EXPECT_EQ(in_place, product);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(ops::silu(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(ops::silu(inf), inf);
  EXPECT_TRUE(std::isnan(ops::silu(-inf)));  // −inf / (1 + inf), as F.silu's −inf · σ(−inf)
  EXPECT_EQ(ops::silu(200.0f), 200.0f);
}

// The drafter's noise: each value against float64 Box-Muller on the same draws of the same
// generator, a call's values a prefix of a longer call's, and 2^20 of them against the standard
// normal's moments and CDF (Kolmogorov-Smirnov).
TEST(OpsVsReference, Normals) {
  const int64_t n = (1 << 20) + 13;
  Rng rng(2024), twin(2024);
  std::vector<float> got(static_cast<size_t>(n));
  ops::normals(rng, n, got.data());
  Vec want(static_cast<size_t>(n)), bound(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 32) {
    for (int l = 0; l < 16; ++l) {
      const uint64_t w = twin.next();
      const double u1 = (double(w >> 41) + 0.5) * 0x1p-23,
                   u2 = double((w >> 16) & 0xffffff) * 0x1p-24;
      const double r = std::sqrt(-2.0 * std::log(u1));
      for (int h = 0; h < 2; ++h) {
        const int64_t j = i + h * 16 + l;
        if (j >= n) continue;
        want[size_t(j)] = r * (h == 0 ? std::cos(2 * M_PI * u2) : std::sin(2 * M_PI * u2));
        bound[size_t(j)] = 1e-6;
      }
    }
  }
  info("normals", expect_within(got, want, bound, "normals"), n);
  EXPECT_EQ(rng.next(), twin.next());  // a tail draws a whole group, no more

  std::vector<float> prefix(45);
  Rng again(2024);
  ops::normals(again, 45, prefix.data());
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), got.begin()));

  double mean = 0, var = 0;
  for (float z : got) mean += z;
  mean /= double(n);
  for (float z : got) var += (z - mean) * (z - mean);
  var /= double(n - 1);
  EXPECT_LT(std::fabs(mean), 5 / std::sqrt(double(n)));         // 5 standard errors
  EXPECT_LT(std::fabs(var - 1), 5 * std::sqrt(2 / double(n)));  // the same for the variance
  std::vector<float> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  double ks = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double cdf = 0.5 * std::erfc(-double(sorted[size_t(i)]) * M_SQRT1_2);
    ks = std::max(
        {ks, std::fabs(cdf - double(i) / double(n)), std::fabs(cdf - double(i + 1) / double(n))});
  }
  EXPECT_LT(ks * std::sqrt(double(n)), 1.95);  // Kolmogorov's 0.1% critical value
  EXPECT_LE(*std::max_element(got.begin(), got.end()), 5.8f);
  EXPECT_GE(*std::min_element(got.begin(), got.end()), -5.8f);
}

}  // namespace
}  // namespace flashmap
