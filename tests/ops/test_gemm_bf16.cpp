// The bf16 compute mode's GEMM (--compute bf16, ops::WeightFormat::Bf16): each output is the
// float64 dot product of the bf16-rounded activations and weights up to fp32 accumulation (checked
// with a bound far below what skipping the activations' rounding would give), rows do not depend
// on their batch (bit for bit, across threads and k slices: what lossless speculation in this
// mode rests on), bf16 files keep their bits and f32/f16 files are rounded to nearest even, and
// the mode is refused, naming the option, where the CPU has no AVX512-BF16.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "held_weight.h"
#include "ops/gemm.h"
#include "ops/ops.h"

namespace flashmap {
namespace {

using ops::Isa;
using ops::WeightFormat;
using test::HeldWeight;
using ::testing::HasSubstr;

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = sd * float(rng.normal());
  return v;
}

double round_bf16(float v) {
  return double(bf16_to_f32(f32_to_bf16(v)));
}

#define REQUIRE_BF16_COMPUTE()                                                               \
  if (!ops::has_bf16_compute())                                                              \
  GTEST_SKIP() << "no AVX512-BF16 kernel here (active: " << ops::isa_name(ops::active_isa()) \
               << ", by the CPU or FLASHMAP_ISA): the bf16 compute mode cannot run"

struct IsaGuard {
  ~IsaGuard() { ops::set_isa(ops::best_isa()); }
};

// The mode's kernels this CPU runs (vdpbf16ps chains; AMX tiles), made active in turn by the
// tests below; the best one active again after them.
std::vector<Isa> bf16_kernels() {
  std::vector<Isa> v;
  for (const Isa isa : {Isa::Avx512Bf16, Isa::Amx})
    if (ops::isa_supported(isa)) v.push_back(isa);
  return v;
}

// Odd shapes across the kernel's edges: rows 1–2 (4-panel tiles), 3–5 (2-panel tiles), 6–12 (one
// row block), 13, 17, 25, 33 (several blocks, k slices past 512 pairs); columns inside a vector,
// across vectors and panels; K odd (a half-filled last pair), around the slice.
TEST(Bf16Compute, EachOutputIsTheDotOfBf16RoundedOperandsInFp32) {
  REQUIRE_BF16_COMPUTE();
  IsaGuard guard;
  ThreadPool pool(2);
  int64_t checked = 0;
  double worst = 0;
  for (const Isa isa : bf16_kernels())
    for (const int64_t K : {1, 2, 3, 31, 32, 33, 257, 1025, 2101})
      for (const int64_t N : {1, 15, 16, 17, 33, 129}) {
        ops::set_isa(isa);
        const HeldWeight m{
            DType::F32, N, K, normal(size_t(N * K), uint64_t(N * 7919 + K), 0.5f), {}};
        Weight W = m.view();
        W.packed = ops::pack(W, WeightFormat::Bf16, "test", pool);
        const auto bias = normal(size_t(N), 3);
        for (const int64_t M : {1, 2, 3, 5, 6, 12, 13, 17, 25, 33}) {
          const auto x = normal(size_t(M * K), uint64_t(M * 31 + K));
          const bool with_bias = (M + N) % 2 == 1;
          std::vector<float> y(size_t(M * N));
          ops::linear(x.data(), M, W, with_bias ? bias.data() : nullptr, y.data(), pool);
          for (int64_t r = 0; r < M; ++r)
            for (int64_t n = 0; n < N; ++n) {
              double want = with_bias ? bias[size_t(n)] : 0.0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double t =
                    round_bf16(x[size_t(r * K + k)]) * round_bf16(m.f32[size_t(n * K + k)]);
                want += t;
                mag += std::fabs(t);
              }
              // K fp32 roundings of partial sums at most (two per dot-product instruction), each
              // within 2^-24 of the running sum's magnitude, plus the bias add.
              const double bound = (double(K) + 2) * std::ldexp(1.0, -24) * (mag + std::fabs(want));
              const double err = std::fabs(double(y[size_t(r * N + n)]) - want);
              ASSERT_LE(err, bound)
                  << ops::isa_name(isa) << " M " << M << " N " << N << " K " << K << " row " << r
                  << " col " << n << ": " << y[size_t(r * N + n)] << " vs " << want;
              worst = std::max(worst, bound > 0 ? err / bound : 0.0);
              ++checked;
            }
        }
      }
  std::cout << "[ info ] " << checked << " outputs within the fp32-accumulation bound (worst "
            << worst << " of it)\n";
}

// The activations are rounded: an exact product of unrounded x would sit outside the bound above
// for most outputs of a long dot product, so a kernel that skipped the rounding is caught here.
TEST(Bf16Compute, ActivationsAreRoundedToBf16) {
  REQUIRE_BF16_COMPUTE();
  IsaGuard guard;
  ThreadPool pool(1);
  for (const Isa isa : bf16_kernels()) {
    ops::set_isa(isa);
    const int64_t K = 512, N = 64, M = 4;
    const HeldWeight m{DType::F32, N, K, normal(size_t(N * K), 1, 0.5f), {}};
    Weight W = m.view();
    W.packed = ops::pack(W, WeightFormat::Bf16, "test", pool);
    const auto x = normal(size_t(M * K), 2);
    std::vector<float> y(size_t(M * N));
    ops::linear(x.data(), M, W, nullptr, y.data(), pool);
    int closer_to_rounded = 0;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double rounded = 0, unrounded = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double w = round_bf16(m.f32[size_t(n * K + k)]);
          rounded += round_bf16(x[size_t(r * K + k)]) * w;
          unrounded += double(x[size_t(r * K + k)]) * w;
        }
        const double got = y[size_t(r * N + n)];
        closer_to_rounded += std::fabs(got - rounded) < std::fabs(got - unrounded);
      }
    EXPECT_GE(closer_to_rounded, int(M * N * 9 / 10)) << ops::isa_name(isa);
  }
}

// Rows computed together equal each row alone, bit for bit, for 1 and 2 threads, with K past
// one k slice (several row blocks then run the panel in slices, one row in one pass).
TEST(Bf16Compute, RowsDoNotDependOnTheirBatch) {
  REQUIRE_BF16_COMPUTE();
  IsaGuard guard;
  for (const Isa isa : bf16_kernels())
    for (const int threads : {1, 2}) {
      ops::set_isa(isa);
      ThreadPool pool(threads);
      for (const int64_t K : {int64_t(319), int64_t(2113)}) {
        const int64_t N = 301;
        const HeldWeight m{DType::F32, N, K, normal(size_t(N * K), 9, 0.5f), {}};
        Weight W = m.view();
        W.packed = ops::pack(W, WeightFormat::Bf16, "test", pool);
        const auto bias = normal(size_t(N), 4);
        for (const int64_t M : {3, 6, 16, 17, 40, 70}) {
          const auto x = normal(size_t(M * K), 11);
          std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
          ops::linear(x.data(), M, W, bias.data(), all.data(), pool);
          for (int64_t r = 0; r < M; ++r) {
            ops::linear(x.data() + r * K, 1, W, bias.data(), one.data(), pool);
            ASSERT_EQ(std::memcmp(one.data(), all.data() + r * N, size_t(N) * 4), 0)
                << ops::isa_name(isa) << " threads " << threads << " K " << K << " M " << M
                << " row " << r;
          }
        }
      }
    }
}

// A bf16 file keeps its bits; an f32 or f16 file holding the same values (bf16-representable)
// gives the same products; an f32 value between two bf16 is rounded to nearest even.
TEST(Bf16Compute, Bf16F32AndF16FilesOfTheSameValuesAgree) {
  REQUIRE_BF16_COMPUTE();
  IsaGuard guard;
  ThreadPool pool(2);
  for (const Isa isa : bf16_kernels()) {
    SCOPED_TRACE(ops::isa_name(isa));
    ops::set_isa(isa);
    const int64_t N = 40, K = 77, M = 5;
    const auto raw = normal(size_t(N * K), 21, 0.5f);
    HeldWeight b16{DType::BF16, N, K, {}, {}}, f32{DType::F32, N, K, {}, {}},
        f16{DType::F16, N, K, {}, {}};
    for (float v : raw) {
      // Values with 8 significant bits and a small exponent range: exact in bf16 and in f16.
      const float e = std::ldexp(std::round(std::ldexp(v, 7)), -7);
      b16.half.push_back(f32_to_bf16(e));
      f32.f32.push_back(e);
      f16.half.push_back(f32_to_f16(e));
    }
    const auto x = normal(size_t(M * K), 22);
    auto product = [&](const HeldWeight& h) {
      Weight W = h.view();
      W.packed = ops::pack(W, WeightFormat::Bf16, "test", pool);
      std::vector<float> y(size_t(M * N));
      ops::linear(x.data(), M, W, nullptr, y.data(), pool);
      return y;
    };
    const auto a = product(b16), b = product(f32), c = product(f16);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0);
    // Rounding of an f32 file: packing f32 values equals packing their f32_to_bf16 images.
    HeldWeight rough{DType::F32, N, K, normal(size_t(N * K), 23, 0.5f), {}}, rounded = rough;
    for (float& v : rounded.f32) v = bf16_to_f32(f32_to_bf16(v));
    const auto d = product(rough), e = product(rounded);
    EXPECT_EQ(std::memcmp(d.data(), e.data(), d.size() * 4), 0);
  }
}

// The drafter's state read through the embedding (ops::matmul_rows_bf16): a vocabulary that is
// odd and crosses the kernel's chunks of pairs, columns that end inside a 32-column strip, a
// thread's columns wider than one group of strips (8000 over 2 threads), tables in each float
// dtype, rows across the row blocks; against float64 of the bf16-rounded operands.
TEST(Bf16Compute, EmbeddingProductIsTheDotOfBf16RoundedOperands) {
  REQUIRE_BF16_COMPUTE();
  IsaGuard guard;
  ThreadPool pool(2);
  struct Shape {
    int64_t V, H;
  };
  std::vector<Shape> shapes;
  for (const int64_t V : {1, 7, 1031})
    for (const int64_t H : {5, 64, 100}) shapes.push_back({V, H});
  shapes.push_back({97, 8000});
  for (const Isa isa : bf16_kernels())
    for (const DType dt : {DType::BF16, DType::F32, DType::F16})
      for (const auto [V, H] : shapes) {
        HeldWeight E{dt, V, H, normal(size_t(V * H), uint64_t(V + H), 0.5f), {}};
        if (dt != DType::F32)
          for (float v : E.f32)
            E.half.push_back(dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v));
        const Weight W = E.view();
        ops::set_isa(isa);
        for (const int64_t M : {1, 13, 16, 17, 35}) {
          const auto x = normal(size_t(M * V), uint64_t(M * 3 + V));
          std::vector<float> y(size_t(M * H));
          ops::matmul_rows_bf16(x.data(), M, W, y.data(), pool);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t h = 0; h < H; ++h) {
              double want = 0, mag = 0;
              for (int64_t v = 0; v < V; ++v) {
                const double t = round_bf16(x[size_t(m * V + v)]) * round_bf16(W.at(v, h));
                want += t;
                mag += std::fabs(t);
              }
              const double bound = double(V + 1) * std::ldexp(1.0, -24) * (mag + std::fabs(want));
              ASSERT_LE(std::fabs(y[size_t(m * H + h)] - want), bound)
                  << ops::isa_name(isa) << " " << dtype_name(dt) << " V " << V << " H " << H
                  << " M " << M << " row " << m << " col " << h;
            }
        }
      }
}

TEST(Bf16Compute, RefusedWhereItCannotRunOrDoesNotApply) {
  IsaGuard guard;
  EXPECT_EQ(ops::weight_format("native", "fp32"), WeightFormat::Native);
  EXPECT_EQ(ops::weight_format("q8", "fp32"), WeightFormat::Q8);
  try {
    ops::weight_format("native", "fp16");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--compute"));
    EXPECT_THAT(e.what(), HasSubstr("fp16"));
  }
  if (ops::has_bf16_compute()) {
    EXPECT_EQ(ops::weight_format("native", "bf16"), WeightFormat::Bf16);
    try {
      ops::weight_format("q8", "bf16");
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("--weights q8"));
    }
    // A weight packed for the mode, then the kernels capped below it (as on a CPU without it).
    ThreadPool pool(1);
    const HeldWeight m{DType::F32, 8, 8, normal(64, 1), {}};
    Weight W = m.view();
    W.packed = ops::pack(W, WeightFormat::Bf16, "test", pool);
    ops::set_isa(Isa::Avx512Vnni);
    std::vector<float> x(8, 1.0f), y(8);
    EXPECT_THROW(ops::linear(x.data(), 1, W, nullptr, y.data(), pool), Error);
  }
  ops::set_isa(Isa::Avx2);
  try {
    ops::weight_format("native", "bf16");
    FAIL() << "accepted on the AVX2 kernels";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("AVX512-BF16"));
    EXPECT_THAT(e.what(), HasSubstr("--compute fp32"));
  }
}

}  // namespace
}  // namespace flashmap
