// plan_draft, anchor_slot and plan_commit against the definitions they must meet: a draft row sits
// at context + j, sees the context and nothing of the step, writes nothing; the anchor's context
// and every committed row land where the sequence's table puts their position (found here by
// walking the table, not by dividing), which is where the target's forward wrote that position's
// key; commits come sequence by sequence, no two write one slot; and the images hold the arrays
// where the device reads them.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "error_of.h"
#include "paged/block_pool.h"
#include "paged/draft_plan.h"
#include "paged/step_plan.h"

namespace flashmap::paged {
namespace {

using ::flashmap::testing::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// The slot of position q, by counting positions through the table block by block, row by row.
int32_t slot_by_walk(const std::vector<int32_t>& table, int64_t q, int32_t bt) {
  int64_t pos = 0;
  for (const int32_t block : table)
    for (int32_t r = 0; r < bt; ++r, ++pos)
      if (pos == q) return block * bt + r;
  ADD_FAILURE() << "position " << q << " is beyond a table of " << table.size() << " blocks";
  return -2;
}

// The smallest bucket that holds the batch, by looking at every bucket.
int32_t smallest_bucket(const std::vector<int32_t>& buckets, int batch) {
  int32_t best = -1;
  for (const int32_t b : buckets)
    if (b >= batch && (best < 0 || b < best)) best = b;
  return best;
}

// A draft sequence's inputs, owning what DraftSeq only points at.
struct Ctx {
  std::vector<int32_t> table;
  int64_t context = 0;
};

std::vector<DraftSeq> drafts_of(const std::vector<Ctx>& in) {
  std::vector<DraftSeq> out;
  for (const Ctx& c : in) out.push_back({c.table, c.context});
  return out;
}

// Contexts over scattered tables of distinct blocks, some longer than their contexts need.
std::vector<Ctx> random_contexts(std::mt19937& rng, int batch, int32_t bt) {
  std::vector<int32_t> blocks(8192);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  size_t next = 0;
  std::vector<Ctx> in(static_cast<size_t>(batch));
  for (Ctx& c : in) {
    c.context = 1 + int64_t(rng() % 300);
    int64_t covered = 0;
    while (covered < c.context) {
      c.table.push_back(blocks[next++]);
      covered += bt;
    }
    for (int extra = int(rng() % 3); extra > 0; --extra) c.table.push_back(blocks[next++]);
  }
  return in;
}

// What plan_draft must produce, built from the definition.
struct DraftWant {
  int32_t bucket = 0, stride = 0;
  std::vector<int32_t> row_pos, row_slot, seq_base, seq_rows, mask, tables;
};

DraftWant draft_want(const std::vector<Ctx>& in, int K, const std::vector<int32_t>& buckets) {
  DraftWant w;
  w.bucket = smallest_bucket(buckets, int(in.size()));
  w.stride = 1;
  for (const Ctx& c : in) w.stride = std::max(w.stride, int32_t(c.table.size()));
  for (int i = 0; i < w.bucket; ++i) {
    const bool real = i < int(in.size());
    w.seq_base.push_back(real ? int32_t(in[size_t(i)].context) : 0);
    w.seq_rows.push_back(real ? K : 0);
    for (int j = 0; j < K; ++j) {
      w.row_pos.push_back(real ? int32_t(in[size_t(i)].context) + j : 0);
      w.row_slot.push_back(-1);
    }
    for (int j = 0; j < (K + 31) / 32 * K; ++j) w.mask.push_back(0);
    for (int32_t k = 0; k < w.stride; ++k)
      w.tables.push_back(
          real && k < int32_t(in[size_t(i)].table.size()) ? in[size_t(i)].table[size_t(k)] : -1);
  }
  return w;
}

std::vector<int32_t> slice(const std::vector<int32_t>& img, int64_t at, size_t n) {
  return std::vector<int32_t>(img.begin() + at, img.begin() + at + int64_t(n));
}

void check_draft(const StepPlan& p, const std::vector<Ctx>& in, int K, int32_t bt,
                 const std::vector<int32_t>& buckets) {
  const DraftWant w = draft_want(in, K, buckets);
  ASSERT_EQ(p.batch, int32_t(in.size()));
  ASSERT_EQ(p.bucket, w.bucket);
  ASSERT_EQ(p.R, K);
  ASSERT_EQ(p.mask_words, (K + 31) / 32);
  ASSERT_EQ(p.table_stride, w.stride);
  ASSERT_EQ(p.block_tokens, bt);
  EXPECT_EQ(p.row_pos, w.row_pos);
  EXPECT_EQ(p.row_slot, w.row_slot);
  EXPECT_EQ(p.seq_base, w.seq_base);
  EXPECT_EQ(p.seq_rows, w.seq_rows);
  EXPECT_EQ(p.tables, w.tables);
  EXPECT_EQ(std::vector<int32_t>(p.row_mask.begin(), p.row_mask.end()), w.mask);

  // The device reads the image, not the fields: every array where offsets() says.
  const std::vector<int32_t> img = p.image();
  const StepPlan::Offsets o = p.offsets();
  ASSERT_EQ(int64_t(img.size()), o.total);
  EXPECT_THAT(slice(img, 0, StepPlan::kHeaderFields),
              ElementsAre(int32_t(in.size()), w.bucket, K, (K + 31) / 32, w.stride, bt));
  EXPECT_EQ(slice(img, o.row_pos, w.row_pos.size()), w.row_pos);
  EXPECT_EQ(slice(img, o.row_slot, w.row_slot.size()), w.row_slot);
  EXPECT_EQ(slice(img, o.seq_base, w.seq_base.size()), w.seq_base);
  EXPECT_EQ(slice(img, o.seq_rows, w.seq_rows.size()), w.seq_rows);
  EXPECT_EQ(slice(img, o.row_mask, w.mask.size()), w.mask);
  EXPECT_EQ(slice(img, o.tables, w.tables.size()), w.tables);
  EXPECT_EQ(o.tables + int64_t(w.tables.size()), o.total) << "the tables end the image";
}

TEST(DraftPlan, RandomDraftsMatchTheirDefinition) {
  std::mt19937 rng(11);
  const std::vector<int32_t> buckets = default_buckets(24);
  for (int trial = 0; trial < 200; ++trial) {
    const int Ks[] = {1, 2, 4, 7, 31, 32, 33, 64, 70};
    const int K = Ks[rng() % 9];
    const int32_t bt = int32_t(1 + rng() % 20);
    const int batch = 1 + int(rng() % 24);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " K " << K << " bt " << bt << " batch " << batch);
    const std::vector<Ctx> in = random_contexts(rng, batch, bt);
    const std::vector<DraftSeq> seqs = drafts_of(in);
    const StepPlan p = plan_draft(seqs, K, bt, buckets);
    ASSERT_NO_FATAL_FAILURE(check_draft(p, in, K, bt, buckets));
  }
}

TEST(DraftPlan, SmallDraftByHand) {
  // Three sequences in a bucket of 4, K = 3, blocks of 4 positions.
  const std::vector<int32_t> t0 = {7, 2}, t1 = {3}, t2 = {9, 4, 8};
  const std::vector<DraftSeq> seqs = {{t0, 5}, {t1, 1}, {t2, 9}};
  const std::vector<int32_t> buckets = {1, 2, 4, 8};
  const StepPlan p = plan_draft(seqs, 3, 4, buckets);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.bucket, 4);
  EXPECT_EQ(p.R, 3);
  EXPECT_EQ(p.mask_words, 1);
  EXPECT_EQ(p.table_stride, 3);
  EXPECT_THAT(p.row_pos, ElementsAre(5, 6, 7, 1, 2, 3, 9, 10, 11, 0, 0, 0));
  EXPECT_THAT(p.seq_base, ElementsAre(5, 1, 9, 0));
  EXPECT_THAT(p.seq_rows, ElementsAre(3, 3, 3, 0));
  EXPECT_THAT(p.tables, ElementsAre(7, 2, -1, 3, -1, -1, 9, 4, 8, -1, -1, -1));
  EXPECT_EQ(p.row_slot, std::vector<int32_t>(12, -1));
  EXPECT_EQ(p.row_mask, std::vector<uint32_t>(12, 0));
}

TEST(DraftPlan, BucketIsTheSmallestThatHolds) {
  const std::vector<int32_t> table = {0, 1};
  for (const std::vector<int32_t>& buckets :
       {std::vector<int32_t>{1, 2, 4, 8}, std::vector<int32_t>{3, 5}, default_buckets(40)}) {
    for (int batch = 1; batch <= buckets.back(); ++batch) {
      const std::vector<DraftSeq> seqs(size_t(batch), DraftSeq{table, 6});
      const StepPlan p = plan_draft(seqs, 2, 4, buckets);
      EXPECT_EQ(p.bucket, smallest_bucket(buckets, batch)) << "batch " << batch;
      EXPECT_EQ(p.seq_rows.size(), size_t(p.bucket));
    }
  }
}

TEST(DraftPlan, OffsetsDependOnlyOnBucketAndK) {
  // A graph captured for (bucket, K) reads the draft's image at fixed offsets while contexts grow.
  const std::vector<int32_t> short_table = {4}, long_table = {0, 1, 2, 3, 5, 6};
  const std::vector<int32_t> buckets = {4};
  const std::vector<DraftSeq> a = {{short_table, 3}};
  const std::vector<DraftSeq> b = {{long_table, 23}, {short_table, 1}};
  const StepPlan::Offsets oa = plan_draft(a, 5, 4, buckets).offsets();
  const StepPlan::Offsets ob = plan_draft(b, 5, 4, buckets).offsets();
  EXPECT_EQ(std::vector<int64_t>(
                {oa.row_pos, oa.row_slot, oa.seq_base, oa.seq_rows, oa.row_mask, oa.tables}),
            std::vector<int64_t>(
                {ob.row_pos, ob.row_slot, ob.seq_base, ob.seq_rows, ob.row_mask, ob.tables}));
  EXPECT_EQ(ob.total - oa.total, 4 * (6 - 1));
}

TEST(DraftPlan, BadInputsNameTheSequenceAndParameter) {
  const std::vector<int32_t> t = {0, 1}, buckets = {1, 2};
  auto err = [&](DraftSeq s, int K = 4, int32_t bt = 4) {
    const std::vector<DraftSeq> seqs = {{t, 1}, s};
    return error_of([&] { plan_draft(seqs, K, bt, buckets); });
  };
  EXPECT_EQ(err({t, 8}), "<no error>");
  EXPECT_THAT(err({t, 0}), HasSubstr("sequence 1 has context 0 outside [1,"));
  EXPECT_THAT(err({t, -3}), HasSubstr("sequence 1 has context -3"));
  EXPECT_THAT(err({t, 9}), HasSubstr("sequence 1 has a table of 2 blocks but context 9 needs 3"));
  const std::vector<int32_t> hole = {0, -1}, past = {0, 1, -1};
  EXPECT_THAT(err({hole, 5}), HasSubstr("sequence 1 has block -1 at table index 1"));
  // Entries past the context are not read.
  EXPECT_EQ(err({past, 8}), "<no error>");
  EXPECT_EQ(err({hole, 4}), "<no error>");
  // A block whose slots overflow int32.
  const std::vector<int32_t> huge = {1 << 29};
  EXPECT_THAT(err({huge, 1}), HasSubstr("sequence 1 has block 536870912 at table index 0"));
  // The last draft row's position must fit int32: context + K <= 2^31 - 1.
  std::vector<int32_t> distinct(size_t(1) << 16);
  std::iota(distinct.begin(), distinct.end(), 0);
  EXPECT_EQ(err({distinct, kInt32Max - 4}, 4, 1 << 15), "<no error>");
  EXPECT_THAT(err({distinct, kInt32Max - 3}, 4, 1 << 15),
              HasSubstr("sequence 1 has context 2147483644"));
  EXPECT_THAT(err({t, 1}, 0), HasSubstr("K 0"));
  EXPECT_THAT(err({t, 1}, 4, 0), HasSubstr("block_tokens 0"));
  const std::vector<DraftSeq> three = {{t, 1}, {t, 2}, {t, 3}};
  EXPECT_THAT(error_of([&] { plan_draft(three, 1, 4, buckets); }),
              HasSubstr("batch 3 exceeds the largest bucket 2"));
  EXPECT_THAT(error_of([&] { plan_draft({}, 1, 4, buckets); }), HasSubstr("no sequences"));
}

TEST(AnchorSlot, MatchesAWalkOverTheTable) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int32_t bt = int32_t(1 + rng() % 17);
    const std::vector<Ctx> in = random_contexts(rng, 1, bt);
    const std::vector<int32_t>& table = in[0].table;
    // Every context the table holds, not just the one drawn.
    for (int64_t context = 1; context <= int64_t(table.size()) * bt; ++context)
      ASSERT_EQ(anchor_slot(table, context, bt), slot_by_walk(table, context - 1, bt))
          << "trial " << trial << " bt " << bt << " context " << context;
  }
  const std::vector<int32_t> t0 = {7, 2}, t1 = {3}, t2 = {9, 4, 8};
  EXPECT_EQ(anchor_slot(t0, 5, 4), 8);
  EXPECT_EQ(anchor_slot(t1, 1, 4), 12);
  EXPECT_EQ(anchor_slot(t2, 9, 4), 32);
}

TEST(AnchorSlot, IsWhereTheTargetWritesTheAnchorsKey) {
  // The drafter's context of a position shares the target's slot for it: the anchor's key is the
  // row a plain decode step at base context - 1 writes.
  BlockPool pool(64, 4);
  std::vector<BlockCopy> copies;
  const int a = pool.open(40), b = pool.open(40);
  pool.grow(a, 3, copies);
  pool.grow(b, 11, copies);
  pool.grow(a, 14, copies);
  pool.grow(b, 13, copies);
  const std::vector<int32_t> buckets = {2};
  for (const auto& [seq, context] : {std::pair{a, int64_t(14)}, std::pair{b, int64_t(13)},
                                     std::pair{a, int64_t(4)}, std::pair{b, int64_t(1)}}) {
    const std::vector<StepSeq> step = {{pool.table(seq), context - 1, 1, {}}};
    EXPECT_EQ(anchor_slot(pool.table(seq), context, 4), plan_step(step, 1, 4, buckets).row_slot[0])
        << "sequence " << seq << " context " << context;
  }
}

TEST(AnchorSlot, BadInputsNameTheParameter) {
  const std::vector<int32_t> t = {0, 1}, hole = {0, -1};
  EXPECT_THAT(error_of([&] { anchor_slot(t, 0, 4); }), HasSubstr("context 0"));
  EXPECT_THAT(error_of([&] { anchor_slot(t, 9, 4); }),
              HasSubstr("a table of 2 blocks does not hold context 9"));
  EXPECT_EQ(error_of([&] { anchor_slot(t, 8, 4); }), "<no error>");
  EXPECT_THAT(error_of([&] { anchor_slot(hole, 5, 4); }), HasSubstr("block -1 at table index 1"));
  EXPECT_EQ(error_of([&] { anchor_slot(hole, 4, 4); }), "<no error>");
  EXPECT_THAT(error_of([&] { anchor_slot(t, 1, 0); }), HasSubstr("block_tokens 0"));
}

// A committing sequence's inputs, owning what CommitSeq only points at.
struct Commit {
  std::vector<int32_t> table;
  int64_t first_row = 0, position = 0;
  int count = 0;
};

std::vector<CommitSeq> commits_of(const std::vector<Commit>& in) {
  std::vector<CommitSeq> out;
  for (const Commit& c : in) out.push_back({c.table, c.first_row, c.position, c.count});
  return out;
}

std::vector<int32_t> copy_of(std::span<const int32_t> s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

// The model: every committed row, sequence by sequence, each at its position's slot by walking.
void check_commit(const CommitPlan& p, const std::vector<Commit>& in, int32_t bt) {
  std::vector<int32_t> rows, positions, slots;
  for (const Commit& c : in)
    for (int k = 0; k < c.count; ++k) {
      rows.push_back(int32_t(c.first_row + k));
      positions.push_back(int32_t(c.position + k));
      slots.push_back(slot_by_walk(c.table, c.position + k, bt));
    }
  ASSERT_EQ(p.n, int32_t(rows.size()));
  EXPECT_EQ(p.rows, rows);
  EXPECT_EQ(p.positions, positions);
  EXPECT_EQ(p.slots, slots);
  EXPECT_EQ(std::set<int32_t>(slots.begin(), slots.end()).size(), slots.size())
      << "no two rows write one slot";
  const std::vector<int32_t> img = p.image();
  ASSERT_EQ(img.size(), 3 * rows.size());
  EXPECT_EQ(slice(img, 0, rows.size()), rows);
  EXPECT_EQ(slice(img, p.n, rows.size()), positions);
  EXPECT_EQ(slice(img, 2 * int64_t(p.n), rows.size()), slots);
}

TEST(CommitPlan, RandomCommitsMatchABruteForceModel) {
  for (int seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int32_t bt = int32_t(1 + rng() % 16);
    BlockPool pool(16384, bt);
    std::vector<BlockCopy> copies;
    // Sequences opened or forked from earlier ones (sharing their prefixes), at random lengths.
    const int batch = 1 + int(rng() % 12);
    std::vector<int> ids;
    std::vector<int64_t> lengths;
    for (int i = 0; i < batch; ++i) {
      int id;
      int64_t length;
      if (!ids.empty() && rng() % 3 == 0) {
        const size_t from = rng() % ids.size();
        length = int64_t(rng() % uint32_t(lengths[from] + 1));
        id = pool.fork(ids[from], length, length + 300);
      } else {
        length = int64_t(rng() % 150);
        id = pool.open(length + 300);
        pool.grow(id, length, copies);
      }
      ASSERT_GE(id, 0);
      ids.push_back(id);
      lengths.push_back(length);
    }

    std::vector<Commit> in(static_cast<size_t>(batch));
    int64_t feature_rows = 0;
    if (seed % 2 == 0) {
      // A verify step: anchor + drafts of every sequence in R-row slots, then only the accepted
      // rows (none for some) commit, from the tables the target's truncate left.
      const int R = 1 + int(rng() % 8);
      std::vector<std::vector<int32_t>> grown(static_cast<size_t>(batch));
      for (int i = 0; i < batch; ++i) {
        pool.grow(ids[size_t(i)], lengths[size_t(i)] + R, copies);
        grown[size_t(i)] = copy_of(pool.table(ids[size_t(i)]));
      }
      std::vector<StepSeq> step;
      for (int i = 0; i < batch; ++i) step.push_back({grown[size_t(i)], lengths[size_t(i)], R, {}});
      const StepPlan verify = plan_step(step, R, bt, default_buckets(12));
      feature_rows = int64_t(verify.bucket) * R;
      for (int i = 0; i < batch; ++i) {
        const int accepted = int(rng() % uint32_t(R + 1));
        pool.truncate(ids[size_t(i)], lengths[size_t(i)] + accepted);
        in[size_t(i)] = {copy_of(pool.table(ids[size_t(i)])), int64_t(i) * R, lengths[size_t(i)],
                         accepted};
      }
      const std::vector<CommitSeq> seqs = commits_of(in);
      const CommitPlan p = plan_commit(seqs, bt, feature_rows);
      ASSERT_NO_FATAL_FAILURE(check_commit(p, in, bt));
      // The drafter's context of a position goes where the target wrote its key.
      size_t k = 0;
      for (int i = 0; i < batch; ++i)
        for (int r = 0; r < in[size_t(i)].count; ++r, ++k)
          ASSERT_EQ(p.slots[k], verify.row_slot[size_t(i * R + r)])
              << "sequence " << i << " row " << r;
    } else {
      // A prefill chunk: every sequence's chunk packed back to back, all of it committed.
      for (int i = 0; i < batch; ++i) {
        const int chunk = int(rng() % 40);
        pool.grow(ids[size_t(i)], lengths[size_t(i)] + chunk, copies);
        in[size_t(i)] = {copy_of(pool.table(ids[size_t(i)])), feature_rows, lengths[size_t(i)],
                         chunk};
        feature_rows += chunk;
      }
      const std::vector<CommitSeq> seqs = commits_of(in);
      ASSERT_NO_FATAL_FAILURE(check_commit(plan_commit(seqs, bt, feature_rows), in, bt));
    }
  }
}

TEST(CommitPlan, SmallCommitByHand) {
  // Blocks of 4: sequence 0 commits 3 rows at positions 6..8 (block 5 rows 2, 3, block 1 row 0),
  // sequence 1 none, sequence 2 one row at position 0 (block 9 row 0).
  const std::vector<int32_t> t0 = {2, 5, 1}, t1 = {4}, t2 = {9};
  const std::vector<CommitSeq> seqs = {{t0, 1, 6, 3}, {t1, 4, 3, 0}, {t2, 5, 0, 1}};
  const CommitPlan p = plan_commit(seqs, 4, 8);
  EXPECT_EQ(p.n, 4);
  EXPECT_THAT(p.rows, ElementsAre(1, 2, 3, 5));
  EXPECT_THAT(p.positions, ElementsAre(6, 7, 8, 0));
  EXPECT_THAT(p.slots, ElementsAre(22, 23, 4, 36));
  EXPECT_THAT(p.image(), ElementsAre(1, 2, 3, 5, 6, 7, 8, 0, 22, 23, 4, 36));
  const CommitPlan none = plan_commit({}, 4, 0);
  EXPECT_EQ(none.n, 0);
  EXPECT_TRUE(none.image().empty());
}

TEST(CommitPlan, RowsSharingASlotAreRefused) {
  {
    // A fork shares its parent's partial block; committing into it from both is refused until
    // BlockPool::grow hands each a private copy.
    BlockPool pool(16, 4);
    std::vector<BlockCopy> copies;
    const int a = pool.open(32);
    pool.grow(a, 6, copies);
    const int b = pool.fork(a, 6, 32);
    const std::vector<int32_t> ta = copy_of(pool.table(a)), tb = copy_of(pool.table(b));
    const int32_t shared = ta[1];
    const std::vector<CommitSeq> seqs = {{ta, 0, 6, 2}, {tb, 2, 6, 2}};
    EXPECT_THAT(error_of([&] { plan_commit(seqs, 4, 4); }),
                HasSubstr(fmt::format("sequences 0 and 1 both write slot {} (block {}, row 2)",
                                      shared * 4 + 2, shared)));
    pool.grow(a, 8, copies);
    pool.grow(b, 8, copies);
    ASSERT_EQ(copies.size(), 1u);
    const std::vector<CommitSeq> grown = {{pool.table(a), 0, 6, 2}, {pool.table(b), 2, 6, 2}};
    EXPECT_EQ(error_of([&] { plan_commit(grown, 4, 4); }), "<no error>");
  }
  {
    // A table holding a block twice writes one slot from two rows of one sequence.
    const std::vector<int32_t> t = {3, 3};
    const std::vector<CommitSeq> seqs = {{t, 0, 0, 4}};
    EXPECT_THAT(error_of([&] { plan_commit(seqs, 2, 4); }),
                HasSubstr("sequence 0 writes slot 6 (block 3, row 0) from its rows 0 and 2"));
  }
  {
    // The third of three sequences collides with the first; the message names those two.
    const std::vector<int32_t> t0 = {0}, t1 = {1}, t2 = {2, 0};
    const std::vector<CommitSeq> seqs = {{t0, 0, 0, 2}, {t1, 2, 0, 2}, {t2, 4, 5, 2}};
    EXPECT_THAT(error_of([&] { plan_commit(seqs, 4, 6); }),
                HasSubstr("sequences 0 and 2 both write slot 1"));
  }
}

TEST(CommitPlan, BadInputsNameTheSequenceAndParameter) {
  const std::vector<int32_t> t = {0, 1};
  auto err = [&](CommitSeq s, int64_t feature_rows = 8, int32_t bt = 4) {
    const std::vector<int32_t> other = {5};
    const std::vector<CommitSeq> seqs = {{other, 0, 0, 1}, s};
    return error_of([&] { plan_commit(seqs, bt, feature_rows); });
  };
  EXPECT_EQ(err({t, 1, 2, 6}), "<no error>");
  EXPECT_THAT(err({t, 1, 2, -1}), HasSubstr("sequence 1 has count -1"));
  EXPECT_THAT(err({t, -1, 2, 1}), HasSubstr("sequence 1 has first_row -1"));
  EXPECT_THAT(err({t, 6, 2, 3}),
              HasSubstr("sequence 1 has first_row 6 + count 3 outside the feature_rows 8"));
  EXPECT_EQ(err({t, 6, 2, 2}), "<no error>");
  EXPECT_THAT(err({t, 1, -1, 1}), HasSubstr("sequence 1 has position -1"));
  EXPECT_THAT(err({t, 1, 6, 3}),
              HasSubstr("sequence 1 has a table of 2 blocks but position 6 + count 3 need 3"));
  const std::vector<int32_t> hole = {-1, 1}, tail_hole = {0, -1};
  // Only the blocks the rows write are read: a hole before them is no error, one among them is.
  EXPECT_EQ(err({hole, 1, 4, 3}), "<no error>");
  EXPECT_THAT(err({hole, 1, 3, 2}), HasSubstr("sequence 1 has block -1 at table index 0"));
  EXPECT_THAT(err({tail_hole, 1, 3, 2}), HasSubstr("sequence 1 has block -1 at table index 1"));
  // Committing nothing reads no table.
  const std::vector<int32_t> empty;
  EXPECT_EQ(err({empty, 8, 100, 0}), "<no error>");
  const std::vector<int32_t> huge = {1 << 29};
  EXPECT_THAT(err({huge, 0, 0, 1}), HasSubstr("sequence 1 has block 536870912 at table index 0"));
  // The last row's position must fit int32: position + count <= 2^31 - 1.
  std::vector<int32_t> wide(size_t(1) << 16);
  std::iota(wide.begin(), wide.end(), 0);
  EXPECT_EQ(err({wide, 0, kInt32Max - 2, 2}, 8, 1 << 15), "<no error>");
  EXPECT_THAT(err({wide, 0, kInt32Max - 1, 2}, 8, 1 << 15),
              HasSubstr("sequence 1 has position 2147483646"));
  EXPECT_THAT(err({t, 1, 2, 1}, kInt32Max + 1), HasSubstr("feature_rows 2147483648"));
  EXPECT_THAT(err({t, 1, 2, 1}, -1), HasSubstr("feature_rows -1"));
  EXPECT_THAT(err({t, 1, 2, 1}, 8, 0), HasSubstr("block_tokens 0"));
  {
    // Rows whose total overflows int32 (two sequences reading the same feature rows).
    const int32_t bt = 1 << 20;
    std::vector<int32_t> ta(1024), tb(1024);
    std::iota(ta.begin(), ta.end(), 0);
    std::iota(tb.begin(), tb.end(), 1024);
    const std::vector<CommitSeq> seqs = {{ta, 0, 0, 1 << 30}, {tb, 0, 0, 1 << 30}};
    EXPECT_THAT(error_of([&] { plan_commit(seqs, bt, int64_t(1) << 30); }),
                HasSubstr("2147483648 rows to commit do not fit int32"));
  }
}

// A tree's anchor and accepted path committed from wherever their rows sat: row k of the plan is
// the named row, at position + k, stored where the table puts that position.
TEST(CommitPlan, NamedRowsOfATreePath) {
  const std::vector<int32_t> t = {7, 3};  // blocks of 4: positions 0..3 in block 7, 4..7 in 3
  const std::vector<int32_t> rows = {10, 12, 15};  // the anchor's row, then nodes 1 and 4
  const std::vector<CommitSeq> seqs = {{t, 10, 3, 3, rows}};
  const CommitPlan p = plan_commit(seqs, 4, 16);
  EXPECT_THAT(p.rows, ElementsAre(10, 12, 15));
  EXPECT_THAT(p.positions, ElementsAre(3, 4, 5));
  EXPECT_THAT(p.slots,
              ElementsAre(slot_by_walk(t, 3, 4), slot_by_walk(t, 4, 4), slot_by_walk(t, 5, 4)));
  const std::vector<int32_t> two = {10, 12}, far = {10, 12, 16};
  EXPECT_THAT(error_of([&] {
                plan_commit(std::vector<CommitSeq>{{t, 10, 3, 3, two}}, 4, 16);
              }),
              HasSubstr("names 2 rows for count 3"));
  EXPECT_THAT(error_of([&] {
                plan_commit(std::vector<CommitSeq>{{t, 10, 3, 3, far}}, 4, 16);
              }),
              HasSubstr("row 16 outside the feature_rows 16"));
}

// Keeping a tree's accepted path: every moved node's source is the slot of its tree row's
// position and its destination the slot of its depth's, found by walking the table; nodes already
// at their depth do not move; and applying the pairs in path order to a model of the cache leaves
// the path's values at positions base + 1 … in order.
TEST(KeepPath, MovesEachNodeToItsDepth) {
  std::mt19937_64 g(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t bt = 1 + int32_t(g() % 8);
    const int64_t base = int64_t(g() % 40);
    const int nodes = 1 + int(g() % 30);
    // A random increasing path with path[j] >= j.
    std::vector<int32_t> path;
    for (int32_t n = 0; n < nodes && path.size() < 8; ++n)
      if (g() % 2) path.push_back(n);
    const int64_t positions = base + 1 + nodes;
    std::vector<int32_t> table(size_t((positions + bt - 1) / bt));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), g);
    const std::vector<int32_t> pairs = plan_keep_path(table, base, path, bt);
    size_t at = 0;
    for (size_t j = 0; j < path.size(); ++j) {
      if (path[j] == int32_t(j)) continue;
      ASSERT_LT(at + 1, pairs.size());
      EXPECT_EQ(pairs[at], slot_by_walk(table, base + 1 + path[j], bt));
      EXPECT_EQ(pairs[at + 1], slot_by_walk(table, base + 1 + int64_t(j), bt));
      at += 2;
    }
    EXPECT_EQ(at, pairs.size());
    // The cache as slot -> the position whose key it holds; the copies in path order.
    std::vector<int64_t> cache(table.size() * size_t(bt), -1);
    for (int64_t q = 0; q < positions; ++q) cache[size_t(slot_by_walk(table, q, bt))] = q;
    for (size_t c = 0; c < pairs.size(); c += 2)
      cache[size_t(pairs[c + 1])] = cache[size_t(pairs[c])];
    for (size_t j = 0; j < path.size(); ++j)
      EXPECT_EQ(cache[size_t(slot_by_walk(table, base + 1 + int64_t(j), bt))], base + 1 + path[j]);
  }
  const std::vector<int32_t> t = {0, 1};
  const std::vector<int32_t> down = {2, 1}, early = {0, 0}, beyond = {9};
  EXPECT_THAT(error_of([&] { plan_keep_path(t, 0, down, 4); }), HasSubstr("increasing"));
  EXPECT_THAT(error_of([&] { plan_keep_path(t, 0, early, 4); }), HasSubstr("increasing"));
  EXPECT_THAT(error_of([&] { plan_keep_path(t, 0, beyond, 4); }),
              HasSubstr("does not hold position 10"));
  EXPECT_TRUE(plan_keep_path(t, 3, std::vector<int32_t>{0, 1}, 4).empty());
}

// A DFlash block over the shared tables: every row at its position after the context, written
// where the table puts that position (found by walking it), seeing the context and all B block
// rows (bits read back out of the image as the device reads them), padding empty.
TEST(BlockPlan, RowsArePositionsAfterTheContextSeeingTheWholeBlock) {
  std::mt19937_64 g(9);
  for (int trial = 0; trial < 100; ++trial) {
    const int B = 1 + int(g() % 40);
    const int32_t bt = 1 + int32_t(g() % 16);
    const int n = 1 + int(g() % 5);
    std::vector<std::vector<int32_t>> tables;
    std::vector<int64_t> contexts;
    int32_t next = 0;
    for (int i = 0; i < n; ++i) {
      contexts.push_back(int64_t(g() % 50));
      const int64_t blocks = (contexts.back() + B + bt - 1) / bt + int64_t(g() % 2);
      std::vector<int32_t> t;
      for (int64_t k = 0; k < blocks; ++k) t.push_back(next++);
      std::shuffle(t.begin(), t.end(), g);
      tables.push_back(t);
    }
    std::vector<DraftSeq> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back({tables[size_t(i)], contexts[size_t(i)]});
    const std::vector<int32_t> buckets = {1, 2, 4, 8};
    const StepPlan p = plan_block(seqs, B, bt, buckets);
    ASSERT_EQ(p.bucket, smallest_bucket(buckets, n));
    EXPECT_EQ(p.R, B);
    const auto image = p.image();
    const auto o = p.offsets();
    for (int i = 0; i < p.bucket; ++i) {
      const bool real = i < n;
      EXPECT_EQ(image[size_t(o.seq_base + i)], real ? contexts[size_t(i)] : 0);
      EXPECT_EQ(image[size_t(o.seq_rows + i)], real ? B : 0);
      for (int j = 0; j < B; ++j) {
        const size_t r = size_t(i) * size_t(B) + size_t(j);
        const int64_t pos = real ? contexts[size_t(i)] + j : 0;
        EXPECT_EQ(image[size_t(o.row_pos) + r], pos);
        EXPECT_EQ(image[size_t(o.row_slot) + r],
                  real ? slot_by_walk(tables[size_t(i)], pos, bt) : -1);
        for (int k = 0; k < 32 * p.mask_words; ++k) {
          const uint32_t word = std::bit_cast<uint32_t>(
              image[size_t(o.row_mask) + r * size_t(p.mask_words) + k / 32]);
          EXPECT_EQ((word >> (k % 32)) & 1u, real && k < B ? 1u : 0u)
              << "row " << r << " bit " << k;
        }
      }
    }
  }
  const std::vector<int32_t> short_table = {0};
  const std::vector<int32_t> b1 = {1};
  EXPECT_THAT(error_of([&] {
                plan_block(std::vector<DraftSeq>{{short_table, 3}}, 2, 4, b1);
              }),
              HasSubstr("context 3 and its block of 2 need 2"));
  EXPECT_THAT(error_of([&] {
                plan_block(std::vector<DraftSeq>{{short_table, -1}}, 2, 4, b1);
              }),
              HasSubstr("context -1"));
  EXPECT_THAT(error_of([&] {
                plan_block(std::vector<DraftSeq>{{short_table, 0}}, 0, 4, b1);
              }),
              HasSubstr("B 0"));
}

}  // namespace
}  // namespace flashmap::paged
