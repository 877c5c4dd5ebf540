// A table held in blocks (Weight::blocks: a GGUF's quantized embedding) against the same values
// held as an fp32 matrix: its rows, its product with rows of x (fp32 and the bf16 compute mode,
// decoded chunk by chunk) and its Gram matrix must give the fp32 matrix's bits exactly, at a
// vocabulary that spans several decoded chunks and ends in an odd one, with columns past the
// last multiple of 16, on every instruction-set variant this CPU has.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/gemm.h"
#include "ops/gram.h"
#include "ops/ops.h"

namespace flashmap {
namespace {

using ops::Isa;

struct IsaGuard {
  ~IsaGuard() { ops::set_isa(ops::best_isa()); }
};

// A toy block encoding of rows of H values: an fp16 scale, then H int8 codes; value = code · scale.
// Decoded in blocks of kBlock values (a run that cuts one throws): the product's second thread
// owns columns 64… of a 72-column table, inside the block 48…71, which it must decode whole.
constexpr int64_t kBlock = 24;
struct Table {
  int64_t V, H;
  Weight blocks;
  std::vector<float> f32;  // the decoded values
  Weight fp32() const { return Weight{DType::F32, f32.data(), V, H}; }
};

Table make_table(int64_t V, int64_t H, uint64_t seed) {
  Rng rng(seed);
  Table t{V, H, {}, std::vector<float>(size_t(V * H))};
  auto b = std::make_shared<BlockRows>();
  b->row_bytes = 2 + H;
  b->tag = 7;
  b->bytes.resize(size_t(V * b->row_bytes));
  for (int64_t r = 0; r < V; ++r) {
    uint8_t* row = b->bytes.data() + r * b->row_bytes;
    const uint16_t d = f32_to_f16(0.001f * float(1 + rng.next() % 50));
    std::memcpy(row, &d, 2);
    for (int64_t c = 0; c < H; ++c) {
      const auto q = int8_t(int(rng.next() % 255) - 127);
      row[2 + c] = uint8_t(q);
      t.f32[size_t(r * H + c)] = float(q) * f16_to_f32(d);
    }
  }
  b->block = kBlock;
  b->decode = [H](const uint8_t* row, int64_t c0, int64_t n, float* out) {
    if (c0 % kBlock != 0 || (n % kBlock != 0 && c0 + n != H) || c0 + n > H)
      throw std::logic_error("decode of columns [" + std::to_string(c0) + ", " +
                             std::to_string(c0 + n) + ") cuts a block");
    uint16_t d;
    std::memcpy(&d, row, 2);
    for (int64_t c = 0; c < n; ++c) out[c] = float(int8_t(row[2 + c0 + c])) * f16_to_f32(d);
  };
  t.blocks.rows = V;
  t.blocks.cols = H;
  t.blocks.blocks = std::move(b);
  return t;
}

std::vector<float> softmax_like(int64_t M, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(size_t(M * V));
  for (auto& v : x) v = float(rng.normal()) / float(V);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// 2 × 1024 + 453 rows: two whole decoded chunks and an odd last one; H = 72: four columns of
// 16 and a tail of 8.
constexpr int64_t kV = 2 * ops::kDecodedRows + 453, kH = 72;

TEST(BlockRows, RowsAndElementsAreTheDecodedValues) {
  const Table t = make_table(kV, kH, 1);
  std::vector<float> row(static_cast<size_t>(kH));
  for (const int64_t r : {int64_t(0), int64_t(1), int64_t(1500), kV - 1}) {
    t.blocks.row_f32(r, row.data());
    EXPECT_EQ(std::memcmp(row.data(), t.f32.data() + r * kH, kH * 4), 0) << "row " << r;
    for (const int64_t c : {int64_t(0), int64_t(17), kH - 1})
      EXPECT_EQ(t.blocks.at(r, c), t.f32[size_t(r * kH + c)]);
  }
}

TEST(BlockRows, ProductsWithRowsOfXEqualTheDecodedMatrixBitForBit) {
  ThreadPool pool(2);
  IsaGuard guard;
  const Table t = make_table(kV, kH, 2);
  for (int i = 0; i <= int(ops::best_isa()); ++i) {
    const Isa isa = Isa(i);
    if (!ops::isa_supported(isa)) continue;
    ops::set_isa(isa);
    for (const int64_t M : {1, 5, 17}) {
      const auto x = softmax_like(M, kV, 3 + uint64_t(M));
      std::vector<float> want(size_t(M * kH), -1.0f), got(size_t(M * kH), -2.0f);
      ops::matmul_rows(x.data(), M, t.fp32(), want.data(), pool);
      ops::matmul_rows(x.data(), M, t.blocks, got.data(), pool);
      EXPECT_TRUE(same_bits(want, got)) << ops::isa_name(isa) << " M " << M;
      if (ops::has_bf16_compute()) {
        ops::matmul_rows_bf16(x.data(), M, t.fp32(), want.data(), pool);
        ops::matmul_rows_bf16(x.data(), M, t.blocks, got.data(), pool);
        EXPECT_TRUE(same_bits(want, got)) << "bf16 compute, M " << M;
      }
    }
  }
}

TEST(BlockRows, GramMatrixIsTheDecodedMatrixs) {
  const Table t = make_table(kV, kH, 4);
  std::vector<double> want(size_t(kH * kH), 0.0), got(size_t(kH * kH), 0.0);
  ops::gram_accumulate(t.fp32(), 0, kV, want.data(), 2);
  ops::gram_accumulate(t.blocks, 0, kV, got.data(), 2);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 8), 0);
}

}  // namespace
}  // namespace flashmap
