#include "paged/block_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "core/check.h"

namespace flashmap::paged {

namespace {
template <typename... Args>
void require(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok)
    throw InternalError("BlockPool invariant: " + fmt::format(f, std::forward<Args>(args)...));
}
}  // namespace

BlockPool::BlockPool(int32_t num_blocks, int32_t block_tokens) : block_tokens_(block_tokens) {
  FLASHMAP_CHECK(block_tokens >= 1, "BlockPool: block_tokens {} must be at least 1", block_tokens);
  FLASHMAP_CHECK(num_blocks >= 1, "BlockPool: num_blocks {} must be at least 1", num_blocks);
  FLASHMAP_CHECK(int64_t(num_blocks) * block_tokens <= std::numeric_limits<int32_t>::max(),
                 "BlockPool: num_blocks {} x block_tokens {} slots do not fit the int32 slot "
                 "indices of the device",
                 num_blocks, block_tokens);
  refcount_.assign(size_t(num_blocks), 0);
  writers_.assign(size_t(num_blocks), 0);
  // Block 0 on top, so that a fresh pool hands out blocks in ascending order.
  free_.resize(size_t(num_blocks));
  for (int32_t i = 0; i < num_blocks; ++i) free_[size_t(i)] = num_blocks - 1 - i;
}

int32_t BlockPool::blocks_for(int64_t positions) const {
  FLASHMAP_CHECK(positions >= 0, "BlockPool::blocks_for: positions {} is negative", positions);
  const int64_t n = blocks64(positions);
  FLASHMAP_CHECK(n <= std::numeric_limits<int32_t>::max(),
                 "BlockPool::blocks_for: positions {} need more than 2^31 blocks", positions);
  return int32_t(n);
}

int64_t BlockPool::blocks64(int64_t positions) const {
  return positions / block_tokens_ + (positions % block_tokens_ != 0 ? 1 : 0);
}

int32_t BlockPool::writable_block(const Seq& s) const {
  return s.length % block_tokens_ != 0 && s.max_positions > s.length ? s.table.back() : -1;
}

int64_t BlockPool::copies_needed(int32_t refcount, int32_t writers) {
  return refcount > 0 ? std::min(writers, refcount - 1) : 0;
}

int64_t BlockPool::reserve_delta(int32_t block, int d_refcount, int d_writers) const {
  const int32_t rc = refcount_[size_t(block)], w = writers_[size_t(block)];
  return copies_needed(rc + d_refcount, w + d_writers) - copies_needed(rc, w);
}

void BlockPool::adjust(int32_t block, int d_refcount, int d_writers) {
  reserved_ += reserve_delta(block, d_refcount, d_writers);
  int32_t& rc = refcount_[size_t(block)];
  int32_t& w = writers_[size_t(block)];
  rc += d_refcount;
  w += d_writers;
  FLASHMAP_ASSERT(w >= 0 && rc >= w);
  if (d_refcount < 0 && rc == 0) free_.push_back(block);
}

void BlockPool::update_writer(Seq& s) {
  const int32_t block = writable_block(s);
  if (block == s.writing) return;
  if (s.writing >= 0) adjust(s.writing, 0, -1);
  if (block >= 0) adjust(block, 0, 1);
  s.writing = block;
}

int32_t BlockPool::allocate() {
  // Callers allocate only against a reservation, and free_blocks() >= reserved_blocks().
  FLASHMAP_ASSERT(!free_.empty());
  const int32_t block = free_.back();
  free_.pop_back();
  FLASHMAP_ASSERT(refcount_[size_t(block)] == 0);
  refcount_[size_t(block)] = 1;
  return block;
}

int BlockPool::new_id() {
  if (!free_ids_.empty()) {
    const int id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  seqs_.emplace_back();
  return int(seqs_.size()) - 1;
}

BlockPool::Seq& BlockPool::at(int seq, const char* op) {
  return const_cast<Seq&>(std::as_const(*this).at(seq, op));
}

const BlockPool::Seq& BlockPool::at(int seq, const char* op) const {
  FLASHMAP_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].open,
                 "BlockPool::{}: seq {} is not an open sequence", op, seq);
  return seqs_[size_t(seq)];
}

int BlockPool::open(int64_t max_positions) {
  FLASHMAP_CHECK(max_positions >= 0, "BlockPool::open: max_positions {} is negative",
                 max_positions);
  const int64_t need = blocks64(max_positions);
  if (need > free_blocks() - reserved_) return -1;
  const int id = new_id();
  Seq& s = seqs_[size_t(id)];
  s.open = true;
  s.length = 0;
  s.max_positions = max_positions;
  s.table.clear();
  s.writing = -1;
  reserved_ += need;
  return id;
}

int BlockPool::fork(int from, int64_t length, int64_t max_positions) {
  const Seq& src = at(from, "fork");
  FLASHMAP_CHECK(length >= 0 && length <= src.length,
                 "BlockPool::fork: length {} is outside [0, {}], the length of sequence {}", length,
                 src.length, from);
  FLASHMAP_CHECK(max_positions >= length, "BlockPool::fork: max_positions {} is below length {}",
                 max_positions, length);
  const int64_t shared = blocks64(length);
  const int64_t growth = blocks64(max_positions) - shared;
  const int32_t writes =
      length % block_tokens_ != 0 && max_positions > length ? src.table[size_t(shared - 1)] : -1;
  int64_t need = growth;
  for (int64_t i = 0; i < shared; ++i) {
    const int32_t b = src.table[size_t(i)];
    need += reserve_delta(b, 1, b == writes ? 1 : 0);
  }
  if (need > free_blocks() - reserved_) return -1;

  const int id = new_id();  // may grow seqs_: `src` is not used past here
  Seq& s = seqs_[size_t(id)];
  const std::vector<int32_t>& from_table = seqs_[size_t(from)].table;
  s.table.assign(from_table.begin(), from_table.begin() + shared);
  for (const int32_t b : s.table) adjust(b, 1, 0);
  s.open = true;
  s.length = length;
  s.max_positions = max_positions;
  s.writing = -1;
  reserved_ += growth;
  update_writer(s);
  FLASHMAP_ASSERT(free_blocks() >= reserved_);
  return id;
}

void BlockPool::grow(int seq, int64_t length, std::vector<BlockCopy>& copies) {
  Seq& s = at(seq, "grow");
  FLASHMAP_CHECK(length >= s.length,
                 "BlockPool::grow: length {} is below the length {} of sequence {} (truncate "
                 "shortens)",
                 length, s.length, seq);
  FLASHMAP_CHECK(length <= s.max_positions,
                 "BlockPool::grow: length {} passes the max_positions {} of sequence {}", length,
                 s.max_positions, seq);
  if (length == s.length) return;

  const int32_t rows = int32_t(s.length % block_tokens_);
  if (rows != 0 && refcount_[size_t(s.table.back())] > 1) {
    // This sequence is a writer of the shared block, so giving it up releases one copy of the
    // reservation: the allocation below is covered.
    const int32_t shared = s.table.back();
    FLASHMAP_ASSERT(s.writing == shared);
    s.writing = -1;
    adjust(shared, -1, -1);
    const int32_t copy = allocate();
    s.table.back() = copy;
    copies.push_back({shared, copy, rows});
  }
  const int64_t blocks = blocks64(length);
  while (int64_t(s.table.size()) < blocks) {
    s.table.push_back(allocate());
    --reserved_;
  }
  s.length = length;
  update_writer(s);
}

void BlockPool::truncate(int seq, int64_t length) {
  Seq& s = at(seq, "truncate");
  FLASHMAP_CHECK(length >= 0 && length <= s.length,
                 "BlockPool::truncate: length {} is outside [0, {}], the length of sequence {}",
                 length, s.length, seq);
  if (length == s.length) return;

  // What the cut would do to the reservation and the free list, before doing it, so that a
  // refusal leaves everything as it was.
  const size_t keep = size_t(blocks64(length));
  const int32_t old_w = s.writing;
  const int32_t new_w = length % block_tokens_ != 0 ? s.table[keep - 1] : -1;  // max > length
  int64_t d_reserved = int64_t(s.table.size() - keep);  // the released blocks' regrowth
  int64_t d_free = 0;
  for (size_t i = keep; i < s.table.size(); ++i) {
    const int32_t b = s.table[i];
    d_reserved += reserve_delta(b, -1, b == old_w ? -1 : 0);
    if (refcount_[size_t(b)] == 1) ++d_free;
  }
  const bool old_w_kept = keep == s.table.size();
  if (old_w >= 0 && old_w_kept && old_w != new_w) d_reserved += reserve_delta(old_w, 0, -1);
  if (new_w >= 0 && new_w != old_w) d_reserved += reserve_delta(new_w, 0, 1);
  FLASHMAP_CHECK(free_blocks() + d_free >= reserved_ + d_reserved,
                 "BlockPool::truncate: sequence {} cannot drop to length {}: the blocks it would "
                 "release or write again are shared with other sequences, and with {} free "
                 "blocks of which {} are reserved the pool cannot promise their replacement",
                 seq, length, free_blocks(), reserved_);

  if (s.writing >= 0) adjust(s.writing, 0, -1);
  s.writing = -1;
  // Released from the end, so that the lowest released block is on top of the free list and
  // regrowing puts each block back where it was.
  while (s.table.size() > keep) {
    adjust(s.table.back(), -1, 0);
    s.table.pop_back();
    ++reserved_;
  }
  s.length = length;
  update_writer(s);
  FLASHMAP_ASSERT(free_blocks() >= reserved_);
}

void BlockPool::settle(int seq) {
  Seq& s = at(seq, "settle");
  reserved_ -= blocks64(s.max_positions) - int64_t(s.table.size());
  s.max_positions = s.length;
  update_writer(s);  // a sequence that cannot grow writes no block: fewer copies to promise
  FLASHMAP_ASSERT(free_blocks() >= reserved_);
}

void BlockPool::close(int seq) {
  Seq& s = at(seq, "close");
  if (s.writing >= 0) adjust(s.writing, 0, -1);
  s.writing = -1;
  reserved_ -= blocks64(s.max_positions) - int64_t(s.table.size());
  while (!s.table.empty()) {
    adjust(s.table.back(), -1, 0);
    s.table.pop_back();
  }
  s.open = false;
  s.length = s.max_positions = 0;
  free_ids_.push_back(seq);
}

int64_t BlockPool::length(int seq) const {
  return at(seq, "length").length;
}

int64_t BlockPool::max_positions(int seq) const {
  return at(seq, "max_positions").max_positions;
}

std::span<const int32_t> BlockPool::table(int seq) const {
  return at(seq, "table").table;
}

int32_t BlockPool::refcount(int32_t block) const {
  FLASHMAP_CHECK(block >= 0 && block < num_blocks(),
                 "BlockPool::refcount: block {} is outside [0, {})", block, num_blocks());
  return refcount_[size_t(block)];
}

void BlockPool::check_invariants() const {
  const size_t n = refcount_.size();
  std::vector<int32_t> holders(n, 0), writers(n, 0);
  std::vector<int> last_holder(n, -1);
  int64_t reserved = 0;
  size_t closed = 0;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Seq& s = seqs_[i];
    if (!s.open) {
      ++closed;
      require(s.table.empty() && s.writing == -1, "closed sequence {} holds blocks", i);
      continue;
    }
    require(s.length >= 0 && s.length <= s.max_positions,
            "sequence {} has length {} outside [0, max_positions {}]", i, s.length,
            s.max_positions);
    require(int64_t(s.table.size()) == blocks64(s.length),
            "sequence {} has {} blocks for length {}", i, s.table.size(), s.length);
    for (const int32_t b : s.table) {
      require(b >= 0 && size_t(b) < n, "sequence {} holds block {} outside the pool", i, b);
      require(last_holder[size_t(b)] != int(i), "sequence {} holds block {} twice", i, b);
      last_holder[size_t(b)] = int(i);
      ++holders[size_t(b)];
    }
    require(s.writing == writable_block(s), "sequence {} is counted as writer of block {}, not {}",
            i, s.writing, writable_block(s));
    if (s.writing >= 0) ++writers[size_t(s.writing)];
    reserved += blocks64(s.max_positions) - int64_t(s.table.size());
  }
  require(free_ids_.size() == closed, "{} free sequence ids for {} closed sequences",
          free_ids_.size(), closed);
  for (const int id : free_ids_)
    require(id >= 0 && size_t(id) < seqs_.size() && !seqs_[size_t(id)].open,
            "free sequence id {} is not a closed sequence", id);

  size_t unheld = 0;
  for (size_t b = 0; b < n; ++b) {
    require(refcount_[b] == holders[b], "block {} has refcount {} but {} holders", b, refcount_[b],
            holders[b]);
    require(writers_[b] == writers[b], "block {} counts {} writers, not {}", b, writers_[b],
            writers[b]);
    reserved += copies_needed(holders[b], writers[b]);
    if (holders[b] == 0) ++unheld;
  }
  require(reserved == reserved_, "reserved_blocks() {} but the reservations add up to {}",
          reserved_, reserved);

  std::vector<bool> listed(n, false);
  for (const int32_t b : free_) {
    require(b >= 0 && size_t(b) < n, "free list holds block {} outside the pool", b);
    require(refcount_[size_t(b)] == 0, "free list holds block {} with refcount {}", b,
            refcount_[size_t(b)]);
    require(!listed[size_t(b)], "free list holds block {} twice", b);
    listed[size_t(b)] = true;
  }
  require(free_.size() == unheld, "free list holds {} blocks but {} have refcount 0", free_.size(),
          unheld);
  require(int64_t(free_.size()) >= reserved_, "{} free blocks for {} reserved", free_.size(),
          reserved_);
}

}  // namespace flashmap::paged
