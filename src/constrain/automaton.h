// Internals of src/constrain: expressions over bytes with calls between rules, their compilation
// to one DFA per rule (Thompson NFA + subset construction over byte classes), and code-point sets
// encoded as UTF-8 byte sequences.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "constrain/constrain.h"

namespace flashmap::constrain {

inline constexpr uint32_t kDead = UINT32_MAX;

// The compiled automaton. States of all rules are numbered together.
struct GrammarImpl {
  int num_classes = 0;
  uint8_t class_of[256] = {};
  std::vector<uint32_t> trans;  // state * num_classes + class -> state or kDead
  std::vector<uint8_t> accept;  // the rule may end here
  std::vector<uint8_t> has_bytes;
  std::vector<uint8_t> simple;       // has bytes, no calls, not accepting: a thread stays as it is
  std::vector<uint32_t> call_begin;  // size states + 1
  std::vector<std::pair<uint32_t, uint32_t>> calls;  // (rule, state to return to)
  std::vector<uint32_t> rule_start;
  std::vector<std::string> rule_names;
  uint32_t start_rule = 0;

  size_t num_states() const { return accept.size(); }
  uint32_t next(uint32_t state, uint8_t byte) const {
    return trans[size_t(state) * num_classes + class_of[byte]];
  }
};

// Sorted disjoint code-point ranges, never holding surrogates (U+D800..U+DFFF).
using CpSet = std::vector<std::pair<uint32_t, uint32_t>>;
CpSet cp_normalize(CpSet set);  // sorts, merges, drops surrogates and anything past U+10FFFF
CpSet cp_complement(const CpSet& set);
CpSet cp_subtract(const CpSet& a, const CpSet& b);

// Expressions are indices into a Builder; they may be shared (a DAG), each use is copied.
class Builder {
 public:
  enum class Kind : uint8_t { kBytes, kSeq, kAlt, kRepeat, kCall, kMembers };
  struct Node {
    Kind kind = Kind::kSeq;
    uint8_t lo = 0, hi = 0;  // kBytes
    int min = 0, max = 0;    // kRepeat (max -1: unbounded)
    int rule = -1;           // kCall
    std::vector<int> kids;
    std::vector<uint8_t> required;  // kMembers
  };

  int bytes(uint8_t lo, uint8_t hi);
  int lit(std::string_view s);
  int seq(std::vector<int> kids);
  int alt(std::vector<int> kids);  // no kids: matches nothing
  int empty() { return seq({}); }
  int nothing() { return alt({}); }
  int repeat(int e, int min, int max);  // max -1: unbounded; bounds checked against kMaxRepeat
  int opt(int e) { return repeat(e, 0, 1); }
  int star(int e) { return repeat(e, 0, -1); }
  int call(int rule);
  // members[0..n) in order, separated by `sep`, each optional one may be left out, at least one
  // written unless `allow_empty`. Linear in n (a plain expression for it would be quadratic).
  int members(std::vector<int> members, std::vector<uint8_t> required, int sep, bool allow_empty);
  int utf8(const CpSet& set);  // one code point of `set`, UTF-8 encoded

  int new_rule(std::string name);
  void define(int rule, int expr);
  bool defined(int rule) const { return rule_body_[rule] >= 0; }

  // Compiles with `start` as the top rule. Throws flashmap::Error when the grammar is too large
  // or matches nothing.
  std::unique_ptr<GrammarImpl> compile(int start) const;

  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int> rule_body_;
  std::vector<std::string> rule_names_;
};

// Compiled grammars by key, most recently used first, bounded in count and in the bytes that
// the keys and grammars hold; a grammar larger than the whole budget is not kept. Thread-safe.
class GrammarCache {
 public:
  GrammarCache(size_t max_entries, size_t max_bytes);
  std::shared_ptr<const Grammar> find(const std::string& key);  // null when not held
  void insert(const std::string& key, std::shared_ptr<const Grammar> grammar);
  size_t bytes() const;
  size_t size() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const Grammar> grammar;
    size_t bytes;
  };
  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;
  size_t bytes_ = 0;
};

// Regex syntax tree for the parser shared by compile_regex and JSON-schema `pattern`.
// `encode_cp` turns a code-point set into an expression (plain UTF-8, or JSON-string escaped).
struct RegexEncoder {
  virtual ~RegexEncoder() = default;
  virtual int encode(Builder& b, const CpSet& set) = 0;
};
// Parses `pattern` into b; `context` prefixes error messages. With `search` (JSON-schema
// semantics) the match is unanchored unless ^ / $ are written at the ends.
int parse_regex(Builder& b, std::string_view pattern, RegexEncoder& enc, bool search,
                const std::string& context);

// The JSON-string encoding of code points: '"', '\\' and controls as their escapes.
struct JsonStringEncoder : RegexEncoder {
  int encode(Builder& b, const CpSet& set) override;
};

}  // namespace flashmap::constrain
