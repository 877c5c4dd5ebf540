// BlockPool against a model of what a paged KV cache must do: every sequence reads back, through
// its block table, exactly the tokens written at its positions, in a simulated device memory to
// which only the pool's BlockCopy operations and the sequences' own writes are applied; a
// sequence admitted for max_positions can always grow to it, and the pool reserves exactly what
// growing every sequence to its maximum consumes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "paged/block_pool.h"

namespace flashmap::paged {
namespace {

using ::flashmap::testing::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int32_t> vec(std::span<const int32_t> s) {
  return {s.begin(), s.end()};
}

// The pool plus what the device would hold: storage[block][row] is the token last written
// there (-1: never), contents[seq] the tokens the sequence wrote (or inherited) in order.
struct Sim {
  BlockPool pool;
  std::vector<std::vector<int64_t>> storage;
  std::map<int, std::vector<int64_t>> contents;
  int64_t next_token = 0;
  int64_t copies_made = 0;

  Sim(int32_t num_blocks, int32_t block_tokens)
      : pool(num_blocks, block_tokens),
        storage(size_t(num_blocks), std::vector<int64_t>(size_t(block_tokens), -1)) {}

  int32_t bt() const { return pool.block_tokens(); }

  int open(int64_t max_positions) {
    const int id = pool.open(max_positions);
    if (id >= 0) {
      EXPECT_FALSE(contents.count(id)) << "open returned the id of an open sequence " << id;
      contents[id] = {};
    }
    return id;
  }

  int fork(int from, int64_t length, int64_t max_positions) {
    const int id = pool.fork(from, length, max_positions);
    if (id >= 0) {
      EXPECT_FALSE(contents.count(id)) << "fork returned the id of an open sequence " << id;
      const std::vector<int64_t>& src = contents.at(from);
      contents[id] = std::vector<int64_t>(src.begin(), src.begin() + length);
    }
    return id;
  }

  // Grows and writes a fresh token at each new position, after running the copies as the device
  // would. Returns the copies.
  std::vector<BlockCopy> grow(int seq, int64_t length) {
    const int64_t old = pool.length(seq);
    std::vector<BlockCopy> copies;
    pool.grow(seq, length, copies);
    EXPECT_LE(copies.size(), 1u) << "only the block the old length ends in can need a copy";
    for (const BlockCopy& c : copies) {
      EXPECT_TRUE(c.src >= 0 && c.src < pool.num_blocks() && c.dst >= 0 &&
                  c.dst < pool.num_blocks() && c.src != c.dst)
          << c.src << " -> " << c.dst;
      EXPECT_EQ(c.tokens, old % bt()) << "a copy carries the rows below the old length";
      EXPECT_EQ(pool.refcount(c.dst), 1) << "a copy is private to the sequence that writes it";
      for (int32_t r = 0; r < c.tokens; ++r)
        storage[size_t(c.dst)][size_t(r)] = storage[size_t(c.src)][size_t(r)];
      ++copies_made;
    }
    const auto table = pool.table(seq);
    for (int64_t p = old; p < length; ++p) {
      const int32_t block = table[size_t(p / bt())];
      EXPECT_EQ(pool.refcount(block), 1) << "sequence " << seq << " writes position " << p
                                         << " into block " << block << " that others hold";
      storage[size_t(block)][size_t(p % bt())] = next_token;
      contents[seq].push_back(next_token++);
    }
    return copies;
  }

  void truncate(int seq, int64_t length) {
    pool.truncate(seq, length);
    contents[seq].resize(size_t(length));
  }

  void close(int seq) {
    pool.close(seq);
    contents.erase(seq);
  }

  // Every sequence reads back its own tokens; the pool's own invariants hold.
  void check() const {
    pool.check_invariants();
    for (const auto& [seq, tokens] : contents) {
      ASSERT_EQ(pool.length(seq), int64_t(tokens.size())) << "sequence " << seq;
      const auto table = pool.table(seq);
      ASSERT_EQ(int64_t(table.size()), pool.blocks_for(pool.length(seq))) << "sequence " << seq;
      for (size_t p = 0; p < tokens.size(); ++p)
        ASSERT_EQ(storage[size_t(table[p / size_t(bt())])][p % size_t(bt())], tokens[p])
            << "sequence " << seq << " position " << p;
    }
  }

  // Everything the pool changes, to show that a refused operation changed nothing.
  struct State {
    int32_t free_blocks;
    int64_t reserved;
    std::map<int, std::vector<int32_t>> tables;
    std::map<int, int64_t> lengths;
    std::vector<int32_t> refcounts;
    bool operator==(const State&) const = default;
  };
  State state() const {
    State s{pool.free_blocks(), pool.reserved_blocks(), {}, {}, {}};
    for (const auto& [seq, tokens] : contents) {
      s.tables[seq] = vec(pool.table(seq));
      s.lengths[seq] = pool.length(seq);
    }
    for (int32_t b = 0; b < pool.num_blocks(); ++b) s.refcounts.push_back(pool.refcount(b));
    return s;
  }
};

// Grows every open sequence of a copy of `sim` to its max_positions, in random interleaved steps:
// none may fail, every sequence must read back its tokens, and the blocks consumed must be
// exactly the reservation (it promises no more and no less than growing everything takes).
void fill_copy(const Sim& sim, std::mt19937& rng) {
  Sim copy = sim;
  const int32_t free_before = copy.pool.free_blocks();
  const int64_t reserved_before = copy.pool.reserved_blocks();
  std::vector<int> growing;
  for (const auto& [seq, tokens] : copy.contents)
    if (copy.pool.length(seq) < copy.pool.max_positions(seq)) growing.push_back(seq);
  while (!growing.empty()) {
    const size_t k = rng() % growing.size();
    const int seq = growing[k];
    const int64_t room = copy.pool.max_positions(seq) - copy.pool.length(seq);
    const int64_t to = copy.pool.length(seq) + 1 + int64_t(rng() % uint64_t(room));
    ASSERT_EQ(error_of([&] { copy.grow(seq, to); }), "<no error>")
        << "growing sequence " << seq << " to " << to << " within its max_positions";
    if (to == copy.pool.max_positions(seq)) growing.erase(growing.begin() + int64_t(k));
  }
  ASSERT_NO_FATAL_FAILURE(copy.check());
  EXPECT_EQ(free_before - copy.pool.free_blocks(), reserved_before)
      << "growing every sequence to its maximum took a different number of blocks than reserved";
  EXPECT_EQ(copy.pool.reserved_blocks(), 0);
}

struct Counts {
  int opened = 0, open_refused = 0, forked = 0, fork_refused = 0, shared_forks = 0;
  int truncated = 0, truncate_refused = 0, closed = 0, settled = 0;
};

void random_ops(uint32_t seed, int ops, Counts& n, int64_t& copies) {
  std::mt19937 rng(seed);
  const int32_t bts[] = {1, 2, 3, 4, 8};
  const int32_t bt = bts[rng() % 5];
  const int32_t num_blocks = 8 + int32_t(rng() % 40);
  Sim sim(num_blocks, bt);
  const int64_t max_len = 5 * int64_t(bt) + 1;
  auto pick = [&]() {
    auto it = sim.contents.begin();
    std::advance(it, int64_t(rng() % sim.contents.size()));
    return it->first;
  };
  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << " op " << op << " bt " << bt << " blocks " << num_blocks);
    const int kind = int(rng() % 100);
    const bool any = !sim.contents.empty();
    const int64_t slack = int64_t(sim.pool.free_blocks()) - sim.pool.reserved_blocks();
    if (!any || kind < 14) {
      const int64_t max_positions = int64_t(rng() % uint64_t(max_len + 1));
      const int id = sim.open(max_positions);
      // Admission is exact: a fresh sequence needs its blocks and nothing more.
      ASSERT_EQ(id >= 0, sim.pool.blocks_for(max_positions) <= slack)
          << "open(" << max_positions << ") with " << slack << " unreserved blocks";
      (id >= 0 ? n.opened : n.open_refused)++;
    } else if (kind < 30) {
      const int from = pick();
      const int64_t len = sim.pool.length(from);
      // Half at a block boundary or just inside one, where the sharing rules differ.
      int64_t length = int64_t(rng() % uint64_t(len + 1));
      if (rng() % 2 && len >= bt) length = length / bt * bt + (rng() % 2 ? 0 : 1);
      length = std::min(length, len);
      const int64_t max_positions = length + int64_t(rng() % uint64_t(max_len + 1));
      const Sim::State before = sim.state();
      const int id = sim.fork(from, length, max_positions);
      const int64_t beyond = sim.pool.blocks_for(max_positions) - sim.pool.blocks_for(length);
      const int64_t partial = length % bt != 0 ? 1 : 0;
      if (id >= 0) {
        ASSERT_GE(slack, beyond) << "fork admitted without room for its own new blocks";
        ++n.forked;
        if (length > 0) ++n.shared_forks;
      } else {
        ASSERT_LT(slack, beyond + partial)
            << "fork(" << from << ", " << length << ", " << max_positions
            << ") refused although its new blocks and a copy fit";
        ASSERT_TRUE(sim.state() == before) << "a refused fork changed the pool";
        ++n.fork_refused;
      }
    } else if (kind < 65) {
      const int seq = pick();
      const int64_t len = sim.pool.length(seq), room = sim.pool.max_positions(seq) - len;
      if (room == 0) continue;
      const int64_t to = len + 1 + int64_t(rng() % uint64_t(std::min<int64_t>(room, 2 * bt + 1)));
      ASSERT_EQ(error_of([&] { sim.grow(seq, to); }), "<no error>")
          << "grow(" << seq << ", " << to << ") within max_positions "
          << sim.pool.max_positions(seq);
    } else if (kind < 85) {
      const int seq = pick();
      const int64_t len = sim.pool.length(seq);
      const int64_t length =
          rng() % 4 == 0 ? 0 : len - int64_t(rng() % uint64_t(std::min<int64_t>(len, 2 * bt) + 1));
      // A cut can only be refused when it gives up blocks others hold (or reopens a shared block
      // for writing), each costing one unreserved block to replace.
      const auto table = sim.pool.table(seq);
      int64_t shared_cost = 0;
      for (size_t i = size_t(sim.pool.blocks_for(length)); i < table.size(); ++i)
        if (sim.pool.refcount(table[i]) > 1) ++shared_cost;
      if (length < len && length % bt != 0 && sim.pool.refcount(table[size_t(length / bt)]) > 1)
        ++shared_cost;
      const Sim::State before = sim.state();
      const std::string err = error_of([&] { sim.truncate(seq, length); });
      if (err == "<no error>") {
        ++n.truncated;
      } else {
        ASSERT_THAT(err, HasSubstr("BlockPool::truncate"));
        ASSERT_LT(slack, shared_cost) << "truncate refused: " << err;
        ASSERT_TRUE(sim.state() == before) << "a refused truncate changed the pool";
        ++n.truncate_refused;
      }
    } else if (kind < 90) {
      // A finished sequence kept to be forked from: it gives back what was promised for its
      // growth (and, no longer a writer, possibly a copy), and the others can still grow.
      const int seq = pick();
      const int64_t growth =
          sim.pool.blocks_for(sim.pool.max_positions(seq)) - int64_t(sim.pool.table(seq).size());
      const int64_t reserved = sim.pool.reserved_blocks();
      sim.pool.settle(seq);
      ASSERT_EQ(sim.pool.max_positions(seq), sim.pool.length(seq));
      ASSERT_LE(sim.pool.reserved_blocks(), reserved - growth);
      ASSERT_GE(sim.pool.reserved_blocks(), reserved - growth - 1);
      ++n.settled;
    } else {
      sim.close(pick());
      ++n.closed;
    }
    ASSERT_NO_FATAL_FAILURE(sim.check());
    if (op % 16 == 0) {
      ASSERT_NO_FATAL_FAILURE(fill_copy(sim, rng));
    }
  }
  copies += sim.copies_made;
  // Closing everything gives every block back.
  while (!sim.contents.empty()) sim.close(sim.contents.begin()->first);
  sim.check();
  EXPECT_EQ(sim.pool.free_blocks(), num_blocks);
  EXPECT_EQ(sim.pool.reserved_blocks(), 0);
}

TEST(BlockPool, RandomOperationsAgainstModel) {
  Counts n;
  int64_t copies = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    ASSERT_NO_FATAL_FAILURE(random_ops(seed, 2000, n, copies));
  }
  // The run reached every path it is meant to test.
  EXPECT_GT(n.opened, 100);
  EXPECT_GT(n.open_refused, 10);
  EXPECT_GT(n.shared_forks, 100);
  EXPECT_GT(n.fork_refused, 10);
  EXPECT_GT(n.truncated, 100);
  EXPECT_GT(n.truncate_refused, 10);
  EXPECT_GT(n.closed, 100);
  EXPECT_GT(n.settled, 100);
  EXPECT_GT(copies, 100);
  std::printf(
      "opened %d (refused %d), forked %d (refused %d, sharing %d), truncated %d "
      "(refused %d), settled %d, closed %d, copies %lld\n",
      n.opened, n.open_refused, n.forked, n.fork_refused, n.shared_forks, n.truncated,
      n.truncate_refused, n.settled, n.closed, static_cast<long long>(copies));
}

TEST(BlockPool, FreshPoolAndBlocksFor) {
  BlockPool pool(10, 4);
  EXPECT_EQ(pool.num_blocks(), 10);
  EXPECT_EQ(pool.block_tokens(), 4);
  EXPECT_EQ(pool.free_blocks(), 10);
  EXPECT_EQ(pool.reserved_blocks(), 0);
  EXPECT_EQ(pool.blocks_for(0), 0);
  EXPECT_EQ(pool.blocks_for(1), 1);
  EXPECT_EQ(pool.blocks_for(4), 1);
  EXPECT_EQ(pool.blocks_for(5), 2);
  EXPECT_EQ(pool.blocks_for(40), 10);
  pool.check_invariants();
}

TEST(BlockPool, BlockTokensOne) {
  Sim sim(8, 1);
  const int a = sim.open(5);
  ASSERT_GE(a, 0);
  EXPECT_EQ(sim.pool.reserved_blocks(), 5);
  EXPECT_TRUE(sim.grow(a, 3).empty());
  EXPECT_EQ(sim.pool.table(a).size(), 3u);
  EXPECT_EQ(sim.pool.reserved_blocks(), 2);
  // Every fork point is a block boundary: nothing is ever copied.
  const int b = sim.fork(a, 2, 4);
  ASSERT_GE(b, 0);
  EXPECT_EQ(sim.pool.reserved_blocks(), 2 + 2);
  EXPECT_TRUE(sim.grow(b, 4).empty());
  EXPECT_TRUE(sim.grow(a, 5).empty());
  sim.check();
  EXPECT_EQ(sim.pool.refcount(sim.pool.table(a)[0]), 2);
  EXPECT_EQ(sim.pool.refcount(sim.pool.table(a)[2]), 1);
  EXPECT_EQ(sim.pool.reserved_blocks(), 0);
  EXPECT_EQ(sim.pool.free_blocks(), 8 - 5 - 2);
}

TEST(BlockPool, ForkAtABlockBoundarySharesWithoutCopying) {
  Sim sim(8, 4);
  const int a = sim.open(16);
  sim.grow(a, 8);
  const int b = sim.fork(a, 8, 12);
  ASSERT_GE(b, 0);
  EXPECT_EQ(vec(sim.pool.table(b)), vec(sim.pool.table(a)));
  EXPECT_EQ(sim.pool.refcount(sim.pool.table(a)[0]), 2);
  EXPECT_EQ(sim.pool.refcount(sim.pool.table(a)[1]), 2);
  // a may add 2 blocks, b 1: the shared prefix costs nothing more.
  EXPECT_EQ(sim.pool.reserved_blocks(), 2 + 1);
  EXPECT_TRUE(sim.grow(b, 10).empty());
  EXPECT_TRUE(sim.grow(a, 9).empty());
  EXPECT_NE(sim.pool.table(a)[2], sim.pool.table(b)[2]);
  sim.check();
}

TEST(BlockPool, ForkInsideABlockCopiesItOnFirstWrite) {
  Sim sim(8, 4);
  const int a = sim.open(16);
  sim.grow(a, 6);
  const int32_t shared = sim.pool.table(a)[1];
  const int b = sim.fork(a, 6, 16);
  ASSERT_GE(b, 0);
  // Both may write into the shared partial block; one copy covers it (the last holder writes
  // in place).
  EXPECT_EQ(sim.pool.reserved_blocks(), (4 - 2) + (4 - 2) + 1);
  const std::vector<BlockCopy> copies = sim.grow(b, 7);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared);
  EXPECT_EQ(copies[0].tokens, 2);
  EXPECT_EQ(sim.pool.table(b)[1], copies[0].dst);
  EXPECT_EQ(sim.pool.table(b)[0], sim.pool.table(a)[0]);
  EXPECT_EQ(sim.pool.refcount(shared), 1);
  EXPECT_TRUE(sim.grow(a, 7).empty()) << "a holds the block alone now";
  EXPECT_EQ(sim.pool.table(a)[1], shared);
  sim.check();
}

TEST(BlockPool, ForkOfAShorterPrefixKeepsTheParentsRows) {
  // b holds 6 of a's 8 positions: its writes at 6 and 7 must not land on a's.
  Sim sim(8, 4);
  const int a = sim.open(8);
  sim.grow(a, 8);
  const int b = sim.fork(a, 6, 8);
  ASSERT_GE(b, 0);
  // a is full and never writes again; b needs its copy.
  EXPECT_EQ(sim.pool.reserved_blocks(), 1);
  const std::vector<BlockCopy> copies = sim.grow(b, 8);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].tokens, 2);
  sim.check();
  EXPECT_EQ(sim.pool.reserved_blocks(), 0);
}

TEST(BlockPool, ForkThatCannotGrowReservesTheParentsCopy) {
  // b may not grow, but while it holds a's partial block a must copy it to write.
  Sim sim(3, 4);
  const int a = sim.open(8);
  sim.grow(a, 6);
  EXPECT_EQ(sim.pool.reserved_blocks(), 0);
  const int b = sim.fork(a, 6, 6);
  ASSERT_GE(b, 0);
  EXPECT_EQ(sim.pool.reserved_blocks(), 1);
  // Another reader adds nothing (a copies once, whoever else holds the block), another writer
  // one more copy: no room for it.
  EXPECT_GE(sim.fork(a, 6, 6), 0);
  EXPECT_EQ(sim.pool.reserved_blocks(), 1);
  EXPECT_EQ(sim.fork(a, 6, 7), -1);
  EXPECT_EQ(sim.grow(a, 8).size(), 1u);
  sim.check();
  EXPECT_EQ(sim.pool.free_blocks(), 0);
  // a holds a private copy now: forking it at a boundary costs nothing.
  EXPECT_GE(sim.fork(a, 8, 8), 0);
  sim.check();
}

TEST(BlockPool, ForkOfAFork) {
  Sim sim(16, 4);
  const int a = sim.open(16);
  sim.grow(a, 10);
  const int b = sim.fork(a, 9, 16);
  ASSERT_GE(b, 0);
  const int c = sim.fork(b, 5, 16);
  ASSERT_GE(c, 0);
  const auto ta = vec(sim.pool.table(a));
  EXPECT_EQ(sim.pool.refcount(ta[0]), 3);
  EXPECT_EQ(sim.pool.refcount(ta[1]), 3);
  EXPECT_EQ(sim.pool.refcount(ta[2]), 2);
  sim.grow(c, 12);
  sim.grow(b, 12);
  sim.grow(a, 12);
  sim.check();
  EXPECT_EQ(sim.pool.refcount(ta[0]), 3) << "block 0 is full in all three: never copied";
  sim.close(b);
  sim.check();
  EXPECT_EQ(sim.pool.refcount(ta[0]), 2);
}

TEST(BlockPool, TruncateToZeroAndRegrowReusesTheSameBlocks) {
  Sim sim(8, 4);
  const int a = sim.open(20);
  sim.grow(a, 11);
  const auto table = vec(sim.pool.table(a));
  EXPECT_EQ(sim.pool.reserved_blocks(), 2);
  sim.truncate(a, 0);
  sim.check();
  EXPECT_TRUE(sim.pool.table(a).empty());
  EXPECT_EQ(sim.pool.free_blocks(), 8);
  EXPECT_EQ(sim.pool.reserved_blocks(), 5);
  EXPECT_TRUE(sim.grow(a, 11).empty());
  EXPECT_EQ(vec(sim.pool.table(a)), table) << "the blocks just released come back in order";
  sim.check();
}

TEST(BlockPool, RejectedDraftsGiveBackTheirBlocks) {
  // The decoding pattern: grow by a block of drafts, keep a prefix, grow again.
  Sim sim(6, 4);
  const int a = sim.open(24);
  sim.grow(a, 5);
  sim.grow(a, 5 + 9);
  const auto table = vec(sim.pool.table(a));
  sim.truncate(a, 7);
  sim.check();
  EXPECT_EQ(vec(sim.pool.table(a)), std::vector<int32_t>(table.begin(), table.begin() + 2));
  sim.grow(a, 7 + 9);
  EXPECT_EQ(vec(sim.pool.table(a)), table);
  sim.check();
}

TEST(BlockPool, FreedBlocksAreReusedMostRecentFirst) {
  BlockPool pool(8, 2);
  std::vector<BlockCopy> copies;
  const int a = pool.open(4), b = pool.open(4);
  pool.grow(a, 4, copies);
  pool.grow(b, 4, copies);
  EXPECT_THAT(vec(pool.table(a)), ElementsAre(0, 1));
  EXPECT_THAT(vec(pool.table(b)), ElementsAre(2, 3));
  pool.close(a);
  pool.close(b);
  const int c = pool.open(8);
  EXPECT_EQ(c, b) << "the most recently closed id comes back first";
  pool.grow(c, 8, copies);
  EXPECT_THAT(vec(pool.table(c)), ElementsAre(2, 3, 0, 1));
  EXPECT_TRUE(copies.empty());
  pool.check_invariants();
}

TEST(BlockPool, CloseInAnyOrderFreesABlockWithItsLastHolder) {
  for (const bool parent_first : {true, false}) {
    Sim sim(8, 4);
    const int a = sim.open(12);
    sim.grow(a, 10);
    const int b = sim.fork(a, 10, 12);
    const int c = sim.fork(a, 4, 12);
    const auto ta = vec(sim.pool.table(a));
    EXPECT_EQ(sim.pool.free_blocks(), 5);
    sim.close(parent_first ? a : b);
    sim.check();
    EXPECT_EQ(sim.pool.free_blocks(), 5) << "b still holds all of a's blocks";
    sim.close(parent_first ? b : a);
    sim.check();
    EXPECT_EQ(sim.pool.free_blocks(), 7) << "only c's block 0 is left";
    EXPECT_EQ(sim.pool.refcount(ta[0]), 1);
    EXPECT_EQ(sim.pool.refcount(ta[1]), 0);
    sim.close(c);
    sim.check();
    EXPECT_EQ(sim.pool.free_blocks(), 8);
    EXPECT_EQ(sim.pool.reserved_blocks(), 0);
  }
}

TEST(BlockPool, OpenIsRefusedWhileReservationsHoldThePoolAndAcceptedAfterAClose) {
  Sim sim(4, 4);
  const int a = sim.open(12);
  ASSERT_GE(a, 0);
  // No block is allocated yet, but three are promised.
  EXPECT_EQ(sim.pool.free_blocks(), 4);
  EXPECT_EQ(sim.pool.reserved_blocks(), 3);
  const int b = sim.open(4);
  ASSERT_GE(b, 0);
  const Sim::State before = sim.state();
  EXPECT_EQ(sim.open(1), -1);
  EXPECT_EQ(sim.open(100), -1);
  EXPECT_TRUE(sim.state() == before);
  EXPECT_GE(sim.open(0), 0) << "an empty sequence needs nothing";
  sim.grow(a, 12);
  sim.grow(b, 4);
  sim.check();
  sim.close(b);
  const int c = sim.open(4);
  ASSERT_GE(c, 0);
  sim.grow(c, 4);
  sim.check();
  EXPECT_EQ(BlockPool(4, 4).open(17), -1) << "more than the whole pool";
}

TEST(BlockPool, TruncateIsRefusedWhenItsRegrowthCannotBeCovered) {
  {
    // a gives up a block b still holds: regrowing would need a fourth block.
    Sim sim(3, 4);
    const int a = sim.open(12);
    sim.grow(a, 12);
    const int b = sim.fork(a, 12, 12);
    ASSERT_GE(b, 0);
    const Sim::State before = sim.state();
    EXPECT_THAT(error_of([&] { sim.pool.truncate(a, 8); }),
                HasSubstr("BlockPool::truncate: sequence 0 cannot drop to length 8"));
    EXPECT_TRUE(sim.state() == before);
    sim.check();
    sim.close(b);
    sim.truncate(a, 8);
    sim.check();
    sim.grow(a, 12);
    sim.check();
  }
  {
    // a would write again into the partial block it shares with b: a copy with no room for it.
    Sim sim(2, 4);
    const int a = sim.open(8);
    sim.grow(a, 8);
    const int b = sim.fork(a, 8, 8);
    ASSERT_GE(b, 0);
    EXPECT_THAT(error_of([&] { sim.pool.truncate(a, 6); }), HasSubstr("cannot drop to length 6"));
    sim.check();
    EXPECT_EQ(sim.pool.length(a), 8);
    sim.close(b);
    sim.truncate(a, 6);
    EXPECT_TRUE(sim.grow(a, 8).empty()) << "a holds the block alone";
    sim.check();
  }
}

TEST(BlockPool, SequenceIdsAreReused) {
  BlockPool pool(4, 4);
  const int a = pool.open(4), b = pool.open(4);
  EXPECT_NE(a, b);
  pool.close(a);
  EXPECT_EQ(pool.fork(b, 0, 4), a);
  pool.check_invariants();
}

TEST(BlockPool, BadArgumentsNameThem) {
  EXPECT_THAT(error_of([] { BlockPool(0, 4); }), HasSubstr("num_blocks 0"));
  EXPECT_THAT(error_of([] { BlockPool(4, 0); }), HasSubstr("block_tokens 0"));
  EXPECT_THAT(error_of([] { BlockPool(1 << 20, 1 << 12); }), HasSubstr("int32"));
  BlockPool pool(4, 4);
  std::vector<BlockCopy> copies;
  EXPECT_THAT(error_of([&] { pool.open(-1); }), HasSubstr("max_positions -1"));
  EXPECT_THAT(error_of([&] { pool.blocks_for(-3); }), HasSubstr("positions -3"));
  const int a = pool.open(8);
  pool.grow(a, 5, copies);
  EXPECT_THAT(error_of([&] { pool.grow(7, 1, copies); }), HasSubstr("seq 7 is not an open"));
  EXPECT_THAT(error_of([&] { pool.grow(-1, 1, copies); }), HasSubstr("seq -1"));
  EXPECT_THAT(error_of([&] { pool.grow(a, 9, copies); }),
              HasSubstr("length 9 passes the max_positions 8"));
  EXPECT_THAT(error_of([&] { pool.grow(a, 4, copies); }), HasSubstr("length 4 is below"));
  EXPECT_THAT(error_of([&] { pool.truncate(a, 6); }), HasSubstr("length 6 is outside [0, 5]"));
  EXPECT_THAT(error_of([&] { pool.truncate(a, -1); }), HasSubstr("length -1"));
  EXPECT_THAT(error_of([&] { pool.fork(a, 6, 8); }), HasSubstr("length 6 is outside [0, 5]"));
  EXPECT_THAT(error_of([&] { pool.fork(a, 4, 3); }), HasSubstr("max_positions 3 is below"));
  EXPECT_THAT(error_of([&] { pool.fork(3, 0, 3); }), HasSubstr("BlockPool::fork: seq 3"));
  EXPECT_THAT(error_of([&] { pool.refcount(4); }), HasSubstr("block 4"));
  EXPECT_THAT(error_of([&] { (void)pool.table(2); }), HasSubstr("BlockPool::table: seq 2"));
  pool.close(a);
  EXPECT_THAT(error_of([&] { pool.close(a); }), HasSubstr("BlockPool::close: seq 0"));
  EXPECT_THAT(error_of([&] { (void)pool.length(a); }), HasSubstr("seq 0 is not an open"));
  EXPECT_TRUE(copies.empty());
  pool.check_invariants();
}

}  // namespace
}  // namespace flashmap::paged
