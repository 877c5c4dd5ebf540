// The one-step noise factor's kernels (src/ops/gram.h) against plain float64 arithmetic: the
// Gram accumulation EᵀE over odd shapes (rows and columns that are no multiple of any tile or
// panel), bf16, f16 and f32 rows, every instruction-set variant this CPU has and more than one
// thread; the blocked Cholesky against the textbook one (and L·Lᵀ = A), with a matrix that is
// not positive definite reported at its failing column.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "held_weight.h"
#include "ops/gemm.h"
#include "ops/gram.h"
#include "ops/ops.h"

namespace flashmap {
namespace {

using ops::Isa;

std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::Generic};
  if (ops::best_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (ops::best_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

struct IsaGuard {
  ~IsaGuard() { ops::set_isa(ops::best_isa()); }
};

// An embedding [V, H] in one storage dtype, holding its bytes.
using Emb = test::HeldWeight;

Emb make(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  Rng rng(seed);
  Emb e{dtype, rows, cols, std::vector<float>(size_t(rows * cols)), {}};
  // Embedding-like magnitudes and a non-zero mean per column, so that the entries of EᵀE differ
  // in size and cancellation would show.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      e.f32[size_t(r * cols + c)] = 0.02f * float(rng.normal()) + 0.001f * float(c % 7);
  if (dtype != DType::F32)
    for (float v : e.f32) e.half.push_back(dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v));
  return e;
}

// Σ_r E[r, i] E[r, j] and Σ_r |E[r, i] E[r, j]| in float64 over rows [r0, r0 + n).
void reference_gram(const Weight& E, int64_t r0, int64_t n, std::vector<double>& g,
                    std::vector<double>& mag) {
  const int64_t H = E.cols;
  g.assign(size_t(H * H), 0.0);
  mag.assign(size_t(H * H), 0.0);
  for (int64_t r = r0; r < r0 + n; ++r)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < H; ++j) {
        const double p = double(E.at(r, i)) * double(E.at(r, j));
        g[size_t(i * H + j)] += p;
        mag[size_t(i * H + j)] += std::fabs(p);
      }
}

TEST(Gram, MatchesFloat64OverOddShapesDtypesIsasAndThreads) {
  IsaGuard guard;
  struct Shape {
    int64_t V, H, r0, n;
  };
  // Column counts around the tiles (6/12/4 rows, 16/32/8 columns) and panels (32); row counts
  // around the k blocks (192–512 rows) and the 96-row thread blocks.
  const Shape shapes[] = {{1, 1, 0, 1},      {9, 5, 2, 7},        {70, 33, 3, 61},
                          {300, 97, 0, 300}, {700, 130, 90, 601}, {260, 191, 1, 259}};
  int compared = 0;
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const Shape& s : shapes) {
      const Emb e = make(s.V, s.H, dtype, uint64_t(s.H * 31 + s.n));
      const Weight E = e.view();
      std::vector<double> want, mag;
      reference_gram(E, s.r0, s.n, want, mag);
      for (const Isa isa : isas()) {
        ops::set_isa(isa);
        for (const int threads : {1, 3}) {
          // G starts from values of its own: the call adds to the upper triangle and leaves the
          // lower one as it was.
          std::vector<double> G(size_t(s.H * s.H));
          for (size_t i = 0; i < G.size(); ++i) G[i] = 0.25 * double(i % 13);
          ops::gram_accumulate(E, s.r0, s.n, G.data(), threads);
          for (int64_t i = 0; i < s.H; ++i)
            for (int64_t j = 0; j < s.H; ++j) {
              const size_t at = size_t(i * s.H + j);
              const double start = 0.25 * double(at % 13);
              if (j < i) {
                ASSERT_EQ(G[at], start) << "lower triangle written at " << i << "," << j;
                continue;
              }
              // fp32 sums over at most 512 rows: within 512 · 2⁻²⁴ of the sum of magnitudes.
              ASSERT_NEAR(G[at] - start, want[at], 3.1e-5 * mag[at] + 1e-300)
                  << dtype_name(dtype) << " " << ops::isa_name(isa) << " threads " << threads
                  << " V " << s.V << " H " << s.H << " rows [" << s.r0 << ", " << s.r0 + s.n
                  << ") at " << i << "," << j;
            }
          ++compared;
        }
      }
    }
  EXPECT_GE(compared, 36);
}

TEST(Gram, ChunksAddUp) {
  // The noise factor's use: chunk by chunk into one float64 matrix equals one call over all rows.
  const Emb e = make(1000, 45, DType::BF16, 5);
  const Weight E = e.view();
  std::vector<double> one(45 * 45, 0.0), chunks(45 * 45, 0.0), want, mag;
  ops::gram_accumulate(E, 0, 1000, one.data(), 2);
  for (int64_t r0 = 0; r0 < 1000; r0 += 333)
    ops::gram_accumulate(E, r0, std::min<int64_t>(333, 1000 - r0), chunks.data(), 2);
  reference_gram(E, 0, 1000, want, mag);
  for (int64_t i = 0; i < 45; ++i)
    for (int64_t j = i; j < 45; ++j) {
      const size_t at = size_t(i * 45 + j);
      EXPECT_NEAR(one[at], want[at], 3.1e-5 * mag[at]);
      EXPECT_NEAR(chunks[at], want[at], 3.1e-5 * mag[at]);
    }
}

TEST(Gram, RejectsRowsOutsideTheEmbedding) {
  const Emb e = make(10, 4, DType::F32, 1);
  std::vector<double> G(16, 0.0);
  EXPECT_THROW(ops::gram_accumulate(e.view(), 5, 6, G.data()), Error);
  EXPECT_THROW(ops::gram_accumulate(e.view(), -1, 2, G.data()), Error);
}

// A symmetric positive definite [n, n]: BᵀB / n + I for a random B [n + 3, n] (full matrix).
std::vector<double> spd(int64_t n, uint64_t seed) {
  Rng rng(seed);
  const int64_t m = n + 3;
  std::vector<double> B(size_t(m * n)), A(size_t(n * n), 0.0);
  for (auto& b : B) b = rng.normal();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        A[size_t(i * n + j)] += B[size_t(r * n + i)] * B[size_t(r * n + j)];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      A[size_t(i * n + j)] = A[size_t(i * n + j)] / double(n) + (i == j);
  return A;
}

// The textbook Cholesky–Banachiewicz recurrence in float64 (lower, row-major).
std::vector<double> reference_cholesky(const std::vector<double>& A, int64_t n) {
  std::vector<double> L(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double s = A[size_t(i * n + j)];
      for (int64_t k = 0; k < j; ++k) s -= L[size_t(i * n + k)] * L[size_t(j * n + k)];
      L[size_t(i * n + j)] = i == j ? std::sqrt(s) : s / L[size_t(j * n + j)];
    }
  return L;
}

TEST(Cholesky, MatchesTheTextbookFactorAndReproducesA) {
  IsaGuard guard;
  // Around the 128-column blocks, the 96-row thread blocks and the tiles.
  for (const int64_t n : {1, 2, 7, 33, 127, 128, 129, 250, 301}) {
    const auto A = spd(n, uint64_t(n));
    const auto want = reference_cholesky(A, n);
    for (const Isa isa : isas()) {
      ops::set_isa(isa);
      for (const int threads : {1, 2}) {
        std::vector<double> L = A;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = i + 1; j < n; ++j) L[size_t(i * n + j)] = -7.0;  // never read
        ASSERT_EQ(ops::cholesky_lower(L.data(), n, threads), -1) << n;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const double got = L[size_t(i * n + j)];
            if (j > i) {
              ASSERT_EQ(got, -7.0) << "upper triangle written at " << i << "," << j;
              continue;
            }
            // A is well conditioned (eigenvalues in [1, ~5]): both factors agree to rounding.
            ASSERT_NEAR(got, want[size_t(i * n + j)], 1e-12)
                << ops::isa_name(isa) << " threads " << threads << " n " << n << " at " << i << ","
                << j;
          }
        // L·Lᵀ = A.
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            double s = 0;
            for (int64_t k = 0; k <= j; ++k) s += L[size_t(i * n + k)] * L[size_t(j * n + k)];
            ASSERT_NEAR(s, A[size_t(i * n + j)], 1e-12 * double(n)) << n << " " << i << "," << j;
          }
      }
    }
  }
}

TEST(Cholesky, ReportsTheColumnWhereANotPositiveDefiniteMatrixFails) {
  IsaGuard guard;
  // A = U D Uᵀ with U unit lower triangular: its pivots are D, so with D[f] = −1 (the rest
  // positive) the factorization must stop at column f exactly.
  for (const auto& [n, f] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {50, 49}, {300, 171}, {300, 128}}) {
    Rng rng(uint64_t(n + f));
    std::vector<double> U(size_t(n * n), 0.0), d(static_cast<size_t>(n)), A(size_t(n * n), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      U[size_t(i * n + i)] = 1.0;
      for (int64_t j = 0; j < i; ++j) U[size_t(i * n + j)] = 0.1 * rng.normal();
      d[size_t(i)] = i == f ? -1.0 : 1.0 + rng.uniform();
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k <= std::min(i, j); ++k)
          A[size_t(i * n + j)] += U[size_t(i * n + k)] * d[size_t(k)] * U[size_t(j * n + k)];
    for (const Isa isa : isas()) {
      ops::set_isa(isa);
      std::vector<double> L = A;
      EXPECT_EQ(ops::cholesky_lower(L.data(), n, 2), f) << ops::isa_name(isa) << " n " << n;
    }
  }
  // A NaN pivot is not positive either.
  std::vector<double> nan{std::nan(""), 0.0, 0.0, 1.0};
  EXPECT_EQ(ops::cholesky_lower(nan.data(), 2), 0);
}

TEST(GramCholesky, FactorOfABf16EmbeddingReproducesItsGram) {
  // The noise factor's whole computation at a small odd shape: L Lᵀ = EᵀE.
  const int64_t V = 777, H = 77;
  const Emb e = make(V, H, DType::BF16, 9);
  const Weight E = e.view();
  std::vector<double> G(size_t(H * H), 0.0), want, mag;
  for (int64_t r0 = 0; r0 < V; r0 += 256)
    ops::gram_accumulate(E, r0, std::min<int64_t>(256, V - r0), G.data(), 2);
  reference_gram(E, 0, V, want, mag);
  for (int64_t i = 0; i < H; ++i)
    for (int64_t j = 0; j < i; ++j) G[size_t(i * H + j)] = G[size_t(j * H + i)];
  ASSERT_EQ(ops::cholesky_lower(G.data(), H, 2), -1);
  for (int64_t i = 0; i < H; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t k = 0; k <= j; ++k) s += G[size_t(i * H + k)] * G[size_t(j * H + k)];
      EXPECT_NEAR(s, want[size_t(i * H + j)], 3.1e-5 * mag[size_t(i * H + j)] + 1e-12)
          << i << "," << j;
    }
}

}  // namespace
}  // namespace flashmap
