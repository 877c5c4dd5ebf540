// The round loop of speculative decoding, once, over a batch of sequences on any backend: the
// loop of spec_generate (modeling_flashmap.py) — prefill, first token from the target, then
// { draft a block after the anchor; verify anchor + block in one target forward; accept; commit }
// until max_tokens or a stop token — for every running sequence at once. `flashmap generate` is
// a batch of one; `flashmap serve` admits and retires sequences between rounds (engine.cpp).
#pragma once

#include <flashmap/request.h>  // RequestParams, PhaseTimes

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/draft_cut.h"
#include "engine/prefix_cache.h"
#include "engine/spec_policy.h"
#include "engine/tree_policy.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"
#include "specdec/sampling.h"

namespace flashmap::engine {

// One sequence as the loop keeps it between rounds.
struct Sequence {
  explicit Sequence(RequestParams p);
  RequestParams params;
  SeqSampler sampler;
  ControlState controls;
  Slot slot;
  int64_t length = 0;            // positions in the target's cache (the anchor's position)
  int64_t cached_tokens = 0;     // prompt tokens that came from the prefix cache
  std::vector<int32_t> history;  // prompt + committed tokens (the prefix cache's key)
  std::vector<TokenLogprob> prompt_logprobs;  // tokens 1.. of the prompt, when asked for
  size_t generated = 0;
  bool drafting = false;  // has a drafter context
  bool done = false;
  std::string finish_reason;  // "stop", "length"; set by the loop or by the engine
  std::string error;          // why, when finish_reason is "error"
  int room = 0;               // drafts verified in the current round
  // Statistics (the reference's acceptance lengths: tokens committed per verify pass).
  int rounds = 0;
  std::vector<int> acceptance_lengths;
  std::vector<int64_t> accepted_at;  // [K]: rounds in which draft slot k was accepted
  PhaseTimes times;
  // Receives the tokens each step emits (cut at a stop token and at max_tokens), the number
  // committed by the verify pass that produced them (0 for the prefill's first token) and, when
  // params.logprobs >= 0, their logprobs (else empty).
  std::function<void(std::span<const int32_t>, int, std::span<const TokenLogprob>)> sink;
  // Receives the prompt logprobs (params.prompt_logprobs >= 0) before the first token.
  std::function<void(const std::vector<TokenLogprob>&)> on_prompt_logprobs;
  // Back to the state before admission (its slot freed), for a new try; sink and
  // on_prompt_logprobs stay.
  void restart();
};

// Acceptance histogram etc. of one round, for the engine's counters.
struct RoundReport {
  bool ran = false;        // some sequence was running
  bool any_draft = false;  // some sequence could draft (the policy decided)
  SpecPolicy::Decision decision;
  int speculating = 0;                // sequences that drafted
  std::vector<int> committed_counts;  // per drafting sequence
  std::vector<bool> lookup;           // per drafting sequence: drafted by prompt lookup
  TreeShape tree;                     // the round's draft tree (off: single blocks)
  int lookup_choice = -1;             // lookup_policy()'s choice (-1: none made)
  int64_t drafts_verified = 0;        // draft tokens (block slots or tree nodes) verified
};

class RoundLoop {
 public:
  // max_context: prompt + max_tokens limit (0: the target's and the backend's cache size).
  // prefix_cache_bytes: the prefix cache's budget (0: off).
  RoundLoop(Backend& backend, SpecPolicyOptions policy, int64_t max_context,
            std::function<double()> clock = nullptr, size_t prefix_cache_bytes = 0);

  Backend& backend() { return backend_; }
  int64_t max_context() const { return max_context_; }
  int block_size() const { return backend_.info().block_size; }
  const SpecPolicy& policy() const { return policy_; }
  // Rounds offer draft trees of this shape to the proposer (off by default; the engine checks
  // the backend takes trees).
  void set_tree(TreeShape tree) { tree_ = tree; }
  // --draft-tree auto: each speculative round's tree chosen by measured tokens/s.
  void set_tree_auto(std::vector<TreeShape> candidates) {
    tree_policy_.emplace(std::move(candidates), policy_.options().explore_min,
                         policy_.options().explore_max, policy_.options().alpha);
  }
  const TreePolicy* tree_policy() const { return tree_policy_ ? &*tree_policy_ : nullptr; }
  // Speculative rounds verify only the drafts that pay (draft_cut.h) where the backend reports
  // its drafts; off by default (every draft, as the reference's loop).
  void set_draft_cut(std::optional<DraftCut> cut) { cut_ = std::move(cut); }
  const DraftCut* draft_cut() const { return cut_ ? &*cut_ : nullptr; }
  // Hybrid rounds under the adaptive policy: whether a speculative round lets prompt lookup
  // replace the drafter where it matches (choice 0) or runs the drafter alone (1), by measured
  // tokens/s. Null where the backend has no such choice or the policy is not adaptive (then
  // lookup always takes its matches).
  const MeasuredChoice* lookup_policy() const {
    return lookup_policy_ ? &*lookup_policy_ : nullptr;
  }

  // The one place a request is checked: empty prompt, ids outside the vocabulary, max_tokens,
  // stop ids, sampling parameters, context. Throws flashmap::Error naming the parameter.
  void validate(const RequestParams& p) const;
  // Opens, prefills and starts sequences (one batched forward); some may finish at once.
  void admit(std::span<Sequence* const> fresh);
  // One round over the running sequences that are not done.
  RoundReport round(std::span<Sequence* const> running);
  // Runs one sequence to its end (generate()), or to the round boundary after `cancel` is set.
  void run(Sequence& seq, const std::atomic<bool>* cancel = nullptr);
  // A sequence leaves: its slot goes to the prefix cache (unless it failed) or is freed.
  void retire(Sequence& seq);
  PrefixCacheStats prefix_cache_stats() const { return cache_.stats(); }
  // Drops the least recently used cached prefix, giving its memory back to the backend; false
  // when the cache is empty. Running sequences come first: admission calls it when the backend
  // cannot hold the queue's head.
  bool drop_cached_prefix() { return cache_.evict_one(); }

 private:
  // admit() for sequences that prefill together; `sources` (empty, or one per sequence): the
  // sequence whose slot each starts from (its prompt but the last token).
  void admit_group(std::span<Sequence* const> fresh, std::span<Sequence* const> sources);
  // Emits fresh tokens, cut at a stop token and at max_tokens; false when the sequence ends.
  // verified: they come from a verify pass, whose acceptance length (the tokens through the
  // first stop token) is recorded.
  bool emit(Sequence& s, std::span<const int32_t> fresh, bool verified,
            std::span<const TokenLogprob> logprobs);
  // The sequence's part in a step: its slot, anchor position, room, sampler, controls, logprobs.
  SeqStep step(Sequence& s, int64_t position, int room, TreeShape tree = {});
  // What the cut keeps of each step's drafts (cut_ set, the drafts reported): chains get a
  // smaller room, trees the nodes to keep (in `kept`, which must outlive the forward).
  struct Cut {
    std::vector<uint8_t> drafting, tree;                      // per step
    std::vector<DraftCut::Drafts> drafts;                     // per step, over the vectors below
    std::vector<std::vector<int32_t>> tokens, parents, kept;  // per step
    std::vector<std::vector<float>> confidence;               // per step
  };
  std::optional<Cut> cut_drafts(std::span<SeqStep> steps);
  void observe_cut(const Cut& cut, std::span<const SeqStep> steps,
                   std::span<const Accepted> results);

  Backend& backend_;
  SpecPolicy policy_;
  TreeShape tree_;
  std::optional<TreePolicy> tree_policy_;
  std::optional<MeasuredChoice> lookup_policy_;
  std::optional<DraftCut> cut_;
  int64_t max_context_;
  std::function<double()> clock_;
  PrefixCache cache_;
};

}  // namespace flashmap::engine
