// What the round loop (rounds.h) needs of a device: three small interfaces, implemented once for
// the CPU (src/cpu, the fp32 reference) and once for CUDA (src/cuda).
//
//   Target    the target's forward over a batch of sequences, each with its own KV cache, with
//             hidden-state taps for the drafter: open / prefill / forward / commit;
//   Proposer  a block (or a tree) of drafts after each sequence's anchor;
//   Verifier  the first token of a sequence and each round's acceptance, where the logits live:
//             logit controls, constraints and logprobs are applied there, so that a device never
//             ships logits rows to the host for them.
//
// A sequence's state on the device (KV cache, drafter context, the round's block, its last
// logits) stays in the backend that made it, in a table of its own type; the loop holds a Slot,
// which names a row of that table and gives it back when it goes. Everything above the loop
// sees only these interfaces and BackendInfo.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/hf_config.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"
#include "specdec/sampling.h"
#include "specdec/tree.h"

namespace flashmap::engine {

class Target;

// A sequence's handle: the index of its state in the backend that opened it. Move-only; its
// destruction closes the sequence (its memory goes back to the backend).
class Slot {
 public:
  Slot() = default;
  Slot(Target* owner, int index) : owner_(owner), index_(index) {}
  Slot(Slot&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), index_(o.index_) {}
  Slot& operator=(Slot&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      index_ = o.index_;
    }
    return *this;
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() { reset(); }
  void reset();
  explicit operator bool() const { return owner_ != nullptr; }
  int index() const { return index_; }

 private:
  Target* owner_ = nullptr;
  int index_ = -1;
};

// What a backend offers beyond the round itself, declared once; the engine checks options and
// requests against it at start (engine.cpp) with a clear error.
struct Capabilities {
  bool fork = false;             // open() from another sequence's prefix (prefix cache, n > 1)
  bool prompt_logprobs = false;  // prefill scoring each prompt token (Prefill::score)
  bool trees = false;            // draft trees (SeqStep::tree) drafted, verified and accepted
  // Hybrid rounds: the proposer drafts by prompt lookup where a sequence's last tokens repeat,
  // unless the round's SeqStep::lookup says the drafter alone.
  bool lookup_choice = false;
};

// What the loop reads of a backend; fixed when the backend is made.
struct BackendInfo {
  const Qwen3Config* config = nullptr;
  int64_t max_positions = 0;    // positions a sequence's KV cache holds
  std::string device;           // "cpu", "cuda:0", ...
  int max_sequences = 1 << 20;  // sequences it holds at once (the engine queues the rest)
  Capabilities caps;
  int block_size = 0;          // K drafts per block; 0: no drafter
  std::vector<int> taps;       // target layers the drafter reads
  bool drafter_noise = false;  // FlashMap: different draws, different blocks; DFlash: none
  bool has_drafter() const { return block_size > 0; }
};

// How a sequence opens: fresh, or (Capabilities::fork) holding the first `length` positions of
// `from` (KV cache and, when drafting, drafter context), to be prefilled with the rest.
// max_positions: the most positions it will hold (prompt + max_tokens; 0: the backend's
// max_positions), for a backend that gives memory by need.
struct Open {
  bool drafting = false;
  const Slot* from = nullptr;
  int64_t length = 0;
  int64_t max_positions = 0;
};

// One sequence's prefill: its `tokens` appended to the KV cache, the drafter context (when it
// drafts) takes their features, and its last row becomes the row first_token() draws from. With
// score >= 0 (Capabilities::prompt_logprobs) every row is kept chunk by chunk and `scored` gets
// the logprob of tokens[r + 1] under row r with its `score` most likely alternatives.
struct Prefill {
  int seq = 0;  // Slot::index()
  std::span<const int32_t> tokens;
  int score = -1;
  std::vector<TokenLogprob>* scored = nullptr;
};

// One sequence's part in a step of the loop.
struct SeqStep {
  int seq = 0;  // Slot::index()
  // Sequence position of the anchor (the cache length before this forward); the token drawn
  // from logits row r is at position + 1 + r.
  int64_t position = 0;
  int room = 0;  // drafts verified this round (0: the anchor alone)
  SeqSampler* sampler = nullptr;
  // The sequence's logit controls and structured-output constraint (null or inactive: none),
  // applied to the target's rows before pick/accept, and the constraint to the drafter's rows.
  ControlState* controls = nullptr;
  // -1: no logprobs; n >= 0: the emitted tokens' logprobs under the raw target rows with their
  // n most likely alternatives (Accepted::logprobs).
  int logprobs = -1;
  // Active: the round may draft a tree of this shape (at most `room` deep) when the proposer
  // takes one for this sequence (Capabilities::trees; never for a sequence with controls or
  // logprobs, whose rows are read as a chain); it is verified in the same forward and accepted
  // by sample-and-match.
  TreeShape tree = {};
  // Capabilities::lookup_choice: false: the drafter drafts even where prompt lookup matches.
  bool lookup = true;
  // A draft tree's nodes to verify (ascending, each node's parent among them; empty: all). A
  // block's drafts to verify are its first `room`.
  std::span<const int32_t> keep;
};

// What a proposer drafted for one sequence, as the round loop reads it to choose how many drafts
// to verify (engine/draft_cut.h): each draft's token, its parent (−1: the anchor; empty for a
// block, whose draft k follows draft k − 1) and the drafter's confidence in it (its probability
// of the token given the drafts before it). Valid until the next forward(); empty where a
// backend does not report it (its rounds verify every draft).
struct DraftsView {
  bool reported = false;  // false: the backend does not report its drafts
  std::span<const int32_t> tokens, parents;
  std::span<const float> confidence;
  bool lookup = false;  // drafted by prompt lookup
};

// first_token()'s or accept()'s outcome for one sequence, on the host: `accepted` drafts then the
// target's token (for a tree: the accepted path's tokens; the backend has already kept only
// that path's KV and rows, first and in order, so that commit() sees a block).
struct Accepted {
  int accepted = 0;
  std::vector<int32_t> tokens;         // accepted + 1 tokens (pick: the one first token)
  std::vector<TokenLogprob> logprobs;  // one per token when SeqStep::logprobs >= 0
  int64_t drafted = 0;                 // draft tokens (block slots or tree nodes) verified
  bool lookup = false;  // drafted by prompt lookup (--draft ngram, a hybrid round's lookup)
};

// After accept: a sequence keeps the first `length` positions of its KV cache (the rejected
// drafts go) and its drafter context takes the target's features of the first `drafted` rows
// of the last forward (the anchor and the accepted drafts; 0: nothing, e.g. it ends).
struct Commit {
  int seq = 0;
  int64_t length = 0;
  int64_t drafted = 0;
};

// What a sequence holds, for the prefix cache: the positions both its KV cache and its drafter
// context hold (what a fork can copy), and the bytes of memory.
struct Held {
  int64_t positions = 0;
  size_t bytes = 0;
};

class Target {
 public:
  virtual ~Target() = default;
  // A new sequence; an empty Slot when `o.from` is set and this one cannot be forked from it.
  virtual Slot open(const Open& o) = 0;
  virtual void prefill(std::span<const Prefill> seqs) = 0;
  // Each sequence's anchor and its `room` drafts (or tree) in one forward over the batch: KV
  // appended, logits of every row, taps for drafting sequences.
  virtual void forward(std::span<const SeqStep> steps) = 0;
  virtual void commit(std::span<const Commit> seqs) = 0;
  virtual Held held(int seq) const = 0;
  // How many of these sequences, in order, can open now (each to hold `positions[i]` positions)
  // with their memory guaranteed until they end; the engine keeps the rest queued. A backend that
  // sizes every sequence alike at start (max_sequences) admits them all.
  virtual size_t admissible(std::span<const int64_t> positions) const { return positions.size(); }
  // The sequence will not grow again: the prefix cache keeps it only to fork from. A backend that
  // promised it memory for its growth may take that promise back.
  virtual void settle(int /*seq*/) {}

 protected:
  friend class Slot;
  virtual void close(int seq) = 0;  // through Slot's destruction only
};

inline void Slot::reset() {
  if (owner_) std::exchange(owner_, nullptr)->close(index_);
}

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Drafts after each sequence's anchor, all in one batch, drawn as the sequence's sampler draws
  // (argmax, keyed by position, or from the filtered q kept for rejection sampling); they stay
  // in the backend for forward().
  virtual void propose(std::span<const SeqStep> steps) = 0;
  // After propose(): what sequence `seq` drafted (empty: not reported).
  virtual DraftsView drafts(int seq) const {
    (void)seq;
    return {};
  }
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  // After prefill: each sequence's first token from its last row (drawn at position
  // step.position + 1, the prompt's length). It becomes the sequence's anchor.
  virtual void first_token(std::span<const SeqStep> steps, std::span<Accepted> out) = 0;
  // After forward: each sequence's acceptance in its sampler's mode (greedy, keyed, rejection).
  // The target's token after the accepted drafts becomes the anchor.
  virtual void accept(std::span<const SeqStep> steps, std::span<Accepted> out) = 0;
};

// A device with the target and, optionally, a drafter.
class Backend : public Target, public Proposer, public Verifier {
 public:
  const BackendInfo& info() const { return info_; }
  const Qwen3Config& config() const { return *info_.config; }

 protected:
  BackendInfo info_;
};

}  // namespace flashmap::engine
