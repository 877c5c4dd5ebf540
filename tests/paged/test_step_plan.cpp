// plan_step against the definitions it must meet: a chain row sees the block rows at and before it
// (the causal mask), a tree row exactly its ancestors-or-self (walked up the parents), tree rows
// sit at base + depth for RoPE but are stored at base + r; every row's write lands where the
// sequence's table puts that position, no two rows write one slot, padding writes nothing; and the
// single-upload image holds each array at its offset.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "error_of.h"
#include "paged/block_pool.h"
#include "paged/step_plan.h"

namespace flashmap::paged {
namespace {

using ::flashmap::testing::error_of;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

bool mask_bit(const StepPlan& p, size_t row, int j) {
  return (p.row_mask[row * size_t(p.mask_words) + size_t(j / 32)] >> (j % 32)) & 1u;
}

// Whether tree row j is row r or one of its ancestors, by walking up from r.
bool ancestor_or_self(const std::vector<int32_t>& parents, int j, int r) {
  for (int x = r; x >= 0; x = parents[size_t(x)])
    if (x == j) return true;
  return false;
}

int depth_of(const std::vector<int32_t>& parents, int r) {
  int d = 0;
  for (int x = r; parents[size_t(x)] >= 0; x = parents[size_t(x)]) ++d;
  return d;
}

// A sequence's inputs, owning what StepSeq only points at.
struct Input {
  std::vector<int32_t> table, parents;
  int64_t base = 0;
  int rows = 0;
  StepSeq seq() const { return {table, base, rows, parents}; }
};

std::vector<StepSeq> seqs_of(const std::vector<Input>& in) {
  std::vector<StepSeq> out;
  for (const Input& i : in) out.push_back(i.seq());
  return out;
}

// Random chains and trees over tables of distinct blocks (so no two rows collide).
std::vector<Input> random_inputs(std::mt19937& rng, int batch, int R, int32_t bt) {
  std::vector<int32_t> blocks(16384);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  size_t next = 0;
  std::vector<Input> in(static_cast<size_t>(batch));
  for (Input& s : in) {
    s.rows = 1 + int(rng() % uint32_t(R));
    s.base = int64_t(rng() % 300);
    const int64_t need = (s.base + s.rows + bt - 1) / bt;
    const int64_t extra = int64_t(rng() % 3);
    for (int64_t k = 0; k < need + extra; ++k) s.table.push_back(blocks[next++]);
    if (rng() % 2) {
      s.parents.push_back(-1);
      for (int r = 1; r < s.rows; ++r) {
        // Mostly deep, sometimes bushy: children of the previous row or of any earlier one.
        s.parents.push_back(rng() % 3 ? r - 1 - int(rng() % uint32_t(std::min(r, 3)))
                                      : int(rng() % uint32_t(r)));
      }
    }
  }
  return in;
}

void check_plan(const StepPlan& p, const std::vector<Input>& in, int R, int32_t bt,
                const std::vector<int32_t>& buckets) {
  const int batch = int(in.size());
  ASSERT_EQ(p.batch, batch);
  ASSERT_EQ(p.R, R);
  ASSERT_EQ(p.block_tokens, bt);
  ASSERT_EQ(p.mask_words, (R + 31) / 32);
  // The smallest bucket that holds the batch.
  ASSERT_GE(p.bucket, batch);
  ASSERT_NE(std::find(buckets.begin(), buckets.end(), p.bucket), buckets.end());
  for (const int32_t b : buckets) ASSERT_TRUE(b >= p.bucket || b < batch) << b;
  size_t longest = 1;
  for (const Input& s : in) longest = std::max(longest, s.table.size());
  ASSERT_EQ(p.table_stride, int32_t(longest));

  const size_t rows = size_t(p.bucket) * size_t(R), words = size_t(p.mask_words);
  ASSERT_EQ(p.row_pos.size(), rows);
  ASSERT_EQ(p.row_slot.size(), rows);
  ASSERT_EQ(p.row_mask.size(), rows * words);
  ASSERT_EQ(p.seq_base.size(), size_t(p.bucket));
  ASSERT_EQ(p.seq_rows.size(), size_t(p.bucket));
  ASSERT_EQ(p.tables.size(), size_t(p.bucket) * longest);

  for (int i = 0; i < p.bucket; ++i) {
    SCOPED_TRACE(::testing::Message() << "sequence " << i);
    const bool real = i < batch;
    const int n = real ? in[size_t(i)].rows : 0;
    EXPECT_EQ(p.seq_rows[size_t(i)], n);
    EXPECT_EQ(p.seq_base[size_t(i)], real ? in[size_t(i)].base : 0);
    for (size_t k = 0; k < longest; ++k) {
      const int32_t want = real && k < in[size_t(i)].table.size() ? in[size_t(i)].table[k] : -1;
      ASSERT_EQ(p.tables[size_t(i) * longest + k], want) << "table index " << k;
    }
    for (int r = 0; r < R; ++r) {
      const size_t row = size_t(i) * size_t(R) + size_t(r);
      if (r >= n) {
        EXPECT_EQ(p.row_pos[row], 0) << "padding row " << r;
        EXPECT_EQ(p.row_slot[row], -1) << "padding row " << r;
        for (size_t w = 0; w < words; ++w) EXPECT_EQ(p.row_mask[row * words + w], 0u) << r;
        continue;
      }
      const Input& s = in[size_t(i)];
      const bool tree = !s.parents.empty();
      for (int j = 0; j < int(words) * 32; ++j) {
        const bool want = j < n && (tree ? ancestor_or_self(s.parents, j, r) : j <= r);
        ASSERT_EQ(mask_bit(p, row, j), want) << "row " << r << " block row " << j;
      }
      EXPECT_EQ(p.row_pos[row], s.base + (tree ? depth_of(s.parents, r) : r)) << "row " << r;
      // Stored in row order: row r is cache position base + r, at the table's block for it.
      const int64_t pos = s.base + r;
      EXPECT_EQ(p.row_slot[row] / bt, s.table[size_t(pos / bt)]) << "row " << r;
      EXPECT_EQ(p.row_slot[row] % bt, pos % bt) << "row " << r;
    }
  }
}

TEST(StepPlan, RandomChainsAndTreesMatchTheirDefinitions) {
  std::mt19937 rng(7);
  const std::vector<int32_t> buckets = default_buckets(24);
  for (int trial = 0; trial < 400; ++trial) {
    const int Rs[] = {1, 2, 5, 9, 31, 32, 33, 63, 64, 65, 100};
    const int R = Rs[rng() % 11];
    const int32_t bt = int32_t(1 + rng() % 20);
    const int batch = 1 + int(rng() % 24);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " R " << R << " bt " << bt << " batch " << batch);
    const std::vector<Input> in = random_inputs(rng, batch, R, bt);
    const std::vector<StepSeq> seqs = seqs_of(in);
    const StepPlan p = plan_step(seqs, R, bt, buckets);
    ASSERT_NO_FATAL_FAILURE(check_plan(p, in, R, bt, buckets));
  }
}

TEST(StepPlan, ChainMaskIsTheCausalMask) {
  // R = 40: two mask words, the second partly used.
  std::vector<int32_t> table(8);
  std::iota(table.begin(), table.end(), 10);
  const std::vector<StepSeq> seqs = {{table, 3, 40, {}}};
  const std::vector<int32_t> buckets = {1};
  const StepPlan p = plan_step(seqs, 40, 8, buckets);
  ASSERT_EQ(p.mask_words, 2);
  for (int r = 0; r < 40; ++r) {
    const uint64_t mask =
        uint64_t(p.row_mask[size_t(2 * r)]) | uint64_t(p.row_mask[size_t(2 * r + 1)]) << 32;
    EXPECT_EQ(mask, (uint64_t(2) << r) - 1) << "row " << r;
    EXPECT_EQ(p.row_pos[size_t(r)], 3 + r);
    EXPECT_EQ(p.row_slot[size_t(r)], (10 + (3 + r) / 8) * 8 + (3 + r) % 8);
  }
  // The same rows as a tree in which each row hangs below the one before: the same plan.
  std::vector<int32_t> parents(40);
  std::iota(parents.begin(), parents.end(), -1);
  const std::vector<StepSeq> as_tree = {{table, 3, 40, parents}};
  const StepPlan q = plan_step(as_tree, 40, 8, buckets);
  EXPECT_EQ(q.row_mask, p.row_mask);
  EXPECT_EQ(q.row_pos, p.row_pos);
  EXPECT_EQ(q.row_slot, p.row_slot);
}

TEST(StepPlan, SmallTreeByHand) {
  // Row 0 has children 1 and 2; row 1 has 3 and 4; row 2 has 5.
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 1, 2};
  const std::vector<int32_t> table = {7, 3};
  const std::vector<StepSeq> seqs = {{table, 2, 6, parents}};
  const std::vector<int32_t> buckets = {1, 2};
  const StepPlan p = plan_step(seqs, 8, 4, buckets);
  EXPECT_THAT(p.row_mask, ElementsAre(0b1, 0b11, 0b101, 0b1011, 0b10011, 0b100101, 0, 0));
  EXPECT_THAT(p.row_pos, ElementsAre(2, 3, 3, 4, 4, 4, 0, 0));
  // Positions 2..7: block 7 rows 2, 3, then block 3 rows 0..3.
  EXPECT_THAT(p.row_slot, ElementsAre(30, 31, 12, 13, 14, 15, -1, -1));
}

TEST(StepPlan, PaddingRowsAndSequences) {
  const std::vector<int32_t> t0 = {5}, t1 = {1, 2, 9};
  const std::vector<StepSeq> seqs = {{t0, 0, 1, {}}, {t1, 9, 2, {}}, {t0, 1, 3, {}}};
  const std::vector<int32_t> buckets = {1, 2, 4, 8};
  const StepPlan p = plan_step(seqs, 4, 4, buckets);
  EXPECT_EQ(p.bucket, 4);
  EXPECT_EQ(p.table_stride, 3);
  EXPECT_THAT(p.seq_rows, ElementsAre(1, 2, 3, 0));
  EXPECT_THAT(p.seq_base, ElementsAre(0, 9, 1, 0));
  EXPECT_THAT(p.row_slot,
              ElementsAre(20, -1, -1, -1, 37, 38, -1, -1, 21, 22, 23, -1, -1, -1, -1, -1));
  EXPECT_THAT(p.row_pos, ElementsAre(0, 0, 0, 0, 9, 10, 0, 0, 1, 2, 3, 0, 0, 0, 0, 0));
  EXPECT_THAT(p.row_mask, ElementsAre(1, 0, 0, 0, 1, 3, 0, 0, 1, 3, 7, 0, 0, 0, 0, 0));
  EXPECT_THAT(p.tables, ElementsAre(5, -1, -1, 1, 2, 9, 5, -1, -1, -1, -1, -1));
}

TEST(StepPlan, BucketFor) {
  const std::vector<int32_t> b = {1, 2, 4, 8};
  EXPECT_EQ(bucket_for(1, b), 1);
  EXPECT_EQ(bucket_for(2, b), 2);
  EXPECT_EQ(bucket_for(3, b), 4);
  EXPECT_EQ(bucket_for(5, b), 8);
  EXPECT_EQ(bucket_for(8, b), 8);
  EXPECT_THAT(error_of([&] { bucket_for(9, b); }),
              HasSubstr("batch 9 exceeds the largest bucket 8"));
  EXPECT_THAT(error_of([&] { bucket_for(0, b); }), HasSubstr("batch 0"));
  const std::vector<int32_t> unsorted = {1, 4, 2}, zero = {0, 1}, none = {};
  EXPECT_THAT(error_of([&] { bucket_for(1, unsorted); }), HasSubstr("bucket 2 at index 2"));
  EXPECT_THAT(error_of([&] { bucket_for(1, zero); }), HasSubstr("bucket 0 at index 0"));
  EXPECT_THAT(error_of([&] { bucket_for(1, none); }), HasSubstr("empty"));
}

TEST(StepPlan, DefaultBuckets) {
  EXPECT_THAT(default_buckets(1), ElementsAre(1));
  EXPECT_THAT(default_buckets(2), ElementsAre(1, 2));
  EXPECT_THAT(default_buckets(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(default_buckets(5), ElementsAre(1, 2, 4, 5));
  EXPECT_THAT(default_buckets(8), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(default_buckets(9), ElementsAre(1, 2, 4, 8, 9));
  EXPECT_THAT(default_buckets(32), ElementsAre(1, 2, 4, 8, 16, 24, 32));
  EXPECT_THAT(default_buckets(40), ElementsAre(1, 2, 4, 8, 16, 24, 32, 40));
  EXPECT_THAT(default_buckets(128), ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128));
  EXPECT_THAT(default_buckets(200),
              ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 200));
  EXPECT_THAT(default_buckets(256),
              ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256));
  for (int32_t max_batch = 1; max_batch <= 700; ++max_batch) {
    const std::vector<int32_t> b = default_buckets(max_batch);
    ASSERT_EQ(b.front(), 1);
    ASSERT_EQ(b.back(), max_batch);
    for (size_t k = 1; k < b.size(); ++k) {
      ASSERT_LT(b[k - 1], b[k]) << max_batch;
      const int32_t step = b[k - 1] < 8 ? b[k - 1] : b[k - 1] < 32 ? 8 : b[k - 1] < 128 ? 16 : 32;
      ASSERT_LE(b[k] - b[k - 1], step) << "max_batch " << max_batch << " after " << b[k - 1];
    }
    // Every batch size maps to a bucket, which plan_step pads it to.
    for (int32_t batch = 1; batch <= max_batch; batch += 7) ASSERT_GE(bucket_for(batch, b), batch);
  }
  EXPECT_THAT(error_of([] { default_buckets(0); }), HasSubstr("max_batch 0"));
}

TEST(StepPlan, ImageHoldsEveryArrayAtItsOffset) {
  std::mt19937 rng(3);
  const std::vector<int32_t> buckets = {1, 2, 4, 8, 16};
  for (int trial = 0; trial < 50; ++trial) {
    const int R = 1 + int(rng() % 70);
    const int32_t bt = int32_t(1 + rng() % 16);
    const std::vector<Input> in = random_inputs(rng, 1 + int(rng() % 16), R, bt);
    const std::vector<StepSeq> seqs = seqs_of(in);
    const StepPlan p = plan_step(seqs, R, bt, buckets);
    const std::vector<int32_t> img = p.image();
    const StepPlan::Offsets o = p.offsets();
    ASSERT_EQ(int64_t(img.size()), o.total);
    EXPECT_THAT(std::vector<int32_t>(img.begin(), img.begin() + StepPlan::kHeaderFields),
                ElementsAre(p.batch, p.bucket, p.R, p.mask_words, p.table_stride, p.block_tokens));
    struct Array {
      int64_t offset;
      std::vector<int32_t> values;
    };
    std::vector<uint32_t> mask = p.row_mask;
    std::vector<int32_t> mask_bits(mask.size());
    std::transform(mask.begin(), mask.end(), mask_bits.begin(),
                   [](uint32_t w) { return std::bit_cast<int32_t>(w); });
    const std::vector<Array> arrays = {{o.row_pos, p.row_pos},   {o.row_slot, p.row_slot},
                                       {o.seq_base, p.seq_base}, {o.seq_rows, p.seq_rows},
                                       {o.row_mask, mask_bits},  {o.tables, p.tables}};
    std::vector<bool> covered(img.size(), false);
    for (int k = 0; k < StepPlan::kHeaderFields; ++k) covered[size_t(k)] = true;
    int64_t end = StepPlan::kHeaderFields;
    for (const Array& a : arrays) {
      EXPECT_EQ(a.offset % 16, 0) << "offsets are 64-byte aligned";
      ASSERT_GE(a.offset, end) << "arrays in order, not overlapping";
      end = a.offset + int64_t(a.values.size());
      ASSERT_LE(end, o.total);
      EXPECT_EQ(std::vector<int32_t>(img.begin() + a.offset, img.begin() + end), a.values);
      for (int64_t k = a.offset; k < end; ++k) covered[size_t(k)] = true;
    }
    EXPECT_EQ(end, o.total) << "the tables end the image";
    for (size_t k = 0; k < img.size(); ++k)
      if (!covered[k]) {
        ASSERT_EQ(img[k], 0) << "gap at " << k;
      }
  }
}

TEST(StepPlan, OffsetsDependOnlyOnBucketAndR) {
  // A graph captured for (bucket, R) reads the image at fixed offsets while tables grow.
  const std::vector<int32_t> short_table = {4}, long_table = {0, 1, 2, 3, 5, 6};
  const std::vector<int32_t> buckets = {4};
  const std::vector<StepSeq> a = {{short_table, 0, 3, {}}};
  const std::vector<StepSeq> b = {{long_table, 18, 5, {}}, {short_table, 1, 1, {}}};
  const StepPlan pa = plan_step(a, 5, 4, buckets), pb = plan_step(b, 5, 4, buckets);
  ASSERT_NE(pa.table_stride, pb.table_stride);
  const StepPlan::Offsets oa = pa.offsets(), ob = pb.offsets();
  EXPECT_EQ(std::vector<int64_t>(
                {oa.row_pos, oa.row_slot, oa.seq_base, oa.seq_rows, oa.row_mask, oa.tables}),
            std::vector<int64_t>(
                {ob.row_pos, ob.row_slot, ob.seq_base, ob.seq_rows, ob.row_mask, ob.tables}));
  EXPECT_EQ(ob.total - oa.total, 4 * (6 - 1));
}

TEST(StepPlan, RowsSharingASlotAreRefused) {
  const std::vector<int32_t> buckets = {1, 2, 4};
  {
    // Two sequences share block 1 and both write into it: A positions 4..6, B position 5.
    const std::vector<int32_t> t = {0, 1};
    const std::vector<StepSeq> seqs = {{t, 4, 3, {}}, {t, 5, 1, {}}};
    EXPECT_THAT(error_of([&] { plan_step(seqs, 4, 4, buckets); }),
                HasSubstr("sequences 0 and 1 both write KV slot 5 (block 1, row 1)"));
  }
  {
    // Sharing a prefix they only read is what forks do: allowed.
    const std::vector<int32_t> ta = {0, 1}, tb = {0, 2};
    const std::vector<StepSeq> seqs = {{ta, 4, 3, {}}, {tb, 4, 4, {}}};
    EXPECT_EQ(error_of([&] { plan_step(seqs, 4, 4, buckets); }), "<no error>");
  }
  {
    // A table holding a block twice writes one slot from two rows.
    const std::vector<int32_t> t = {3, 3};
    const std::vector<StepSeq> seqs = {{t, 0, 4, {}}};
    EXPECT_THAT(error_of([&] { plan_step(seqs, 4, 2, buckets); }),
                HasSubstr("sequence 0 writes KV slot 6 (block 3, row 0) from rows 0 and 2"));
  }
  {
    // The third of three sequences collides with the first; the message names those two.
    const std::vector<int32_t> t0 = {0}, t1 = {1}, t2 = {2, 0};
    const std::vector<StepSeq> seqs = {{t0, 0, 2, {}}, {t1, 0, 2, {}}, {t2, 3, 2, {}}};
    EXPECT_THAT(error_of([&] { plan_step(seqs, 2, 4, buckets); }),
                HasSubstr("sequences 0 and 2 both write KV slot 0"));
  }
}

TEST(StepPlan, ForkedSequencesCollideUntilGrowCopiesTheSharedBlock) {
  // What the two halves do together: a fork shares its parent's partial block; planning both
  // sequences' next rows on the shared tables is refused, and after BlockPool::grow (which hands
  // each writer a private copy) the same step is accepted.
  BlockPool pool(16, 4);
  std::vector<BlockCopy> copies;
  const int a = pool.open(32);
  pool.grow(a, 6, copies);
  const int b = pool.fork(a, 6, 32);
  const std::vector<int32_t> buckets = default_buckets(8);
  const std::vector<int32_t> ta(pool.table(a).begin(), pool.table(a).end());
  const std::vector<StepSeq> shared = {{ta, 6, 2, {}}, {pool.table(b), 6, 2, {}}};
  EXPECT_THAT(error_of([&] { plan_step(shared, 2, 4, buckets); }),
              HasSubstr("sequences 0 and 1 both write"));
  pool.grow(a, 8, copies);
  pool.grow(b, 8, copies);
  EXPECT_EQ(copies.size(), 1u);
  const std::vector<StepSeq> grown = {{pool.table(a), 6, 2, {}}, {pool.table(b), 6, 2, {}}};
  const StepPlan p = plan_step(grown, 2, 4, buckets);
  EXPECT_NE(p.row_slot[0], p.row_slot[2]);
}

TEST(StepPlan, BadInputsNameTheSequenceAndParameter) {
  const std::vector<int32_t> t = {0, 1}, buckets = {1, 2};
  auto err = [&](StepSeq s, int R = 4) {
    const std::vector<StepSeq> seqs = {{t, 0, 1, {}}, s};
    return error_of([&] { plan_step(seqs, R, 4, buckets); });
  };
  EXPECT_THAT(err({t, 0, 0, {}}), HasSubstr("sequence 1 has rows 0 outside [1, R = 4]"));
  EXPECT_THAT(err({t, 0, 5, {}}), HasSubstr("sequence 1 has rows 5 outside [1, R = 4]"));
  EXPECT_THAT(err({t, -1, 1, {}}), HasSubstr("sequence 1 has base -1"));
  EXPECT_THAT(err({t, 6, 3, {}}),
              HasSubstr("sequence 1 has a table of 2 blocks but base 6 + rows 3 need 3"));
  const std::vector<int32_t> bad_block = {0, -1};
  EXPECT_THAT(err({bad_block, 0, 1, {}}), HasSubstr("sequence 1 has block -1 at table index 1"));
  const std::vector<int32_t> short_parents = {-1}, root = {0, 0}, forward = {-1, 0, 2},
                             self = {-1, 1};
  EXPECT_THAT(err({t, 0, 2, short_parents}), HasSubstr("sequence 1 has 1 parents for 2 rows"));
  EXPECT_THAT(err({t, 0, 2, root}), HasSubstr("sequence 1 has parents[0] = 0, not -1"));
  EXPECT_THAT(err({t, 0, 3, forward}), HasSubstr("sequence 1 has parents[2] = 2 outside [0, 2)"));
  EXPECT_THAT(err({t, 0, 2, self}), HasSubstr("parents[1] = 1"));
  EXPECT_THAT(err({t, 0, 1, {}}, 0), HasSubstr("R 0"));
  const std::vector<StepSeq> three = {{t, 0, 1, {}}, {t, 1, 1, {}}, {t, 2, 1, {}}};
  EXPECT_THAT(error_of([&] { plan_step(three, 1, 4, buckets); }),
              HasSubstr("batch 3 exceeds the largest bucket 2"));
  EXPECT_THAT(error_of([&] { plan_step({}, 1, 4, buckets); }), HasSubstr("no sequences"));
  const std::vector<StepSeq> one = {{t, 0, 1, {}}};
  EXPECT_THAT(error_of([&] { plan_step(one, 1, 0, buckets); }), HasSubstr("block_tokens 0"));
}

}  // namespace
}  // namespace flashmap::paged
