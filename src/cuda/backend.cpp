#include "cuda/backend.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/check.h"
#include "cuda/controls.h"
#include "cuda/device.h"
#include "cuda/dflash_cuda.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/kernels.h"
#include "cuda/proposers.h"
#include "cuda/qwen3_cuda.h"
#include "cuda/sampling.h"
#include "models/dflash.h"
#include "models/drafter.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

namespace flashmap::cuda {
namespace {

using engine::Accepted;
using engine::SeqStep;

// Prompt tokens per prefill forward.
constexpr size_t kPrefillChunk = 512;

// A lane's round buffer: [accepted, token, anchor, drafts K]. The forward reads anchor + drafts
// from kAnchor; acceptance writes a RoundResult at kAccepted.
constexpr int kAccepted = 0, kToken = 1, kAnchor = 2, kDrafts = 3;

// One sequence's device resources and state, a row of the backend's table. The buffers are made
// once per lane and kept by the sequences that take it in turn, so that the graphs captured for
// them (the forward keyed by the KV cache, the draft by the proposer's lane, anchor and logits
// buffers) stay valid.
struct Lane {
  std::unique_ptr<KVCache> kv;
  int draft = -1;                       // the proposer's lane (-1: no proposer)
  DeviceBuffer<int32_t> round;          // [accepted, token, anchor, drafts K]
  DeviceBuffer<float> logits;           // [K + 1, V] the last forward's rows (controls: in place)
  DeviceBuffer<float> features;         // [K + 1, F] the last forward's taps
  DeviceBuffer<float> draft_logits, q;  // [K, V]: the proposer's logits; filtered q
  DeviceBuffer<uint64_t> rng;           // {seed, counter} of unseeded sampling
  // The sequence that holds it.
  bool open = false;
  bool drafting = false;
  bool rng_started = false;
  uint64_t drafts = 0;    // drafts made (the noise counter)
  int64_t committed = 0;  // positions its drafter lane holds
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
        p_(size_t(K_ + 1) * size_t(V_)),
        raw_(size_t(K_ + 1) * size_t(V_)),
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
    }
    info_.config = &tc;
    info_.max_positions = capacity_;
    info_.device = ctx_.name();
    info_.caps = {.fork = false, .prompt_logprobs = false, .trees = false};
    info_.block_size = K_;
    // The forward's activations up front, so that a round never regrows them (regrowing drops
    // the captured graphs), and a prefill chunk's.
    target_.reserve(std::max<int64_t>(K_ + 1, kPrefillChunk), K_ + 1);
    count_lanes(max_lanes);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream());
    for (const Lane& l : lanes_)
      if (l.draft >= 0) proposer_->remove_lane(l.draft);
  }

  engine::Slot open(const engine::Open& o) override {
    if (o.from) return {};  // no fork: the sequence prefills its whole prompt
    ctx_.make_current();
    int i;
    if (!free_.empty()) {
      i = free_.back();
      Lane& l = lanes_[size_t(i)];
      l.kv->truncate(0);
      if (l.draft >= 0) proposer_->reset(l.draft);
      free_.pop_back();
    } else {
      lanes_.push_back(new_lane());  // throws before the table holds it: no half-built lane
      i = int(lanes_.size()) - 1;
    }
    Lane& l = lanes_[size_t(i)];
    l.open = true;
    l.drafting = o.drafting && proposer_;
    l.rng_started = false;
    l.drafts = 0;
    l.committed = 0;
    return engine::Slot(this, i);
  }

  void prefill(std::span<const engine::Prefill> seqs) override {
    ctx_.make_current();
    for (const engine::Prefill& p : seqs) {
      FLASHMAP_CHECK(p.score < 0, "prompt logprobs are not supported on {}", info_.device);
      FLASHMAP_ASSERT(!p.tokens.empty());
      Lane& l = lane(p.seq);
      // In chunks of kPrefillChunk tokens: the activations of a forward grow with its rows
      // (~80 floats per hidden unit and token at Qwen3-8B), so a long prompt in one piece would
      // need gigabytes at once; chunked, they stay bounded whatever the prompt.
      for (size_t at = 0; at < p.tokens.size(); at += kPrefillChunk) {
        const auto chunk = p.tokens.subspan(at, std::min(kPrefillChunk, p.tokens.size() - at));
        const bool last = at + chunk.size() == p.tokens.size();
        const auto out = target_.forward_host(
            *l.kv, chunk, last ? Qwen3Model::Logits::Last : Qwen3Model::Logits::None, taps(l),
            false);
        if (last) keep_logits(l, out.logits, 1);
        // The chunk's features go to the drafter now: the next forward reuses the target's
        // feature buffer.
        if (l.drafting) {
          proposer_->commit(l.draft, out.features, int64_t(chunk.size()));
          l.committed += int64_t(chunk.size());
        }
      }
    }
  }

  void forward(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    for (const SeqStep& st : steps) {
      Lane& l = lane(st.seq);
      FLASHMAP_ASSERT(st.room >= 0 && st.room <= K_ && (st.room == 0 || l.drafting));
      const int64_t n = st.room + 1;
      // A block cut near the end runs eagerly: graphs are kept for the full block and the single
      // token, the sizes of every other round.
      const bool graph = graphs_ && (st.room == K_ || st.room == 0);
      const auto out = target_.forward(*l.kv, l.round.data() + kAnchor, n, Qwen3Model::Logits::All,
                                       taps(l), graph);
      keep_logits(l, out.logits, n);
      if (l.drafting)
        check(cudaMemcpyAsync(l.features.data(), out.features, size_t(n * F_) * sizeof(float),
                              cudaMemcpyDeviceToDevice, ctx_.stream()),
              "cudaMemcpyAsync D2D (taps)");
    }
  }

  void commit(std::span<const engine::Commit> seqs) override {
    ctx_.make_current();
    for (const engine::Commit& c : seqs) {
      Lane& l = lane(c.seq);
      l.kv->truncate(c.length);
      if (l.drafting && c.drafted > 0) {
        FLASHMAP_ASSERT(c.drafted <= K_ + 1);
        proposer_->commit(l.draft, l.features.data(), c.drafted);
        l.committed += c.drafted;
      }
    }
  }

  engine::Held held(int seq) const override {
    const Lane& l = lanes_.at(size_t(seq));
    engine::Held h{l.kv->length(), lane_bytes_};
    if (l.drafting) h.positions = std::min(h.positions, l.committed);
    return h;
  }

  void propose(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    const cudaStream_t st = ctx_.stream();
    for (const SeqStep& step : steps) {
      Lane& l = lane(step.seq);
      FLASHMAP_ASSERT(l.drafting);
      SeqSampler& sm = *step.sampler;
      proposer_->draft(l.draft, l.round.data() + kAnchor, sm.seed, ++l.drafts,
                       l.draft_logits.data());
      mask(l.draft_logits.data(), K_);
      int32_t* drafts = l.round.data() + kDrafts;
      if (sm.params.greedy()) {
        argmax_rows(l.draft_logits.data(), K_, V_, drafts, st);
        check(cudaGetLastError(), "argmax_rows (draft)");
        continue;
      }
      sampler_.filtered_probs(l.draft_logits.data(), K_, sm.params, l.q.data());
      if (sm.keyed()) {
        sampler_.sample_keyed(l.q.data(), K_, sm.seed, step.position + 1, drafts);
      } else {
        bind(l, sm);
        sampler_.sample(l.q.data(), K_, drafts);
        sampler_.bind(nullptr);
      }
    }
  }

  void pick(std::span<const SeqStep> steps, std::span<Accepted> out) override {
    ctx_.make_current();
    prepare(steps.size());
    stage_controls(steps, false);
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& st = steps[i];
      Lane& l = lane(st.seq);
      SeqSampler& sm = *st.sampler;
      const float* raw = control(i, st, l, 1);
      int32_t* anchor = l.round.data() + kAnchor;
      if (sm.keyed() || sm.params.greedy()) {
        sampler_.pick_keyed(l.logits.data(), sm.params, sm.seed, st.position + 1, anchor);
      } else {
        bind(l, sm);
        sampler_.pick(l.logits.data(), sm.params, anchor);
        sampler_.bind(nullptr);
      }
      to_host(anchor, 1, i);
      if (st.logprobs >= 0) logprobs_.enqueue(i, raw, 1, nullptr, nullptr, anchor, st.logprobs);
    }
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) {
      const int32_t t = host_.data()[i * row_];
      FLASHMAP_CHECK(t >= 0 && t < V_, "device pick returned token {}", t);
      out[i].accepted = 0;
      out[i].drafted = 0;
      out[i].tokens.assign(1, t);
      out[i].logprobs.clear();
      if (steps[i].logprobs >= 0) out[i].logprobs = logprobs_.results(i, 1, steps[i].logprobs);
    }
  }

  void accept(std::span<const SeqStep> steps, std::span<Accepted> out) override {
    ctx_.make_current();
    prepare(steps.size());
    stage_controls(steps, true);
    const cudaStream_t st = ctx_.stream();
    for (size_t i = 0; i < steps.size(); ++i) {
      const SeqStep& step = steps[i];
      Lane& l = lane(step.seq);
      SeqSampler& sm = *step.sampler;
      const int room = step.room;
      const float* raw = control(i, step, l, room + 1);
      const int32_t* drafts = l.round.data() + kDrafts;
      auto* result = reinterpret_cast<RoundResult*>(l.round.data() + kAccepted);
      if (sm.params.greedy()) {
        sampler_.verify_greedy(l.logits.data(), drafts, room, result);
      } else {
        sampler_.filtered_probs(l.logits.data(), room + 1, sm.params, p_.data());
        if (sm.keyed()) {
          sampler_.verify_keyed(p_.data(), drafts, room, sm.seed, step.position + 1, result);
        } else {
          bind(l, sm);
          sampler_.verify_sampled(p_.data(), l.q.data(), drafts, room, result);
          sampler_.bind(nullptr);
        }
      }
      to_host(l.round.data(), size_t(room) + kDrafts, i);
      // Token r of the emitted ones is draft r before the accepted count, then the target's.
      if (step.logprobs >= 0)
        logprobs_.enqueue(i, raw, room + 1, l.round.data() + kAccepted, drafts,
                          l.round.data() + kToken, step.logprobs);
      // The target's token is the next round's anchor, read there by the draft and the forward.
      check(cudaMemcpyAsync(l.round.data() + kAnchor, l.round.data() + kToken, sizeof(int32_t),
                            cudaMemcpyDeviceToDevice, st),
            "cudaMemcpyAsync D2D (next anchor)");
    }
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) {
      const int32_t* h = host_.data() + i * row_;
      const int accepted = h[kAccepted];
      FLASHMAP_CHECK(accepted >= 0 && accepted <= steps[i].room && h[kToken] >= 0 && h[kToken] < V_,
                     "device acceptance returned {} drafts and token {}", accepted, h[kToken]);
      out[i].accepted = accepted;
      out[i].drafted = steps[i].room;
      out[i].tokens.assign(h + kDrafts, h + kDrafts + accepted);
      out[i].tokens.push_back(h[kToken]);
      out[i].logprobs.clear();
      if (steps[i].logprobs >= 0)
        out[i].logprobs = logprobs_.results(i, accepted + 1, steps[i].logprobs);
    }
  }

 protected:
  void close(int seq) override {
    Lane& l = lanes_.at(size_t(seq));
    l.open = false;
    l.drafting = false;
    free_.push_back(seq);
  }

 private:
  Lane& lane(int seq) {
    FLASHMAP_ASSERT(seq >= 0 && size_t(seq) < lanes_.size() && lanes_[size_t(seq)].open);
    return lanes_[size_t(seq)];
  }
  std::span<const int> taps(const Lane& l) const {
    return l.drafting ? std::span<const int>(info_.taps) : std::span<const int>{};
  }

  // One sequence's buffers, all or none (a failed allocation throws and frees what it made; the
  // proposer's lane comes last, so that it is added only when the rest exists).
  Lane new_lane() {
    Lane l;
    l.kv = target_.new_cache(capacity_);
    l.round = DeviceBuffer<int32_t>(size_t(K_) + kDrafts);
    l.logits = DeviceBuffer<float>(size_t(K_ + 1) * size_t(V_));
    l.features = DeviceBuffer<float>(size_t(K_ + 1) * size_t(std::max<int64_t>(F_, 1)));
    if (K_ > 0) {
      l.draft_logits = DeviceBuffer<float>(size_t(K_) * size_t(V_));
      l.q = DeviceBuffer<float>(size_t(K_) * size_t(V_));
    }
    l.rng = DeviceBuffer<uint64_t>(2);
    if (proposer_) l.draft = proposer_->add_lane(capacity_);
    return l;
  }

  // How many sequences fit: the first lane is made now (free in the table) and what it took of
  // the free device memory sets the count, less a reserve for what grows later (activations of
  // longer forwards, graphs, cuBLASLt's scratch). At most max_lanes (0: no cap of the caller's).
  void count_lanes(int max_lanes) {
    const size_t before = ctx_.free_bytes();
    lanes_.push_back(new_lane());
    free_.push_back(0);
    const size_t after = ctx_.free_bytes();
    lane_bytes_ = before > after ? before - after : 1;
    const size_t reserve = std::max<size_t>(size_t(1) << 30, after / 20);
    const size_t more = after > reserve ? (after - reserve) / lane_bytes_ : 0;
    info_.max_sequences =
        int(std::min<size_t>(more + 1, size_t(max_lanes > 0 ? max_lanes : 1 << 20)));
  }

  // The sequence's own generator {seed, counter}, started at its first use.
  void bind(Lane& l, const SeqSampler& sm) {
    if (!l.rng_started) {
      sampler_.init_state(l.rng.data(), sm.seed);
      l.rng_started = true;
    }
    sampler_.bind(l.rng.data());
  }
  // Padding ids past the tokenizer's size (flashmap::Qwen3Model::mask_padding) on every sampled
  // row; the raw rows of logprobs are these.
  void mask(float* logits, int64_t rows) {
    const int64_t known = target_.sampled_vocab();
    if (known > 0 && known < V_) {
      fill_columns(logits, rows, V_, known, -std::numeric_limits<float>::infinity(), ctx_.stream());
      check(cudaGetLastError(), "fill_columns (padding ids)");
    }
  }
  void keep_logits(Lane& l, const float* logits, int64_t rows) {
    check(cudaMemcpyAsync(l.logits.data(), logits, size_t(rows * V_) * sizeof(float),
                          cudaMemcpyDeviceToDevice, ctx_.stream()),
          "cudaMemcpyAsync D2D (logits)");
    mask(l.logits.data(), rows);
  }

  // Pinned room for a batch of `seqs` sequences' results.
  void prepare(size_t seqs) {
    row_ = size_t(K_) + kDrafts;
    if (seqs > host_seqs_) {
      ctx_.sync();  // nothing may still be copied into the old buffers
      host_ = HostBuffer<int32_t>(seqs * row_);
      drafts_ = HostBuffer<int32_t>(seqs * size_t(std::max(K_, 1)));
      host_seqs_ = seqs;
    }
    logprobs_.reserve(seqs);
  }
  void to_host(const int32_t* src, size_t n, size_t i) {
    check(cudaMemcpyAsync(host_.data() + i * row_, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          ctx_.stream()),
          "cudaMemcpyAsync D2H (round)");
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
          cudaMemcpyAsync(drafts_.data() + i * K, lane(st.seq).round.data() + kDrafts,
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
  // Sequence i's rows with its controls applied on the device (rows = anchor + drafts); returns
  // the raw rows its logprobs read: a copy taken before the controls when it has both.
  const float* control(size_t i, const SeqStep& st, Lane& l, int rows) {
    if (programs_[i] < 0) return l.logits.data();
    const float* raw = l.logits.data();
    if (st.logprobs >= 0) {
      // raw_ is shared: the previous sequence's logprobs read it earlier in stream order.
      check(cudaMemcpyAsync(raw_.data(), l.logits.data(), size_t(rows) * size_t(V_) * sizeof(float),
                            cudaMemcpyDeviceToDevice, ctx_.stream()),
            "cudaMemcpyAsync D2D (raw rows)");
      raw = raw_.data();
    }
    controls_.apply(programs_[i], l.logits.data(), l.round.data() + kDrafts);
    return raw;
  }

  Qwen3Model& target_;
  DeviceProposer* proposer_;
  bool graphs_;
  Context& ctx_;
  int64_t V_;
  int K_;
  int64_t F_ = 0;
  int64_t capacity_ = 0;
  Sampler sampler_;
  DeviceBuffer<float> p_;    // [K + 1, V] filtered target rows
  DeviceBuffer<float> raw_;  // [K + 1, V] a controlled sequence's raw rows, for its logprobs
  DeviceControls controls_;
  DeviceLogprobs logprobs_;
  std::vector<int> programs_;  // the batch's program per sequence (-1: no controls)
  std::vector<Lane> lanes_;    // by Slot::index()
  std::vector<int> free_;      // lanes no sequence holds
  size_t lane_bytes_ = 0;
  HostBuffer<int32_t> host_;    // [sequences, K + 3] round results
  HostBuffer<int32_t> drafts_;  // [sequences, K] constrained sequences' drafts
  size_t host_seqs_ = 0, row_ = 0;
};

// The models a factory-made backend owns. A base class before CudaBackend, so that they are
// made before it and destroyed after it (its lanes' KV caches and drafter contexts need them).
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
      m->proposer = std::make_unique<FlashMapDeviceProposer>(*m->draft, steps);
    }
    capacity = cap;
  }
  return std::make_unique<OwningBackend>(std::move(m), capacity, max_lanes);
}

}  // namespace flashmap::cuda
