// Prompt-lookup drafting (vLLM's and SGLang's "ngram" speculators, llama.cpp's lookup decoding,
// transformers' prompt_lookup_num_tokens): no drafter model. The last n tokens of a sequence
// (n from max_n down to min_n) are looked up in its own prompt and generated text, and the
// tokens that followed the latest earlier occurrence of the longest match are the draft.
//
// The index is a hash table from each n-gram to the last position it ended at, with a chain to
// its previous occurrence (zlib's hash chains): appending a token costs O(max_n), a lookup
// O(max_n · (max_n + kMaxChain)), whatever the sequence holds, and memory grows linearly with the
// tokens indexed even when they repeat one token for megabytes (one key per n, one chain entry
// per position and n).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace flashmap {

struct NgramOptions {
  // Default 1..4 (vLLM's prompt_lookup_min/max, llama.cpp's lookup): a 4-gram match in natural
  // text is nearly always a quotation, and below it the longest shorter match still proposes
  // something; a rejected draft only adds rows to a verify forward that reads the weights once.
  int min_n = 1;
  int max_n = 4;
  // Default 8 draft tokens: the block FlashMap's default drafter verifies, long enough for a
  // quoted run and still a cheap verify forward when it misses.
  int block = 8;
  // Limits: longer n-grams than 32 add nothing over 32 (a 32-token match is already certain
  // quotation) and cost O(n) per appended token; 64 drafts is past any τ measured (bench/TREES.md).
  static constexpr int kMaxN = 32;
  static constexpr int kMaxBlock = 64;
  // Throws flashmap::Error naming --ngram-min, --ngram-max or --ngram-block.
  void validate() const;
};

class NgramIndex {
 public:
  // Older occurrences of one n-gram walked per lookup, at most (trees; the block uses the latest).
  static constexpr int kMaxChain = 64;

  NgramIndex(int min_n, int max_n);
  // Appends committed tokens and indexes the n-grams ending at each of them.
  void append(std::span<const int32_t> tokens);
  // The first `length` tokens only (rebuilt: O(length)).
  NgramIndex prefix(int64_t length) const;
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t size() const { return int64_t(tokens_.size()); }
  size_t bytes() const;

  // Up to `max_candidates` distinct continuations of `length` tokens after the sequence
  // tokens() + [anchor] (the anchor is drawn, not committed yet): first the continuation of the
  // latest occurrence of the longest matching n-gram, then older occurrences of it, then those of
  // shorter n-grams, each at most kMaxChain occurrences back. A continuation that reaches the
  // sequence's end repeats the period it matched (LZ77's overlapping copy: a run of one token
  // continues the run). None when no n-gram of min_n tokens or more occurred before.
  // `match`, when given, gets each continuation's n-gram length.
  std::vector<std::vector<int32_t>> continuations(int32_t anchor, int length, int max_candidates,
                                                  std::vector<int>* match = nullptr) const;

 private:
  int level(int n) const { return n - min_n_; }
  int64_t find(uint64_t key) const;  // slot of `key` in the table (or the empty slot for it)
  void insert(uint64_t key, int32_t end, int lvl);
  void grow();

  int min_n_, max_n_;
  std::vector<int32_t> tokens_;
  // Open addressing (linear probing, at most half full): key (the n-gram's hash, never 0) and
  // the latest position it ended at.
  std::vector<uint64_t> keys_;
  std::vector<int32_t> heads_;
  int64_t used_ = 0;
  // prev_[i · levels + level]: the previous end of the n-gram ending at i (−1: none).
  std::vector<int32_t> prev_;
};

}  // namespace flashmap
