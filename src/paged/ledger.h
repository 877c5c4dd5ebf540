// A paged device's per-sequence bookkeeping through a round, on the host: how many positions a
// sequence's KV cache holds, how many its drafter's context holds (a batched drafter keeps it in
// a pool beside the KV cache, in the same blocks), and which BlockPool sequence holds their
// blocks. Every step that writes asks the ledger for room first and gets the block copies to run
// before the write (copy on write, in both pools). The CUDA backend keeps its sequences with it;
// tests run it under the engine beside the CPU reference (tests/engine/paged_mirror.h), so that
// the lengths it keeps and the blocks it writes are checked without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "paged/block_pool.h"

namespace flashmap::paged {

struct SeqBlocks {
  int kv = -1;            // its BlockPool sequence (-1: none)
  int64_t length = 0;     // positions its KV cache holds
  int64_t committed = 0;  // positions its drafter context holds (drafting sequences)
  bool drafting = false;
};

class Ledger {
 public:
  // extra: positions past the committed ones that a block drafter's draft writes (its block:
  // DFlash); 0: a draft writes the anchor's position only (FlashMap's context entry of the
  // anchor). A sequence reserves extra positions beyond its own for them.
  Ledger(BlockPool& pool, int extra);

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  int extra() const { return extra_; }

  // Opens `s` for up to `most` positions: fresh, or (from) holding the first `length` positions
  // of `from` (its KV and, when drafting, its drafter context, shared block by block). False,
  // with `s` unchanged, when the pool cannot promise the growth, or when a drafting copy's source
  // lacks drafter context for those positions. Throws on a length outside [1, from's length] or
  // above most.
  bool open(SeqBlocks& s, int64_t most, bool drafting, const SeqBlocks* from = nullptr,
            int64_t length = 0);
  // Blocks for n positions after s.length (a prefill chunk, a step's rows); a draft that took
  // the table further keeps it. The copies to run first are appended to `copies`.
  void reserve(SeqBlocks& s, int64_t n, std::vector<BlockCopy>& copies);
  // Blocks for what a draft writes to the drafter's pool: positions [committed, committed +
  // max(extra, 1)), the anchor's at least.
  void reserve_draft(SeqBlocks& s, std::vector<BlockCopy>& copies);
  // The positions a draft writes: [first, first + count).
  int64_t draft_first(const SeqBlocks& s) const { return s.committed; }
  int64_t draft_count() const { return extra_ > 0 ? extra_ : 1; }
  // n positions written after s.length (reserved first); a prefill's enter the drafter's context
  // too (they are all kept).
  void wrote(SeqBlocks& s, int64_t n, bool prefill);
  // After acceptance: the first `length` positions stay (blocks wholly past them go back), and the
  // step's first `drafted` rows (the anchor and the accepted drafts, at positions length −
  // drafted onwards) enter the drafter's context. Throws (nothing changes) when they do not follow
  // its context.
  void commit(SeqBlocks& s, int64_t length, int64_t drafted);
  // What a copy of it can hold: its KV positions, and no more than its drafter context's.
  int64_t held(const SeqBlocks& s) const;
  // It will not grow again (a prefix kept to copy from): its promise of growth goes back.
  void settle(SeqBlocks& s);
  void close(SeqBlocks& s);
  // How many of these sequences, in order, could open now (each for up to positions[i], at most
  // `capacity`) with `lanes` sequences left to hold them.
  size_t admissible(std::span<const int64_t> positions, int64_t capacity, int64_t lanes) const;

 private:
  BlockPool& pool_;
  int extra_;
};

}  // namespace flashmap::paged
