// Prefix caching: finished sequences leave their slot (target KV cache and drafter context) in a
// cache keyed by the tokens it holds, and a new request whose prompt starts with the same tokens
// (a system prompt, the earlier turns of a chat) starts from a copy of that prefix and prefills
// only the rest. Entries are evicted least recently used first to stay under a byte budget.
//
// Lossless by construction: the copied positions hold exactly what a prefill of the same tokens
// computes (the kernels give every row the same bits whatever the batch: ops/gemm.h,
// ops/attention.cpp), which the tests check as identical greedy output with the cache on and off.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend.h"

namespace flashmap::engine {

struct PrefixCacheStats {
  uint64_t queries = 0, hits = 0;
  uint64_t query_tokens = 0, hit_tokens = 0;  // prompt tokens asked for, and served from cache
  uint64_t inserts = 0, evictions = 0;
  size_t entries = 0, bytes = 0, budget = 0;
};

class PrefixCache {
 public:
  // budget_bytes 0: off. Matches shorter than min_match tokens are not used (a copy is not
  // worth it for a few positions).
  PrefixCache(Backend& backend, size_t budget_bytes, int64_t min_match = 16);
  bool enabled() const { return budget_ > 0; }

  // A slot for `prompt` holding its longest cached prefix (at most prompt.size() − 1 tokens: the
  // last prompt token's logits must come from a forward), and for a drafting request only from
  // an entry that has a drafter context; `cached` gets the positions it holds. Null: no usable
  // entry (or the backend cannot fork).
  std::unique_ptr<Slot> lookup(std::span<const int32_t> prompt, bool drafting, int64_t& cached);
  // Keeps a finished sequence's slot; `tokens` are what its positions hold (the first
  // backend.forkable(slot) of them count). Entries it extends are dropped; an entry it is a prefix
  // of makes it redundant.
  void insert(std::vector<int32_t> tokens, std::unique_ptr<Slot> slot, bool drafting);
  PrefixCacheStats stats() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // exactly the positions the slot holds
    std::unique_ptr<Slot> slot;
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
