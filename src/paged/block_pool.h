// A paged KV cache's bookkeeping on the host: which fixed-size blocks of the device's K and V
// pools hold which sequence's positions. The device holds, per layer, K and V pools of
// `num_blocks` blocks of `block_tokens` positions; a sequence's positions live in its block
// table (block ids in order): position p is at block table[p / block_tokens], row
// p % block_tokens. Blocks are reference-counted so that a fork (a shared prompt prefix) shares
// its parent's blocks instead of copying them; a block is copied only when a holder is about to
// write into it while others still read it (copy on write).
//
// Admission comes with a guarantee: a sequence opened for max_positions can always grow to that
// length, so a batch never stalls or preempts mid-generation for memory. The pool keeps enough
// blocks unallocated for every open sequence's remaining need (its reservation): the blocks its
// table still lacks up to max_positions, plus the copies that shared blocks may need. A shared
// block b whose holders include w writers (holders whose partial last block it is and who may
// still grow) needs min(w, refcount(b) - 1) copies at most: each writer copies before writing
// while another holder remains, and a last writer holding it alone writes in place.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashmap::paged {

// Copy the first `tokens` rows of block src into block dst (every layer's K and V), before the
// next forward writes into dst.
struct BlockCopy {
  int32_t src = 0, dst = 0, tokens = 0;
  bool operator==(const BlockCopy&) const = default;
};

class BlockPool {
 public:
  // Slots (block * block_tokens + row) are int32 on the device, so the pool's slot count must fit.
  BlockPool(int32_t num_blocks, int32_t block_tokens);

  int32_t block_tokens() const { return block_tokens_; }
  int32_t num_blocks() const { return int32_t(refcount_.size()); }
  int32_t free_blocks() const { return int32_t(free_.size()); }
  int32_t blocks_for(int64_t positions) const;  // ceil(positions / block_tokens)

  // A new empty sequence that may grow to max_positions; its id, or -1 (nothing changes) when the
  // pool cannot reserve the blocks for it.
  int open(int64_t max_positions);
  // A sequence holding the first `length` positions of `from` (length <= from's length), sharing
  // its blocks, that may grow to max_positions (>= length). Its reservation counts only what it
  // may newly allocate: the blocks beyond the shared ones, plus one copy when the shared prefix
  // ends inside a block that someone may still write. -1 (nothing changes) when the pool cannot
  // reserve that.
  int fork(int from, int64_t length, int64_t max_positions);
  // Makes room for positions [0, length) (length from the current length up to max_positions),
  // allocating blocks; never fails within max_positions. When the positions [old length, length)
  // fall into a shared block, the sequence gets a private copy of it: a BlockCopy with the rows
  // below the old length is appended to `copies`, for the caller to run before writing.
  void grow(int seq, int64_t length, std::vector<BlockCopy>& copies);
  // Keeps positions [0, length) (length <= the current length): blocks wholly past it are
  // released (freed when no other sequence holds them). Regrowing reuses the blocks just released
  // (they are the most recently freed), so rejected drafts cost no fresh memory. Throws (nothing
  // changes) when the cut would leave some open sequence's growth uncovered: possible only when
  // it releases blocks that other sequences still hold, or reopens a shared block for writing, and
  // no unreserved block is left to stand in for them.
  void truncate(int seq, int64_t length);
  // The sequence will not grow again (kept only to be read or forked from): its max_positions
  // becomes its length and the blocks promised for its growth go back to the pool.
  void settle(int seq);
  // Releases the sequence's blocks and its reservation; its id may be reused by a later open/fork.
  void close(int seq);

  int64_t length(int seq) const;
  int64_t max_positions(int seq) const;
  std::span<const int32_t> table(int seq) const;
  int32_t refcount(int32_t block) const;
  // Blocks promised to open sequences but not yet allocated; free_blocks() never falls below it.
  int64_t reserved_blocks() const { return reserved_; }

  // For tests (O(num_blocks + total table length)): refcounts equal the number of tables holding
  // each block; the free list holds exactly the blocks with refcount 0, each once; tables fit
  // their lengths; the reservation equals its definition; free_blocks() >= reserved_blocks().
  // Throws flashmap::InternalError when one does not hold.
  void check_invariants() const;

 private:
  struct Seq {
    bool open = false;
    int64_t length = 0, max_positions = 0;
    std::vector<int32_t> table;
    int32_t writing = -1;  // the block it is counted as a writer of (-1: none)
  };

  int64_t blocks64(int64_t positions) const;  // blocks_for without the int32 check
  // The block a sequence may still write below its current length: its partial last block, if it
  // may grow; -1 otherwise.
  int32_t writable_block(const Seq& s) const;
  static int64_t copies_needed(int32_t refcount, int32_t writers);
  // The change in reserved blocks if `block`'s refcount and writer count changed by these.
  int64_t reserve_delta(int32_t block, int d_refcount, int d_writers) const;
  // Applies such a change, keeping reserved_ and the free list in step.
  void adjust(int32_t block, int d_refcount, int d_writers);
  void update_writer(Seq& s);
  int32_t allocate();
  int new_id();
  Seq& at(int seq, const char* op);
  const Seq& at(int seq, const char* op) const;

  int32_t block_tokens_;
  std::vector<int32_t> refcount_, writers_;  // per block
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<Seq> seqs_;
  std::vector<int> free_ids_;
  int64_t reserved_ = 0;
};

}  // namespace flashmap::paged
