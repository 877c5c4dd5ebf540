#include "constrain/automaton.h"

#include <algorithm>
#include <bit>
#include <map>
#include <unordered_map>

#include "core/check.h"
#include "text/utf8.h"

namespace flashmap::constrain {

Grammar::Grammar(std::unique_ptr<GrammarImpl> impl) : impl_(std::move(impl)) {}
Grammar::~Grammar() = default;
size_t Grammar::num_states() const {
  return impl_->num_states();
}
size_t Grammar::num_rules() const {
  return impl_->rule_start.size();
}
size_t Grammar::bytes() const {
  const GrammarImpl& g = *impl_;
  size_t n = sizeof(GrammarImpl) + g.trans.capacity() * sizeof(uint32_t) + g.accept.capacity() +
             g.has_bytes.capacity() + g.simple.capacity() +
             g.call_begin.capacity() * sizeof(uint32_t) + g.calls.capacity() * sizeof(g.calls[0]) +
             g.rule_start.capacity() * sizeof(uint32_t);
  for (const std::string& name : g.rule_names) n += sizeof(name) + name.capacity();
  return n;
}

// --- the cache of compiled grammars

GrammarCache::GrammarCache(size_t max_entries, size_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {}

std::shared_ptr<const Grammar> GrammarCache::find(const std::string& key) {
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->key == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return it->grammar;
    }
  return nullptr;
}

void GrammarCache::insert(const std::string& key, std::shared_ptr<const Grammar> grammar) {
  const size_t bytes = key.size() + grammar->bytes();
  if (bytes > max_bytes_ || max_entries_ == 0) return;
  std::lock_guard lock(mu_);
  for (const Entry& e : entries_)
    if (e.key == key) return;  // another thread compiled it meanwhile
  while (!entries_.empty() && (entries_.size() >= max_entries_ || bytes_ + bytes > max_bytes_)) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  entries_.push_front({key, std::move(grammar), bytes});
  bytes_ += bytes;
}

size_t GrammarCache::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t GrammarCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

// --- code-point sets

CpSet cp_normalize(CpSet set) {
  CpSet cut;
  for (auto [lo, hi] : set) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      cut.push_back({lo, 0xD7FF});
      lo = 0xE000;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      lo = 0xE000;
    }
    if (lo <= hi) cut.push_back({lo, hi});
  }
  std::sort(cut.begin(), cut.end());
  CpSet out;
  for (auto r : cut) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

CpSet cp_complement(const CpSet& set) {
  const CpSet s = cp_normalize(set);
  CpSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : s) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return cp_normalize(out);
}

CpSet cp_subtract(const CpSet& a, const CpSet& b) {
  CpSet out;
  const CpSet nb = cp_complement(b);
  const CpSet na = cp_normalize(a);
  for (auto [alo, ahi] : na)
    for (auto [blo, bhi] : nb) {
      const uint32_t lo = std::max(alo, blo), hi = std::min(ahi, bhi);
      if (lo <= hi) out.push_back({lo, hi});
    }
  return cp_normalize(out);
}

// --- expressions

int Builder::bytes(uint8_t lo, uint8_t hi) {
  Node n;
  n.kind = Kind::kBytes;
  n.lo = lo;
  n.hi = hi;
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::lit(std::string_view s) {
  std::vector<int> kids;
  for (unsigned char c : s) kids.push_back(bytes(c, c));
  return seq(std::move(kids));
}

int Builder::seq(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Node n;
  n.kind = Kind::kSeq;
  n.kids = std::move(kids);
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::alt(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Node n;
  n.kind = Kind::kAlt;
  n.kids = std::move(kids);
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::repeat(int e, int min, int max) {
  FLASHMAP_CHECK(min >= 0 && min <= kMaxRepeat && max <= kMaxRepeat && (max < 0 || max >= min),
                 "repetition count {{{},{}}} is out of range (at most {})", min, max, kMaxRepeat);
  if (min == 1 && max == 1) return e;
  Node n;
  n.kind = Kind::kRepeat;
  n.min = min;
  n.max = max;
  n.kids = {e};
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::call(int rule) {
  Node n;
  n.kind = Kind::kCall;
  n.rule = rule;
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::members(std::vector<int> members, std::vector<uint8_t> required, int sep,
                     bool allow_empty) {
  FLASHMAP_ASSERT(members.size() == required.size());
  Node n;
  n.kind = Kind::kMembers;
  n.kids = std::move(members);
  n.kids.push_back(sep);
  n.required = std::move(required);
  n.min = allow_empty;
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int Builder::new_rule(std::string name) {
  rule_body_.push_back(-1);
  rule_names_.push_back(std::move(name));
  return int(rule_body_.size()) - 1;
}

void Builder::define(int rule, int expr) {
  rule_body_[rule] = expr;
}

namespace {

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of byte ranges (as RE2 does).
void utf8_sequences(uint32_t lo, uint32_t hi,
                    std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static constexpr uint32_t kMaxOfLen[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t m : kMaxOfLen)
    if (lo <= m && hi > m) {
      utf8_sequences(lo, m, out);
      utf8_sequences(m + 1, hi, out);
      return;
    }
  std::string a, b;
  utf8::append(a, lo);
  utf8::append(b, hi);
  const int n = int(a.size());
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.push_back({uint8_t(a[size_t(i)]), uint8_t(b[size_t(i)])});
  out.push_back(std::move(seq));
}

}  // namespace

int Builder::utf8(const CpSet& set) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : cp_normalize(set)) utf8_sequences(lo, hi, seqs);
  // Merge sequences sharing their leading byte ranges into a small trie so that the NFA (and
  // thus subset construction) stays small for large classes such as "any character".
  std::vector<int> alts;
  for (const auto& s : seqs) {
    std::vector<int> kids;
    for (auto [lo, hi] : s) kids.push_back(bytes(lo, hi));
    alts.push_back(seq(std::move(kids)));
  }
  return alt(std::move(alts));
}

// --- compilation

namespace {

struct NfaEdge {
  enum Kind : uint8_t { kByte, kEps, kCall } kind;
  uint8_t lo, hi;
  int rule;
  int to;
};

class Nfa {
 public:
  static constexpr size_t kMaxStates = 1'000'000;
  std::vector<std::vector<NfaEdge>> out;

  int add() {
    FLASHMAP_CHECK(out.size() < kMaxStates,
                   "grammar too large: more than {} automaton states (lower the repetition "
                   "counts or lengths)",
                   kMaxStates);
    out.emplace_back();
    return int(out.size()) - 1;
  }
  void eps(int from, int to) { out[from].push_back({NfaEdge::kEps, 0, 0, -1, to}); }

  // Thompson construction of `e` starting at `from`; returns the end state.
  int emit(const Builder& b, int e, int from) {
    const Builder::Node& n = b.nodes()[e];
    switch (n.kind) {
      case Builder::Kind::kBytes: {
        const int s = add();
        out[from].push_back({NfaEdge::kByte, n.lo, n.hi, -1, s});
        return s;
      }
      case Builder::Kind::kCall: {
        const int s = add();
        out[from].push_back({NfaEdge::kCall, 0, 0, n.rule, s});
        return s;
      }
      case Builder::Kind::kSeq: {
        int cur = from;
        for (int k : n.kids) cur = emit(b, k, cur);
        return cur;
      }
      case Builder::Kind::kAlt: {
        const int end = add();
        for (int k : n.kids) {
          const int s = add();
          eps(from, s);
          eps(emit(b, k, s), end);
        }
        return end;
      }
      case Builder::Kind::kMembers: {
        // Two chains: `none` (nothing written before member j) and `some` (something written,
        // so member j needs the separator first).
        const size_t m = n.required.size();
        const int sep = n.kids[m];
        const int end = add();
        int none = from, some = -1;
        for (size_t j = 0; j < m; ++j) {
          const int next_some = add();
          if (none >= 0) eps(emit(b, n.kids[j], none), next_some);
          if (some >= 0) eps(emit(b, n.kids[j], emit(b, sep, some)), next_some);
          if (!n.required[j]) {
            if (some >= 0) eps(some, next_some);
          } else {
            none = -1;
          }
          some = next_some;
        }
        if (some >= 0) eps(some, end);
        if (none >= 0 && n.min) eps(none, end);
        return end;
      }
      case Builder::Kind::kRepeat: {
        int cur = from;
        for (int i = 0; i < n.min; ++i) {
          const int s = add();  // a fresh entry so that loops inside do not leak
          eps(cur, s);
          cur = emit(b, n.kids[0], s);
        }
        if (n.max < 0) {
          const int loop = add();
          eps(cur, loop);
          eps(emit(b, n.kids[0], loop), loop);
          return loop;
        }
        const int end = add();
        for (int i = n.min; i < n.max; ++i) {
          eps(cur, end);
          const int s = add();
          eps(cur, s);
          cur = emit(b, n.kids[0], s);
        }
        eps(cur, end);
        return end;
      }
    }
    return from;
  }
};

}  // namespace

std::unique_ptr<GrammarImpl> Builder::compile(int start) const {
  const int nrules = int(rule_body_.size());
  Nfa nfa;
  std::vector<int> rstart(nrules), rfinal(nrules);
  std::vector<int> state_rule;
  for (int r = 0; r < nrules; ++r) {
    FLASHMAP_ASSERT(rule_body_[r] >= 0);
    rstart[r] = nfa.add();
    rfinal[r] = nfa.emit(*this, rule_body_[r], rstart[r]);
    state_rule.resize(nfa.out.size(), r);
  }
  std::vector<uint8_t> is_final(nfa.out.size(), 0);
  for (int r = 0; r < nrules; ++r) is_final[rfinal[r]] = 1;

  auto g = std::make_unique<GrammarImpl>();
  // Byte classes: bytes no edge tells apart share a class.
  std::vector<uint8_t> boundary(257, 0);
  boundary[0] = 1;
  for (const auto& edges : nfa.out)
    for (const NfaEdge& e : edges)
      if (e.kind == NfaEdge::kByte) boundary[e.lo] = boundary[e.hi + 1] = 1;
  int cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (boundary[b]) ++cls;
    g->class_of[b] = uint8_t(cls);
  }
  g->num_classes = cls + 1;
  const int nc = g->num_classes;

  // Subset construction; a DFA state is an epsilon-closed sorted set of NFA states of one rule.
  // Its cost is the NFA states and edges it visits and the sorting of each set it closes, summed
  // over every set it builds; a few DFA states can each hold most of a large NFA (an optional
  // repeated many times), so that sum is bounded as well as the number of states.
  size_t steps = 0;
  auto spend = [&](size_t n) {
    steps += n;
    FLASHMAP_CHECK(steps <= kMaxCompileSteps,
                   "grammar too large: its automaton takes more than {} steps to build (lower "
                   "the repetition counts, lengths or alternatives)",
                   kMaxCompileSteps);
  };
  constexpr size_t kClosureCost = 8;  // its allocations and sort, in steps
  std::vector<uint32_t> stamp(nfa.out.size(), 0);
  uint32_t epoch = 0;
  auto closure = [&](std::vector<int>& set) {
    ++epoch;
    std::vector<int> work = set;
    set.clear();
    for (int s : work) stamp[s] = epoch;
    while (!work.empty()) {
      const int s = work.back();
      work.pop_back();
      set.push_back(s);
      spend(1 + nfa.out[s].size());
      for (const NfaEdge& e : nfa.out[s])
        if (e.kind == NfaEdge::kEps && stamp[e.to] != epoch) {
          stamp[e.to] = epoch;
          work.push_back(e.to);
        }
    }
    std::sort(set.begin(), set.end());
    spend(kClosureCost + set.size() * std::bit_width(set.size()) / 4);
  };
  struct SetHash {
    size_t operator()(const std::vector<int>& v) const {
      uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
      for (int x : v) h = (h ^ uint32_t(x)) * 0x100000001B3ull;
      return size_t(h ^ (h >> 29));
    }
  };
  std::unordered_map<std::vector<int>, uint32_t, SetHash> ids;
  std::vector<std::vector<int>> sets;
  auto intern = [&](std::vector<int> set) -> uint32_t {
    auto [it, fresh] = ids.emplace(set, uint32_t(sets.size()));
    if (fresh) {
      FLASHMAP_CHECK(sets.size() < kMaxDfaStates,
                     "grammar too large: more than {} DFA states (lower the repetition counts, "
                     "lengths or alternatives)",
                     kMaxDfaStates);
      sets.push_back(std::move(set));
    }
    return it->second;
  };
  for (int r = 0; r < nrules; ++r) {
    std::vector<int> s{rstart[r]};
    closure(s);
    g->rule_start.push_back(intern(std::move(s)));
  }
  // A kernel (the states one byte class reaches, before closure) recurs across byte classes and
  // DFA states whenever a wide range such as `.` leaves many states; it is closed and sorted once.
  std::unordered_map<std::vector<int>, uint32_t, SetHash> kernel_ids;
  auto target = [&](std::vector<int>& kernel) -> uint32_t {
    spend(kernel.size());
    if (auto it = kernel_ids.find(kernel); it != kernel_ids.end()) return it->second;
    std::vector<int> t = kernel;
    closure(t);
    const uint32_t id = intern(std::move(t));
    kernel_ids.emplace(std::move(kernel), id);
    return id;
  };
  std::vector<std::vector<int>> by_class(nc);
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& v : by_class) v.clear();
    std::map<int, std::vector<int>> call_targets;
    bool acc = false, any_bytes = false;
    for (int s : sets[d]) {
      spend(1 + nfa.out[s].size());
      if (is_final[s]) acc = true;
      for (const NfaEdge& e : nfa.out[s]) {
        if (e.kind == NfaEdge::kByte) {
          any_bytes = true;
          spend(size_t(g->class_of[e.hi] - g->class_of[e.lo]));
          for (int c = g->class_of[e.lo]; c <= g->class_of[e.hi]; ++c) by_class[c].push_back(e.to);
        } else if (e.kind == NfaEdge::kCall) {
          call_targets[e.rule].push_back(e.to);
        }
      }
    }
    g->accept.push_back(acc);
    g->has_bytes.push_back(any_bytes);
    for (int c = 0; c < nc; ++c) {
      if (by_class[c].empty()) {
        g->trans.push_back(kDead);
        continue;
      }
      g->trans.push_back(target(by_class[c]));
    }
    g->call_begin.push_back(uint32_t(g->calls.size()));
    for (auto& [rule, targets] : call_targets) {
      closure(targets);
      const uint32_t id = intern(std::move(targets));
      g->calls.push_back({uint32_t(rule), id});
    }
  }
  g->call_begin.push_back(uint32_t(g->calls.size()));
  const size_t n = sets.size();

  // Liveness: a state is live when some path through bytes and calls of productive rules
  // reaches the end of its rule. Transitions into dead states are removed, so that every prefix
  // the automaton accepts can be completed.
  std::vector<uint8_t> live(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = n; s-- > 0;) {
      if (live[s]) continue;
      bool l = g->accept[s];
      for (int c = 0; c < nc && !l; ++c) {
        const uint32_t t = g->trans[s * nc + c];
        l = t != kDead && live[t];
      }
      for (uint32_t k = g->call_begin[s]; k < g->call_begin[s + 1] && !l; ++k)
        l = live[g->rule_start[g->calls[k].first]] && live[g->calls[k].second];
      if (l) live[s] = changed = true;
    }
  }
  FLASHMAP_CHECK(live[g->rule_start[start]], "the grammar matches nothing");
  for (size_t s = 0; s < n; ++s) {
    bool any = false;
    for (int c = 0; c < nc; ++c) {
      uint32_t& t = g->trans[s * nc + c];
      if (t != kDead && !live[t]) t = kDead;
      any |= t != kDead;
    }
    g->has_bytes[s] = any;
  }
  std::vector<std::pair<uint32_t, uint32_t>> calls;
  std::vector<uint32_t> call_begin;
  for (size_t s = 0; s < n; ++s) {
    call_begin.push_back(uint32_t(calls.size()));
    for (uint32_t k = g->call_begin[s]; k < g->call_begin[s + 1]; ++k)
      if (live[g->rule_start[g->calls[k].first]] && live[g->calls[k].second])
        calls.push_back(g->calls[k]);
  }
  call_begin.push_back(uint32_t(calls.size()));
  g->calls = std::move(calls);
  g->call_begin = std::move(call_begin);
  for (size_t s = 0; s < n; ++s)
    g->simple.push_back(g->has_bytes[s] && !g->accept[s] &&
                        g->call_begin[s] == g->call_begin[s + 1]);
  g->rule_names = rule_names_;
  g->start_rule = uint32_t(start);
  return g;
}

}  // namespace flashmap::constrain
