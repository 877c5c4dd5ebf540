// paged::Ledger through the calls a device round makes, against the lengths the round implies:
// a block drafter's draft reserves its whole block and a verify cut short near max_tokens still
// finds room; commits keep the drafter's context behind the KV; copies share what the source
// holds (a drafting copy only what its context holds) and copy the block they first write.
// The engine-level mirror (tests/engine/test_paged_mirror.cpp) runs it under real rounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "error_of.h"
#include "paged/block_pool.h"
#include "paged/ledger.h"

namespace flashmap::paged {
namespace {

using ::flashmap::testing::error_of;
using ::testing::HasSubstr;

// A drafting sequence of `prompt` positions, prefilled.
SeqBlocks prefilled(Ledger& ledger, int64_t prompt, int64_t most, bool drafting = true) {
  SeqBlocks s;
  EXPECT_TRUE(ledger.open(s, most, drafting));
  std::vector<BlockCopy> copies;
  ledger.reserve(s, prompt, copies);
  EXPECT_TRUE(copies.empty());
  ledger.wrote(s, prompt, true);
  return s;
}

TEST(Ledger, ABlockDraftReservesItsBlockAndAShortVerifyFitsInIt) {
  BlockPool pool(64, 4);
  const int B = 5;  // DFlash: the anchor and B − 1 drafts at positions context ... context + B − 1
  Ledger ledger(pool, B);
  SeqBlocks s = prefilled(ledger, 7, 20);
  EXPECT_EQ(s.length, 7);
  EXPECT_EQ(s.committed, 7);
  std::vector<BlockCopy> copies;
  ledger.reserve_draft(s, copies);
  EXPECT_EQ(pool.length(s.kv), 7 + B);
  EXPECT_EQ(ledger.draft_first(s), 7);
  EXPECT_EQ(ledger.draft_count(), B);
  // Near max_tokens the round verifies the anchor and one draft: 2 rows, within the block.
  ledger.reserve(s, 2, copies);
  EXPECT_EQ(pool.length(s.kv), 7 + B);
  ledger.wrote(s, 2, false);
  EXPECT_EQ(s.length, 9);
  EXPECT_EQ(s.committed, 7);  // a verify's rows enter the context only when committed
  ledger.commit(s, 8, 1);     // the anchor kept, its draft rejected
  EXPECT_EQ(s.length, 8);
  EXPECT_EQ(s.committed, 8);
  EXPECT_EQ(pool.length(s.kv), 8);
  pool.check_invariants();
  ledger.close(s);
  EXPECT_EQ(s.kv, -1);
  EXPECT_EQ(pool.free_blocks(), 64);
  EXPECT_EQ(pool.reserved_blocks(), 0);
}

TEST(Ledger, AnAnchorDraftWritesOnePosition) {
  BlockPool pool(64, 4);
  Ledger ledger(pool, 0);  // FlashMap: the anchor's context entry at the first position it lacks
  SeqBlocks s = prefilled(ledger, 8, 30);
  std::vector<BlockCopy> copies;
  ledger.reserve_draft(s, copies);
  EXPECT_EQ(pool.length(s.kv), 9);
  EXPECT_EQ(ledger.draft_count(), 1);
  ledger.reserve(s, 5, copies);  // the anchor and 4 drafts
  ledger.wrote(s, 5, false);
  ledger.commit(s, 11, 3);
  EXPECT_EQ(s.committed, 11);
  EXPECT_EQ(pool.length(s.kv), 11);
}

TEST(Ledger, CommitsMustFollowTheContext) {
  BlockPool pool(64, 4);
  Ledger ledger(pool, 0);
  SeqBlocks s = prefilled(ledger, 8, 30);
  std::vector<BlockCopy> copies;
  ledger.reserve(s, 5, copies);
  ledger.wrote(s, 5, false);
  EXPECT_THAT(error_of([&] { ledger.commit(s, 11, 2); }), HasSubstr("do not follow"));
  EXPECT_THAT(error_of([&] { ledger.commit(s, 14, 1); }), HasSubstr("keeps 14 of 13"));
  EXPECT_THAT(error_of([&] { ledger.wrote(s, 1, false); }), HasSubstr("room for 13"));
  // A sequence that does not draft keeps no context.
  SeqBlocks plain = prefilled(ledger, 3, 10, false);
  EXPECT_EQ(plain.committed, 0);
  EXPECT_EQ(ledger.held(plain), 3);
  EXPECT_THAT(error_of([&] { ledger.reserve_draft(plain, copies); }), HasSubstr("does not draft"));
}

TEST(Ledger, CopiesHoldWhatTheSourceHoldsAndCopyTheBlockTheyWrite) {
  BlockPool pool(64, 4);
  Ledger ledger(pool, 0);
  SeqBlocks src = prefilled(ledger, 10, 30);
  std::vector<BlockCopy> copies;
  // Drafted and verified, not yet committed: the context holds 10 of 13 positions.
  ledger.reserve(src, 3, copies);
  ledger.wrote(src, 3, false);
  EXPECT_EQ(ledger.held(src), 10);
  SeqBlocks copy;
  EXPECT_FALSE(ledger.open(copy, 40, true, &src, 11));  // past the context: refused
  EXPECT_EQ(copy.kv, -1);
  EXPECT_TRUE(ledger.open(copy, 40, false, &src, 11));  // without drafting: the KV is there
  ledger.close(copy);
  ASSERT_TRUE(ledger.open(copy, 40, true, &src, 9));
  EXPECT_EQ(copy.length, 9);
  EXPECT_EQ(copy.committed, 9);
  // Position 9 falls in the block that holds 8..11, shared with the source: copied first.
  ledger.reserve(copy, 1, copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, pool.table(src.kv)[2]);
  EXPECT_EQ(copies[0].dst, pool.table(copy.kv)[2]);
  EXPECT_EQ(copies[0].tokens, 1);
  ledger.wrote(copy, 1, true);
  EXPECT_EQ(copy.committed, 10);
  // A drafting copy from a source that does not draft has no context to share.
  SeqBlocks plain = prefilled(ledger, 6, 10, false);
  SeqBlocks none;
  EXPECT_FALSE(ledger.open(none, 20, true, &plain, 5));
  EXPECT_THAT(error_of([&] { ledger.open(none, 20, false, &plain, 7); }),
              HasSubstr("7 positions of a sequence of 6"));
  pool.check_invariants();
}

TEST(Ledger, SettledSourcesAndAdmission) {
  BlockPool pool(9, 4);
  const int B = 4;
  Ledger ledger(pool, B);
  // Each asks for its positions and the B of a block draft: 2, 2, 4 and 2 blocks.
  const std::vector<int64_t> asks = {4, 4, 9, 4};
  EXPECT_EQ(ledger.admissible(asks, 100, 8), 3u);  // the fourth does not fit in the 9 blocks
  EXPECT_EQ(ledger.admissible(asks, 100, 2), 2u);  // two lanes left
  EXPECT_EQ(ledger.admissible(asks, 3, 8), 4u);    // each capped at 3 positions: 2 blocks
  SeqBlocks s = prefilled(ledger, 6, 24);  // promised 28 positions: 7 blocks, 2 of them held
  EXPECT_EQ(pool.reserved_blocks(), 5);
  EXPECT_EQ(ledger.admissible(asks, 100, 8), 1u);
  ledger.settle(s);  // it keeps its 2 blocks, the promise of 5 more goes back
  EXPECT_EQ(pool.reserved_blocks(), 0);
  EXPECT_EQ(ledger.admissible(asks, 100, 8), 2u);
  // A commit that does not follow the context changes nothing.
  SeqBlocks t = prefilled(ledger, 2, 3);
  std::vector<BlockCopy> copies;
  ledger.reserve(t, 1, copies);
  ledger.wrote(t, 1, false);
  EXPECT_THAT(error_of([&] { ledger.commit(t, 2, 2); }), HasSubstr("do not follow"));
  EXPECT_EQ(t.length, 3);
  EXPECT_EQ(pool.length(t.kv), 3);
}

}  // namespace
}  // namespace flashmap::paged
