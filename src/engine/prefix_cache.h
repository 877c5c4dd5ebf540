// Prefix caching: finished sequences leave their slot (target KV cache and drafter context) in a
// cache keyed by the tokens it holds, and a new request whose prompt starts with the same tokens
// (a system prompt, the earlier turns of a chat) starts from a copy of that prefix and prefills
// only the rest. Entries are evicted least recently used first to stay under a byte budget.
//
// Lossless by construction: the copied positions hold exactly what a prefill of the same tokens
// computes (the kernels give every row the same bits whatever the batch: ops/gemm.h,
// ops/attention.cpp), which the tests check as identical greedy output with the cache on and off.
#pragma once

#include <flashmap/stats.h>  // PrefixCacheStats

#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace flashmap::engine {

using PrefixCacheStats = ::flashmap::PrefixCacheStats;

class PrefixCache {
 public:
  // budget_bytes 0 (or a backend that cannot fork): off. Matches shorter than min_match tokens are
  // not used (a copy is not worth it for a few positions).
  PrefixCache(Backend& backend, size_t budget_bytes, int64_t min_match = 16);
  bool enabled() const { return budget_ > 0; }

  // A slot for `prompt` holding its longest cached prefix (at most prompt.size() − 1 tokens: the
  // last prompt token's logits must come from a forward), and for a drafting request only from
  // an entry that has a drafter context; `cached` gets the positions it holds. Null: no usable
  // entry (or the drafter's kind cannot fork).
  // max_positions: what the new sequence may grow to (Open::max_positions).
  Slot lookup(std::span<const int32_t> prompt, bool drafting, int64_t& cached,
              int64_t max_positions = 0);
  // Keeps a finished sequence's slot; `tokens` are what its positions hold (the first
  // backend.held(slot).positions of them count). Entries it extends are dropped; an entry it is a
  // prefix of makes it redundant.
  void insert(std::vector<int32_t> tokens, Slot slot, bool drafting);
  // Evicts the least recently used entry; false when there is none.
  bool evict_one();
  PrefixCacheStats stats() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // exactly the positions the slot holds
    Slot slot;
    bool drafting = false;
    size_t bytes = 0;
  };
  void evict_to(size_t budget);

  Backend& backend_;
  size_t budget_;
  int64_t min_match_;
  std::list<Entry> lru_;  // most recently used first
  PrefixCacheStats stats_;
};

}  // namespace flashmap::engine
