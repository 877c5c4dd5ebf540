// Constrained decoding for structured output: a token mask over the model's vocabulary that
// allows only tokens whose bytes keep the output a prefix of some string of a language (any JSON
// object, a JSON schema's documents, or a regex's full matches). See docs/STRUCTURED_OUTPUT.md.
//
// A Grammar is a set of byte-level DFAs ("rules") that may call each other (a pushdown
// automaton: recursion only through calls). A Matcher holds the set of (DFA state, call stack)
// threads alive after the bytes so far; the mask walks a byte trie of the vocabulary in preorder,
// stepping the thread set once per trie node and skipping a whole subtree when it dies. Masks are
// cached per thread set (the same state recurs constantly, e.g. inside a string).
//
// Limits (inputs above them are a flashmap::Error, never a crash or a hang): call nesting depth
// kMaxStackDepth (for JSON: nesting of arrays/objects/schema levels), kMaxRepeat for counted
// repetitions ({m,n}, minItems/maxItems, minLength/maxLength), kMaxDfaStates and
// kMaxCompileSteps (the work of building the automaton) per grammar, kMaxSchemaDepth for the schema
// document itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashmap {
class Tokenizer;
}

namespace flashmap::constrain {

inline constexpr size_t kMaxStackDepth = 64;            // pushes beyond it are refused at run time
inline constexpr int kMaxRepeat = 512;                  // largest m or n in {m,n} and JSON counts
inline constexpr size_t kMaxDfaStates = 200000;         // per grammar
inline constexpr size_t kMaxCompileSteps = 1ull << 26;  // NFA states and edges visited, per grammar
inline constexpr size_t kMaxSchemaDepth = 64;           // nesting of the schema document
inline constexpr size_t kGrammarCacheEntries = 32;      // compiled JSON schemas kept
inline constexpr size_t kGrammarCacheBytes = size_t(256) << 20;  // and the memory they may hold

// Token byte strings of a vocabulary and their byte trie, built once per tokenizer.
class Vocabulary {
 public:
  // Ids at or beyond tokenizer.vocab_size() (up to the model's `vocab_size`), unassigned ids and
  // added tokens (special or not) get no bytes and are never allowed by a grammar.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const flashmap::Tokenizer& tokenizer,
                                                          size_t vocab_size);
  // Also for tests: token i has bytes tokens[i] (empty: never allowed).
  static std::shared_ptr<const Vocabulary> from_bytes(std::vector<std::string> tokens);

  size_t size() const { return bytes_.size(); }             // the model's vocabulary size
  size_t mask_words() const { return (size() + 31) / 32; }  // uint32 words fill_mask needs
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  // Trie in preorder: node k has `byte`, `depth` (1 = first byte), `skip` (first node after its
  // subtree) and the tokens ending there, ids[tok_begin[k] .. tok_begin[k+1]).
  struct Trie {
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<uint32_t> skip;
    std::vector<uint32_t> tok_begin;  // size nodes + 1
    std::vector<int32_t> ids;
    size_t max_depth = 0;
  };
  const Trie& trie() const { return trie_; }

 private:
  std::vector<std::string> bytes_;
  Trie trie_;
};

struct GrammarImpl;  // the automaton, defined in automaton.h

// A compiled grammar: immutable, shareable across requests and threads.
class Grammar {
 public:
  explicit Grammar(std::unique_ptr<GrammarImpl> impl);
  ~Grammar();
  const GrammarImpl& impl() const { return *impl_; }
  size_t num_states() const;  // DFA states over all rules
  size_t num_rules() const;
  size_t bytes() const;  // memory the automaton holds

 private:
  std::unique_ptr<GrammarImpl> impl_;
};

struct JsonOptions {
  // Default: compact separators (llguidance's default, XGrammar's any_whitespace=False) — no
  // whitespace anywhere but at most one space after ',' and ':' (so both `{"a":1,"b":2}` and
  // `{"a": 1, "b": 2}` are accepted). Free whitespace is what a sampled model spends its
  // max_tokens on (each position allowing it is another chance for a run of "\n\t\r").
  // flexible_whitespace: at each structural position (after '{' '[' ',' ':' and before ':' ','
  // '}' ']') a run of at most max_whitespace of ' ' '\n' '\t' '\r' (0: no whitespace at all).
  // None before or after the top-level value either way.
  bool flexible_whitespace = false;
  int max_whitespace = 16;
};

// Any JSON object (json_object mode: the top level must be an object, as OpenAI and vLLM do).
// Numbers have at most 16 integer digits, 20 fraction digits and 2 exponent digits.
std::shared_ptr<const Grammar> compile_json_object(const JsonOptions& options = {});
// The documents a JSON schema accepts (the subset of docs/STRUCTURED_OUTPUT.md). Throws
// flashmap::Error("... unsupported JSON-schema construct '<keyword>' at <json pointer>").
// Properties are generated in the order of the schema object: pass an ordered_json to keep the
// order of the request (nlohmann::json sorts keys, so its properties come alphabetically).
// Grammars are cached by schema text (the kGrammarCacheEntries most recent, holding at most
// kGrammarCacheBytes together; a larger grammar is compiled for each request that names it).
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const JsonOptions& options = {});
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema,
                                                   const JsonOptions& options = {});
// Full matches of `pattern` (anchors implicit; a leading ^ and trailing $ are accepted). Throws
// flashmap::Error naming the unsupported construct and its byte offset.
std::shared_ptr<const Grammar> compile_regex(std::string_view pattern);

// Per-sequence state. Keeps its own history of states, so speculation can step through a draft
// and go back: checkpoint() is the number of tokens advanced so far, rollback(c) returns to the
// state after c tokens. Copies are cheap but share a scratch context (stack frames, mask cache):
// a Matcher and its copies must be used from one thread at a time.
class Matcher {
 public:
  Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);
  ~Matcher();
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);

  // Allowed next tokens: bit (i % 32) of word i / 32 for token i; mask.size() >= mask_words().
  // End-of-sequence ids are never set: the caller allows them when can_end().
  void fill_mask(std::span<uint32_t> mask) const;
  size_t mask_words() const { return vocab_->mask_words(); }
  bool is_allowed(int32_t token) const;  // one token, without the mask
  // The text so far is a complete member of the language.
  bool can_end() const;
  // Only the end can follow (can_end() and no token is allowed).
  bool done() const;
  // Consumes `token`; false (state unchanged) if it is not allowed.
  bool advance(int32_t token);
  // Consumes raw bytes (for tests and forced prefixes); false (state unchanged) if refused.
  bool advance_bytes(std::string_view bytes);

  size_t checkpoint() const;         // tokens advanced so far
  void rollback(size_t checkpoint);  // back to the state after `checkpoint` tokens
  void reset() { rollback(0); }

 private:
  struct Context;
  struct State;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<Context> ctx_;
  std::vector<State> history_;  // history_[i]: the state after i tokens
};

}  // namespace flashmap::constrain
