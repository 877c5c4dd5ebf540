#include "cuda/cuda_backend.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/check.h"
#include "cuda/device.h"
#include "cuda/dflash_cuda.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/kernels.h"
#include "cuda/qwen3_cuda.h"
#include "cuda/sampling.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

namespace flashmap::cuda {

// --- FlashMapDeviceProposer
// -----------------------------------------------------------------------

namespace {
struct FlashMapState : DeviceDraftState {
  DeviceDraftContext ctx;
};
}  // namespace

FlashMapDeviceProposer::FlashMapDeviceProposer(FlashMapModel& model, int steps, bool graphs)
    : model_(model), steps_(steps > 0 ? steps : model.config().num_steps), graphs_(graphs) {
  model_.grid(steps_);  // throws naming the supported step counts
}
int FlashMapDeviceProposer::block_size() const {
  return model_.block_size();
}
int64_t FlashMapDeviceProposer::vocab() const {
  return model_.vocab();
}
std::span<const int> FlashMapDeviceProposer::target_layer_ids() const {
  return model_.config().target_layer_ids;
}
int64_t FlashMapDeviceProposer::feature_dim() const {
  return model_.feature_dim();
}
std::unique_ptr<DeviceDraftState> FlashMapDeviceProposer::begin(int64_t capacity) {
  auto s = std::make_unique<FlashMapState>();
  s->ctx = model_.new_context(capacity + 1);  // committed tokens + the anchor's slot
  return s;
}
void FlashMapDeviceProposer::reset(DeviceDraftState& state) {
  model_.reset(static_cast<FlashMapState&>(state).ctx);
}
void FlashMapDeviceProposer::commit(DeviceDraftState& state, const float* d_features, int64_t n) {
  model_.extend_context(static_cast<FlashMapState&>(state).ctx, d_features, n);
}
void FlashMapDeviceProposer::draft(DeviceDraftState& state, const int32_t* d_anchor, uint64_t seed,
                                   uint64_t counter, float* d_logits) {
  FlashMapModel::Noise noise;
  noise.kind = FlashMapModel::Noise::Draw;
  noise.seed = seed;
  noise.counter = counter;
  model_.draft(static_cast<FlashMapState&>(state).ctx, d_anchor, steps_, noise, d_logits,
               graphs_ ? FlashMapModel::Exec::Graph : FlashMapModel::Exec::Eager);
}

namespace {
struct DFlashState : DeviceDraftState {
  DFlashDeviceContext ctx;
};
}  // namespace

int DFlashDeviceProposer::block_size() const {
  return model_.block_size() - 1;
}
int64_t DFlashDeviceProposer::vocab() const {
  return model_.vocab();
}
std::span<const int> DFlashDeviceProposer::target_layer_ids() const {
  return model_.config().target_layer_ids;
}
int64_t DFlashDeviceProposer::feature_dim() const {
  return model_.feature_dim();
}
std::unique_ptr<DeviceDraftState> DFlashDeviceProposer::begin(int64_t capacity) {
  auto s = std::make_unique<DFlashState>();
  s->ctx = model_.new_context(capacity);
  return s;
}
void DFlashDeviceProposer::reset(DeviceDraftState& state) {
  model_.reset(static_cast<DFlashState&>(state).ctx);
}
void DFlashDeviceProposer::commit(DeviceDraftState& state, const float* d_features, int64_t n) {
  model_.extend_context(static_cast<DFlashState&>(state).ctx, d_features, n);
}
void DFlashDeviceProposer::draft(DeviceDraftState& state, const int32_t* d_anchor, uint64_t,
                                 uint64_t, float* d_logits) {
  model_.draft(static_cast<DFlashState&>(state).ctx, d_anchor, d_logits);
}

// --- the backend
// ------------------------------------------------------------------------------------

namespace {

using engine::Accepted;
using engine::SeqStep;
using engine::Slot;

// Prompt tokens per prefill forward.
constexpr size_t kPrefillChunk = 512;

// One sequence's device resources, pooled: the graphs captured for them (the verify forward
// keyed by the KV cache, the draft keyed by its context, anchor and logits buffers) stay valid
// for the next sequence that takes them.
struct Lane {
  std::unique_ptr<KVCache> kv;
  std::unique_ptr<DeviceDraftState> draft;  // null without a proposer
  DeviceBuffer<int32_t> round;              // [accepted, token, anchor, drafts K]
  DeviceBuffer<float> logits;               // [K + 1, V] the last forward's rows
  DeviceBuffer<float> features;             // [K + 1, F] the last verify's taps
  DeviceBuffer<float> draft_logits, q;      // [K, V]: the proposer's logits; filtered q
  DeviceBuffer<uint64_t> rng;               // {seed, counter} of rejection sampling
};

class CudaBackend;

struct CudaSlot : Slot {
  CudaBackend* owner = nullptr;
  std::unique_ptr<Lane> lane;
  bool drafting = false;
  int64_t rows = 0;     // rows of the last forward
  uint64_t drafts = 0;  // drafts made (the noise counter)
  bool rng_started = false;
  ~CudaSlot() override;
};

CudaSlot& cu(Slot& s) {
  return static_cast<CudaSlot&>(s);
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
        p_(size_t(K_ + 1) * size_t(V_)) {
    const Qwen3Config& tc = target_.config();
    capacity_ = std::min<int64_t>(capacity > 0 ? capacity : tc.max_position_embeddings,
                                  tc.max_position_embeddings);
    if (proposer_) {
      FLASHMAP_CHECK(proposer_->vocab() == V_,
                     "the drafter's vocabulary ({}) is not the target's ({})", proposer_->vocab(),
                     V_);
      const auto taps = proposer_->target_layer_ids();
      taps_.assign(taps.begin(), taps.end());
      F_ = int64_t(taps_.size()) * tc.hidden_size;
      FLASHMAP_CHECK(proposer_->feature_dim() == F_,
                     "the drafter reads {} features per token, the target's taps give {}",
                     proposer_->feature_dim(), F_);
      FLASHMAP_CHECK(K_ >= 1, "the drafter's block size must be >= 1, got {}", K_);
    }
    // The verify pass's activations up front, so that a round never regrows them (regrowing
    // drops the captured graphs), and a prefill chunk's.
    target_.reserve(std::max<int64_t>(K_ + 1, kPrefillChunk), K_ + 1);
    count_lanes(max_lanes);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream());
    if (host_) cudaFreeHost(host_);
  }

  void release(std::unique_ptr<Lane> lane) {
    if (lane) pool_.push_back(std::move(lane));
  }

  const Qwen3Config& config() const override { return target_.config(); }
  int64_t max_positions() const override { return capacity_; }
  bool has_drafter() const override { return proposer_ != nullptr; }
  std::span<const int> taps() const override { return taps_; }
  std::string device() const override { return ctx_.name(); }
  int block_size() const override { return K_; }

  std::unique_ptr<Slot> open(bool drafting) override {
    ctx_.make_current();
    std::unique_ptr<Lane> lane;
    if (!pool_.empty()) {
      lane = std::move(pool_.back());
      pool_.pop_back();
      lane->kv->truncate(0);
      if (lane->draft) proposer_->reset(*lane->draft);
    } else {
      lane = new_lane();  // throws before the slot holds it: no half-built lane reaches the pool
    }
    auto s = std::make_unique<CudaSlot>();
    s->owner = this;
    s->drafting = drafting && proposer_;
    s->lane = std::move(lane);
    return s;
  }

  int max_sequences() const override { return lanes_; }

  void prefill(std::span<Slot* const> slots,
               std::span<const std::span<const int32_t>> prompts) override {
    ctx_.make_current();
    for (size_t i = 0; i < slots.size(); ++i) {
      CudaSlot& s = cu(*slots[i]);
      Lane& l = *s.lane;
      const std::span<const int32_t> prompt = prompts[i];
      // In chunks of kPrefillChunk tokens: the activations of a forward grow with its rows
      // (~80 floats per hidden unit and token at Qwen3-8B), so a long prompt in one piece would
      // need gigabytes at once; chunked, they stay bounded whatever the prompt.
      for (size_t at = 0; at < prompt.size(); at += kPrefillChunk) {
        const auto chunk = prompt.subspan(at, std::min(kPrefillChunk, prompt.size() - at));
        const bool last = at + chunk.size() == prompt.size();
        const auto out = target_.forward_host(
            *l.kv, chunk, last ? Qwen3Model::Logits::Last : Qwen3Model::Logits::None,
            s.drafting ? std::span<const int>(taps_) : std::span<const int>{}, false);
        if (last) keep_logits(l, out.logits, 1);
        // The chunk's features go to the drafter now: the next forward reuses the target's
        // feature buffer.
        if (s.drafting) proposer_->commit(*l.draft, out.features, int64_t(chunk.size()));
      }
      s.rows = 1;
    }
  }

  void verify(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    for (const SeqStep& st : steps) {
      CudaSlot& s = cu(*st.slot);
      Lane& l = *s.lane;
      const int64_t n = st.room + 1;
      // A block cut near the end runs eagerly: graphs are kept for the full block and the single
      // token, the sizes of every other round.
      const bool graph = graphs_ && (st.room == K_ || st.room == 0);
      const auto out =
          target_.forward(*l.kv, l.round.data() + 2, n, Qwen3Model::Logits::All,
                          s.drafting ? std::span<const int>(taps_) : std::span<const int>{}, graph);
      keep_logits(l, out.logits, n);
      if (s.drafting)
        check(cudaMemcpyAsync(l.features.data(), out.features, size_t(n * F_) * sizeof(float),
                              cudaMemcpyDeviceToDevice, ctx_.stream()),
              "cudaMemcpyAsync D2D (taps)");
      s.rows = n;
    }
  }

  void truncate(Slot& slot, int64_t length) override { cu(slot).lane->kv->truncate(length); }

  // The loop's logit controls and logprobs run on the host (src/engine/rounds.cpp): the rows
  // travel through pageable memory, a cost only requests that ask for them pay.
  void read_logits(Slot& slot, int64_t first, int64_t n, float* dst) override {
    ctx_.make_current();
    check(cudaMemcpyAsync(dst, cu(slot).lane->logits.data() + first * V_,
                          size_t(n * V_) * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream()),
          "cudaMemcpyAsync D2H (logits rows)");
    ctx_.sync();
  }
  void write_logits(Slot& slot, int64_t first, int64_t n, const float* src) override {
    ctx_.make_current();
    check(cudaMemcpyAsync(cu(slot).lane->logits.data() + first * V_, src,
                          size_t(n * V_) * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()),
          "cudaMemcpyAsync H2D (logits rows)");
    ctx_.sync();
  }
  void read_drafts(Slot& slot, int n, int32_t* dst) override {
    ctx_.make_current();
    check(cudaMemcpyAsync(dst, cu(slot).lane->round.data() + 3, size_t(n) * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, ctx_.stream()),
          "cudaMemcpyAsync D2H (drafts)");
    ctx_.sync();
  }

  void commit(std::span<Slot* const> slots, std::span<const int64_t> n) override {
    ctx_.make_current();
    for (size_t i = 0; i < slots.size(); ++i) {
      CudaSlot& s = cu(*slots[i]);
      if (s.drafting) proposer_->commit(*s.lane->draft, s.lane->features.data(), n[i]);
    }
  }

  void propose(std::span<const SeqStep> steps) override {
    ctx_.make_current();
    const cudaStream_t st = ctx_.stream();
    for (const SeqStep& step : steps) {
      CudaSlot& s = cu(*step.slot);
      Lane& l = *s.lane;
      SeqSampler& sm = *step.sampler;
      proposer_->draft(*l.draft, l.round.data() + 2, sm.seed, ++s.drafts, l.draft_logits.data());
      mask(l.draft_logits.data(), K_);
      int32_t* drafts = l.round.data() + 3;
      if (sm.params.greedy()) {
        argmax_rows(l.draft_logits.data(), K_, V_, drafts, st);
        check(cudaGetLastError(), "argmax_rows (draft)");
        continue;
      }
      sampler_.filtered_probs(l.draft_logits.data(), K_, sm.params, l.q.data());
      if (sm.keyed()) {
        sampler_.sample_keyed(l.q.data(), K_, sm.seed, step.position + 1, drafts);
      } else {
        bind(s, sm);
        sampler_.sample(l.q.data(), K_, drafts);
        sampler_.bind(nullptr);
      }
    }
  }

  void pick(std::span<const SeqStep> steps, std::span<int32_t> tokens) override {
    ctx_.make_current();
    grow_host(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      CudaSlot& s = cu(*steps[i].slot);
      Lane& l = *s.lane;
      SeqSampler& sm = *steps[i].sampler;
      int32_t* anchor = l.round.data() + 2;
      if (sm.keyed() || sm.params.greedy()) {
        sampler_.pick_keyed(l.logits.data(), sm.params, sm.seed, steps[i].position + 1, anchor);
      } else {
        bind(s, sm);
        sampler_.pick(l.logits.data(), sm.params, anchor);
        sampler_.bind(nullptr);
      }
      to_host(l.round.data() + 2, 1, i);
    }
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) tokens[i] = host_[i * row_];
  }

  void accept(std::span<const SeqStep> steps, std::span<Accepted> out) override {
    ctx_.make_current();
    grow_host(steps.size());
    const cudaStream_t st = ctx_.stream();
    for (size_t i = 0; i < steps.size(); ++i) {
      CudaSlot& s = cu(*steps[i].slot);
      Lane& l = *s.lane;
      SeqSampler& sm = *steps[i].sampler;
      const int room = steps[i].room;
      const int32_t* drafts = l.round.data() + 3;
      auto* result = reinterpret_cast<RoundResult*>(l.round.data());
      if (sm.params.greedy()) {
        sampler_.verify_greedy(l.logits.data(), drafts, room, result);
      } else {
        sampler_.filtered_probs(l.logits.data(), room + 1, sm.params, p_.data());
        if (sm.keyed()) {
          sampler_.verify_keyed(p_.data(), drafts, room, sm.seed, steps[i].position + 1, result);
        } else {
          bind(s, sm);
          sampler_.verify_sampled(p_.data(), l.q.data(), drafts, room, result);
          sampler_.bind(nullptr);
        }
      }
      to_host(l.round.data(), size_t(room) + 3, i);
      // The target's token is the next round's anchor, read there by the draft and the verify.
      check(cudaMemcpyAsync(l.round.data() + 2, l.round.data() + 1, sizeof(int32_t),
                            cudaMemcpyDeviceToDevice, st),
            "cudaMemcpyAsync D2D (next anchor)");
    }
    ctx_.sync();
    for (size_t i = 0; i < steps.size(); ++i) {
      const int32_t* h = host_ + i * row_;
      const int accepted = h[0];
      FLASHMAP_CHECK(accepted >= 0 && accepted <= steps[i].room && h[1] >= 0 && h[1] < V_,
                     "device acceptance returned {} drafts and token {}", accepted, h[1]);
      out[i].accepted = accepted;
      out[i].tokens.assign(h + 3, h + 3 + accepted);
      out[i].tokens.push_back(h[1]);
    }
  }

 private:
  // One sequence's buffers, all or none (a failed allocation throws and frees what it made).
  std::unique_ptr<Lane> new_lane() {
    auto lane = std::make_unique<Lane>();
    Lane& l = *lane;
    l.kv = target_.new_cache(capacity_);
    if (proposer_) l.draft = proposer_->begin(capacity_);
    l.round = DeviceBuffer<int32_t>(size_t(K_) + 3);
    l.logits = DeviceBuffer<float>(size_t(K_ + 1) * size_t(V_));
    l.features = DeviceBuffer<float>(size_t(K_ + 1) * size_t(std::max<int64_t>(F_, 1)));
    if (K_ > 0) {
      l.draft_logits = DeviceBuffer<float>(size_t(K_) * size_t(V_));
      l.q = DeviceBuffer<float>(size_t(K_) * size_t(V_));
    }
    l.rng = DeviceBuffer<uint64_t>(2);
    return lane;
  }

  // How many sequences fit: the first lane is made now (into the pool) and what it took of the
  // free device memory sets the count, less a reserve for what grows later (activations of
  // longer forwards, graphs, cuBLASLt's scratch). At most max_lanes (0: no cap of the caller's).
  void count_lanes(int max_lanes) {
    const size_t before = ctx_.free_bytes();
    auto first = new_lane();
    const size_t after = ctx_.free_bytes();
    lane_bytes_ = before > after ? before - after : 1;
    pool_.push_back(std::move(first));
    const size_t reserve = std::max<size_t>(size_t(1) << 30, after / 20);
    const size_t more = after > reserve ? (after - reserve) / lane_bytes_ : 0;
    lanes_ = int(std::min<size_t>(more + 1, size_t(max_lanes > 0 ? max_lanes : 1 << 20)));
  }

 public:
  size_t lane_bytes() const { return lane_bytes_; }

 private:
  // The sequence's own generator {seed, counter}, started at its first use.
  void bind(CudaSlot& s, const SeqSampler& sm) {
    if (!s.rng_started) {
      sampler_.init_state(s.lane->rng.data(), sm.seed);
      s.rng_started = true;
    }
    sampler_.bind(s.lane->rng.data());
  }
  // Padding ids past the tokenizer's size (flashmap::Qwen3Model::mask_padding) on every sampled
  // row.
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
  void grow_host(size_t seqs) {
    row_ = size_t(K_) + 3;
    if (seqs <= host_seqs_) return;
    ctx_.sync();
    if (host_) cudaFreeHost(host_);
    host_ = nullptr;
    check(cudaMallocHost(reinterpret_cast<void**>(&host_), seqs * row_ * sizeof(int32_t)),
          "cudaMallocHost (round results)");
    host_seqs_ = seqs;
  }
  void to_host(const int32_t* src, size_t n, size_t i) {
    check(cudaMemcpyAsync(host_ + i * row_, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          ctx_.stream()),
          "cudaMemcpyAsync D2H (round)");
  }

  Qwen3Model& target_;
  DeviceProposer* proposer_;
  bool graphs_;
  Context& ctx_;
  int64_t V_;
  int K_;
  int64_t F_ = 0;
  int64_t capacity_ = 0;
  std::vector<int> taps_;
  Sampler sampler_;
  DeviceBuffer<float> p_;  // [K + 1, V] filtered target rows
  std::vector<std::unique_ptr<Lane>> pool_;
  size_t lane_bytes_ = 0;
  int lanes_ = 1;
  int32_t* host_ = nullptr;  // pinned [sequences, K + 3]
  size_t host_seqs_ = 0, row_ = 0;
};

CudaSlot::~CudaSlot() {
  if (owner) owner->release(std::move(lane));
}

// The models a factory-made backend owns. A base class before CudaBackend, so that they are
// made before it and destroyed after it (its pooled KV caches and contexts need them).
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
    if (!draft_dir.empty() && DFlashConfig::is_dflash(draft_dir)) {
      FLASHMAP_CHECK(steps == 0, "--steps applies to FlashMap drafters; {} is a DFlash drafter",
                     draft_dir);
      ::flashmap::DFlashModel cpu_draft(draft_dir, cpu_target, nullptr,
                                        ops::WeightFormat::Unpacked);
      m->dflash =
          std::make_unique<DFlashModel>(*m->ctx, cpu_draft, m->target->embedding(),
                                        m->target->lm_head(), tc.vocab_size, tc.hidden_size);
      m->proposer = std::make_unique<DFlashDeviceProposer>(*m->dflash);
    } else if (!draft_dir.empty()) {
      ::flashmap::FlashMapModel cpu_draft(draft_dir, cpu_target, nullptr,
                                          ops::WeightFormat::Unpacked);
      m->draft =
          std::make_unique<FlashMapModel>(*m->ctx, cpu_draft, m->target->embedding(),
                                          m->target->lm_head(), tc.vocab_size, tc.hidden_size);
      m->proposer = std::make_unique<FlashMapDeviceProposer>(*m->draft, steps);
    } else {
      FLASHMAP_CHECK(steps == 0, "--steps needs a drafter (--draft)");
    }
    capacity = cap;
  }
  return std::make_unique<OwningBackend>(std::move(m), capacity, max_lanes);
}

}  // namespace flashmap::cuda
