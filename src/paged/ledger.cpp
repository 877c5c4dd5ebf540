#include "paged/ledger.h"

#include <algorithm>

#include "core/check.h"

namespace flashmap::paged {

Ledger::Ledger(BlockPool& pool, int extra) : pool_(pool), extra_(extra) {
  FLASHMAP_CHECK(extra >= 0, "Ledger: extra positions {} < 0", extra);
}

bool Ledger::open(SeqBlocks& s, int64_t most, bool drafting, const SeqBlocks* from,
                  int64_t length) {
  FLASHMAP_CHECK(s.kv < 0, "Ledger::open: the sequence is open");
  int kv;
  if (from) {
    FLASHMAP_CHECK(length >= 1 && length <= from->length && length <= most,
                   "Ledger::open: a copy of {} positions of a sequence of {} (at most {})", length,
                   from->length, most);
    // A drafting copy reads the source's context from the shared blocks: only what it committed.
    if (drafting && (!from->drafting || from->committed < length)) return false;
    kv = pool_.fork(from->kv, length, most + extra_);
  } else {
    kv = pool_.open(most + extra_);
  }
  if (kv < 0) return false;
  s.kv = kv;
  s.drafting = drafting;
  s.length = from ? length : 0;
  s.committed = from && drafting ? length : 0;
  return true;
}

void Ledger::reserve(SeqBlocks& s, int64_t n, std::vector<BlockCopy>& copies) {
  FLASHMAP_CHECK(n >= 0, "Ledger::reserve: {} positions", n);
  pool_.grow(s.kv, std::max(s.length + n, pool_.length(s.kv)), copies);
}

void Ledger::reserve_draft(SeqBlocks& s, std::vector<BlockCopy>& copies) {
  FLASHMAP_CHECK(s.drafting && s.committed <= s.length,
                 "Ledger::reserve_draft: a sequence that does not draft, or context {} past {}",
                 s.committed, s.length);
  const int64_t end = std::max(s.length + 1, draft_first(s) + draft_count());
  pool_.grow(s.kv, std::max(end, pool_.length(s.kv)), copies);
}

void Ledger::wrote(SeqBlocks& s, int64_t n, bool prefill) {
  FLASHMAP_CHECK(n >= 0 && s.length + n <= pool_.length(s.kv),
                 "Ledger::wrote: {} positions after {}, room for {}", n, s.length,
                 pool_.length(s.kv));
  s.length += n;
  if (prefill && s.drafting) {
    FLASHMAP_CHECK(s.committed + n == s.length,
                   "Ledger::wrote: a prefill after {} positions with {} in the drafter's context",
                   s.length - n, s.committed);
    s.committed += n;
  }
}

void Ledger::commit(SeqBlocks& s, int64_t length, int64_t drafted) {
  FLASHMAP_CHECK(length >= 0 && length <= s.length, "Ledger::commit: keeps {} of {} positions",
                 length, s.length);
  const bool enters = s.drafting && drafted > 0;
  FLASHMAP_CHECK(!enters || s.committed == length - drafted,
                 "Ledger::commit: {} rows ending at {} do not follow the drafter's {} positions",
                 drafted, length, s.committed);
  pool_.truncate(s.kv, length);
  s.length = length;
  if (enters) s.committed = length;
}

int64_t Ledger::held(const SeqBlocks& s) const {
  return s.drafting ? std::min(s.length, s.committed) : s.length;
}

void Ledger::settle(SeqBlocks& s) {
  pool_.settle(s.kv);
}

void Ledger::close(SeqBlocks& s) {
  if (s.kv >= 0) pool_.close(s.kv);
  s = SeqBlocks{};
}

size_t Ledger::admissible(std::span<const int64_t> positions, int64_t capacity,
                          int64_t lanes) const {
  int64_t blocks = int64_t(pool_.free_blocks()) - pool_.reserved_blocks();
  size_t n = 0;
  for (int64_t p : positions) {
    const int64_t need = pool_.blocks_for(std::min(p, capacity) + extra_);
    if (need > blocks || lanes <= 0) break;
    blocks -= need;
    --lanes;
    ++n;
  }
  return n;
}

}  // namespace flashmap::paged
