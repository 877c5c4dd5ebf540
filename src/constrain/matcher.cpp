// Vocabulary (token bytes and their trie) and Matcher (the thread set of the pushdown automaton,
// the token mask and the history for rollback).
#include <flashmap/tokenizer.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "constrain/automaton.h"
#include "core/check.h"

namespace flashmap::constrain {

// --- vocabulary

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const flashmap::Tokenizer& tokenizer,
                                                             size_t vocab_size) {
  std::vector<std::string> tokens(vocab_size);
  const size_t n = std::min(vocab_size, tokenizer.vocab_size());
  for (size_t id = 0; id < n; ++id) {
    const int32_t i = int32_t(id);
    if (tokenizer.is_added(i)) continue;
    if (auto b = tokenizer.token_bytes(i)) tokens[id] = std::string(*b);
  }
  return from_bytes(std::move(tokens));
}

std::shared_ptr<const Vocabulary> Vocabulary::from_bytes(std::vector<std::string> tokens) {
  auto v = std::make_shared<Vocabulary>();
  v->bytes_ = std::move(tokens);
  std::vector<int32_t> order;
  for (size_t i = 0; i < v->bytes_.size(); ++i) {
    FLASHMAP_CHECK(v->bytes_[i].size() < 65536, "token {} is longer than 65535 bytes", i);
    if (!v->bytes_[i].empty()) order.push_back(int32_t(i));
  }
  const auto& by = v->bytes_;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return by[a] < by[b] || (by[a] == by[b] && a < b); });
  Trie& t = v->trie_;
  std::vector<uint32_t> path;  // node at depth d + 1
  std::string_view prev;
  for (int32_t id : order) {
    const std::string_view s = by[id];
    size_t l = 0;
    while (l < prev.size() && l < s.size() && prev[l] == s[l]) ++l;
    while (path.size() > l) {
      t.skip[path.back()] = uint32_t(t.byte.size());
      path.pop_back();
    }
    for (size_t d = l; d < s.size(); ++d) {
      path.push_back(uint32_t(t.byte.size()));
      t.byte.push_back(uint8_t(s[d]));
      t.depth.push_back(uint16_t(d + 1));
      t.skip.push_back(0);
      t.tok_begin.push_back(uint32_t(t.ids.size()));
    }
    t.ids.push_back(id);
    t.max_depth = std::max(t.max_depth, s.size());
    prev = s;
  }
  while (!path.empty()) {
    t.skip[path.back()] = uint32_t(t.byte.size());
    path.pop_back();
  }
  t.tok_begin.push_back(uint32_t(t.ids.size()));
  return v;
}

// --- matcher

namespace {

struct Thread {
  uint32_t state;
  uint32_t stack;  // frame id, 0 = empty stack
  bool operator==(const Thread&) const = default;
  bool operator<(const Thread& o) const {
    return state != o.state ? state < o.state : stack < o.stack;
  }
};

}  // namespace

struct Matcher::State {
  std::vector<Thread> threads;  // closed: each can read a byte; sorted
  bool can_end = false;
};

struct Matcher::Context {
  static constexpr size_t kCacheBytes = size_t(64) << 20;

  const GrammarImpl* g;
  std::vector<std::pair<uint32_t, uint32_t>> frames{{0, 0}};  // (return state, parent)
  std::vector<uint16_t> depth{0};
  std::unordered_map<uint64_t, uint32_t> frame_ids;
  std::unordered_map<std::string, std::vector<uint32_t>> mask_cache;
  size_t cache_bytes = 0;
  std::vector<Thread> work;
  std::vector<std::vector<Thread>> level;
  std::vector<uint8_t> level_end;

  explicit Context(const GrammarImpl* grammar) : g(grammar) {}

  uint32_t push(uint32_t parent, uint32_t ret) {
    const uint64_t key = (uint64_t(parent) << 32) | ret;
    auto [it, fresh] = frame_ids.emplace(key, uint32_t(frames.size()));
    if (fresh) {
      frames.push_back({ret, parent});
      depth.push_back(uint16_t(depth[parent] + 1));
    }
    return it->second;
  }

  // Expands calls and rule ends of `set` (in place) until every thread can read a byte; returns
  // whether the whole input may end here.
  bool close(std::vector<Thread>& set) {
    bool can_end = false;
    work.assign(set.begin(), set.end());
    auto add = [&](Thread t) {
      if (std::find(work.begin(), work.end(), t) == work.end()) work.push_back(t);
    };
    for (size_t i = 0; i < work.size(); ++i) {
      const Thread t = work[i];
      for (uint32_t k = g->call_begin[t.state]; k < g->call_begin[t.state + 1]; ++k)
        if (depth[t.stack] < kMaxStackDepth)
          add({g->rule_start[g->calls[k].first], push(t.stack, g->calls[k].second)});
      if (g->accept[t.state]) {
        if (t.stack == 0)
          can_end = true;
        else
          add({frames[t.stack].first, frames[t.stack].second});
      }
    }
    set.clear();
    for (const Thread& t : work)
      if (g->has_bytes[t.state]) set.push_back(t);
    if (set.size() > 1) {
      std::sort(set.begin(), set.end());
      set.erase(std::unique(set.begin(), set.end()), set.end());
    }
    return can_end;
  }

  bool step(const std::vector<Thread>& in, uint8_t byte, std::vector<Thread>& out) {
    out.clear();
    if (in.size() == 1) {  // the common case, e.g. inside a string: no closure to compute
      const uint32_t n = g->next(in[0].state, byte);
      if (n == kDead) return false;
      out.push_back({n, in[0].stack});
      if (g->simple[n]) return false;
      return close(out);
    }
    for (const Thread& t : in) {
      const uint32_t n = g->next(t.state, byte);
      if (n != kDead) out.push_back({n, t.stack});
    }
    if (out.empty()) return false;
    return close(out);
  }

  // The state after `bytes` from `from`; false if some byte is refused.
  bool run(const State& from, std::string_view bytes, State& to) {
    if (bytes.empty()) return false;
    std::vector<Thread> cur = from.threads, next;
    bool can_end = false;
    for (unsigned char c : bytes) {
      if (cur.empty()) return false;
      can_end = step(cur, c, next);
      std::swap(cur, next);
    }
    if (cur.empty() && !can_end) return false;
    to.threads = std::move(cur);
    to.can_end = can_end;
    return true;
  }

  void walk(const Vocabulary& vocab, const State& st, uint32_t* mask) {
    const Vocabulary::Trie& t = vocab.trie();
    level.resize(t.max_depth + 1);
    level[0] = st.threads;
    const size_t n = t.byte.size();
    for (size_t k = 0; k < n;) {
      const size_t d = t.depth[k];
      const bool can_end = step(level[d - 1], t.byte[k], level[d]);
      const bool alive = !level[d].empty();
      if (alive || can_end)
        for (uint32_t j = t.tok_begin[k]; j < t.tok_begin[k + 1]; ++j) {
          const int32_t id = t.ids[j];
          mask[id >> 5] |= 1u << (id & 31);
        }
      k = alive ? k + 1 : t.skip[k];
    }
  }
};

namespace {

std::string cache_key(const std::vector<Thread>& threads) {
  std::string key(threads.size() * sizeof(Thread), '\0');
  if (!threads.empty()) std::memcpy(key.data(), threads.data(), key.size());
  return key;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  FLASHMAP_CHECK(grammar_ && vocab_, "Matcher needs a grammar and a vocabulary");
  const GrammarImpl& g = grammar_->impl();
  ctx_ = std::make_shared<Context>(&g);
  State s;
  s.threads.push_back({g.rule_start[g.start_rule], 0});
  s.can_end = ctx_->close(s.threads);
  history_.push_back(std::move(s));
}

Matcher::~Matcher() = default;
Matcher::Matcher(const Matcher&) = default;
Matcher& Matcher::operator=(const Matcher&) = default;

void Matcher::fill_mask(std::span<uint32_t> mask) const {
  FLASHMAP_CHECK(mask.size() >= mask_words(), "token mask has {} words, the vocabulary needs {}",
                 mask.size(), mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  const State& st = history_.back();
  if (st.threads.empty()) return;
  Context& c = *ctx_;
  std::string key = cache_key(st.threads);
  if (auto it = c.mask_cache.find(key); it != c.mask_cache.end()) {
    std::copy(it->second.begin(), it->second.end(), mask.begin());
    return;
  }
  c.walk(*vocab_, st, mask.data());
  const size_t bytes = mask_words() * sizeof(uint32_t) + key.size();
  if (c.cache_bytes + bytes > Context::kCacheBytes) {
    c.mask_cache.clear();
    c.cache_bytes = 0;
  }
  c.mask_cache.emplace(std::move(key),
                       std::vector<uint32_t>(mask.begin(), mask.begin() + mask_words()));
  c.cache_bytes += bytes;
}

bool Matcher::is_allowed(int32_t token) const {
  if (token < 0 || size_t(token) >= vocab_->size()) return false;
  State next;
  return ctx_->run(history_.back(), vocab_->bytes(token), next);
}

bool Matcher::can_end() const {
  return history_.back().can_end;
}

bool Matcher::done() const {
  return history_.back().can_end && history_.back().threads.empty();
}

bool Matcher::advance(int32_t token) {
  if (token < 0 || size_t(token) >= vocab_->size()) return false;
  State next;
  if (!ctx_->run(history_.back(), vocab_->bytes(token), next)) return false;
  history_.push_back(std::move(next));
  return true;
}

bool Matcher::advance_bytes(std::string_view bytes) {
  State next;
  if (!ctx_->run(history_.back(), bytes, next)) return false;
  history_.push_back(std::move(next));
  return true;
}

size_t Matcher::checkpoint() const {
  return history_.size() - 1;
}

void Matcher::rollback(size_t checkpoint) {
  FLASHMAP_CHECK(checkpoint < history_.size(), "rollback to {} tokens, only {} were advanced",
                 checkpoint, history_.size() - 1);
  history_.resize(checkpoint + 1);
}

}  // namespace flashmap::constrain
