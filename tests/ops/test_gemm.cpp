// The packed GEMM kernel (src/ops/gemm.h): every instruction-set variant gives the bits of the
// scalar one (each output is the same sequence of fused multiply-adds), results do not depend on
// how many rows a call carries (batch invariance, which lossless greedy speculation rests on),
// q8 and q4 packings are byte-for-byte llama.cpp's Q8_0 and Q4_0 (the gguf package's quantizer,
// fixture made by tools/make_q8_fixture.py), and their products are ggml's Q8_0 × Q8_0 and
// Q4_0 × Q8_0 products within fp32 rounding.
// The accuracy of the native formats against float64 is in test_ops_vs_reference.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "error_of.h"
#include "held_weight.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "reference_ops.h"

namespace flashmap {
namespace {

namespace ref = reference;
using ops::Isa;
using ops::WeightFormat;
using testing::error_of;
using ::testing::HasSubstr;

std::vector<float> normal(size_t n, uint64_t seed, float sd = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = sd * float(rng.normal());
  return v;
}

// The x side of an integer product, quantized as ggml quantizes activations (quantize_row_q8_0):
// its 32 values qx = round(x · (1 / (amax / 127))) in fp32, returned as doubles, and the block's
// scale amax / 127 as its block_q8_0 stores it, in fp16 (saturated at 65504 where fp16 would
// overflow, as the engine does).
float quantize_x_block(const float* xb, double* qx) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
  const float dx = amax / 127.0f, id = dx == 0.0f ? 0.0f : 1.0f / dx;
  for (int i = 0; i < 32; ++i) qx[i] = std::round(xb[i] * id);
  return f16_to_f32(f32_to_f16(std::min(dx, 65504.0f)));
}

// A weight in one storage dtype, holding its bytes.
using Mat = test::HeldWeight;

Mat make(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  Mat m{dtype, rows, cols, normal(size_t(rows * cols), seed, 0.5f), {}};
  if (dtype != DType::F32)
    for (float v : m.f32) m.half.push_back(dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v));
  return m;
}

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::Generic, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512, Isa::Avx512Vnni,
                  Isa::Avx512Bf16, Isa::Amx})
    if (ops::isa_supported(isa)) v.push_back(isa);
  return v;
}

struct IsaGuard {
  ~IsaGuard() { ops::set_isa(ops::best_isa()); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

struct Case {
  DType dtype;
  WeightFormat format;
  const char* name;
};
const Case kCases[] = {{DType::F32, WeightFormat::Native, "f32"},
                       {DType::BF16, WeightFormat::Native, "bf16"},
                       {DType::F16, WeightFormat::Native, "f16"},
                       {DType::BF16, WeightFormat::Q8, "q8"},
                       {DType::BF16, WeightFormat::Q4, "q4"}};

bool integer(WeightFormat f) {
  return f == WeightFormat::Q8 || f == WeightFormat::Q4;
}

// One product with x's and y's row strides wider than K and N (gaps never read / never written).
std::vector<float> run(const Weight& W, const std::vector<float>& x, int64_t M, const float* bias,
                       ThreadPool& pool, int64_t pad = 0) {
  const int64_t K = W.cols, N = W.rows, ldx = K + pad, ldy = N + pad;
  std::vector<float> xs(size_t(M * ldx), NAN), ys(size_t(M * ldy), -7.0f), y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    std::memcpy(&xs[size_t(m * ldx)], &x[size_t(m * K)], size_t(K) * 4);
  ops::linear(xs.data(), M, W, bias, ys.data(), pool, ldx, ldy);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(&y[size_t(m * N)], &ys[size_t(m * ldy)], size_t(N) * 4);
    for (int64_t n = N; n < ldy; ++n) EXPECT_EQ(ys[size_t(m * ldy + n)], -7.0f) << "gap written";
  }
  return y;
}

// Every kernel variant (scalar, AVX2, AVX-512 where the CPU has them) at tile edges: rows 1–3
// (the wide one-row tiles), 4–6/7, 12/13 (one tile / two row blocks), 17, 33 (blocks of unequal
// size); columns inside one panel, across panels, and past the one-row tile's 4 panels; K across
// the widened chunk (256), and K past one slice of 1024 (rows beyond one block run in k slices).
TEST(Gemm, EveryInstructionSetGivesTheSameBits) {
  IsaGuard guard;
  ThreadPool pool(2);
  int64_t compared = 0;
  for (const Case& c : kCases)
    for (const int64_t K : integer(c.format) ? std::vector<int64_t>{32, 96, 288, 544, 1088}
                                             : std::vector<int64_t>{1, 17, 31, 257, 300, 2100})
      for (const int64_t N : {1, 31, 33, 129, 300}) {
        const Mat m = make(N, K, c.dtype, uint64_t(N * 1000 + K));
        Weight W = m.view();
        W.packed = ops::pack(W, c.format, "test", pool);
        const auto bias = normal(size_t(N), 5);
        for (const int64_t M : {1, 2, 3, 4, 6, 7, 12, 13, 17, 33}) {
          const auto x = normal(size_t(M * K), uint64_t(M + K));
          const bool with_bias = (M + N) % 2 == 0;
          std::vector<float> want;
          for (const Isa isa : isas()) {
            ops::set_isa(isa);
            const auto y = run(W, x, M, with_bias ? bias.data() : nullptr, pool, M % 3);
            if (isa == Isa::Generic) {
              want = y;
              continue;
            }
            ASSERT_TRUE(same_bits(y, want))
                << c.name << " " << ops::isa_name(isa) << " M " << M << " N " << N << " K " << K;
            ++compared;
          }
        }
      }
  std::cout << "[ info ] compared " << compared << " products with the scalar kernel's bits ("
            << ops::isa_name(ops::best_isa()) << " CPU)\n";
}

// Rows computed together equal each row computed alone, bit for bit, for 1 and 2 threads: a
// verify pass of 17 rows gives the 17 decode steps' outputs.
TEST(Gemm, RowsDoNotDependOnTheirBatch) {
  IsaGuard guard;
  for (const Isa isa : isas()) {
    ops::set_isa(isa);
    for (const int threads : {1, 2}) {
      ThreadPool pool(threads);
      // K = 2112: several row blocks take it in k slices, one row in one pass.
      for (const Case& c : kCases)
        for (const int64_t K : {int64_t(320), int64_t(2112)}) {
          const int64_t N = 301;
          const Mat m = make(N, K, c.dtype, 3);
          Weight W = m.view();
          W.packed = ops::pack(W, c.format, "test", pool);
          for (const int64_t M : {5, 17, 64}) {
            const auto x = normal(size_t(M * K), 11);
            std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
            ops::linear(x.data(), M, W, nullptr, all.data(), pool);
            for (int64_t r = 0; r < M; ++r) {
              ops::linear(x.data() + r * K, 1, W, nullptr, one.data(), pool);
              ASSERT_EQ(std::memcmp(one.data(), all.data() + r * N, size_t(N) * 4), 0)
                  << c.name << " " << ops::isa_name(isa) << " threads " << threads << " M " << M
                  << " K " << K << " row " << r;
            }
          }
        }
    }
  }
}

// Matrices stacked along their rows (a layer's q, k and v) hold each part's panels one after
// the other, and their product gives each part's outputs bit for bit, the stack copied on 1 or 3
// threads; the last part may end inside a panel.
TEST(Gemm, StackedRowsGiveEachPartsOutputs) {
  for (const int threads : {1, 3})
    for (const Case& c : kCases) {
      ThreadPool pool(threads);
      const int64_t K = 288, M = 5;
      const int64_t rows[] = {64, 96, 45};
      std::vector<Mat> mats;
      std::vector<Weight> parts;
      for (int i = 0; i < 3; ++i) mats.push_back(make(rows[i], K, c.dtype, uint64_t(40 + i)));
      std::vector<const ops::PackedWeight*> packed;
      for (const Mat& m : mats) {
        parts.push_back(m.view());
        parts.back().packed = ops::pack(parts.back(), c.format, "part", pool);
      }
      for (const Weight& w : parts) packed.push_back(w.packed.get());
      Weight all;
      all.dtype = parts[0].dtype;
      all.rows = rows[0] + rows[1] + rows[2];
      all.cols = K;
      all.packed = ops::stack_rows(packed, pool);
      ASSERT_EQ(all.packed->rows, all.rows);
      int64_t at = 0;
      for (const Weight& w : parts) {
        ASSERT_EQ(std::memcmp(all.packed->data.get() + at, w.packed->data.get(),
                              size_t(w.packed->bytes())),
                  0)
            << c.name << " threads " << threads;
        at += w.packed->bytes();
      }
      EXPECT_EQ(at, all.packed->bytes());
      const auto x = normal(size_t(M * K), 9);
      const auto y = run(all, x, M, nullptr, pool);
      int64_t col = 0;
      for (const Weight& w : parts) {
        const auto want = run(w, x, M, nullptr, pool);
        for (int64_t m = 0; m < M; ++m)
          ASSERT_EQ(std::memcmp(&y[size_t(m * all.rows + col)], &want[size_t(m * w.rows)],
                                size_t(w.rows) * 4),
                    0)
              << c.name << " threads " << threads << " row " << m << " column " << col;
        col += w.rows;
      }
    }
}

// A non-finite activation (inf or NaN) in a q8 or q4 product makes its row's outputs NaN, as
// fp32 arithmetic would, and leaves the other rows as they are computed without it: in every
// kernel variant, in either half of a block.
TEST(Gemm, NonFiniteActivationsMakeOnlyTheirRowNaN) {
  IsaGuard guard;
  ThreadPool pool(2);
  const int64_t K = 160, N = 70, M = 7;
  for (const Case& c : kCases) {
    if (!integer(c.format)) continue;
    const Mat m = make(N, K, c.dtype, 21);
    Weight W = m.view();
    W.packed = ops::pack(W, c.format, "test", pool);
    const auto clean = normal(size_t(M * K), 22);
    for (const Isa isa : isas()) {
      ops::set_isa(isa);
      std::vector<float> want(size_t(M * N)), y(size_t(M * N));
      ops::linear(clean.data(), M, W, nullptr, want.data(), pool);
      for (const float bad : {INFINITY, -INFINITY, NAN})
        for (const int64_t at : {int64_t(2 * K + 33), int64_t(5 * K + 127)}) {
          auto x = clean;
          x[size_t(at)] = bad;
          ops::linear(x.data(), M, W, nullptr, y.data(), pool);
          for (int64_t r = 0; r < M; ++r)
            for (int64_t n = 0; n < N; ++n) {
              const float got = y[size_t(r * N + n)];
              if (r == at / K)
                ASSERT_TRUE(std::isnan(got)) << c.name << " " << ops::isa_name(isa) << " col " << n;
              else
                ASSERT_EQ(got, want[size_t(r * N + n)])
                    << c.name << " " << ops::isa_name(isa) << " row " << r << " col " << n;
            }
        }
    }
  }
}

// --- q8 and q4 ---------------------------------------------------------------------------------

// The packed layouts (gemm.h): panel p, block b of 32 k. q8: bytes q + 128 as [8 groups of 4 k]
// [32 columns][4 k]; q4: nibbles q (0…15), groups 2h and 2h + 1 in the low and high nibbles of
// pair h's [32 columns][4 k] bytes; then the 32 columns' fp16 scales. q_at gives q8's signed q and
// q4's nibble.
int64_t q_bytes(const ops::PackedWeight& P) {
  return P.q4 ? ops::kQ8Block * ops::kPanel / 2 : ops::kQ8Block * ops::kPanel;
}
int q_at(const ops::PackedWeight& P, int64_t n, int64_t k) {
  const int64_t blk = q_bytes(P) + ops::kPanel * 2;
  const uint8_t* b = P.panel(n / ops::kPanel) + (k / ops::kQ8Block) * blk;
  const int64_t kk = k % ops::kQ8Block, g = kk / 4, c = (n % ops::kPanel) * 4 + kk % 4;
  if (P.q4) return (b[(g / 2) * ops::kPanel * 4 + c] >> (4 * (g % 2))) & 15;
  return int(b[g * ops::kPanel * 4 + c]) - 128;
}
uint16_t d_at(const ops::PackedWeight& P, int64_t n, int64_t b) {
  const int64_t blk = q_bytes(P) + ops::kPanel * 2;
  const uint8_t* p = P.panel(n / ops::kPanel) + b * blk + q_bytes(P) + (n % ops::kPanel) * 2;
  uint16_t d;
  std::memcpy(&d, p, 2);
  return d;
}

TEST(Gemm, Q8AndQ4PackingsAreGgmlQ8_0AndQ4_0ByteForByte) {
  ThreadPool pool(2);
  SafetensorsFile f("tests/fixtures/q8/q8_reference.safetensors");
  for (const auto& [w_name, d_name, q_name, format] :
       {std::tuple<const char*, const char*, const char*, WeightFormat>{"w", "d", "q",
                                                                        WeightFormat::Q8},
        {"wb", "db", "qb", WeightFormat::Q8},
        {"w", "d4", "q4", WeightFormat::Q4},
        {"wb", "d4b", "q4b", WeightFormat::Q4}}) {
    const TensorView& w = f.get(w_name);
    const auto* d = static_cast<const uint16_t*>(f.get(d_name).data);
    const auto* q = static_cast<const int32_t*>(f.get(q_name).data);
    const int64_t N = w.dim(0), K = w.dim(1);
    const auto P = ops::pack(Weight::of(w), format, w_name, pool);
    int64_t zero_scales = 0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t b = 0; b < K / 32; ++b) {
        ASSERT_EQ(d_at(*P, n, b), d[n * (K / 32) + b])
            << w_name << " " << q_name << " scale of row " << n << " block " << b;
        zero_scales += (d[n * (K / 32) + b] & 0x7fff) == 0;  // q4's d = m / −8 may be −0
      }
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(int(q_at(*P, n, k)), q[n * K + k])
            << w_name << " " << q_name << " of row " << n << " col " << k;
    }
    EXPECT_GE(zero_scales, 2) << "the fixture's zero and underflowing blocks";
  }
}

// y = Σ_b dot_b · (d_b · dx_b) + bias: ggml's Q8_0 × Q8_0 and Q4_0 × Q8_0 products, with the
// weights' q and d from the gguf fixture (Q4_0's weight integers are q − 8) and x quantized here
// by ggml's rule (per row and 32-block: q = roundf(x / (max|x| / 127)) in fp32, and dx, that
// max|x| / 127, kept in fp16 as ggml does), the sums in float64. The kernel's dot products are
// exact integers, so its only roundings are d · dx and the fp32 sum over the K/32 blocks (and the
// bias): |error| ≤ (K/32 + 2)·u·(Σ_b |dot_b| d_b dx_b + |bias|).
TEST(Gemm, Q8AndQ4LinearAreGgmlsProductsWithinFp32Rounding) {
  ThreadPool pool(2);
  SafetensorsFile f("tests/fixtures/q8/q8_reference.safetensors");
  IsaGuard guard;
  for (const auto& [d_name, q_name, format, offset] :
       {std::tuple<const char*, const char*, WeightFormat, int>{"d", "q", WeightFormat::Q8, 0},
        {"d4", "q4", WeightFormat::Q4, 8}}) {
    const TensorView& w = f.get("w");
    const auto* d = static_cast<const uint16_t*>(f.get(d_name).data);
    const auto* q = static_cast<const int32_t*>(f.get(q_name).data);
    const int64_t N = w.dim(0), K = w.dim(1), KB = K / 32;
    Weight W = Weight::of(w);
    W.packed = ops::pack(W, format, "w", pool);
    for (const Isa isa : isas()) {
      ops::set_isa(isa);
      for (const int64_t M : {1, 3, 17}) {
        auto x = normal(size_t(M * K), 9);
        for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = 0.0f;  // a zero block: dx = 0
        // A block past fp16's range (max|x| / 127 > 65504: dx saturates), one whose largest
        // |x| is negative, and ties that round away from zero (x = (j + ½) · amax / 127).
        for (int i = 0; i < 32; ++i) x[size_t(64 + i)] *= 3e7f;
        for (int i = 0; i < 32; ++i) x[size_t(96 + i)] = i == 5 ? -4.0f : 0.01f * float(i);
        for (int i = 0; i < 32; ++i)
          x[size_t(128 + i)] = i == 0 ? 127.0f : float(i % 2 ? -1 : 1) * (float(i) + 0.5f);
        const auto bias = normal(size_t(N), 10);
        std::vector<float> y(size_t(M * N));
        ops::linear(x.data(), M, W, bias.data(), y.data(), pool);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double want = bias[size_t(n)], mag = std::fabs(bias[size_t(n)]);
            for (int64_t b = 0; b < KB; ++b) {
              double qx[32];
              const float dx = quantize_x_block(x.data() + m * K + b * 32, qx);
              int64_t dot = 0;
              for (int i = 0; i < 32; ++i)
                dot += int64_t(q[n * K + b * 32 + i] - offset) * int64_t(qx[i]);
              const double scale = ref::f16_value(d[n * KB + b]) * double(dx);
              want += double(dot) * scale;
              mag += std::fabs(double(dot) * scale);  // q4's d is negative for a positive m
            }
            ASSERT_LE(std::fabs(double(y[size_t(m * N + n)]) - want),
                      double(KB + 2) * 0x1p-24 * mag)
                << q_name << " " << ops::isa_name(isa) << " M " << M << " row " << m << " col "
                << n;
          }
      }
    }
  }
}

// A Q8_0 tensor read through its F32 values (as a GGUF target loads one) and packed as q8 gives
// its own blocks back: Q8_0's rule applied to d·q returns d and q. On the GGUF fixture's Q8_0
// tensor, and on rows of random blocks over scales from 1e-4 to 1e4 (fp16 subnormal scales
// included) and zero blocks. (A block whose fp16 scale is 0 but whose q are not, which ggml's
// quantizer can write for values below 2^-24 · 127, comes back with q = 0: the same zeros.)
TEST(Gemm, Q8OfADequantizedQ8_0TensorIsTheSameBlocks) {
  ThreadPool pool(2);
  const auto check = [&](const uint8_t* blocks, int64_t N, int64_t K, const std::string& what) {
    const int64_t KB = K / 32, row_bytes = KB * 34;
    std::vector<float> x(size_t(N * K));
    for (int64_t n = 0; n < N; ++n)
      dequantize_row(GgmlType::Q8_0, blocks + n * row_bytes, x.data() + n * K, K);
    const Weight W{DType::F32, x.data(), N, K};
    const auto P = ops::pack(W, WeightFormat::Q8, what, pool);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* blk = blocks + n * row_bytes + b * 34;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        ASSERT_EQ(d_at(*P, n, b), d) << what << " scale of row " << n << " block " << b;
        for (int64_t i = 0; i < 32; ++i)
          ASSERT_EQ(q_at(*P, n, b * 32 + i), int(int8_t(blk[2 + i])))
              << what << " q of row " << n << " col " << b * 32 + i;
      }
  };
  GgufFile g("tests/fixtures/gguf/quants.gguf");
  const GgufTensor& t = g.tensor("q8_0");
  ASSERT_EQ(t.type, GgmlType::Q8_0);
  check(t.data, t.rows(), t.dims[0], "quants.gguf q8_0");
  // Random blocks as Q8_0 holds them: q in [-127, 127] with ±127 at the block's largest
  // magnitude (Q8_0's rule puts it there), d an fp16 of any scale.
  const int64_t N = 96, K = 256;
  std::vector<uint8_t> blocks(size_t(N * K / 32 * 34));
  Rng rng(5);
  for (int64_t blk = 0; blk < N * K / 32; ++blk) {
    uint8_t* p = blocks.data() + blk * 34;
    const bool zero = blk % 17 == 0;
    const float scale = zero ? 0.0f : std::pow(10.0f, float(-4.0 + 8.0 * rng.uniform()));
    const uint16_t d = f32_to_f16(scale / 127.0f);
    std::memcpy(p, &d, 2);
    for (int i = 0; i < 32; ++i)
      p[2 + i] = uint8_t(int8_t(zero ? 0 : std::lround(254.0 * rng.uniform()) - 127));
    if (!zero) p[2 + rng.next() % 32] = uint8_t(int8_t(rng.uniform() < 0.5 ? -127 : 127));
  }
  check(blocks.data(), N, K, "random Q8_0 blocks");
}

// A Q4_0 tensor that ggml's quantizer wrote, read through its F32 values and packed as q4, gives
// its own blocks back: the rule puts q = 0 at each block's first value of largest magnitude, so
// m = −8 · d there and the rule finds d and every q again. (A Q4_0 block written otherwise, without
// a 0 at its largest magnitude, is a different block after the round trip: a q4 model of its
// values, not its bytes.)
TEST(Gemm, Q4OfADequantizedQ4_0TensorIsTheSameBlocks) {
  ThreadPool pool(2);
  GgufFile g("tests/fixtures/gguf/quants.gguf");
  const GgufTensor& t = g.tensor("q4_0");
  ASSERT_EQ(t.type, GgmlType::Q4_0);
  const int64_t N = t.rows(), K = t.dims[0], KB = K / 32, row_bytes = KB * 18;
  std::vector<float> x(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    dequantize_row(GgmlType::Q4_0, t.data + n * row_bytes, x.data() + n * K, K);
  const Weight W{DType::F32, x.data(), N, K};
  const auto P = ops::pack(W, WeightFormat::Q4, "q4_0", pool);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < KB; ++b) {
      const uint8_t* blk = t.data + n * row_bytes + b * 18;
      uint16_t d;
      std::memcpy(&d, blk, 2);
      ASSERT_EQ(d_at(*P, n, b), d) << "scale of row " << n << " block " << b;
      for (int64_t i = 0; i < 32; ++i) {
        const int want = i < 16 ? blk[2 + i] & 15 : blk[2 + i - 16] >> 4;
        ASSERT_EQ(q_at(*P, n, b * 32 + i), want) << "q of row " << n << " col " << b * 32 + i;
      }
    }
}

// The K-quant products over 1–33 rows on every instruction set (x normal from seed + M, with
// block zero_block of each x all zeros: dx = 0; the bias normal from seed + 1): each output
// within `rounds` fp32 roundings of the fp64 reference, where ref(x row, n) gives the sum and
// the sum of magnitudes it is made of (bias excluded); the 33-row outputs the same bits on every
// instruction set, and row 20 alone the same bits as in the batch.
template <class Ref>
void expect_every_isa_within(const Weight& W, uint64_t seed, int64_t zero_block, int64_t rounds,
                             const std::string& what, ThreadPool& pool, const Ref& ref) {
  const int64_t N = W.rows, K = W.cols;
  std::vector<float> first;
  for (const Isa isa : isas()) {
    ops::set_isa(isa);
    for (const int64_t M : {1, 2, 3, 5, 9, 17, 33}) {
      auto x = normal(size_t(M * K), seed + uint64_t(M));
      for (int i = 0; i < 32; ++i) x[size_t(zero_block * 32 + i)] = 0.0f;
      const auto bias = normal(size_t(N), seed + 1);
      std::vector<float> y(size_t(M * N));
      ops::linear(x.data(), M, W, bias.data(), y.data(), pool);
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const auto [sum, mag] = ref(x.data() + r * K, n);
          ASSERT_LE(std::fabs(double(y[size_t(r * N + n)]) - (bias[size_t(n)] + sum)),
                    double(rounds) * 0x1p-24 * (std::fabs(bias[size_t(n)]) + mag))
              << what << " " << ops::isa_name(isa) << " M " << M << " row " << r << " col " << n;
        }
      if (M == 33) {
        if (first.empty()) first = y;
        EXPECT_TRUE(same_bits(y, first)) << what << ": " << ops::isa_name(isa);
        std::vector<float> one(static_cast<size_t>(N));
        ops::linear(x.data() + 20 * K, 1, W, bias.data(), one.data(), pool);
        EXPECT_EQ(std::memcmp(one.data(), y.data() + 20 * N, size_t(N) * 4), 0)
            << what << ": " << ops::isa_name(isa);
      }
    }
  }
}

// Q4_K and Q5_K blocks held as q4k and q5k: each output is ggml's weights (dequantize_row, equal
// to the gguf package's dequantize in test_gguf.cpp) times x quantized as for q8, within the
// kernel's fp32 roundings: (d·sc)·dx and (−dmin·m)·dx, and the 2·K/32 fused adds over the blocks
// (the dot products and Σ qx are exact integers); the weights' own fp32 rounding
// (d·sc·q − dmin·m) is the reference's. Every instruction set gives the same bits, and a row the
// same bits in any batch. On the fixture's tensors (3 × 512) and on random blocks at an odd
// shape (45 × 768).
class KQuantWithMin : public ::testing::TestWithParam<GgmlType> {};

TEST_P(KQuantWithMin, HeldAsItsOwnBlocksGivesGgmlsWeightsExactly) {
  ThreadPool pool(2);
  IsaGuard guard;
  const GgmlType type = GetParam();
  const bool q5 = type == GgmlType::Q5_K;
  const int64_t kBytes = q5 ? 176 : 144;  // a block
  const auto unpack = q5 ? unpack_q5_k : unpack_q4_k;
  const auto pack_as = q5 ? ops::pack_q5k : ops::pack_q4k;
  const auto check = [&](const uint8_t* blocks, int64_t N, int64_t K, const std::string& what) {
    const int64_t SB = K / 256, KB = K / 32, row_bytes = SB * kBytes;
    std::vector<float> w(size_t(N * K));
    std::vector<double> s(size_t(N * KB)), m(size_t(N * KB));
    std::vector<uint8_t> code(size_t(N * K));
    for (int64_t n = 0; n < N; ++n) {
      dequantize_row(type, blocks + n * row_bytes, w.data() + n * K, K);
      for (int64_t sb = 0; sb < SB; ++sb) {
        uint16_t d, dmin;
        uint8_t sc[8], mn[8], q[256];
        unpack(blocks + n * row_bytes + sb * kBytes, d, dmin, sc, mn, q);
        std::memcpy(code.data() + n * K + sb * 256, q, 256);
        for (int j = 0; j < 8; ++j) {
          s[size_t(n * KB + sb * 8 + j)] = ref::f16_value(d) * sc[j];
          m[size_t(n * KB + sb * 8 + j)] = ref::f16_value(dmin) * mn[j];
        }
      }
    }
    Weight W;
    W.rows = N;
    W.cols = K;
    W.packed = pack_as(
        N, K,
        [&](int64_t n, int64_t sb, ops::Q4KBlock& b) {
          unpack(blocks + n * row_bytes + sb * kBytes, b.d, b.dmin, b.sc, b.m, b.q);
        },
        what, pool);
    EXPECT_EQ(W.packed->bytes(), (N + 31) / 32 * 32 * K * (q5 ? 45 : 37) / 64)
        << (q5 ? "5.625" : "4.625") << " bits a weight";
    expect_every_isa_within(W, 11, 1, 2 * KB + 3, what, pool, [&](const float* xr, int64_t n) {
      double want = 0, mag = 0;
      for (int64_t b = 0; b < KB; ++b) {
        double qx[32];
        const float dx = quantize_x_block(xr + b * 32, qx);
        double dot = 0, wabs = 0, dot_q = 0, sx = 0;
        for (int i = 0; i < 32; ++i) {
          const double wk = w[size_t(n * K + b * 32 + i)];
          dot += wk * qx[i];
          wabs += std::fabs(wk * qx[i]);
          dot_q += code[size_t(n * K + b * 32 + i)] * qx[i];
          sx += qx[i];
        }
        const size_t nb = size_t(n * KB + b);
        want += dot * dx;
        mag += dx * (wabs + std::fabs(s[nb] * dot_q) + std::fabs(m[nb] * sx));
      }
      return std::pair{want, mag};
    });
  };
  GgufFile g("tests/fixtures/gguf/quants.gguf");
  const GgufTensor& t = g.tensor(q5 ? "q5_k" : "q4_k");
  ASSERT_EQ(t.type, type);
  check(t.data, t.rows(), t.dims[0], q5 ? "quants.gguf q5_k" : "quants.gguf q4_k");
  // Random blocks: every code and 6-bit scale random, d and dmin finite fp16s of either sign.
  const int64_t N = 45, K = 768;
  std::vector<uint8_t> blocks(size_t(N * K / 256 * kBytes));
  Rng rng(6);
  for (auto& b : blocks) b = uint8_t(rng.next());
  for (int64_t blk = 0; blk < N * K / 256; ++blk) {
    const uint16_t d = f32_to_f16(float(rng.uniform() - 0.5) * 0.02f);
    const uint16_t dmin = f32_to_f16(float(rng.uniform() - 0.5) * 0.02f);
    std::memcpy(blocks.data() + blk * kBytes, &d, 2);
    std::memcpy(blocks.data() + blk * kBytes + 2, &dmin, 2);
  }
  check(blocks.data(), N, K, q5 ? "random Q5_K blocks" : "random Q4_K blocks");

  const std::string name = q5 ? "Q5_K" : "Q4_K";
  const auto zero = [](int64_t, int64_t, ops::Q4KBlock&) {};
  EXPECT_THAT(error_of([&] { pack_as(4, 320, zero, "w", pool); }),
              HasSubstr("w: a " + name + " matrix needs the input size to be a multiple of 256"));
  const auto inf = [](int64_t n, int64_t, ops::Q4KBlock& b) { b.dmin = n == 2 ? 0x7c00 : 0; };
  EXPECT_THAT(
      error_of([&] { pack_as(4, 256, inf, "w", pool); }),
      HasSubstr("w: row 2 has a " + name + " block (k from 0) whose d or dmin is not finite"));
}

INSTANTIATE_TEST_SUITE_P(Gemm, KQuantWithMin, ::testing::Values(GgmlType::Q4_K, GgmlType::Q5_K),
                         [](const auto& info) { return ggml_type_name(uint32_t(info.param)); });

// Q6_K blocks held as q6k: each output is ggml's Q6_K weights, d · sc · (q − 32) exactly (the
// codes checked against dequantize_row, which rounds each to fp32), times x quantized as for q8,
// within the kernel's fp32 roundings: (d · sc) · dx and one fused add per half block (the dot
// products are exact integers). Every instruction set gives the same bits, and a row the same
// bits in any batch. On the fixture's Q6_K tensor (3 × 512) and on random blocks (45 × 768).
TEST(Gemm, Q6KHoldsGgmlsQ6_KWeightsExactly) {
  ThreadPool pool(2);
  IsaGuard guard;
  constexpr int64_t kBytes = 210;  // a Q6_K block
  const auto check = [&](const uint8_t* blocks, int64_t N, int64_t K, const std::string& what) {
    const int64_t SB = K / 256, KH = K / 16, row_bytes = SB * kBytes;
    std::vector<double> s(size_t(N * KH));  // d · sc of each half block
    std::vector<int> code(size_t(N * K));   // q − 32
    std::vector<float> w(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      dequantize_row(GgmlType::Q6_K, blocks + n * row_bytes, w.data(), K);
      for (int64_t sb = 0; sb < SB; ++sb) {
        uint16_t d;
        int8_t sc[16];
        uint8_t q[256];
        unpack_q6_k(blocks + n * row_bytes + sb * kBytes, d, sc, q);
        for (int i = 0; i < 256; ++i) {
          const int64_t k = sb * 256 + i;
          code[size_t(n * K + k)] = int(q[i]) - 32;
          s[size_t(n * KH + k / 16)] = ref::f16_value(d) * sc[i / 16];
          ASSERT_EQ(w[size_t(k)], float(s[size_t(n * KH + k / 16)] * code[size_t(n * K + k)]))
              << what << " row " << n << " col " << k;
        }
      }
    }
    Weight W;
    W.rows = N;
    W.cols = K;
    W.packed = ops::pack_q6k(
        N, K,
        [&](int64_t n, int64_t sb, ops::Q6KBlock& b) {
          unpack_q6_k(blocks + n * row_bytes + sb * kBytes, b.d, b.sc, b.q);
        },
        what, pool);
    EXPECT_EQ(W.packed->bytes(), (N + 31) / 32 * 32 * K * 105 / 128) << "6.5625 bits a weight";
    expect_every_isa_within(W, 21, 2, 2 * KH + 3, what, pool, [&](const float* xr, int64_t n) {
      double want = 0, mag = 0;
      for (int64_t b = 0; b < K / 32; ++b) {
        double qx[32];
        const float dx = quantize_x_block(xr + b * 32, qx);
        for (int h = 0; h < 2; ++h) {
          double dot = 0, dabs = 0;
          for (int i = 16 * h; i < 16 * h + 16; ++i) {
            dot += code[size_t(n * K + b * 32 + i)] * qx[i];
            dabs += std::fabs(code[size_t(n * K + b * 32 + i)] * qx[i]);
          }
          const double sh = s[size_t(n * KH + 2 * b + h)];
          want += dot * sh * dx;
          mag += dabs * std::fabs(sh) * dx;
        }
      }
      return std::pair{want, mag};
    });
  };
  GgufFile g("tests/fixtures/gguf/quants.gguf");
  const GgufTensor& t = g.tensor("q6_k");
  ASSERT_EQ(t.type, GgmlType::Q6_K);
  check(t.data, t.rows(), t.dims[0], "quants.gguf q6_k");
  // Random blocks: every code and int8 scale random (−128 included), d a finite fp16 of either
  // sign.
  const int64_t N = 45, K = 768;
  std::vector<uint8_t> blocks(size_t(N * K / 256 * kBytes));
  Rng rng(8);
  for (auto& b : blocks) b = uint8_t(rng.next());
  for (int64_t blk = 0; blk < N * K / 256; ++blk) {
    const uint16_t d = f32_to_f16(float(rng.uniform() - 0.5) * 0.02f);
    std::memcpy(blocks.data() + blk * kBytes + 208, &d, 2);
    if (blk == 3) blocks[size_t(blk * kBytes + 192)] = 0x80;  // sc −128
  }
  check(blocks.data(), N, K, "random Q6_K blocks");

  const auto zero = [](int64_t, int64_t, ops::Q6KBlock&) {};
  EXPECT_THAT(error_of([&] { ops::pack_q6k(4, 320, zero, "w", pool); }),
              HasSubstr("w: a Q6_K matrix needs the input size to be a multiple of 256"));
  const auto inf = [](int64_t n, int64_t, ops::Q6KBlock& b) { b.d = n == 2 ? 0x7c00 : 0; };
  EXPECT_THAT(error_of([&] { ops::pack_q6k(4, 256, inf, "w", pool); }),
              HasSubstr("w: row 2 has a Q6_K block (k from 0) whose d is not finite"));
}

TEST(Gemm, IntegerFormatsRefuseShapesAndValuesTheyCannotHold) {
  ThreadPool pool(1);
  for (const auto& [format, name] : {std::pair{WeightFormat::Q8, std::string("q8")},
                                     std::pair{WeightFormat::Q4, std::string("q4")}}) {
    SCOPED_TRACE(name);
    const auto pack_error = [&](const Mat& m, const char* what, ThreadPool& p) {
      return error_of([&] { ops::pack(m.view(), format, what, p); });
    };
    EXPECT_THAT(pack_error(make(4, 48, DType::F32, 1), "model.layers.0.mlp.down_proj.weight", pool),
                HasSubstr("model.layers.0.mlp.down_proj.weight: --weights " + name +
                          " needs the input size to be a multiple of 32 (one scale per 32 "
                          "weights), but it is 48"));
    Mat bad = make(3, 64, DType::F32, 2);
    bad.f32[70] = INFINITY;
    EXPECT_THAT(pack_error(bad, "w", pool),
                HasSubstr("w: row 1 holds inf at column 6; " + name + " needs finite weights"));
    bad.f32[70] = NAN;
    EXPECT_THAT(pack_error(bad, "w", pool), HasSubstr("w: row 1 holds nan at column 6"));
    bad.f32[70] = 1e9f;  // d = 7.9e6 (q8) or 1.25e8 (q4), past fp16's 65504
    EXPECT_THAT(pack_error(bad, "w", pool),
                HasSubstr("w: row 1 has a block of magnitude 1000000000, past what a " + name +
                          " scale (fp16) holds"));
    // Large enough to be packed on the pool, the NaN in a worker's part: an Error, not an abort.
    ThreadPool two(2);
    Mat big = make(1024, 512, DType::F32, 3);
    big.f32[size_t(1000 * 512 + 7)] = NAN;
    EXPECT_THAT(pack_error(big, "big.weight", two), HasSubstr("big.weight: row 1000"));
  }
  EXPECT_EQ(ops::parse_weight_format("q4_0"), WeightFormat::Q4);
  EXPECT_THAT(error_of([] { ops::parse_weight_format("q2"); }),
              HasSubstr("unknown weight format 'q2'"));
}

TEST(Gemm, InstructionSetCapNeverExceedsTheCpu) {
  IsaGuard guard;
  ops::set_isa(Isa::Avx512);
  EXPECT_LE(ops::active_isa(), ops::best_isa());
  ops::set_isa(Isa::Generic);
  EXPECT_EQ(ops::active_isa(), Isa::Generic);
  // AVX-VNNI is its own extension (Zen 4 and Ice Lake have AVX512-VNNI without it): a cap at
  // avx2-vnni lands on avx2 where the CPU lacks it, whatever else it has.
  ops::set_isa(Isa::Avx2Vnni);
  EXPECT_EQ(ops::active_isa(), ops::isa_supported(Isa::Avx2Vnni) ? Isa::Avx2Vnni
                               : ops::best_isa() >= Isa::Avx2    ? Isa::Avx2
                                                                 : Isa::Generic);
  EXPECT_EQ(ops::isa_supported(Isa::Avx2Vnni), ops::active_isa() == Isa::Avx2Vnni);
}

}  // namespace
}  // namespace flashmap
