#include "engine/prefix_cache.h"

#include <algorithm>

namespace flashmap::engine {

namespace {
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}
}  // namespace

PrefixCache::PrefixCache(Backend& backend, size_t budget_bytes, int64_t min_match)
    : backend_(backend),
      budget_(backend.info().caps.fork ? budget_bytes : 0),
      min_match_(std::max<int64_t>(min_match, 1)) {
  stats_.budget = budget_;
}

Slot PrefixCache::lookup(std::span<const int32_t> prompt, bool drafting, int64_t& cached,
                         int64_t max_positions) {
  cached = 0;
  if (!enabled() || prompt.size() < 2) return {};
  ++stats_.queries;
  stats_.query_tokens += prompt.size();
  const auto limit = prompt.size() - 1;
  auto best = lru_.end();
  size_t best_len = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (drafting && !it->drafting) continue;
    const size_t n = std::min(common_prefix(it->tokens, prompt), limit);
    if (n > best_len) {
      best_len = n;
      best = it;
    }
  }
  if (best == lru_.end() || int64_t(best_len) < min_match_) return {};
  Slot slot = backend_.open({drafting, &best->slot, int64_t(best_len), max_positions});
  if (!slot) return {};
  lru_.splice(lru_.begin(), lru_, best);
  ++stats_.hits;
  stats_.hit_tokens += best_len;
  cached = int64_t(best_len);
  return slot;
}

void PrefixCache::insert(std::vector<int32_t> tokens, Slot slot, bool drafting) {
  if (!enabled() || !slot) return;
  backend_.settle(slot.index());  // kept to fork from: it never grows again
  const Held h = backend_.held(slot.index());
  const int64_t held = std::min<int64_t>(h.positions, int64_t(tokens.size()));
  if (held < min_match_) return;
  tokens.resize(size_t(held));
  for (auto it = lru_.begin(); it != lru_.end();) {
    const size_t common = common_prefix(it->tokens, tokens);
    // An entry that holds all of these tokens (and can serve the same requests) makes the new
    // one redundant; one that these tokens extend is replaced by it.
    if (common == tokens.size() && (it->drafting || !drafting)) {
      lru_.splice(lru_.begin(), lru_, it);
      return;
    }
    if (common == it->tokens.size() && (drafting || !it->drafting)) {
      stats_.bytes -= it->bytes;
      it = lru_.erase(it);
      continue;
    }
    ++it;
  }
  Entry e{std::move(tokens), std::move(slot), drafting, h.bytes};
  if (e.bytes > budget_) return;
  evict_to(budget_ - e.bytes);
  stats_.bytes += e.bytes;
  ++stats_.inserts;
  lru_.push_front(std::move(e));
}

void PrefixCache::evict_to(size_t budget) {
  while (stats_.bytes > budget && evict_one()) {
  }
}

bool PrefixCache::evict_one() {
  if (lru_.empty()) return false;
  stats_.bytes -= lru_.back().bytes;
  lru_.pop_back();
  ++stats_.evictions;
  return true;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.entries = lru_.size();
  return s;
}

}  // namespace flashmap::engine
