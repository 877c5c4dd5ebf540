#include "specdec/ngram.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "core/splitmix.h"

namespace flashmap {

namespace {
// The hash of the n-gram ending at a position, extended one token back per n, so that one pass
// over n = 1..max_n gives every level's key. Never 0 (the table's empty slot).
uint64_t extend(uint64_t h, int32_t token) {
  return splitmix64(h + (uint64_t(uint32_t(token)) + 1) * 0x9e3779b97f4a7c15ull);
}
uint64_t as_key(uint64_t h) {
  return h == 0 ? 1 : h;
}
constexpr uint64_t kSeed = 0x6e6772616d6b6579ull;
}  // namespace

void NgramOptions::validate() const {
  FLASHMAP_CHECK(min_n >= 1 && min_n <= kMaxN, "--ngram-min {}: must be in [1, {}]", min_n, kMaxN);
  FLASHMAP_CHECK(max_n >= 1 && max_n <= kMaxN, "--ngram-max {}: must be in [1, {}]", max_n, kMaxN);
  FLASHMAP_CHECK(min_n <= max_n,
                 "--ngram-min {} is above --ngram-max {}: the shortest n-gram matched cannot be "
                 "longer than the longest",
                 min_n, max_n);
  FLASHMAP_CHECK(block >= 1 && block <= kMaxBlock, "--ngram-block {}: must be in [1, {}]", block,
                 kMaxBlock);
}

NgramIndex::NgramIndex(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  NgramOptions{min_n, max_n, 1}.validate();
  keys_.assign(64, 0);
  heads_.assign(64, -1);
}

int64_t NgramIndex::find(uint64_t key) const {
  const int64_t mask = int64_t(keys_.size()) - 1;
  int64_t i = int64_t(key & uint64_t(mask));
  while (keys_[size_t(i)] != 0 && keys_[size_t(i)] != key) i = (i + 1) & mask;
  return i;
}

void NgramIndex::grow() {
  std::vector<uint64_t> keys(keys_.size() * 2, 0);
  std::vector<int32_t> heads(keys.size(), -1);
  std::swap(keys, keys_);
  std::swap(heads, heads_);
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] != 0) {
      const int64_t j = find(keys[i]);
      keys_[size_t(j)] = keys[i];
      heads_[size_t(j)] = heads[i];
    }
}

void NgramIndex::insert(uint64_t key, int32_t end, int lvl) {
  int64_t i = find(key);
  if (keys_[size_t(i)] == 0) {
    if (2 * (used_ + 1) > int64_t(keys_.size())) {
      grow();
      i = find(key);
    }
    keys_[size_t(i)] = key;
    ++used_;
  } else {
    prev_[size_t(end) * size_t(max_n_ - min_n_ + 1) + size_t(lvl)] = heads_[size_t(i)];
  }
  heads_[size_t(i)] = end;
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  FLASHMAP_CHECK(size() + int64_t(tokens.size()) < std::numeric_limits<int32_t>::max(),
                 "n-gram drafter: a sequence of more than 2^31 tokens");
  const size_t levels = size_t(max_n_ - min_n_ + 1);
  for (const int32_t t : tokens) {
    const int64_t end = size();
    tokens_.push_back(t);
    prev_.resize(prev_.size() + levels, -1);
    uint64_t h = kSeed;
    for (int n = 1; n <= max_n_ && n <= end + 1; ++n) {
      h = extend(h, tokens_[size_t(end - n + 1)]);
      if (n >= min_n_) insert(as_key(h), int32_t(end), level(n));
    }
  }
}

NgramIndex NgramIndex::prefix(int64_t length) const {
  FLASHMAP_ASSERT(length >= 0 && length <= size());
  NgramIndex r(min_n_, max_n_);
  r.append(std::span<const int32_t>(tokens_).first(size_t(length)));
  return r;
}

size_t NgramIndex::bytes() const {
  return tokens_.capacity() * sizeof(int32_t) + keys_.capacity() * sizeof(uint64_t) +
         heads_.capacity() * sizeof(int32_t) + prev_.capacity() * sizeof(int32_t);
}

std::vector<std::vector<int32_t>> NgramIndex::continuations(int32_t anchor, int length,
                                                            int max_candidates,
                                                            std::vector<int>* match) const {
  std::vector<std::vector<int32_t>> out;
  if (match) match->clear();
  if (length <= 0 || max_candidates <= 0) return out;
  const int64_t L = size();  // the anchor's index in tokens() + [anchor]
  auto at = [&](int64_t i) { return i < L ? tokens_[size_t(i)] : anchor; };
  const int top = int(std::min<int64_t>(max_n_, L + 1));
  std::vector<uint64_t> query(size_t(top) + 1);
  uint64_t h = kSeed;
  for (int n = 1; n <= top; ++n) query[size_t(n)] = h = extend(h, at(L - n + 1));
  const size_t levels = size_t(max_n_ - min_n_ + 1);
  std::vector<int32_t> cand(static_cast<size_t>(length));
  for (int n = top; n >= min_n_; --n) {
    const int64_t slot = find(as_key(query[size_t(n)]));
    if (keys_[size_t(slot)] == 0) continue;
    int64_t p = heads_[size_t(slot)];
    for (int walked = 0; p >= 0 && walked < kMaxChain; ++walked) {
      // The hash is only a hint: the n tokens ending at p must be the query's.
      bool same = p + 1 >= n;
      for (int j = 0; same && j < n; ++j) same = tokens_[size_t(p - j)] == at(L - j);
      if (same) {
        const int64_t period = L - p;  // >= 1: every indexed end is before the anchor
        for (int j = 0; j < length; ++j) cand[size_t(j)] = at(p + 1 + j % period);
        if (std::find(out.begin(), out.end(), cand) == out.end()) {
          out.push_back(cand);
          if (match) match->push_back(n);
          if (int(out.size()) == max_candidates) return out;
        }
      }
      p = prev_[size_t(p) * levels + size_t(level(n))];
    }
  }
  return out;
}

}  // namespace flashmap
