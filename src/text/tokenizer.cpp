// Byte-level BPE that reproduces Hugging Face `tokenizers` (0.2x) ids exactly. The pipeline mirrors
// TokenizerImpl::encode_single_sequence: added tokens are cut out of the raw text first, the rest
// is normalized, normalized added tokens are cut out of that, the pre-tokenizer splits it into
// words, and the BPE model turns each word into ids.
//
// Speed comes from three things HF does not do: BPE runs on raw bytes (the byte-level vocabulary is
// mapped back to bytes once, at load), merges are looked up in a flat hash table keyed on the pair
// of ids, and every thread keeps a lock-free cache of the words it has already tokenized.
#include "flashmap/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/check.h"
#include "io/files.h"
#include "text/unicode.h"
#include "text/utf8.h"

namespace flashmap {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Hashing

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  return x;
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ULL * (s.size() + 1);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = mix64(h ^ w);
  return h == 0 ? 1 : h;
}

// ---------------------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id), open addressing.

class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // A later merge of the same pair replaces the earlier one, as HF's HashMap collect does.
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t key = make_key(a, b);
    size_t i = mix64(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    slots_[i] = Entry{key, rank, id};
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t key = make_key(a, b);
    size_t i = mix64(key) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static uint64_t make_key(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Per-thread cache of word -> ids. Filling it never changes results, only speed.

class WordCache {
 public:
  WordCache() : slots_(kSlots) {}
  const int32_t* find(std::string_view key, uint64_t h, uint32_t* len) const {
    size_t i = h & (kSlots - 1);
    while (true) {
      const Slot& s = slots_[i];
      if (s.h == 0) return nullptr;
      if (s.h == h && s.klen == key.size() &&
          std::memcmp(keys_.data() + s.koff, key.data(), key.size()) == 0) {
        *len = s.vlen;
        return vals_.data() + s.voff;
      }
      i = (i + 1) & (kSlots - 1);
    }
  }
  void insert(std::string_view key, uint64_t h, const int32_t* ids, uint32_t n) {
    if (used_ >= kSlots / 2 || keys_.size() > kMaxKeyBytes) clear();
    size_t i = h & (kSlots - 1);
    while (slots_[i].h != 0) i = (i + 1) & (kSlots - 1);
    slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()),
                     static_cast<uint32_t>(vals_.size()), n};
    keys_.append(key);
    vals_.insert(vals_.end(), ids, ids + n);
    ++used_;
  }

 private:
  struct Slot {
    uint64_t h = 0;
    uint32_t koff = 0, klen = 0, voff = 0, vlen = 0;
  };
  static constexpr size_t kSlots = size_t{1} << 16;
  static constexpr size_t kMaxKeyBytes = size_t{4} << 20;
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    vals_.clear();
    used_ = 0;
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> vals_;
  size_t used_ = 0;
};

// ---------------------------------------------------------------------------------------------
// PCRE2 regex with Oniguruma's find_iter semantics.

struct PcreThreadState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  PcreThreadState() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    // Long runs of spaces backtrack deeply through \s+(?!\S); the default 32 KiB JIT stack is
    // too small for inputs of a few hundred KB.
    js = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    if (!md || !mc || !js) throw std::bad_alloc();
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~PcreThreadState() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

PcreThreadState& pcre_thread_state() {
  thread_local PcreThreadState state;
  return state;
}

class Regex {
 public:
  Regex(std::string_view onig_pattern, const std::string& where) {
    const std::string pattern = text::onig_to_pcre2(onig_pattern);
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(fmt::format("{}: cannot compile regex {:?}: {} (at offset {})", where,
                              std::string(onig_pattern), reinterpret_cast<char*>(msg), off));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(start, end) for every match in `s`, as rust-onig's find_iter: after an empty match
  // that ends where the previous match ended, the search moves on by one character.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= s.size()) {
      size_t ms, me;
      if (!match(s, last_end, &ms, &me)) break;
      if (ms == me && have_last && last_match_end == me) {
        if (last_end >= s.size()) break;
        size_t k = last_end;
        utf8::next(s, k);
        last_end = k;
        continue;
      }
      last_end = me;
      have_last = true;
      last_match_end = me;
      f(ms, me);
    }
  }

 private:
  bool match(std::string_view s, size_t start, size_t* ms, size_t* me) const {
    PcreThreadState& t = pcre_thread_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc;
    if (jit_) {
      rc = pcre2_jit_match(code_, subject, s.size(), start, 0, t.md, t.mc);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, t.md,
                         nullptr);
    } else {
      rc = pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, t.md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(fmt::format("pre-tokenizer regex failed on a {}-byte piece: {}", s.size(),
                              reinterpret_cast<char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(t.md);
    *ms = ov[0];
    *me = ov[1];
    return true;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest, non-overlapping matching of a set of strings (what HF's aho-corasick automaton
// with MatchKind::LeftmostLongest finds), plus AddedVocabulary::find_matches' handling of the
// single_word / lstrip / rstrip flags.
class AddedMatcher {
 public:
  void add(std::string pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    const auto first = static_cast<uint8_t>(pattern[0]);
    by_first_[first].push_back(static_cast<int>(patterns_.size()));
    patterns_.push_back({std::move(pattern), token});
    is_first_[first] = true;
  }
  void finish() {
    for (auto& list : by_first_)
      std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
        return patterns_[a].text.size() > patterns_[b].text.size();
      });
  }
  bool empty() const { return patterns_.empty(); }

  // Calls piece(begin, end) for text between tokens and token(id) for each token, in order.
  template <class Piece, class Token>
  void split(std::string_view s, Piece&& piece, Token&& token) const {
    size_t start_offset = 0;
    size_t pos = 0;
    while (true) {
      size_t ms = 0, me = 0;
      const AddedToken* t = next_match(s, pos, &ms, &me);
      if (!t) break;
      pos = me;
      size_t start = ms, stop = me;
      if (t->single_word) {
        const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
        const bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t->lstrip) start = std::max(space_leftmost_at_end(s.substr(0, start)), start_offset);
      if (t->rstrip) stop += space_rightmost_at_start(s.substr(stop));
      if (start_offset < start) piece(start_offset, start);
      token(t->id);
      start_offset = stop;
    }
    if (start_offset < s.size()) piece(start_offset, s.size());
  }

 private:
  struct Pattern {
    std::string text;
    const AddedToken* token;
  };

  const AddedToken* next_match(std::string_view s, size_t pos, size_t* ms, size_t* me) const {
    for (size_t p = pos; p < s.size(); ++p) {
      const auto b = static_cast<uint8_t>(s[p]);
      if (!is_first_[b]) continue;
      for (int k : by_first_[b]) {
        const std::string& t = patterns_[k].text;
        if (t.size() <= s.size() - p && std::memcmp(s.data() + p, t.data(), t.size()) == 0) {
          *ms = p;
          *me = p + t.size();
          return patterns_[k].token;
        }
      }
    }
    return nullptr;
  }

  static char32_t last_char(std::string_view s) {
    size_t i = utf8::prev(s, s.size());
    return utf8::next(s, i);
  }
  // The Rust regexes \w$ and ^\w used by HF.
  static bool ends_with_word(std::string_view s) {
    return !s.empty() && text::is_rust_word_char(last_char(s));
  }
  static bool starts_with_word(std::string_view s) {
    size_t i = 0;
    return !s.empty() && text::is_rust_word_char(utf8::next(s, i));
  }
  // Start of the match of \s*$ (the trailing whitespace).
  static size_t space_leftmost_at_end(std::string_view s) {
    size_t end = s.size();
    while (end > 0) {
      const size_t i = utf8::prev(s, end);
      size_t k = i;
      if (!text::is_rust_whitespace(utf8::next(s, k))) break;
      end = i;
    }
    return end;
  }
  // End of the match of ^\s* (the leading whitespace).
  static size_t space_rightmost_at_start(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
      size_t k = i;
      if (!text::is_rust_whitespace(utf8::next(s, k))) break;
      i = k;
    }
    return i;
  }

  std::vector<Pattern> patterns_;
  std::array<std::vector<int>, 256> by_first_;
  std::array<bool, 256> is_first_{};
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer steps

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  std::unique_ptr<Regex> regex;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

struct Span {
  uint32_t begin, end;
  bool flag;  // is_match before the behaviour is applied, "remove" after
};

// The ByteLevel pre-tokenizer's own regex (GPT-2's), used when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr size_t kMaxSplitDepth = 16;

// Largest tokenizer.json read (real ones: 2-35 MB).
constexpr size_t kMaxTokenizerFileBytes = size_t{1} << 30;

// Everything an encode call on one thread reuses between words.
struct Scratch {
  uint64_t owner = 0;
  WordCache cache;
  std::string normalized;
  std::string prefixed;
  std::array<std::vector<Span>, kMaxSplitDepth> spans;
  std::vector<int32_t> syms;
  std::vector<uint32_t> pair_rank;
  std::vector<int32_t> pair_id;
  std::vector<int32_t> prev, next;
  std::vector<uint64_t> heap;
};

// ---------------------------------------------------------------------------------------------
// JSON helpers: every error names the file and the field.

struct JsonCtx {
  std::string file;
  std::string where(std::string_view field) const {
    return fmt::format("tokenizer file '{}': {}", file, field);
  }
  [[noreturn]] void fail(std::string_view field, std::string_view what) const {
    throw Error(fmt::format("{}: {}", where(field), what));
  }
  const json& at(const json& j, const char* key, std::string_view field) const {
    if (!j.is_object()) fail(field, "expected an object");
    auto it = j.find(key);
    if (it == j.end())
      fail(field.empty() ? std::string(key) : fmt::format("{}.{}", field, key), "missing");
    return *it;
  }
  bool flag(const json& j, const char* key, bool dflt, std::string_view field) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(fmt::format("{}.{}", field, key), "expected true or false");
    return it->get<bool>();
  }
  std::string str(const json& j, std::string_view field) const {
    if (!j.is_string()) fail(field, "expected a string");
    return j.get<std::string>();
  }
  std::string type_of(const json& j, std::string_view field) const {
    return str(at(j, "type", field), fmt::format("{}.type", field));
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  uint64_t uid = 0;

  // Model
  std::vector<std::string> token_text;  // id -> token as written in the file ("" if unused)
  std::vector<uint8_t> assigned;        // id -> 1 if some token has this id
  std::vector<uint8_t> special;         // id -> 1 if skip_special_tokens drops it
  std::vector<uint32_t> decoded_off;    // id -> bytes the ByteLevel decoder gives for it
  std::string decoded_bytes;
  std::unordered_map<std::string, int32_t> model_vocab;
  std::unordered_map<std::string, int32_t> added_vocab;
  std::unordered_map<std::string, int32_t> raw_vocab;  // byte form, for ignore_merges
  std::array<int32_t, 256> byte_id{};                  // -1: byte has no token
  std::array<std::vector<int32_t>, 256> byte_fallback_ids;
  MergeTable merges;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;

  // Pipeline
  std::vector<std::unique_ptr<AddedToken>> added;
  AddedMatcher added_raw;   // normalized=false tokens, matched on the input
  AddedMatcher added_norm;  // normalized=true tokens, matched on normalized text
  bool nfc = false;
  std::vector<SplitStep> splits;
  bool add_prefix_space = false;
  std::unique_ptr<Regex> byte_level_regex;  // set when use_regex

  Scratch& scratch() const;
  void encode_segment(std::string_view seg, std::vector<int32_t>& out, Scratch& sc) const;
  void pre_tokenize(std::string_view piece, size_t depth, std::vector<int32_t>& out,
                    Scratch& sc) const;
  void byte_level(std::string_view piece, std::vector<int32_t>& out, Scratch& sc) const;
  void bpe(std::string_view word, std::vector<int32_t>& out, Scratch& sc) const;
  void bpe_merge(std::string_view word, Scratch& sc) const;
  void bpe_merge_long(Scratch& sc) const;
  std::string_view decoded(int32_t id) const {
    return std::string_view(decoded_bytes)
        .substr(decoded_off[id], decoded_off[id + 1] - decoded_off[id]);
  }
  void check_id(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= assigned.size() || !assigned[id])
      throw Error(
          fmt::format("token id {} is not in the vocabulary (size {})", id, assigned.size()));
  }
};

namespace {

std::atomic<uint64_t> g_next_uid{1};

void parse_normalizer(const JsonCtx& cx, const json& j, std::string_view field, bool* nfc) {
  if (j.is_null()) return;
  const std::string type = cx.type_of(j, field);
  if (type == "NFC") {
    *nfc = true;
  } else if (type == "Sequence") {
    const json& list = cx.at(j, "normalizers", field);
    if (!list.is_array()) cx.fail(fmt::format("{}.normalizers", field), "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(cx, list[i], fmt::format("{}.normalizers[{}]", field, i), nfc);
  } else {
    cx.fail(fmt::format("{}.type", field),
            fmt::format("unsupported normalizer '{}' (supported: NFC, Sequence, null)", type));
  }
}

void parse_pre_tokenizer(const JsonCtx& cx, const json& j, std::string_view field,
                         Tokenizer::Impl& m, bool* byte_level_seen) {
  const std::string type = cx.type_of(j, field);
  if (type == "Sequence") {
    const json& list = cx.at(j, "pretokenizers", field);
    if (!list.is_array()) cx.fail(fmt::format("{}.pretokenizers", field), "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(cx, list[i], fmt::format("{}.pretokenizers[{}]", field, i), m,
                          byte_level_seen);
    return;
  }
  if (*byte_level_seen) cx.fail(field, "flashmap needs ByteLevel to be the last pre-tokenizer");
  if (type == "ByteLevel") {
    *byte_level_seen = true;
    m.add_prefix_space = cx.flag(j, "add_prefix_space", true, field);
    if (cx.flag(j, "use_regex", true, field))
      m.byte_level_regex = std::make_unique<Regex>(kGpt2Pattern, cx.where(field));
  } else if (type == "Split") {
    if (m.splits.size() + 1 >= kMaxSplitDepth) cx.fail(field, "too many Split pre-tokenizers");
    SplitStep step;
    const json& pat = cx.at(j, "pattern", field);
    const std::string pfield = fmt::format("{}.pattern", field);
    if (pat.is_object() && pat.contains("Regex")) {
      step.regex =
          std::make_unique<Regex>(cx.str(pat["Regex"], pfield + ".Regex"), cx.where(pfield));
    } else if (pat.is_object() && pat.contains("String")) {
      step.regex = std::make_unique<Regex>(regex_escape(cx.str(pat["String"], pfield + ".String")),
                                           cx.where(pfield));
    } else {
      cx.fail(pfield, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string bfield = fmt::format("{}.behavior", field);
    const std::string behavior = cx.str(cx.at(j, "behavior", field), bfield);
    if (behavior == "Removed")
      step.behavior = Behavior::Removed;
    else if (behavior == "Isolated")
      step.behavior = Behavior::Isolated;
    else if (behavior == "MergedWithPrevious")
      step.behavior = Behavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext")
      step.behavior = Behavior::MergedWithNext;
    else if (behavior == "Contiguous")
      step.behavior = Behavior::Contiguous;
    else
      cx.fail(bfield, fmt::format("unknown behavior '{}'", behavior));
    step.invert = cx.flag(j, "invert", false, field);
    m.splits.push_back(std::move(step));
  } else {
    cx.fail(fmt::format("{}.type", field),
            fmt::format("unsupported pre-tokenizer '{}' (supported: Split, ByteLevel, Sequence)",
                        type));
  }
}

void check_decoder(const JsonCtx& cx, const json& j) {
  if (j.is_null()) cx.fail("decoder", "missing; flashmap needs a ByteLevel decoder");
  const std::string type = cx.type_of(j, "decoder");
  if (type != "ByteLevel")
    cx.fail("decoder.type", fmt::format("unsupported decoder '{}' (supported: ByteLevel)", type));
}

// The bytes a byte-level token stands for, or nullopt if a character is outside GPT-2's map.
std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const int b = text::char_to_byte(utf8::next(token, i));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

// Token ids index tables sized max id + 1, so an id far past the number of tokens would make a
// small file allocate gigabytes: ids stay below kMaxTokenId (64 times the largest vocabularies),
// and build() also checks that they are dense enough.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

int32_t json_id(const JsonCtx& cx, const json& j, std::string_view field) {
  if (!j.is_number_integer()) cx.fail(field, "expected an integer id");
  if (j.is_number_unsigned() && j.get<uint64_t>() >= uint64_t(kMaxTokenId))
    cx.fail(field, fmt::format("id {} out of range [0, {})", j.dump(), kMaxTokenId));
  const int64_t id = j.get<int64_t>();
  if (id < 0 || id >= kMaxTokenId)
    cx.fail(field, fmt::format("id {} out of range [0, {})", id, kMaxTokenId));
  return static_cast<int32_t>(id);
}

std::shared_ptr<Tokenizer::Impl> build(const JsonCtx& cx, const json& root) {
  auto m = std::make_shared<Tokenizer::Impl>();
  m->uid = g_next_uid.fetch_add(1);
  if (!root.is_object()) cx.fail("(top level)", "expected a JSON object");

  // --- model
  const json& model = cx.at(root, "model", "");
  if (!model.is_object()) cx.fail("model", "expected an object");
  const std::string model_type =
      model.contains("type") ? cx.str(model["type"], "model.type") : std::string("BPE");
  if (model_type != "BPE")
    cx.fail("model.type", fmt::format("unsupported model type '{}' (supported: BPE)", model_type));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    cx.fail("model.dropout", "BPE dropout is random; only null is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !cx.str(model[key], fmt::format("model.{}", key)).empty())
      cx.fail(fmt::format("model.{}", key), "not supported for byte-level BPE");
  }
  m->ignore_merges = cx.flag(model, "ignore_merges", false, "model");
  m->byte_fallback = cx.flag(model, "byte_fallback", false, "model");
  m->fuse_unk = cx.flag(model, "fuse_unk", false, "model");

  const json& vocab = cx.at(model, "vocab", "model");
  if (!vocab.is_object()) cx.fail("model.vocab", "expected an object of token: id");
  int32_t max_id = -1;
  m->model_vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = json_id(cx, it.value(), fmt::format("model.vocab[{:?}]", it.key()));
    m->model_vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }

  // --- added tokens
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) cx.fail("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = fmt::format("added_tokens[{}]", i);
      auto t = std::make_unique<AddedToken>();
      t->content = cx.str(cx.at(list[i], "content", field), field + ".content");
      t->id = json_id(cx, cx.at(list[i], "id", field), field + ".id");
      t->single_word = cx.flag(list[i], "single_word", false, field);
      t->lstrip = cx.flag(list[i], "lstrip", false, field);
      t->rstrip = cx.flag(list[i], "rstrip", false, field);
      t->special = cx.flag(list[i], "special", false, field);
      t->normalized = cx.flag(list[i], "normalized", !t->special, field);
      if (t->content.empty()) continue;  // HF ignores empty added tokens
      if (!utf8::valid(t->content)) cx.fail(field, "content is not UTF-8");
      max_id = std::max(max_id, t->id);
      m->added.push_back(std::move(t));
    }
  }

  // --- id tables
  // Real vocabularies are dense (a few reserved holes at most); allow plenty of slack.
  const size_t listed = m->model_vocab.size() + m->added.size();
  if (max_id >= 0 && size_t(max_id) >= 2 * listed + 1024)
    cx.fail("model.vocab",
            fmt::format("token id {} is far beyond the {} tokens listed", max_id, listed));
  const size_t n = static_cast<size_t>(max_id + 1);
  m->token_text.assign(n, std::string());
  m->assigned.assign(n, 0);
  m->special.assign(n, 0);
  for (const auto& [tok, id] : m->model_vocab) {
    m->token_text[id] = tok;
    m->assigned[id] = 1;
  }
  for (const auto& t : m->added) {  // added tokens win over the model, as in HF's id_to_token
    m->token_text[t->id] = t->content;
    m->assigned[t->id] = 1;
    m->added_vocab[t->content] = t->id;
  }
  // HF decides "special" by the token's text (AddedVocabulary::is_special_token).
  std::unordered_map<std::string, bool> special_text;
  for (const auto& t : m->added)
    if (t->special) special_text[t->content] = true;
  for (size_t id = 0; id < n; ++id)
    if (m->assigned[id] && special_text.count(m->token_text[id])) m->special[id] = 1;

  // ByteLevel decoder: a token whose characters all come from the byte map stands for those
  // bytes; any other token for its own UTF-8 (ByteLevel::decode_chain).
  m->decoded_off.assign(n + 1, 0);
  for (size_t id = 0; id < n; ++id) {
    m->decoded_off[id] = static_cast<uint32_t>(m->decoded_bytes.size());
    if (!m->assigned[id]) continue;
    const std::string& tok = m->token_text[id];
    if (auto bytes = byte_level_to_bytes(tok))
      m->decoded_bytes += *bytes;
    else
      m->decoded_bytes += tok;
  }
  m->decoded_off[n] = static_cast<uint32_t>(m->decoded_bytes.size());

  // Byte-level word alphabet: byte b enters BPE as the token for GPT-2's character for b.
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, text::byte_to_char(static_cast<uint8_t>(b)));
    auto it = m->model_vocab.find(ch);
    m->byte_id[b] = it == m->model_vocab.end() ? -1 : it->second;
    if (m->byte_fallback) {  // HF looks up <0xXX> for each UTF-8 byte of the character
      std::vector<int32_t> ids;
      for (unsigned char c : ch) {
        auto f = m->model_vocab.find(fmt::format("<0x{:02X}>", c));
        if (f == m->model_vocab.end()) {
          ids.clear();
          break;
        }
        ids.push_back(f->second);
      }
      m->byte_fallback_ids[b] = std::move(ids);
    }
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string unk = cx.str(model["unk_token"], "model.unk_token");
    auto it = m->model_vocab.find(unk);
    if (it == m->model_vocab.end())
      cx.fail("model.unk_token", fmt::format("'{}' is not in model.vocab", unk));
    m->unk_id = it->second;
  }
  if (m->ignore_merges) {
    for (const auto& [tok, id] : m->model_vocab)
      if (auto bytes = byte_level_to_bytes(tok)) m->raw_vocab.emplace(*bytes, id);
  }

  // --- merges: [["a", "b"], ...] (tokenizers >= 0.20) or ["a b", ...] (older files)
  const json& merges = cx.at(model, "merges", "model");
  if (!merges.is_array()) cx.fail("model.merges", "expected an array");
  m->merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& mj = merges[i];
    const std::string field = fmt::format("model.merges[{}]", i);
    std::string a, b;
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) cx.fail(field, fmt::format("'{}' is not \"left right\"", s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      cx.fail(field, "expected [\"left\", \"right\"] or \"left right\"");
    }
    auto ia = m->model_vocab.find(a), ib = m->model_vocab.find(b), ic = m->model_vocab.find(a + b);
    if (ia == m->model_vocab.end() || ib == m->model_vocab.end() || ic == m->model_vocab.end())
      cx.fail(field,
              fmt::format("merge of '{}' and '{}' uses a token that is not in model.vocab", a, b));
    m->merges.insert(ia->second, ib->second, static_cast<uint32_t>(i), ic->second);
  }

  // --- normalizer, pre-tokenizer, decoder
  parse_normalizer(cx, root.value("normalizer", json()), "normalizer", &m->nfc);
  const json pre = root.value("pre_tokenizer", json());
  bool byte_level_seen = false;
  if (!pre.is_null()) parse_pre_tokenizer(cx, pre, "pre_tokenizer", *m, &byte_level_seen);
  if (!byte_level_seen)
    cx.fail("pre_tokenizer", "flashmap supports byte-level BPE only: no ByteLevel pre-tokenizer");
  check_decoder(cx, root.value("decoder", json()));

  if (m->nfc) {  // build the NFC tables now rather than during the first request (~15 ms)
    std::string warm;
    text::nfc("e\xCC\x81", warm);
  }
  // Added tokens go in one of two matchers; normalized ones are matched in their normalized form.
  for (const auto& t : m->added) {
    if (!t->normalized) {
      m->added_raw.add(t->content, t.get());
    } else {
      std::string norm;
      if (m->nfc && text::nfc(t->content, norm))
        m->added_norm.add(norm, t.get());
      else
        m->added_norm.add(t->content, t.get());
    }
  }
  m->added_raw.finish();
  m->added_norm.finish();
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoding

Scratch& Tokenizer::Impl::scratch() const {
  // A few tokenizers per thread is plenty; evict round-robin beyond that.
  constexpr size_t kSlots = 4;
  thread_local std::array<std::unique_ptr<Scratch>, kSlots> slots;
  thread_local size_t next_evict = 0;
  for (auto& s : slots)
    if (s && s->owner == uid) return *s;
  for (auto& s : slots)
    if (!s) {
      s = std::make_unique<Scratch>();
      s->owner = uid;
      return *s;
    }
  auto& s = slots[next_evict++ % kSlots];
  s = std::make_unique<Scratch>();
  s->owner = uid;
  return *s;
}

void Tokenizer::Impl::encode_segment(std::string_view seg, std::vector<int32_t>& out,
                                     Scratch& sc) const {
  std::string_view s = seg;
  if (nfc && text::nfc(seg, sc.normalized)) s = sc.normalized;
  if (added_norm.empty()) {
    pre_tokenize(s, 0, out, sc);
    return;
  }
  // `s` may live in sc.normalized, which nothing below writes to.
  added_norm.split(
      s, [&](size_t b, size_t e) { pre_tokenize(s.substr(b, e - b), 0, out, sc); },
      [&](int32_t id) { out.push_back(id); });
}

// One Split step per depth, mirroring NormalizedString::split with each SplitDelimiterBehavior;
// empty pieces are dropped as PreTokenizedString::split does.
void Tokenizer::Impl::pre_tokenize(std::string_view piece, size_t depth, std::vector<int32_t>& out,
                                   Scratch& sc) const {
  if (piece.empty()) return;
  if (depth == splits.size()) {
    byte_level(piece, out, sc);
    return;
  }
  const SplitStep& step = splits[depth];
  if (step.behavior == Behavior::Isolated) {  // matches and gaps alike become pieces
    size_t prev = 0;
    step.regex->for_each_match(piece, [&](size_t b, size_t e) {
      if (prev < b) pre_tokenize(piece.substr(prev, b - prev), depth + 1, out, sc);
      pre_tokenize(piece.substr(b, e - b), depth + 1, out, sc);
      prev = e;
    });
    if (prev < piece.size()) pre_tokenize(piece.substr(prev), depth + 1, out, sc);
    return;
  }
  std::vector<Span>& spans = sc.spans[depth];
  spans.clear();
  size_t prev = 0;
  const bool m = !step.invert;
  step.regex->for_each_match(piece, [&](size_t b, size_t e) {
    if (prev != b) spans.push_back({uint32_t(prev), uint32_t(b), !m});
    spans.push_back({uint32_t(b), uint32_t(e), m});
    prev = e;
  });
  if (prev != piece.size()) spans.push_back({uint32_t(prev), uint32_t(piece.size()), !m});

  std::vector<Span> merged;  // (begin, end, remove)
  merged.reserve(spans.size());
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::Removed:
      merged = spans;
      break;
    case Behavior::Contiguous:
      for (const Span& sp : spans) {
        if (sp.flag == previous_match && !merged.empty())
          merged.back().end = sp.end;
        else
          merged.push_back({sp.begin, sp.end, false});
        previous_match = sp.flag;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (const Span& sp : spans) {
        if (sp.flag && !previous_match && !merged.empty())
          merged.back().end = sp.end;
        else
          merged.push_back({sp.begin, sp.end, false});
        previous_match = sp.flag;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !merged.empty())
          merged.back().begin = it->begin;
        else
          merged.push_back({it->begin, it->end, false});
        previous_match = it->flag;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case Behavior::Isolated:
      break;
  }
  for (const Span& sp : merged)
    if (!sp.flag) pre_tokenize(piece.substr(sp.begin, sp.end - sp.begin), depth + 1, out, sc);
}

// ByteLevel pre-tokenizer: optional leading space on every piece, optional GPT-2 split; the byte
// to character mapping itself is folded into the vocabulary.
void Tokenizer::Impl::byte_level(std::string_view piece, std::vector<int32_t>& out,
                                 Scratch& sc) const {
  if (add_prefix_space && piece.front() != ' ') {
    sc.prefixed.assign(1, ' ');
    sc.prefixed.append(piece);
    piece = sc.prefixed;
  }
  if (!byte_level_regex) {
    bpe(piece, out, sc);
    return;
  }
  size_t prev = 0;
  byte_level_regex->for_each_match(piece, [&](size_t b, size_t e) {
    if (prev < b) bpe(piece.substr(prev, b - prev), out, sc);
    if (b < e) bpe(piece.substr(b, e - b), out, sc);
    prev = e;
  });
  if (prev < piece.size()) bpe(piece.substr(prev), out, sc);
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out, Scratch& sc) const {
  if (word.size() == 1 && byte_id[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_id[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (ignore_merges) {  // BPE::tokenize: a word that is a token is kept whole
    auto it = raw_vocab.find(std::string(word));
    if (it != raw_vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  constexpr size_t kMaxCachedWord = 256;
  const bool cacheable = word.size() <= kMaxCachedWord;
  uint64_t h = 0;
  if (cacheable) {
    h = hash_bytes(word);
    uint32_t len = 0;
    if (const int32_t* ids = sc.cache.find(word, h, &len)) {
      out.insert(out.end(), ids, ids + len);
      return;
    }
  }
  bpe_merge(word, sc);
  out.insert(out.end(), sc.syms.begin(), sc.syms.end());
  if (cacheable) sc.cache.insert(word, h, sc.syms.data(), static_cast<uint32_t>(sc.syms.size()));
}

// BPE::merge_word then Word::merge_all. HF pops merges from a heap ordered by (rank, position)
// and drops stale entries, which is the same as repeatedly applying the lowest-ranked pair
// present, leftmost first; short words do exactly that with a linear scan.
void Tokenizer::Impl::bpe_merge(std::string_view word, Scratch& sc) const {
  std::vector<int32_t>& syms = sc.syms;
  syms.clear();
  bool pending_unk = false;
  for (unsigned char c : word) {
    const int32_t id = byte_id[c];
    if (id >= 0) {
      if (pending_unk) syms.push_back(unk_id);
      pending_unk = false;
      syms.push_back(id);
      continue;
    }
    if (byte_fallback && !byte_fallback_ids[c].empty()) {
      syms.insert(syms.end(), byte_fallback_ids[c].begin(), byte_fallback_ids[c].end());
      continue;
    }
    if (unk_id >= 0) {
      if (pending_unk && !fuse_unk) syms.push_back(unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) syms.push_back(unk_id);
  const size_t n = syms.size();
  if (n < 2) return;
  if (n > 64) {
    bpe_merge_long(sc);
    return;
  }
  std::vector<uint32_t>& rank = sc.pair_rank;
  std::vector<int32_t>& merged = sc.pair_id;
  rank.resize(n - 1);
  merged.resize(n - 1);
  auto lookup = [&](size_t i) {
    if (const MergeTable::Entry* e = merges.find(syms[i], syms[i + 1])) {
      rank[i] = e->rank;
      merged[i] = e->id;
    } else {
      rank[i] = UINT32_MAX;
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  size_t len = n;
  while (len > 1) {
    size_t best = 0;
    uint32_t best_rank = rank[0];
    for (size_t i = 1; i + 1 < len; ++i)
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    if (best_rank == UINT32_MAX) break;
    syms[best] = merged[best];
    // Drop symbol best+1 and pair best; the pairs on either side of the new symbol change.
    // Pointers by data() + i: at the last pair, best + 2 is one past the end, which operator[]
    // may not name (even for a move of nothing).
    const size_t tail = len - best - 2;
    std::memmove(syms.data() + best + 1, syms.data() + best + 2, tail * sizeof(int32_t));
    std::memmove(rank.data() + best, rank.data() + best + 1, tail * sizeof(uint32_t));
    std::memmove(merged.data() + best, merged.data() + best + 1, tail * sizeof(int32_t));
    --len;
    if (best + 1 < len) lookup(best);
    if (best > 0) lookup(best - 1);
  }
  syms.resize(len);
}

// Word::merge_all proper (heap + linked list) for long words, where the scan would be quadratic.
void Tokenizer::Impl::bpe_merge_long(Scratch& sc) const {
  std::vector<int32_t>& syms = sc.syms;
  const size_t n = syms.size();
  std::vector<int32_t>& prev = sc.prev;
  std::vector<int32_t>& next = sc.next;
  prev.resize(n);
  next.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // Heap entries are rank << 32 | position, smallest first: HF's Merge ordering. An entry is
  // stale when the pair now at its position has another rank; ranks name pairs one to one, so
  // this is HF's check that the pair still merges into the same token.
  std::vector<uint64_t>& heap = sc.heap;
  heap.clear();
  auto key = [](uint32_t rank, size_t pos) { return (uint64_t{rank} << 32) | pos; };
  for (size_t i = 0; i + 1 < n; ++i)
    if (const MergeTable::Entry* e = merges.find(syms[i], syms[i + 1]))
      heap.push_back(key(e->rank, i));
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<uint32_t>(top);
    const int32_t right = next[pos];
    if (syms[pos] < 0 || right < 0) continue;  // merged away, or last symbol
    const MergeTable::Entry* e = merges.find(syms[pos], syms[right]);
    if (!e || e->rank != top >> 32) continue;
    syms[pos] = e->id;
    syms[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = static_cast<int32_t>(pos);
    if (prev[pos] >= 0) {
      if (const MergeTable::Entry* pe = merges.find(syms[prev[pos]], syms[pos])) {
        heap.push_back(key(pe->rank, prev[pos]));
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    }
    if (next[pos] >= 0) {
      if (const MergeTable::Entry* ne = merges.find(syms[pos], syms[next[pos]])) {
        heap.push_back(key(ne->rank, pos));
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (syms[i] >= 0) syms[k++] = syms[i];
  syms.resize(k);
}

// ---------------------------------------------------------------------------------------------
// Public API

Tokenizer Tokenizer::from_file(const std::string& path) {
  // Refuses a FIFO (which would block) or a device; "PATH: cannot open (...)" when missing.
  const std::string text = read_regular_file(path, kMaxTokenizerFileBytes);
  check_json_depth(text, fmt::format("tokenizer file '{}'", path));
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer file '{}' is not valid JSON: {}", path, e.what()));
  }
  try {
    return Tokenizer(build(JsonCtx{path}, root));
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer file '{}': {}", path, e.what()));
  }
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  return from_file(dir.empty() || dir.back() == '/' ? dir + "tokenizer.json"
                                                    : dir + "/tokenizer.json");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (size_t bad = 0; !utf8::valid(text, &bad))
    throw Error(fmt::format("invalid UTF-8 in text to tokenize at byte offset {} (byte 0x{:02X})",
                            bad, static_cast<uint8_t>(text[bad])));
  const Impl& m = *impl_;
  Scratch& sc = m.scratch();
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  m.added_raw.split(
      text, [&](size_t b, size_t e) { m.encode_segment(text.substr(b, e - b), out, sc); },
      [&](int32_t id) { out.push_back(id); });
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    m.check_id(id);
    if (skip_special_tokens && m.special[id]) continue;
    bytes.append(m.decoded(id));
  }
  if (utf8::valid(bytes)) return bytes;
  std::string out;
  utf8::append_lossy(out, bytes);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& m = *impl_;
  const std::string key(token);
  if (auto it = m.added_vocab.find(key); it != m.added_vocab.end()) return it->second;
  if (auto it = m.model_vocab.find(key); it != m.model_vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  impl_->check_id(id);
  return impl_->token_text[id];
}

size_t Tokenizer::vocab_size() const {
  return impl_->assigned.size();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}

bool Tokenizer::is_added(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->assigned.size() || !impl_->assigned[id])
    return false;
  auto it = impl_->added_vocab.find(impl_->token_text[id]);
  return it != impl_->added_vocab.end() && it->second == id;
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->assigned.size() || !impl_->assigned[id])
    return std::nullopt;
  return impl_->decoded(id);
}

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  impl_->check_id(id);
  if (skip_special_ && impl_->special[id]) return {};
  pending_.append(impl_->decoded(id));
  const size_t done = utf8::complete_prefix(pending_);
  std::string out;
  utf8::append_lossy(out, std::string_view(pending_).substr(0, done));
  pending_.erase(0, done);
  return out;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string out;
  utf8::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace flashmap
