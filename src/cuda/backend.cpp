#include "cuda/backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "cuda/controls.h"
#include "cuda/device.h"
#include "cuda/dflash_cuda.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/kernels.h"
#include "cuda/paged_attention.h"
#include "cuda/proposers.h"
#include "cuda/qwen3_cuda.h"
#include "cuda/round_kernels.h"
#include "cuda/sampling.h"
#include "models/dflash.h"
#include "models/drafter.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "paged/block_pool.h"
#include "paged/draft_plan.h"
#include "paged/ledger.h"
#include "paged/step_plan.h"
#include "specdec/tree.h"

namespace flashmap::cuda {
namespace {

using engine::Accepted;
using engine::SeqStep;

// Prompt tokens per prefill forward: a forward's activations grow with its rows (~80 floats per
// hidden unit and token at Qwen3-8B), so a long prompt in one piece would need gigabytes at once.
constexpr size_t kPrefillChunk = 512;
// Positions per KV block: small enough that a sequence wastes little of its last block, large
// enough that the block tables stay short (2,560 entries at 40,960 positions).
constexpr int32_t kBlockTokens = 16;
// Rows of a batch's sampling sorted at once: 128 rows of Qwen3's vocabulary take ~0.5 GB of keys
// and CUB's room, against ~16 GB for every row of 256 lanes.
constexpr int64_t kSortRows = 128;

// One sequence's device state, a row of the backend's table (Slot::index()). Its round buffer is
// row `index` of the backend's rounds_ array; its keys and values are blocks of the shared pool
// (BlockPool sequence `kv`). The buffers are made once per lane and kept by the sequences that
// take it in turn, so that the drafts captured for its proposer lane stay valid.
struct Lane {
  int index = -1;
  int draft = -1;                    // the proposer's lane (-1: no proposer)
  DeviceBuffer<float> first;         // [V] the prefill's last row, for first_token()
  DeviceBuffer<float> draft_logits;  // [K, V]: the proposer's logits (lanes that draft alone)
  DeviceBuffer<uint64_t> rng;        // {seed, counter} of unseeded sampling
  // The sequence that holds it.
  bool open = false;
  bool rng_started = false;
  uint64_t drafts = 0;  // drafts made (the noise counter)
  // Its KV length, drafter context length and BlockPool sequence, kept by paged::Ledger.
  paged::SeqBlocks blocks;
  int64_t step_row = -1;  // its anchor's row in the last step's outputs
  // A draft tree this round (tree_nodes > 0; its tokens and parents are also in its round row):
  // the step's parent rows (the anchor's −1 first), the cache length before the step, and the
  // accepted path's nodes after acceptance.
  int tree_nodes = 0;
  std::vector<int32_t> step_parents, path;
  int64_t step_base = 0;
};

// A pinned host area and its device copy, for a round's small uploads. Grown (after the stream
// drains: an earlier copy may still read it) only when asked for more.
struct Staging {
  HostBuffer<int32_t> host;
  DeviceBuffer<int32_t> device;
  int32_t* reserve(const Context& ctx, size_t host_ints, size_t device_ints) {
    if (host_ints > host.size() || device_ints > device.size()) ctx.sync();
    if (host_ints > host.size()) host = HostBuffer<int32_t>(std::max(host_ints, 2 * host.size()));
    if (device_ints > device.size())
      device = DeviceBuffer<int32_t>(std::max(device_ints, 2 * device.size()));
    return host.data();
  }
};

bool controlled(const SeqStep& st) {
  return st.controls && st.controls->active();
}

class CudaBackend : public engine::Backend {
 public:
  CudaBackend(Qwen3Model& target, DeviceProposer* proposer, int64_t capacity, bool graphs,
              int max_lanes)
      : target_(target),
        proposer_(proposer),
        graphs_(graphs),
        ctx_(target.context()),
        V_(target.config().vocab_size),
        K_(proposer ? proposer->block_size() : 0),
        sampler_(ctx_, V_, K_ + 1),
        controls_(ctx_),
        logprobs_(ctx_, V_, K_ + 1) {
    const Qwen3Config& tc = target_.config();
    capacity_ = std::min<int64_t>(capacity > 0 ? capacity : tc.max_position_embeddings,
                                  tc.max_position_embeddings);
    if (proposer_) {
      FLASHMAP_CHECK(proposer_->vocab() == V_,
                     "the drafter's vocabulary ({}) is not the target's ({})", proposer_->vocab(),
                     V_);
      const auto taps = proposer_->target_layer_ids();
      info_.taps.assign(taps.begin(), taps.end());
      F_ = int64_t(info_.taps.size()) * tc.hidden_size;
      FLASHMAP_CHECK(proposer_->feature_dim() == F_,
                     "the drafter reads {} features per token, the target's taps give {}",
                     proposer_->feature_dim(), F_);
      FLASHMAP_CHECK(K_ >= 1, "the drafter's block size must be >= 1, got {}", K_);
      info_.drafter_noise = proposer_->has_noise();
      paged_ = proposer_->paged();
      extra_ = paged_ ? proposer_->paged_block() : 0;
    }
    // A round row: [accepted, token, anchor, drafts or a tree's tokens, its parents, the
    // accepted path's nodes]. Trees come with the batched drafter.
    max_nodes_ = paged_ ? kMaxTreeNodes : std::max(K_, 1);
    parents_at_ = kRoundDrafts + max_nodes_;
    path_at_ = parents_at_ + max_nodes_;
    stride_ = path_at_ + std::max(K_, 1);
    info_.config = &tc;
    info_.max_positions = capacity_;
    info_.device = ctx_.name();
    // Copies of a prefix share its KV blocks; a drafting copy shares the drafter's context too,
    // which only the batched drafter keeps in those blocks.
    info_.caps = {.fork = !proposer_ || paged_, .prompt_logprobs = false, .trees = paged_};
    info_.block_size = K_;
    size_memory(max_lanes);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream());
    for (const Lane& l : lanes_)
      if (l.draft >= 0) proposer_->remove_lane(l.draft);
    if (paged_) proposer_->drop_pool();
  }

  engine::Slot open(const engine::Open& o) override {
    ctx_.make_current();
    const bool drafting = o.drafting && proposer_;
    const int64_t most = o.max_positions > 0 ? std::min(o.max_positions, capacity_) : capacity_;
    // A lane first: the pool is sized for max_sequences open sequences (size_memory), so one more
    // must not reach it.
    FLASHMAP_CHECK(!free_.empty() || int(lanes_.size()) < info_.max_sequences,
                   "all {} sequence lanes of {} are taken", info_.max_sequences, info_.device);
    paged::SeqBlocks blocks;
    if (o.from) {
      // A drafting copy takes its context from the shared blocks: only a batched drafter's.
      if (drafting && !paged_) return {};
      // No room for its growth, or no context to share: it opens fresh, or waits.
      if (!ledger_->open(blocks, most, drafting, &lane(o.from->index()).blocks, o.length))
        return {};
    } else {
      const bool opened = ledger_->open(blocks, most, drafting);
      FLASHMAP_CHECK(opened,
                     "out of KV memory on {}: a sequence of up to {} positions needs {} blocks, {} "
                     "are free and {} of them promised to running sequences",
                     info_.device, most, pool_->blocks_for(most + extra_), pool_->free_blocks(),
                     pool_->reserved_blocks());
    }
    int i;
    try {
      if (!free_.empty()) {
        i = free_.back();
        Lane& l = lanes_[size_t(i)];
        if (l.draft >= 0) proposer_->reset(l.draft);
        free_.pop_back();
      } else {
        FLASHMAP_CHECK(int(lanes_.size()) < info_.max_sequences,
                       "all {} sequence lanes of {} are taken", info_.max_sequences, info_.device);
        lanes_.push_back(new_lane(int(lanes_.size())));  // throws before the table holds it
        i = int(lanes_.size()) - 1;
      }
    } catch (...) {
      ledger_->close(blocks);
      throw;
    }
    Lane& l = lanes_[size_t(i)];
    l.open = true;
    l.rng_started = false;
    l.drafts = 0;
    l.blocks = blocks;
    l.step_row = -1;
    return engine::Slot(this, i);
  }

  void settle(int seq) override { ledger_->settle(lane(seq).blocks); }

  size_t admissible(std::span<const int64_t> positions) const override {
    return ledger_->admissible(positions, capacity_, int64_t(info_.max_sequences) - open_lanes());
  }

  void prefill(std::span<const engine::Prefill> seqs) override {
    ctx_.make_current();
    const int32_t one = 1;
    copies_.clear();
    for (const engine::Prefill& p : seqs) {
      FLASHMAP_CHECK(p.score < 0, "prompt logprobs are not supported on {}", info_.device);
      FLASHMAP_ASSERT(!p.tokens.empty());
      Lane& l = lane(p.seq);
      for (int32_t t : p.tokens)
        FLASHMAP_CHECK(t >= 0 && t < V_, "token id {} is outside the vocabulary [0, {})", t, V_);
      for (size_t at = 0; at < p.tokens.size(); at += kPrefillChunk) {
        const auto chunk = p.tokens.subspan(at, std::min(kPrefillChunk, p.tokens.size() - at));
        const int n = int(chunk.size());
        const bool last = at + chunk.size() == p.tokens.size();
        const int64_t from = l.blocks.length;  // the drafter's context ends there too
        grow(l, n);
        run_copies();  // a copy's first write may fall in a block it shares
        const paged::StepSeq ss{pool_->table(l.blocks.kv), from, n, {}};
        const paged::StepPlan plan = paged::plan_step({&ss, 1}, n, kBlockTokens, {&one, 1});
        const std::vector<int32_t> image = plan.image();
        // Pageable sources: each copy returns once staged, so the vectors may go right after.
        check(cudaMemcpyAsync(target_.step_image(int64_t(image.size())), image.data(),
                              image.size() * 4, cudaMemcpyHostToDevice, ctx_.stream()),
              "cudaMemcpyAsync H2D (prefill step)");
        check(cudaMemcpyAsync(target_.step_ids(n), chunk.data(), size_t(n) * 4,
                              cudaMemcpyHostToDevice, ctx_.stream()),
              "cudaMemcpyAsync H2D (prompt ids)");
        const auto out = target_.forward_step(
            *kv_, 1, n, last ? Qwen3Model::Logits::Last : Qwen3Model::Logits::None, taps(l), false,
            n - 1);
        ledger_->wrote(l.blocks, n, true);
        if (last) {
          check(cudaMemcpyAsync(l.first.data(), out.logits, size_t(V_) * 4,
                                cudaMemcpyDeviceToDevice, ctx_.stream()),
                "cudaMemcpyAsync D2D (first row)");
          mask(l.first.data(), 1);
        }
        // The chunk's features go to the drafter now: the next forward reuses the buffer.
        if (l.blocks.drafting) {
          if (paged_) {
            const paged::CommitSeq cs{pool_->table(l.blocks.kv), 0, from, n};
            commit_paged(paged::plan_commit({&cs, 1}, kBlockTokens, n), out.features);
          } else {
            proposer_->commit(l.draft, out.features, n);
          }
        }
      }
    }
  }

  // Every sequence's anchor and drafts in one forward: R rows per sequence (the most any of
  // them verifies), padding rows and sequences up to the graph bucket.
  void forward(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    if (steps.empty()) return;
    int R = 1;
    bool drafting = false;
    for (const SeqStep& st : steps) {
      Lane& l = lane(st.seq);
      FLASHMAP_ASSERT(st.room >= 0 && st.room <= K_ && (st.room == 0 || l.blocks.drafting));
      if (st.room == 0) l.tree_nodes = 0;
      R = std::max(R, rows_of_step(l, st));
      drafting = drafting || l.blocks.drafting;
    }
    copies_.clear();
    std::vector<paged::StepSeq> seqs;
    seqs.reserve(steps.size());
    for (const SeqStep& st : steps) {
      Lane& l = lane(st.seq);
      l.step_base = l.blocks.length;
      grow(l, rows_of_step(l, st));
    }
    for (const SeqStep& st : steps) {
      const Lane& l = lane(st.seq);
      seqs.push_back({pool_->table(l.blocks.kv), l.blocks.length, rows_of_step(l, st),
                      l.tree_nodes > 0 ? std::span<const int32_t>(l.step_parents)
                                       : std::span<const int32_t>{}});
    }
    const paged::StepPlan plan = paged::plan_step(seqs, R, kBlockTokens, buckets_);
    const std::vector<int32_t> image = plan.image();
    // One pinned staging area per round: the image, the lanes of the batch, the block copies.
    const size_t lanes_at = image.size(), copies_at = lanes_at + size_t(plan.bucket);
    int32_t* host = step_stage_.reserve(ctx_, copies_at + 3 * copies_.size(),
                                        size_t(plan.bucket) + 3 * copies_.size());
    int32_t* lanes_copies = step_stage_.device.data();
    std::copy(image.begin(), image.end(), host);
    for (int b = 0; b < plan.bucket; ++b)
      host[lanes_at + size_t(b)] = b < int(steps.size()) ? lane(steps[size_t(b)].seq).index : 0;
    for (size_t c = 0; c < copies_.size(); ++c) {
      host[copies_at + 3 * c] = copies_[c].src;
      host[copies_at + 3 * c + 1] = copies_[c].dst;
      host[copies_at + 3 * c + 2] = copies_[c].tokens;
    }
    const cudaStream_t s = ctx_.stream();
    check(cudaMemcpyAsync(target_.step_image(int64_t(image.size())), host, image.size() * 4,
                          cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync H2D (step)");
    check(
        cudaMemcpyAsync(lanes_copies, host + lanes_at,
                        (copies_at - lanes_at + 3 * copies_.size()) * 4, cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync H2D (lanes, copies)");
    if (!copies_.empty()) {
      target_.copy_blocks(*kv_, lanes_copies + plan.bucket, int(copies_.size()));
      if (paged_) proposer_->copy_blocks(lanes_copies + plan.bucket, int(copies_.size()));
      copies_.clear();
    }
    const int64_t M = int64_t(plan.bucket) * R;
    const StepView view = step_view(target_.step_image(0), plan.bucket, R, kBlockTokens);
    gather_step_ids(rounds_.data(), stride_, lanes_copies, view, target_.step_ids(M), s);
    check(cudaGetLastError(), "gather_step_ids");
    // A block cut near the end runs eagerly: graphs are kept for the full block and the single
    // token, the rows of every other round.
    const bool graph = graphs_ && (R == K_ + 1 || R == 1);
    const auto out = target_.forward_step(
        *kv_, plan.bucket, R, Qwen3Model::Logits::All,
        drafting ? std::span<const int>(info_.taps) : std::span<const int>{}, graph);
    // The rows stay the model's until its next forward; the round masks them, and controls edit
    // them, in place rather than copying [bucket · R, V] floats.
    step_logits_ = const_cast<float*>(out.logits);
    mask(step_logits_, M);
    step_features_ = out.features;
    step_R_ = R;
    step_bucket_ = plan.bucket;
    for (size_t b = 0; b < steps.size(); ++b) {
      Lane& l = lane(steps[b].seq);
      l.step_row = int64_t(b) * R;
      ledger_->wrote(l.blocks, rows_of_step(l, steps[b]), false);
    }
  }

  // The kept positions; their features enter the drafter's context (paged: every sequence's
  // rows in one pass, compacted from the step's output).
  void commit(std::span<const engine::Commit> seqs) override {
    ctx_.make_current();
    std::vector<paged::CommitSeq> commits;
    std::vector<int32_t> moves;                   // slot pairs that keep the trees' accepted paths
    std::vector<std::vector<int32_t>> tree_rows;  // the rows a tree's commit names
    tree_rows.reserve(seqs.size());
    for (const engine::Commit& c : seqs) {
      Lane& l = lane(c.seq);
      if (l.tree_nodes > 0) {
        // The accepted path's keys move to the positions after the anchor (read through the
        // table before the truncate releases the rest), as the CPU's keep_rows does.
        FLASHMAP_ASSERT(c.length == l.step_base + int64_t(l.path.size()) + 1);
        const auto pairs =
            paged::plan_keep_path(pool_->table(l.blocks.kv), l.step_base, l.path, kBlockTokens);
        moves.insert(moves.end(), pairs.begin(), pairs.end());
      }
      // The step's anchor sat at the first position the drafter lacks: the kept rows follow it.
      const int64_t position = l.blocks.committed;
      ledger_->commit(l.blocks, c.length, c.drafted);
      if (l.blocks.drafting && c.drafted > 0) {
        FLASHMAP_ASSERT(c.drafted <= K_ + 1 && step_features_ && l.step_row >= 0);
        if (l.tree_nodes > 0) {
          // The anchor's row and the path's rows, wherever they sat in the step.
          FLASHMAP_ASSERT(paged_ && c.drafted == int64_t(l.path.size()) + 1);
          auto& rows = tree_rows.emplace_back(1, int32_t(l.step_row));
          for (int32_t node : l.path) rows.push_back(int32_t(l.step_row) + 1 + node);
          commits.push_back(
              {pool_->table(l.blocks.kv), l.step_row, position, int(c.drafted), rows});
        } else if (paged_) {
          commits.push_back({pool_->table(l.blocks.kv), l.step_row, position, int(c.drafted)});
        } else {
          proposer_->commit(l.draft, step_features_ + l.step_row * F_, c.drafted);
        }
      }
      l.tree_nodes = 0;
    }
    if (!moves.empty()) {
      keep_stage_.reserve(ctx_, 0, moves.size());
      // A pageable source: staged before the call returns, copied in stream order.
      check(cudaMemcpyAsync(keep_stage_.device.data(), moves.data(), moves.size() * 4,
                            cudaMemcpyHostToDevice, ctx_.stream()),
            "cudaMemcpyAsync H2D (tree paths)");
      target_.copy_rows(*kv_, keep_stage_.device.data(), int(moves.size() / 2));
    }
    if (!commits.empty())
      commit_paged(
          paged::plan_commit(commits, kBlockTokens, int64_t(step_bucket_) * int64_t(step_R_)),
          step_features_);
  }

  engine::Held held(int seq) const override {
    const Lane& l = lanes_.at(size_t(seq));
    const size_t kv_bytes = size_t(pool_->table(l.blocks.kv).size()) * size_t(block_bytes_);
    return {ledger_->held(l.blocks), lane_bytes_ + kv_bytes};
  }

  void propose(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    if (paged_) return propose_paged(steps);
    const cudaStream_t st = ctx_.stream();
    for (const SeqStep& step : steps) {
      Lane& l = lane(step.seq);
      FLASHMAP_ASSERT(l.blocks.drafting);
      SeqSampler& sm = *step.sampler;
      proposer_->draft(l.draft, round(l) + kRoundAnchor, sm.seed, ++l.drafts,
                       l.draft_logits.data());
      mask(l.draft_logits.data(), K_);
      int32_t* drafts = round(l) + kRoundDrafts;
      if (sm.params.greedy()) {
        argmax_rows(l.draft_logits.data(), K_, V_, drafts, st);
        check(cudaGetLastError(), "argmax_rows (draft)");
        continue;
      }
      sampler_.filtered_probs(l.draft_logits.data(), K_, sm.params, q_of(l));
      if (sm.keyed()) {
        sampler_.sample_keyed(q_of(l), K_, sm.seed, step.position + 1, drafts);
      } else {
        bind(l, sm);
        sampler_.sample(q_of(l), K_, drafts);
        sampler_.bind(nullptr);
      }
    }
  }

  void first_token(std::span<const SeqStep> steps, std::span<Accepted> out) override {
    ctx_.make_current();
    prepare(steps.size());
    stage_controls(steps, false);
    reserve_raw(steps, K_ + 1);
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& st = steps[i];
      Lane& l = lane(st.seq);
      SeqSampler& sm = *st.sampler;
      const float* raw = control(i, st, l, l.first.data(), 1);
      int32_t* anchor = round(l) + kRoundAnchor;
      if (sm.keyed() || sm.params.greedy()) {
        sampler_.pick_keyed(l.first.data(), sm.params, sm.seed, st.position + 1, anchor);
      } else {
        bind(l, sm);
        sampler_.pick(l.first.data(), sm.params, anchor);
        sampler_.bind(nullptr);
      }
      if (st.logprobs >= 0) logprobs_.enqueue(i, raw, 1, nullptr, nullptr, anchor, st.logprobs);
    }
    download_rounds();
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) {
      const int32_t t = host_rounds_.data()[lane(steps[i].seq).index * stride_ + kRoundAnchor];
      FLASHMAP_CHECK(t >= 0 && t < V_, "device pick returned token {}", t);
      out[i].accepted = 0;
      out[i].drafted = 0;
      out[i].tokens.assign(1, t);
      out[i].logprobs.clear();
      if (steps[i].logprobs >= 0) out[i].logprobs = logprobs_.results(i, 1, steps[i].logprobs);
    }
  }

  // Controls first (they change the rows in place), then the greedy sequences' acceptance in
  // one launch and the sampling sequences' in one more (after one for their filtered rows), then
  // every next anchor in one launch and every result in one copy.
  void accept(std::span<const SeqStep> steps, std::span<Accepted> out) override {
    ctx_.make_current();
    prepare(steps.size());
    stage_controls(steps, true);
    reserve_raw(steps, K_ + 1);
    const cudaStream_t st = ctx_.stream();
    std::vector<const float*> raw(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      Lane& l = lane(steps[i].seq);
      raw[i] = control(i, steps[i], l, rows_of(l), steps[i].room + 1);
    }
    // Staging: [greedy items (lane, first row, room) × n][lanes of the batch].
    std::vector<int32_t> items, lanes;
    bool greedy_trees = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Lane& l = lane(steps[i].seq);
      lanes.push_back(l.index);
      if (!steps[i].sampler->params.greedy()) continue;
      if (l.tree_nodes > 0) {
        greedy_trees = true;
        continue;
      }
      items.push_back(l.index);
      items.push_back(int32_t(l.step_row));
      items.push_back(steps[i].room);
    }
    const size_t ints = items.size() + lanes.size();
    int32_t* host = accept_stage_.reserve(ctx_, ints, ints);
    int32_t* d_accept = accept_stage_.device.data();
    std::copy(items.begin(), items.end(), host);
    std::copy(lanes.begin(), lanes.end(), host + items.size());
    check(cudaMemcpyAsync(d_accept, host, ints * 4, cudaMemcpyHostToDevice, st),
          "cudaMemcpyAsync H2D (acceptance)");
    if (!items.empty() || greedy_trees)
      argmax_rows(step_logits_, int64_t(step_bucket_) * step_R_, V_, argmax_.data(), st);
    if (!items.empty()) {
      accept_greedy(argmax_.data(), d_accept, int(items.size() / 3), rounds_.data(), stride_, st);
      check(cudaGetLastError(), "accept_greedy");
    }
    // The sampled sequences: every row's filtered p in one launch, every verification in one;
    // the trees' walks (sample-and-match, greedy ones included) in one more.
    std::vector<FilterRow> rows;
    std::vector<VerifyItem> checks;
    std::vector<TreeItem> trees;
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& step = steps[i];
      SeqSampler& sm = *step.sampler;
      Lane& l = lane(step.seq);
      const bool greedy = sm.params.greedy();
      const int32_t first = int32_t(rows.size());
      if (!greedy)
        for (int r = 0; r < rows_of_step(l, step); ++r)
          rows.push_back(Sampler::filter_row(int32_t(l.step_row) + r, first + r, sm.params, V_));
      if (l.tree_nodes > 0) {
        TreeItem t;
        t.rows = greedy ? nullptr : p_.data() + int64_t(first) * V_;
        t.argmax = argmax_.data() + l.step_row;
        t.tokens = round(l) + kRoundDrafts;
        t.parents = round(l) + parents_at_;
        t.result = round(l) + kRoundAccepted;
        t.path_tokens = round(l) + kRoundDrafts;
        t.path_nodes = round(l) + path_at_;
        t.state = greedy || sm.keyed() ? nullptr : generator(l, sm);
        t.seed = sm.seed;
        t.first_position = step.position + 1;
        t.nodes = l.tree_nodes;
        t.mode = greedy ? kTreeGreedy : sm.keyed() ? kTreeKeyed : kTreeSampled;
        trees.push_back(t);
        continue;
      }
      if (greedy) continue;
      VerifyItem it;
      it.q = q_of(l);
      it.draft = round(l) + kRoundDrafts;
      it.result = round(l) + kRoundAccepted;
      it.state = sm.keyed() ? nullptr : generator(l, sm);
      it.seed = sm.seed;
      it.first_position = step.position + 1;
      it.p_row = first;
      it.room = step.room;
      it.keyed = sm.keyed();
      checks.push_back(it);
    }
    if (!rows.empty() || !trees.empty()) {
      const int cuts = cut_rows_first(rows);
      const auto d =
          upload_arrays(verify_stage_, {bytes_of(rows), bytes_of(checks), bytes_of(trees)});
      sampler_.filtered_probs_rows(step_logits_, static_cast<const FilterRow*>(d[0]),
                                   int(rows.size()), cuts, p_.data());
      if (!checks.empty())
        sampler_.verify_items(p_.data(), static_cast<const VerifyItem*>(d[1]), int(checks.size()));
      if (!trees.empty())
        sampler_.verify_trees(static_cast<const TreeItem*>(d[2]), int(trees.size()));
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& step = steps[i];
      Lane& l = lane(step.seq);
      // Token r of the emitted ones is draft r before the accepted count, then the target's.
      if (step.logprobs >= 0)
        logprobs_.enqueue(i, raw[i], step.room + 1, round(l) + kRoundAccepted,
                          round(l) + kRoundDrafts, round(l) + kRoundToken, step.logprobs);
    }
    next_anchors(d_accept + items.size(), int(lanes.size()), rounds_.data(), stride_, st);
    check(cudaGetLastError(), "next_anchors");
    download_rounds();
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) {
      const int32_t* h = host_rounds_.data() + lane(steps[i].seq).index * stride_;
      const int accepted = h[kRoundAccepted];
      FLASHMAP_CHECK(
          accepted >= 0 && accepted <= steps[i].room && h[kRoundToken] >= 0 && h[kRoundToken] < V_,
          "device acceptance returned {} drafts and token {}", accepted, h[kRoundToken]);
      Lane& l = lane(steps[i].seq);
      out[i].accepted = accepted;
      out[i].drafted = l.tree_nodes > 0 ? l.tree_nodes : steps[i].room;
      if (l.tree_nodes > 0) l.path.assign(h + path_at_, h + path_at_ + accepted);
      out[i].tokens.assign(h + kRoundDrafts, h + kRoundDrafts + accepted);
      out[i].tokens.push_back(h[kRoundToken]);
      out[i].logprobs.clear();
      if (steps[i].logprobs >= 0)
        out[i].logprobs = logprobs_.results(i, accepted + 1, steps[i].logprobs);
    }
  }

 protected:
  void close(int seq) override {
    Lane& l = lanes_.at(size_t(seq));
    ledger_->close(l.blocks);
    l.open = false;
    free_.push_back(seq);
  }

 private:
  // Every sequence's block in one draft: a plan over the sequences' block tables (the anchor at
  // the first position the drafter lacks, which the table grows to hold), the lanes whose round
  // rows hold the anchors, and each draft's noise (seed, counter), in one upload; greedy
  // sequences' drafts are the rows' argmaxes, written to every round row in one launch, and the
  // others then sample theirs from their own rows. A sequence drafting a tree takes one draft per
  // noise draw of its shape (each decoded as a block is) and, for top-k expansion, the ranked
  // tokens of its first draw's slots; its trie is built on the host (DraftTrie, as the CPU's
  // proposer builds it) and goes to its round row.
  void propose_paged(std::span<const SeqStep> steps) {
    const cudaStream_t st = ctx_.stream();
    const int n = int(steps.size());
    copies_.clear();
    for (const SeqStep& step : steps) {
      Lane& l = lane(step.seq);
      // The anchor's position (a block drafter's: its whole block).
      ledger_->reserve_draft(l.blocks, copies_);
      l.tree_nodes = 0;
    }
    run_copies();
    const std::vector<int> nodes = tree_budgets(steps);
    std::vector<int> draws(size_t(n), 1), first(size_t(n) + 1, 0);
    for (int b = 0; b < n; ++b) {
      if (nodes[size_t(b)] > 0) draws[size_t(b)] = std::max(1, steps[size_t(b)].tree.paths);
      first[size_t(b) + 1] = first[size_t(b)] + draws[size_t(b)];
    }
    const int T = first.back();
    std::vector<paged::DraftSeq> seqs;
    seqs.reserve(size_t(T));
    for (int b = 0; b < n; ++b) {
      const Lane& l = lane(steps[size_t(b)].seq);
      for (int d = 0; d < draws[size_t(b)]; ++d)
        seqs.push_back({pool_->table(l.blocks.kv), l.blocks.committed + (extra_ > 0 ? 0 : 1)});
    }
    const paged::StepPlan plan = extra_ > 0
                                     ? paged::plan_block(seqs, extra_, kBlockTokens, buckets_)
                                     : paged::plan_draft(seqs, K_, kBlockTokens, buckets_);
    const std::vector<int32_t> image = plan.image();
    FLASHMAP_ASSERT(image.size() <= size_t(draft_image_ints_));
    int32_t* host = draft_stage_.data();
    uint64_t* rng = draft_rng_host_.data();
    std::fill(host, host + plan.bucket, 0);
    std::fill(rng, rng + 2 * plan.bucket, 0);
    for (int b = 0; b < n; ++b) {
      const SeqStep& step = steps[size_t(b)];
      Lane& l = lane(step.seq);
      for (int d = first[size_t(b)]; d < first[size_t(b) + 1]; ++d) {
        host[d] = l.index;
        rng[2 * d] = step.sampler->seed;
        rng[2 * d + 1] = ++l.drafts;
      }
    }
    std::copy(image.begin(), image.end(), host + draft_lanes_cap_);
    int32_t* d_lanes = draft_device_.data();
    const int32_t* d_image = d_lanes + draft_lanes_cap_;
    check(cudaMemcpyAsync(d_lanes, host, size_t(draft_lanes_cap_ + int64_t(image.size())) * 4,
                          cudaMemcpyHostToDevice, st),
          "cudaMemcpyAsync H2D (draft plan)");
    check(cudaMemcpyAsync(draft_rng_.data(), rng, size_t(2 * plan.bucket) * 8,
                          cudaMemcpyHostToDevice, st),
          "cudaMemcpyAsync H2D (draft noise)");
    gather_anchors(rounds_.data(), stride_, d_lanes, plan.bucket, draft_anchors_.data(), st);
    check(cudaGetLastError(), "gather_anchors");
    float* logits = draft_logits_.data();
    proposer_->draft_paged(d_image, plan.bucket, draft_anchors_.data(), draft_rng_.data(), logits);
    mask(logits, int64_t(T) * K_);
    argmax_rows(logits, int64_t(T) * K_, V_, argmax_.data(), st);
    // Every draw's argmaxes into its lane's round row: the greedy blocks' drafts (a tree's draws
    // write there too, and its trie replaces them below).
    scatter_drafts(argmax_.data(), d_lanes, T, K_, rounds_.data(), stride_, st);
    check(cudaGetLastError(), "scatter_drafts");
    // The sampled blocks: a block's filtered q (each lane's rows of q_, which acceptance reads)
    // and its draws in one launch each; a sampled tree's draws are drawn the same way (their q
    // in p_, which nothing reads later), each draw from the sequence's generator in turn, into
    // the draws' argmax rows.
    std::vector<FilterRow> q_rows, tree_rows;
    std::vector<SampleItem> q_items, tree_items;
    for (int b = 0; b < n; ++b) {
      const SeqStep& step = steps[size_t(b)];
      SeqSampler& sm = *step.sampler;
      if (sm.params.greedy()) continue;
      Lane& l = lane(step.seq);
      const bool tree = nodes[size_t(b)] > 0;
      for (int d = first[size_t(b)]; d < first[size_t(b) + 1]; ++d) {
        for (int r = 0; r < K_; ++r)
          (tree ? tree_rows : q_rows)
              .push_back(
                  Sampler::filter_row(d * K_ + r, (tree ? d : l.index) * K_ + r, sm.params, V_));
        SampleItem it;
        it.out = tree ? argmax_.data() + int64_t(d) * K_ : round(l) + kRoundDrafts;
        it.state = sm.keyed() ? nullptr : generator(l, sm);
        it.seed = sm.seed;
        it.first_position = step.position + 1;
        it.p_row = (tree ? d : l.index) * K_;
        it.rows = K_;
        it.keyed = sm.keyed();
        it.skip = (d - first[size_t(b)]) * K_;
        (tree ? tree_items : q_items).push_back(it);
      }
    }
    // The ranked tokens of a top-k tree's first draw, slot by slot.
    std::vector<int32_t> ranked_src;
    std::vector<int> ranked_at(size_t(n), -1);
    int keep = 1;
    for (int b = 0; b < n; ++b) {
      if (nodes[size_t(b)] == 0 || steps[size_t(b)].tree.budget == 0) continue;
      ranked_at[size_t(b)] = int(ranked_src.size());
      for (int k = 0; k < tree_depth(steps[size_t(b)]); ++k)
        ranked_src.push_back(first[size_t(b)] * K_ + k);
      keep = std::max(keep, int(DraftTrie::topk_keep(V_, nodes[size_t(b)])));
    }
    const bool trees = std::any_of(nodes.begin(), nodes.end(), [](int v) { return v > 0; });
    if (q_items.empty() && tree_items.empty() && !trees) return;  // greedy chains only
    const int q_cuts = cut_rows_first(q_rows), tree_cuts = cut_rows_first(tree_rows);
    const auto d =
        upload_arrays(draw_stage_, {bytes_of(q_rows), bytes_of(tree_rows), bytes_of(q_items),
                                    bytes_of(tree_items), bytes_of(ranked_src)});
    sampler_.filtered_probs_rows(logits, static_cast<const FilterRow*>(d[0]), int(q_rows.size()),
                                 q_cuts, q_.data());
    sampler_.filtered_probs_rows(logits, static_cast<const FilterRow*>(d[1]), int(tree_rows.size()),
                                 tree_cuts, p_.data());
    sampler_.sample_items(q_.data(), static_cast<const SampleItem*>(d[2]), int(q_items.size()), K_);
    sampler_.sample_items(p_.data(), static_cast<const SampleItem*>(d[3]), int(tree_items.size()),
                          K_);
    if (!trees) return;
    if (!ranked_src.empty())
      sampler_.ranked_logprobs(logits, static_cast<const int32_t*>(d[4]), int(ranked_src.size()),
                               keep, ranked_ids_.data(), ranked_lps_.data());
    build_trees(steps, nodes, first, ranked_at, keep, int(ranked_src.size()));
  }

  // The rows a sequence verifies this round: its anchor and drafts, or its anchor and tree.
  int rows_of_step(const Lane& l, const SeqStep& st) const {
    return l.tree_nodes > 0 ? 1 + l.tree_nodes : st.room + 1;
  }
  int tree_depth(const SeqStep& st) const { return std::min(st.room, K_); }
  // Per sequence, the most nodes its trie may hold this round (0: it drafts a block): the CPU's
  // budget (the shape's, or kMaxTreePaths · K for noise draws alone) within the device's
  // (max_nodes_) and the positions left in its cache. Trees go to sequences whose rounds may
  // draft one (no controls, no logprobs, as the engine asks) and only when the round's draws fit
  // one batched draft and its rows the step's buffers; otherwise every sequence drafts a block.
  std::vector<int> tree_budgets(std::span<const SeqStep> steps) const {
    const int n = int(steps.size());
    std::vector<int> nodes(size_t(n), 0);
    if (!info_.caps.trees) return nodes;
    int64_t draws = 0, R = 1;
    bool any = false;
    for (int b = 0; b < n; ++b) {
      const SeqStep& st = steps[size_t(b)];
      const Lane& l = lanes_[size_t(st.seq)];
      ++draws;
      const bool tree = st.tree.active() && !controlled(st) && st.logprobs < 0 && st.room > 0;
      int64_t most = 0;
      if (tree) {
        most = st.tree.budget > 0 ? st.tree.budget : int64_t(kMaxTreePaths) * K_;
        most = std::min<int64_t>(
            {most, max_nodes_, pool_->max_positions(l.blocks.kv) - l.blocks.length - 1});
      }
      if (most < 1) {
        R = std::max<int64_t>(R, st.room + 1);
        continue;
      }
      nodes[size_t(b)] = int(most);
      draws += std::max(1, st.tree.paths) - 1;
      R = std::max<int64_t>(R, 1 + most);
      any = true;
    }
    if (any &&
        (draws > buckets_.back() || int64_t(paged::bucket_for(n, buckets_)) * R > step_rows_cap_))
      std::fill(nodes.begin(), nodes.end(), 0);
    return nodes;
  }
  // One synchronization brings every draw's block and the ranked lists to the host; each tree
  // sequence's trie is built as the CPU's proposer builds it (src/cpu/proposers.cpp pick_tree)
  // and goes to its round row: tokens after the anchor, parents after them.
  void build_trees(std::span<const SeqStep> steps, const std::vector<int>& nodes,
                   const std::vector<int>& first, const std::vector<int>& ranked_at, int keep,
                   int ranked_rows) {
    const int T = first.back();
    const cudaStream_t st = ctx_.stream();
    check(cudaMemcpyAsync(tree_blocks_.data(), argmax_.data(), size_t(T) * K_ * 4,
                          cudaMemcpyDeviceToHost, st),
          "cudaMemcpyAsync D2H (tree draws)");
    const size_t ranked = size_t(ranked_rows) * size_t(keep);
    if (ranked) {
      check(cudaMemcpyAsync(ranked_ids_host_.data(), ranked_ids_.data(), ranked * 4,
                            cudaMemcpyDeviceToHost, st),
            "cudaMemcpyAsync D2H (ranked ids)");
      check(cudaMemcpyAsync(ranked_lps_host_.data(), ranked_lps_.data(), ranked * 4,
                            cudaMemcpyDeviceToHost, st),
            "cudaMemcpyAsync D2H (ranked log-probabilities)");
    }
    ctx_.sync();
    for (size_t b = 0; b < steps.size(); ++b) {
      if (nodes[b] == 0) continue;
      const SeqStep& step = steps[b];
      Lane& l = lane(step.seq);
      const int depth = tree_depth(step), most = nodes[b];
      DraftTrie trie;
      if (step.tree.paths > 0)
        for (int d = first[b]; d < first[b + 1]; ++d)
          if (!trie.insert_path({tree_blocks_.data() + int64_t(d) * K_, size_t(K_)}, depth, most))
            break;
      if (step.tree.budget > 0) {
        const int64_t use = std::min<int64_t>(keep, DraftTrie::topk_keep(V_, most));
        std::vector<std::vector<std::pair<int32_t, float>>> lists(static_cast<size_t>(depth));
        for (int k = 0; k < depth; ++k) {
          const size_t row = size_t(ranked_at[b] + k) * size_t(keep);
          for (int64_t j = 0; j < use; ++j)
            lists[size_t(k)].push_back({ranked_ids_host_.data()[row + size_t(j)],
                                        ranked_lps_host_.data()[row + size_t(j)]});
        }
        trie.expand_ranked(lists, most);
      }
      FLASHMAP_ASSERT(trie.nodes() >= 1 && trie.nodes() <= most);
      l.tree_nodes = trie.nodes();
      l.step_parents.assign(1, -1);
      for (int32_t p : trie.parents) l.step_parents.push_back(p + 1);
      // Pageable sources: staged before each call returns, copied in stream order.
      check(cudaMemcpyAsync(round(l) + kRoundDrafts, trie.tokens.data(), trie.tokens.size() * 4,
                            cudaMemcpyHostToDevice, st),
            "cudaMemcpyAsync H2D (tree tokens)");
      check(cudaMemcpyAsync(round(l) + parents_at_, trie.parents.data(), trie.parents.size() * 4,
                            cudaMemcpyHostToDevice, st),
            "cudaMemcpyAsync H2D (tree parents)");
    }
  }

  // Rows that cut (and so are sorted) first, in their order; the count of them.
  int cut_rows_first(std::vector<FilterRow>& rows) const {
    const auto mid = std::stable_partition(
        rows.begin(), rows.end(), [&](const FilterRow& r) { return Sampler::cuts(r, V_); });
    return int(mid - rows.begin());
  }
  template <class T>
  static std::pair<const void*, size_t> bytes_of(const std::vector<T>& v) {
    static_assert(alignof(T) <= 16 && sizeof(T) % 4 == 0);
    return {v.data(), v.size() * sizeof(T)};
  }
  // One upload of several arrays (each at a 16-byte aligned offset of the stage); their device
  // addresses, in order.
  std::vector<const void*> upload_arrays(
      Staging& stage, std::initializer_list<std::pair<const void*, size_t>> arrays) {
    std::vector<size_t> at;
    size_t ints = 0;
    for (const auto& [data, bytes] : arrays) {
      at.push_back(ints);
      ints += (bytes / 4 + 3) / 4 * 4;
    }
    int32_t* host = stage.reserve(ctx_, ints, ints);
    size_t k = 0;
    for (const auto& [data, bytes] : arrays)
      if (bytes)
        std::memcpy(host + at[k++], data, bytes);
      else
        ++k;
    int32_t* dev = stage.device.data();
    if (ints)
      check(cudaMemcpyAsync(dev, host, ints * 4, cudaMemcpyHostToDevice, ctx_.stream()),
            "cudaMemcpyAsync H2D (sampling batch)");
    std::vector<const void*> out;
    for (size_t a : at) out.push_back(dev + a);
    return out;
  }

  // A commit plan's rows of `features` into the drafter's pool (one upload, one pass).
  void commit_paged(const paged::CommitPlan& plan, const float* features) {
    if (plan.n == 0) return;
    const std::vector<int32_t> image = plan.image();
    commit_stage_.reserve(ctx_, 0, image.size());
    int32_t* dev = commit_stage_.device.data();
    // A pageable source: the copy returns once staged, and runs after what the stream holds.
    check(
        cudaMemcpyAsync(dev, image.data(), image.size() * 4, cudaMemcpyHostToDevice, ctx_.stream()),
        "cudaMemcpyAsync H2D (drafter commit)");
    proposer_->commit_paged(features, dev, plan.n);
  }

  Lane& lane(int seq) {
    FLASHMAP_ASSERT(seq >= 0 && size_t(seq) < lanes_.size() && lanes_[size_t(seq)].open);
    return lanes_[size_t(seq)];
  }
  const Lane& lane(int seq) const {
    FLASHMAP_ASSERT(seq >= 0 && size_t(seq) < lanes_.size() && lanes_[size_t(seq)].open);
    return lanes_[size_t(seq)];
  }
  int64_t open_lanes() const { return int64_t(lanes_.size()) - int64_t(free_.size()); }
  int32_t* round(const Lane& l) { return rounds_.data() + int64_t(l.index) * stride_; }
  // The sequence's rows of the last step's logits (anchor first).
  float* rows_of(const Lane& l) {
    FLASHMAP_ASSERT(step_logits_ && l.step_row >= 0);
    return step_logits_ + l.step_row * V_;
  }
  std::span<const int> taps(const Lane& l) const {
    return l.blocks.drafting ? std::span<const int>(info_.taps) : std::span<const int>{};
  }
  // Room in its KV blocks for n more positions; the pool's copies (a shared block about to be
  // written) run before the next write.
  void grow(Lane& l, int64_t n) { ledger_->reserve(l.blocks, n, copies_); }
  // The pending copies, now, in the target's blocks and the batched drafter's (forward() sends
  // its own with the step's upload).
  void run_copies() {
    if (copies_.empty()) return;
    std::vector<int32_t> flat;
    flat.reserve(3 * copies_.size());
    for (const paged::BlockCopy& c : copies_) flat.insert(flat.end(), {c.src, c.dst, c.tokens});
    if (copy_ids_.size() < flat.size()) {
      ctx_.sync();  // an earlier copy may still read the buffer
      copy_ids_ = DeviceBuffer<int32_t>(std::max(flat.size(), 2 * copy_ids_.size()));
    }
    // A pageable source: the call returns once the bytes are staged.
    check(cudaMemcpyAsync(copy_ids_.data(), flat.data(), flat.size() * 4, cudaMemcpyHostToDevice,
                          ctx_.stream()),
          "cudaMemcpyAsync H2D (block copies)");
    target_.copy_blocks(*kv_, copy_ids_.data(), int(copies_.size()));
    if (paged_) proposer_->copy_blocks(copy_ids_.data(), int(copies_.size()));
    copies_.clear();
  }

  // One sequence's buffers, all or none (the proposer's lane comes last, so that it is added
  // only when the rest exists).
  Lane new_lane(int index) {
    Lane l;
    l.index = index;
    l.first = DeviceBuffer<float>(size_t(V_));
    if (K_ > 0) {
      if (!paged_) l.draft_logits = DeviceBuffer<float>(size_t(K_) * size_t(V_));
    }
    l.rng = DeviceBuffer<uint64_t>(2);
    if (proposer_ && !paged_) l.draft = proposer_->add_lane(capacity_);
    return l;
  }

  // The device's memory: the first lane is made now and what it took sets the cost of a
  // sequence's own buffers (its drafter context included); the step buffers are sized for a full
  // batch of them; the KV pool takes the rest, less a reserve for what grows later (cuBLASLt's
  // plans, graphs). Sequences: as many lanes as a share of the memory holds, at most max_lanes
  // (0: no cap of the caller's), each admitted while the pool can promise it its positions.
  void size_memory(int max_lanes) {
    const Qwen3Config& tc = target_.config();
    const size_t before = ctx_.free_bytes();
    lanes_.push_back(new_lane(0));
    free_.push_back(0);
    const size_t after = ctx_.free_bytes();
    lane_bytes_ = before > after ? before - after : 1;
    block_bytes_ = target_.paged_block_bytes(kBlockTokens);
    // A paged drafter keeps its context in blocks beside the target's (same ids and tables).
    if (paged_) block_bytes_ += proposer_->paged_block_bytes(kBlockTokens);
    // A full step of one lane: logits, features, activations and attention partials of K + 1 rows.
    const int64_t R = K_ + 1, H = tc.hidden_size, I = tc.intermediate_size;
    const int64_t step_per_lane =
        R * (V_ + F_ + 8 * H + 3 * I) * 4 +
        paged_attention_partial_floats(1, int(R), tc.num_attention_heads, tc.num_key_value_heads,
                                       tc.head_dim) *
            4 +
        (paged_ ? int64_t(K_) * V_ * 4 + proposer_->batch_bytes(1) : 0) +
        // q rows and the filtered p rows of a lane (the sort's rows are a fixed number).
        (int64_t(K_) + R) * 4 * V_;
    // Half of the memory for lanes and their step buffers, the other half (at least) for keys and
    // values: a lane is only worth its cost while there are blocks for its positions.
    const size_t per = size_t(lane_bytes_) + size_t(step_per_lane);
    const int64_t fit = std::max<int64_t>(1, int64_t(after / 2 / per));
    const int cap = max_lanes > 0 ? max_lanes : 256;
    info_.max_sequences = int(std::min<int64_t>(fit, cap));
    const int n = info_.max_sequences;
    rounds_ = DeviceBuffer<int32_t>(size_t(n) * size_t(stride_));
    check(cudaMemsetAsync(rounds_.data(), 0, rounds_.size() * 4, ctx_.stream()),
          "cudaMemsetAsync (rounds)");
    host_rounds_ = HostBuffer<int32_t>(rounds_.size());
    argmax_ = DeviceBuffer<int32_t>(size_t(n) * size_t(R));  // R > K: a draft's rows fit too
    // Every sampled row of a full batch filtered at once.
    q_ = DeviceBuffer<float>(size_t(n) * size_t(K_) * size_t(V_));
    p_ = DeviceBuffer<float>(size_t(n) * size_t(R) * size_t(V_));
    // Rows that cut are sorted kSortRows at a time: the sort's memory does not grow with lanes.
    sampler_.reserve(int(std::min<int64_t>(int64_t(n) * R, kSortRows)));
    buckets_ = paged::default_buckets(n);
    const int64_t max_table = (capacity_ + extra_ + kBlockTokens - 1) / kBlockTokens;
    paged::StepPlan widest;
    widest.bucket = n;
    widest.R = int(std::max<int64_t>(R, int64_t(kPrefillChunk)));
    widest.mask_words = (widest.R + 31) / 32;
    widest.table_stride = int32_t(max_table);
    const int64_t image_ints = widest.offsets().total;
    const int64_t rows = std::max<int64_t>(int64_t(n) * R, int64_t(kPrefillChunk));
    step_rows_cap_ = int64_t(n) * R;
    const int taps = int(info_.taps.size());
    target_.reserve_step(rows, image_ints, int64_t(n) * R, taps, n, int(R));
    // The prefill's chunk of one sequence needs partials of its own shape.
    target_.reserve_step(rows, image_ints, int64_t(n) * R, taps, 1, int(kPrefillChunk));
    // A round's uploads at full batch: its image (at the longest tables), lanes and copies.
    step_stage_.reserve(ctx_, size_t(image_ints) + 4 * size_t(n), 4 * size_t(n));
    accept_stage_.reserve(ctx_, 4 * size_t(n), 4 * size_t(n));
    int64_t batch_bytes = 0;
    if (paged_) {
      // A batched draft's buffers at full batch, at fixed addresses (its graphs keep them): the
      // lanes then the plan image at the longest tables, anchors, noise, logits.
      paged::StepPlan draft;
      draft.bucket = n;
      draft.R = K_ + 1;  // plan_draft's K rows or plan_block's B = K + 1
      draft.mask_words = (K_ + 1 + 31) / 32;
      draft.table_stride = int32_t(max_table);
      draft_lanes_cap_ = (int64_t(n) + 15) / 16 * 16;
      draft_image_ints_ = draft.offsets().total;
      draft_stage_ = HostBuffer<int32_t>(size_t(draft_lanes_cap_ + draft_image_ints_));
      draft_device_ = DeviceBuffer<int32_t>(size_t(draft_lanes_cap_ + draft_image_ints_));
      draft_anchors_ = DeviceBuffer<int32_t>(size_t(n));
      draft_rng_host_ = HostBuffer<uint64_t>(2 * size_t(n));
      draft_rng_ = DeviceBuffer<uint64_t>(2 * size_t(n));
      draft_logits_ = DeviceBuffer<float>(size_t(n) * size_t(K_) * size_t(V_));
      batch_bytes = proposer_->batch_bytes(n);
      const size_t ranked = size_t(n) * size_t(K_) * size_t(max_nodes_ + 1);
      tree_blocks_ = HostBuffer<int32_t>(size_t(n) * size_t(K_));
      ranked_ids_host_ = HostBuffer<int32_t>(ranked);
      ranked_lps_host_ = HostBuffer<float>(ranked);
      ranked_ids_ = DeviceBuffer<int32_t>(ranked);
      ranked_lps_ = DeviceBuffer<float>(ranked);
    }
    ctx_.sync();
    // The lanes still to be made come out of what is left; a reserve for what grows later.
    const size_t left = ctx_.free_bytes();
    const size_t lanes_later = size_t(n - 1) * size_t(lane_bytes_);
    const size_t reserve = std::max<size_t>(size_t(1) << 30, left / 20);
    const int64_t usable =
        int64_t(left) - int64_t(lanes_later) - int64_t(std::min(reserve, left)) - batch_bytes;
    // No more blocks than the n sequences the lanes hold can ever use: each is opened (fresh or
    // as a copy) for at most capacity_ + extra_ positions, and BlockPool keeps its allocated plus
    // promised blocks within the sum of blocks_for(max_positions) over its open sequences (a block
    // in r tables is counted r times there, which covers the r − 1 copies it may need). With at
    // most n open (open() takes a lane first), n times per_seq blocks refuse no admission the
    // lanes allow; past that, blocks would only be allocated and zeroed for nothing (a small
    // model would take the whole GPU, and a test that builds many backends its time in memsets).
    const int64_t per_seq = (capacity_ + extra_ + kBlockTokens - 1) / kBlockTokens;
    const bool capped = usable / block_bytes_ > int64_t(n) * per_seq;
    const int64_t blocks = std::min(usable / block_bytes_, int64_t(n) * per_seq);
    const int64_t one = (capacity_ + kBlockTokens - 1) / kBlockTokens;
    FLASHMAP_CHECK(blocks >= std::min<int64_t>(one, 64),
                   "{}: {:.2f} GiB left for the KV cache after the weights and {} sequence lanes "
                   "({:.2f} GiB each): too little (pass a smaller --max-context or --max-running)",
                   info_.device, double(std::max<int64_t>(usable, 0)) / double(1 << 30), n,
                   double(lane_bytes_) / double(1 << 30));
    const int64_t most = std::numeric_limits<int32_t>::max() / kBlockTokens;
    kv_ = target_.new_paged(int32_t(std::min(blocks, most)), kBlockTokens);
    pool_ = std::make_unique<paged::BlockPool>(kv_->blocks(), kBlockTokens);
    ledger_ = std::make_unique<paged::Ledger>(*pool_, extra_);
    if (paged_) proposer_->make_pool(kv_->blocks(), kBlockTokens, n);
    // Once per process (a test makes many backends): what the pool takes and what bounded it.
    static std::once_flag told;
    std::call_once(told, [&] {
      const double gib = double(kv_->blocks()) * double(block_bytes_) / double(1 << 30);
      fmt::print(stderr,
                 "flashmap: {}: KV pool of {} blocks of {} positions, {:.2f} GiB{}: {} ({} "
                 "sequences of up to {} positions)\n",
                 info_.device, kv_->blocks(), kBlockTokens, gib,
                 paged_ ? " with the drafter's context" : "",
                 capped ? "all its sequences can use" : "what the free memory holds", n, capacity_);
    });
  }

  void download_rounds() {
    const size_t n = size_t(lanes_.size()) * size_t(stride_);
    check(cudaMemcpyAsync(host_rounds_.data(), rounds_.data(), n * 4, cudaMemcpyDeviceToHost,
                          ctx_.stream()),
          "cudaMemcpyAsync D2H (rounds)");
  }

  // The sequence's own generator {seed, counter}, started at its first use.
  uint64_t* generator(Lane& l, const SeqSampler& sm) {
    if (!l.rng_started) {
      sampler_.init_state(l.rng.data(), sm.seed);
      l.rng_started = true;
    }
    return l.rng.data();
  }
  void bind(Lane& l, const SeqSampler& sm) { sampler_.bind(generator(l, sm)); }
  // The lane's rows of the drafts' filtered distributions.
  float* q_of(const Lane& l) { return q_.data() + int64_t(l.index) * K_ * V_; }
  // Padding ids past the tokenizer's size (flashmap::Qwen3Model::mask_padding) on every sampled
  // row; the raw rows of logprobs are these.
  void mask(float* logits, int64_t rows) {
    const int64_t known = target_.sampled_vocab();
    if (known > 0 && known < V_) {
      fill_columns(logits, rows, V_, known, -std::numeric_limits<float>::infinity(), ctx_.stream());
      check(cudaGetLastError(), "fill_columns (padding ids)");
    }
  }

  // Room for a batch of `seqs` sequences' logprobs and constrained drafts.
  void prepare(size_t seqs) {
    if (seqs > host_seqs_) {
      ctx_.sync();  // nothing may still be copied into the old buffer
      drafts_ = HostBuffer<int32_t>(seqs * size_t(std::max(K_, 1)));
      host_seqs_ = seqs;
    }
    logprobs_.reserve(seqs);
  }

  // The batch's control programs (pick: row 0 alone; accept: anchor + room drafts), uploaded in
  // one copy. A constraint's masks follow the drafts, so the constrained sequences' drafts come
  // to the host first (their ids only; one synchronization for the batch).
  void stage_controls(std::span<const SeqStep> steps, bool block) {
    programs_.assign(steps.size(), -1);
    controls_.clear();
    const size_t K = size_t(std::max(K_, 1));
    bool fetched = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& st = steps[i];
      if (!block || !controlled(st) || !st.controls->constrained() || st.room == 0) continue;
      check(
          cudaMemcpyAsync(drafts_.data() + i * K, round(lane(st.seq)) + kRoundDrafts,
                          size_t(st.room) * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_.stream()),
          "cudaMemcpyAsync D2H (drafts of a constrained sequence)");
      fetched = true;
    }
    if (fetched) ctx_.sync();
    bool any = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& st = steps[i];
      if (!controlled(st)) continue;
      const int rows = block ? st.room + 1 : 1;
      const bool masks = block && st.controls->constrained() && st.room > 0;
      const auto drafts = masks ? std::span<const int32_t>(drafts_.data() + i * K, size_t(st.room))
                                : std::span<const int32_t>{};
      programs_[i] = controls_.add(st.controls->program(rows, drafts));
      any = true;
    }
    if (any) controls_.upload();
  }
  // Room for the raw rows of every controlled sequence that wants logprobs (their controls
  // change the rows in place before the logprobs read them).
  void reserve_raw(std::span<const SeqStep> steps, int rows) {
    size_t n = 0;
    for (const SeqStep& st : steps) n += controlled(st) && st.logprobs >= 0;
    const size_t floats = n * size_t(rows) * size_t(V_);
    if (floats > raw_.size()) {
      ctx_.sync();
      raw_ = DeviceBuffer<float>(floats);
    }
    raw_used_ = 0;
  }
  // Sequence i's rows (logits, anchor first) with its controls applied on the device; returns
  // the raw rows its logprobs read: a copy taken before the controls when it has both.
  const float* control(size_t i, const SeqStep& st, Lane& l, float* logits, int rows) {
    if (programs_[i] < 0) return logits;
    const float* raw = logits;
    if (st.logprobs >= 0) {
      float* copy = raw_.data() + size_t(raw_used_++) * size_t(K_ + 1) * size_t(V_);
      check(cudaMemcpyAsync(copy, logits, size_t(rows) * size_t(V_) * 4, cudaMemcpyDeviceToDevice,
                            ctx_.stream()),
            "cudaMemcpyAsync D2D (raw rows)");
      raw = copy;
    }
    controls_.apply(programs_[i], logits, round(l) + kRoundDrafts);
    return raw;
  }

  Qwen3Model& target_;
  DeviceProposer* proposer_;
  bool graphs_;
  Context& ctx_;
  int64_t V_;
  int K_;
  int64_t stride_;  // ints per round row
  int64_t F_ = 0;
  int64_t capacity_ = 0;
  Sampler sampler_;
  DeviceBuffer<float> p_;    // [lanes · (K + 1), V] a batch's filtered target rows
  DeviceBuffer<float> q_;    // [lanes · K, V] each lane's filtered draft rows
  DeviceBuffer<float> raw_;  // [n, K + 1, V] controlled sequences' raw rows, for their logprobs
  int raw_used_ = 0;
  DeviceControls controls_;
  DeviceLogprobs logprobs_;
  std::vector<int> programs_;  // the batch's program per sequence (-1: no controls)
  std::vector<Lane> lanes_;    // by Slot::index()
  std::vector<int> free_;      // lanes no sequence holds
  size_t lane_bytes_ = 0;
  int64_t block_bytes_ = 0;
  std::unique_ptr<PagedKV> kv_;
  std::unique_ptr<paged::BlockPool> pool_;
  std::unique_ptr<paged::Ledger> ledger_;  // the sequences' lengths over pool_
  std::vector<int32_t> buckets_;
  std::vector<paged::BlockCopy> copies_;
  DeviceBuffer<int32_t> copy_ids_;     // run_copies' (src, dst, tokens) triples
  DeviceBuffer<int32_t> rounds_;       // [lanes, K + 3] round rows
  HostBuffer<int32_t> host_rounds_;    // their copy on the host
  DeviceBuffer<int32_t> argmax_;       // [bucket · R] of a greedy acceptance
  Staging step_stage_, accept_stage_;  // a round's uploads: the step's, the acceptance's
  Staging commit_stage_;               // the drafter's commit plans (device side only)
  Staging draw_stage_, verify_stage_;  // a batch's sampling uploads: drafts', acceptance's
  Staging keep_stage_;                 // the slot moves that keep trees' accepted paths
  // Draft trees: the most nodes a trie holds, where its parents and the accepted path sit in a
  // round row, the rows the step's buffers hold, the draws' blocks and the ranked lists.
  int max_nodes_ = 1;
  int64_t parents_at_ = 0, path_at_ = 0, step_rows_cap_ = 0;
  HostBuffer<int32_t> tree_blocks_, ranked_ids_host_;
  HostBuffer<float> ranked_lps_host_;
  DeviceBuffer<int32_t> ranked_ids_;
  DeviceBuffer<float> ranked_lps_;
  // Batched drafting (a paged proposer): [lanes | plan image] pinned and on the device, the
  // anchors, each draft's (seed, counter), the logits of every sequence's block.
  bool paged_ = false;
  int extra_ = 0;  // positions a sequence reserves past its own for a block drafter's rows
  int64_t draft_lanes_cap_ = 0, draft_image_ints_ = 0;
  HostBuffer<int32_t> draft_stage_;
  DeviceBuffer<int32_t> draft_device_, draft_anchors_;
  HostBuffer<uint64_t> draft_rng_host_;
  DeviceBuffer<uint64_t> draft_rng_;
  DeviceBuffer<float> draft_logits_;
  HostBuffer<int32_t> drafts_;  // [sequences, K] constrained sequences' drafts
  size_t host_seqs_ = 0;
  // The last step's outputs (valid until the next forward).
  float* step_logits_ = nullptr;
  const float* step_features_ = nullptr;
  int step_R_ = 0, step_bucket_ = 0;
};

// The models a factory-made backend owns. A base class before CudaBackend, so that they are
// made before it and destroyed after it (its lanes' drafter contexts and KV pool need them).
struct OwnedModels {
  struct Models {
    std::unique_ptr<Context> ctx;
    std::unique_ptr<Qwen3Model> target;
    std::unique_ptr<FlashMapModel> draft;
    std::unique_ptr<DFlashModel> dflash;
    std::unique_ptr<DeviceProposer> proposer;
  };
  std::unique_ptr<Models> models;
};

// FLASHMAP_CUDA_DRAFT: "batched" (the default: one pass for every sequence's draft, over a
// paged context) or "lanes" (a pass and a context slab per sequence: the older path, kept to
// isolate a fault of the batched one on a device).
bool batched_drafts() {
  const char* v = std::getenv("FLASHMAP_CUDA_DRAFT");
  const std::string mode = v ? v : "";
  FLASHMAP_CHECK(mode.empty() || mode == "batched" || mode == "lanes",
                 "FLASHMAP_CUDA_DRAFT: '{}' is not a drafting mode (batched, lanes)", mode);
  return mode != "lanes";
}

struct OwningBackend : private OwnedModels, public CudaBackend {
  OwningBackend(std::unique_ptr<Models> m, int64_t capacity, int max_lanes)
      : OwnedModels{std::move(m)},
        CudaBackend(*models->target, models->proposer.get(), capacity, true, max_lanes) {}
};

}  // namespace

std::unique_ptr<engine::Backend> make_backend(Qwen3Model& target, DeviceProposer* proposer,
                                              int64_t capacity, bool graphs, int max_lanes) {
  target.context().make_current();
  return std::make_unique<CudaBackend>(target, proposer, capacity, graphs, max_lanes);
}

std::unique_ptr<engine::Backend> make_backend(const std::string& device,
                                              const std::string& target_dir,
                                              const std::string& draft_dir, int steps,
                                              int64_t sampled_vocab, int64_t capacity,
                                              int max_lanes) {
  const DrafterKind kind = drafter_kind(draft_dir, steps);
  auto m = std::make_unique<OwnedModels::Models>();
  m->ctx = std::make_unique<Context>(device);
  {
    // The host copies only live for the upload.
    ::flashmap::Qwen3Model cpu_target(target_dir, nullptr, ops::WeightFormat::Unpacked);
    if (sampled_vocab > 0) cpu_target.set_sampled_vocab(sampled_vocab);
    const Qwen3Config& tc = cpu_target.config();
    const int64_t cap = capacity > 0 ? std::min<int64_t>(capacity, tc.max_position_embeddings)
                                     : tc.max_position_embeddings;
    // The model's own cache is only for single-sequence tools; keep it small.
    m->target = std::make_unique<Qwen3Model>(*m->ctx, cpu_target, 1);
    if (kind == DrafterKind::DFlash) {
      ::flashmap::DFlashModel cpu_draft(draft_dir, cpu_target, nullptr,
                                        ops::WeightFormat::Unpacked);
      m->dflash =
          std::make_unique<DFlashModel>(*m->ctx, cpu_draft, m->target->embedding(),
                                        m->target->lm_head(), tc.vocab_size, tc.hidden_size);
      m->proposer = std::make_unique<DFlashDeviceProposer>(*m->dflash);
    } else if (kind == DrafterKind::FlashMap) {
      ::flashmap::FlashMapModel cpu_draft(draft_dir, cpu_target, nullptr,
                                          ops::WeightFormat::Unpacked);
      m->draft =
          std::make_unique<FlashMapModel>(*m->ctx, cpu_draft, m->target->embedding(),
                                          m->target->lm_head(), tc.vocab_size, tc.hidden_size);
      m->proposer =
          std::make_unique<FlashMapDeviceProposer>(*m->draft, steps, true, batched_drafts());
    }
    capacity = cap;
  }
  return std::make_unique<OwningBackend>(std::move(m), capacity, max_lanes);
}

}  // namespace flashmap::cuda
