// What the round loop (rounds.h) needs of a device: three small interfaces, implemented once for
// the CPU (cpu_backend.h, the reference) and once for CUDA (src/cuda/cuda_backend.cpp).
//
//   Target    the target's forward over a batch of sequences, each with its own KV cache, with
//             hidden-state taps for the drafter;
//   Proposer  a block of K draft tokens after each sequence's anchor;
//   Verifier  the first token of a sequence and each round's acceptance, returned to the host as a
//             small per-sequence result (on a GPU: one device→host copy per round).
//
// A sequence's device state (KV cache, drafter context, the round's block, its last logits) is a
// Slot that the backend makes and the loop holds; the three interfaces act on the same slots, so
// the tokens of a block never need to visit the host. Everything above the loop sees only these.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/hf_config.h"
#include "specdec/controls.h"
#include "specdec/sampling.h"
#include "specdec/tree.h"

namespace flashmap::engine {

// One sequence's state on a device.
class Slot {
 public:
  virtual ~Slot() = default;
};

// One sequence's part in a step of the loop.
struct SeqStep {
  Slot* slot = nullptr;
  // Sequence position of the anchor (the cache length before this forward); the token drawn
  // from logits row r is at position + 1 + r.
  int64_t position = 0;
  int room = 0;  // drafts verified this round (0: the anchor alone)
  SeqSampler* sampler = nullptr;
  ControlState* controls = nullptr;  // the sequence's logit controls (a constraint masks drafts)
  // Active: the round drafts a tree of this shape (at most `room` deep), verifies it in the same
  // forward and accepts by sample-and-match; only on backends with trees() (and never with logit
  // controls or logprobs, whose rows assume a chain).
  TreeShape tree = {};
};

// A round's outcome for one sequence, on the host: `accepted` drafts then the target's token
// (for a tree: the accepted path's tokens; the backend has already kept only that path's KV and
// put its rows first, so that truncate() and commit() see a block).
struct Accepted {
  int accepted = 0;
  std::vector<int32_t> tokens;  // accepted + 1 tokens
};

class Target {
 public:
  virtual ~Target() = default;
  virtual const Qwen3Config& config() const = 0;
  // Positions a sequence's KV cache holds.
  virtual int64_t max_positions() const = 0;
  // A new sequence: an empty KV cache and, when `drafting`, an empty drafter context.
  virtual std::unique_ptr<Slot> open(bool drafting) = 0;
  // The prompts' forward over a batch: KV appended; each sequence's last logits row; and the
  // drafting sequences' drafter contexts take the target's features of every prompt position.
  virtual void prefill(std::span<Slot* const> slots,
                       std::span<const std::span<const int32_t>> prompts) = 0;
  // Prompt logprobs: one sequence's next `tokens` of its prompt with the logits of every row kept,
  // its drafter context extended as prefill does; called chunk by chunk, so the rows held stay
  // bounded. Its last row is then the sequence's row 0 (the one pick() draws from), so
  // read_logits(slot, −(n − 1), n) reads all n.
  virtual void prefill_all(Slot& slot, std::span<const int32_t> tokens) {
    (void)slot, (void)tokens;
    throw InternalError("prefill_all on a backend without it");
  }
  virtual bool has_prefill_all() const { return false; }
  // Each sequence's anchor and its first `room` drafts in one forward over the batch: KV
  // appended, logits of every row, taps for drafting sequences.
  virtual void verify(std::span<const SeqStep> steps) = 0;
  // Keeps the first `length` positions of a sequence's cache (drops rejected drafts).
  virtual void truncate(Slot& slot, int64_t length) = 0;
  // Whether verify() and accept() take draft trees (SeqStep::tree).
  virtual bool trees() const { return false; }
  // Draft tokens (block slots or tree nodes) the last verify() ran, all sequences.
  virtual int64_t drafts_verified() const { return 0; }
  // Host access to a sequence's rows of the last prefill (its one row) or verify (anchor +
  // drafts), for what the loop computes itself: logit controls (read, changed, written back
  // before pick/accept) and logprobs. Rows count from the sequence's first.
  virtual void read_logits(Slot& slot, int64_t first, int64_t n, float* dst) = 0;
  virtual void write_logits(Slot& slot, int64_t first, int64_t n, const float* src) = 0;
  // The first n drafts of the sequence's block, as proposed.
  virtual void read_drafts(Slot& slot, int n, int32_t* dst) = 0;
  // The prefix cache (engine/prefix_cache.h). fork: a new sequence holding the first `length`
  // positions of `from` (KV cache and, when `drafting`, drafter context), to be prefilled
  // with the rest of its prompt; null where the backend cannot. forkable: the positions `slot`
  // holds in both. bytes: the memory it holds.
  virtual std::unique_ptr<Slot> fork(Slot& from, int64_t length, bool drafting) {
    (void)from, (void)length, (void)drafting;
    return nullptr;
  }
  virtual int64_t forkable(Slot& slot) {
    (void)slot;
    return 0;
  }
  virtual size_t bytes(Slot& slot) {
    (void)slot;
    return 0;
  }
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual int block_size() const = 0;
  // Appends to each drafting sequence's context the target's features of the first n[i] rows
  // the last verify fed it (the anchor and the accepted drafts).
  virtual void commit(std::span<Slot* const> slots, std::span<const int64_t> n) = 0;
  // Drafts K tokens after each sequence's anchor, all in one batch, drawn as the sequence's
  // sampler draws (argmax, keyed by position, or from the filtered q kept for rejection
  // sampling); they stay in the slot for Target::verify.
  virtual void propose(std::span<const SeqStep> steps) = 0;
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  // After prefill: each sequence's first token from its last logits row (drawn at position
  // step.position + 1, the prompt's length). It becomes the slot's anchor.
  virtual void pick(std::span<const SeqStep> steps, std::span<int32_t> tokens) = 0;
  // After verify: each sequence's acceptance in its sampler's mode (greedy, keyed, rejection).
  // The target's token after the accepted drafts becomes the slot's anchor.
  virtual void accept(std::span<const SeqStep> steps, std::span<Accepted> out) = 0;
};

// A device with the target and, optionally, a drafter.
class Backend : public Target, public Proposer, public Verifier {
 public:
  virtual bool has_drafter() const = 0;
  // Whether the drafter draws noise (FlashMap: different draws, different blocks; DFlash: none).
  virtual bool drafter_has_noise() const { return true; }
  // Target layers the drafter reads (empty without one).
  virtual std::span<const int> taps() const = 0;
  virtual std::string device() const = 0;  // "cpu", "cuda:0", ...
  // Sequences it can hold at once (device memory for their KV caches and drafter contexts);
  // the engine runs at most this many and queues the rest.
  virtual int max_sequences() const { return 1 << 20; }
};

}  // namespace flashmap::engine
