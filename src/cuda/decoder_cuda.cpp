#include "cuda/decoder_cuda.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/check.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/kernels.h"
#include "cuda/qwen3_cuda.h"

namespace flashmap::cuda {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

// CUDA events around the phases of a round. The commit (KV truncation is host-only; the
// drafter's extend_context runs on the device) is enqueued after the round's synchronization, so
// its device time is read after the next one: `commit_pending`.
struct DeviceDecoder::Events {
  enum { Start, Drafted, Verified, Fetched, CommitBegin, CommitEnd, Count };
  cudaEvent_t e[Count] = {};
  bool commit_pending = false;
  Events() {
    for (auto& x : e) check(cudaEventCreate(&x), "cudaEventCreate");
  }
  ~Events() {
    for (auto& x : e)
      if (x) cudaEventDestroy(x);
  }
  void record(int i, cudaStream_t s) { check(cudaEventRecord(e[i], s), "cudaEventRecord"); }
  // Milliseconds between two recorded events that have completed.
  double ms(int a, int b) const {
    float t = 0;
    check(cudaEventElapsedTime(&t, e[a], e[b]), "cudaEventElapsedTime");
    return double(t);
  }
  // The previous round's commit time, once the stream has passed it.
  double take_commit() {
    if (!commit_pending) return 0.0;
    commit_pending = false;
    return ms(CommitBegin, CommitEnd);
  }
};

// --- FlashMapDeviceDrafter ---------------------------------------------------------------------

FlashMapDeviceDrafter::FlashMapDeviceDrafter(FlashMapDevice& model, int steps, bool graphs)
    : model_(model), steps_(steps > 0 ? steps : model.config().num_steps), graphs_(graphs) {
  model_.grid(steps_);  // throws naming the supported step counts
}

FlashMapDeviceDrafter::~FlashMapDeviceDrafter() = default;

int FlashMapDeviceDrafter::block_size() const {
  return model_.block_size();
}
int64_t FlashMapDeviceDrafter::vocab() const {
  return model_.vocab();
}
std::span<const int> FlashMapDeviceDrafter::target_layer_ids() const {
  return model_.config().target_layer_ids;
}
int64_t FlashMapDeviceDrafter::feature_dim() const {
  return model_.feature_dim();
}

void FlashMapDeviceDrafter::begin(int64_t max_positions) {
  // Committed tokens + the anchor's slot.
  if (ctx_ && ctx_->capacity() >= max_positions + 1) {
    model_.reset(*ctx_);
  } else {
    ctx_.reset();  // frees the old context (and its graphs) first
    ctx_ = std::make_unique<DeviceDraftContext>(model_.new_context(max_positions + 1));
  }
}

void FlashMapDeviceDrafter::commit(const float* d_features, int64_t n) {
  FLASHMAP_ASSERT(ctx_);
  model_.extend_context(*ctx_, d_features, n);
}

void FlashMapDeviceDrafter::draft(const int32_t* d_anchor, uint64_t seed, uint64_t counter,
                                  float* d_logits) {
  FLASHMAP_ASSERT(ctx_);
  FlashMapDevice::Noise noise;
  noise.kind = FlashMapDevice::Noise::Draw;
  noise.seed = seed;
  noise.counter = counter;
  model_.draft(*ctx_, d_anchor, steps_, noise, d_logits,
               graphs_ ? FlashMapDevice::Exec::Graph : FlashMapDevice::Exec::Eager);
}

// --- DeviceDecoder ------------------------------------------------------------------------------

DeviceDecoder::DeviceDecoder(Qwen3Device& target, DeviceDrafter* drafter, bool graphs)
    : target_(target), drafter_(drafter), graphs_(graphs) {
  const Qwen3Config& tc = target_.config();
  V_ = tc.vocab_size;
  if (drafter_) {
    FLASHMAP_CHECK(drafter_->vocab() == V_,
                   "the drafter's vocabulary ({}) is not the target's ({})", drafter_->vocab(), V_);
    const auto taps = drafter_->target_layer_ids();
    taps_.assign(taps.begin(), taps.end());
    FLASHMAP_CHECK(drafter_->feature_dim() == int64_t(taps_.size()) * tc.hidden_size,
                   "the drafter reads {} features per token, the target's taps give {}",
                   drafter_->feature_dim(), int64_t(taps_.size()) * tc.hidden_size);
    K_ = drafter_->block_size();
    FLASHMAP_CHECK(K_ >= 1, "the drafter's block size must be >= 1, got {}", K_);
  }
  Context& ctx = target_.context();
  sampler_ = std::make_unique<Sampler>(ctx, V_, K_ + 1);
  events_ = std::make_unique<Events>();
  round_ = DeviceBuffer<int32_t>(size_t(K_) + 3);
  check(cudaMallocHost(reinterpret_cast<void**>(&host_round_), (size_t(K_) + 3) * sizeof(int32_t)),
        "cudaMallocHost (round result)");
  if (K_ > 0) {
    draft_logits_ = DeviceBuffer<float>(size_t(K_) * size_t(V_));
    q_ = DeviceBuffer<float>(size_t(K_) * size_t(V_));
    p_ = DeviceBuffer<float>(size_t(K_ + 1) * size_t(V_));
  }
  // The verify pass's activations up front, so that a round never regrows them (regrowing drops
  // the captured graphs).
  target_.reserve(K_ + 1, K_ + 1);
}

DeviceDecoder::~DeviceDecoder() {
  if (host_round_) cudaFreeHost(host_round_);
}

void DeviceDecoder::validate(std::span<const int32_t> prompt, const GenerateOptions& o) const {
  // flashmap::validate_request, on the device target's config.
  const Qwen3Config& tc = target_.config();
  FLASHMAP_CHECK(!prompt.empty(), "the prompt is empty: give at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    FLASHMAP_CHECK(prompt[i] >= 0 && prompt[i] < V_,
                   "prompt token {} (at index {}) is outside the vocabulary [0, {})", prompt[i], i,
                   V_);
  FLASHMAP_CHECK(o.max_new_tokens > 0, "max_new_tokens must be > 0, got {}", o.max_new_tokens);
  for (int32_t s : o.stop_ids)
    FLASHMAP_CHECK(s >= 0 && s < V_, "stop token {} is outside the vocabulary [0, {})", s, V_);
  o.sampling.validate();
  const int64_t P = int64_t(prompt.size());
  FLASHMAP_CHECK(P + o.max_new_tokens <= tc.max_position_embeddings,
                 "prompt ({} tokens) + max_new_tokens ({}) exceeds the target's context of {} "
                 "positions",
                 P, o.max_new_tokens, tc.max_position_embeddings);
  // A round verifies no draft it could not emit nor past the cache (flashmap::block_room), so
  // the cache holds at most the prompt and every generated token but the last.
  const int64_t need = P + o.max_new_tokens - 1;
  FLASHMAP_CHECK(need <= target_.max_positions(),
                 "prompt ({} tokens) + max_new_tokens ({}) - 1 = {} positions exceed the device KV "
                 "cache of {} positions",
                 P, o.max_new_tokens, need, target_.max_positions());
}

GenerateResult DeviceDecoder::generate(std::span<const int32_t> prompt,
                                       const GenerateOptions& opt) {
  validate(prompt, opt);
  const auto t_start = Clock::now();
  const SamplingParams& sp = opt.sampling;
  Context& ctx = target_.context();
  const cudaStream_t s = ctx.stream();
  Events& ev = *events_;
  ev.commit_pending = false;
  GenerateResult res;
  auto is_stop = [&](int32_t t) {
    return std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end();
  };
  // flashmap::generate's emit, unchanged: new tokens cut at a stop token and at max_new_tokens;
  // false when done.
  auto emit = [&](std::vector<int32_t> fresh) {
    bool stopped = false;
    for (size_t i = 0; i < fresh.size(); ++i)
      if (is_stop(fresh[i])) {
        fresh.resize(i + 1);
        stopped = true;
        break;
      }
    const size_t room = size_t(opt.max_new_tokens) - res.ids.size();
    std::vector<int32_t> shown(fresh.begin(), fresh.begin() + std::min(room, fresh.size()));
    res.ids.insert(res.ids.end(), shown.begin(), shown.end());
    if (opt.on_tokens && !shown.empty()) opt.on_tokens(shown);
    if (stopped && fresh.size() <= room) {
      res.finish_reason = "stop";
      return false;
    }
    if (res.ids.size() >= size_t(opt.max_new_tokens)) {
      res.finish_reason = "length";
      return false;
    }
    return true;
  };
  // Copies the first n ints of round_ to the host and waits for the stream.
  auto fetch = [&](size_t n) {
    check(
        cudaMemcpyAsync(host_round_, round_.data(), n * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync D2H (round)");
    ev.record(Events::Fetched, s);
    ctx.sync();
  };

  int32_t* d_round = round_.data();
  int32_t* d_block = d_round + 2;  // the anchor, then the K drafts
  RoundResult* d_result = reinterpret_cast<RoundResult*>(d_round);
  const int K = K_;
  const int64_t V = V_;
  const bool keyed = opt.seeded && !sp.greedy();
  // Padding ids past the tokenizer's (Qwen3Model::mask_padding), on every logits sampled from.
  const int64_t known = target_.sampled_vocab();
  auto mask = [&](const float* logits, int64_t rows) {
    if (known > 0 && known < V) {
      fill_columns(const_cast<float*>(logits), rows, V, known,
                   -std::numeric_limits<float>::infinity(), s);
      check(cudaGetLastError(), "fill_columns (padding ids)");
    }
  };

  // A fresh sequence: empty cache and context, the sampler's stream from the seed.
  target_.truncate(0);
  if (drafter_) drafter_->begin(target_.max_positions());
  sampler_->seed(opt.seed);

  // Prefill: the prompt's last logits and the drafter's features of every prompt position.
  {
    ev.record(Events::Start, s);
    const auto out = target_.forward_host(prompt, Qwen3Device::Logits::Last, taps_, false);
    ev.record(Events::Verified, s);
    mask(out.logits, 1);
    sampler_->pick_keyed(out.logits, sp, opt.seed, int64_t(prompt.size()), d_block);
    if (drafter_) drafter_->commit(out.features, int64_t(prompt.size()));
    fetch(3);
    res.times.prefill_ms = ev.ms(Events::Start, Events::Verified);
  }
  const int32_t first = host_round_[2];
  bool going = emit({first});
  if (drafter_) res.accepted_at.assign(size_t(K), 0);

  while (going) {
    ++res.rounds;
    const int64_t anchor_pos = target_.length();
    const int room = block_room(K, anchor_pos, target_.max_positions(),
                                int64_t(opt.max_new_tokens) - int64_t(res.ids.size()));
    if (room == 0) {
      // Target alone (or a drafter's round with no room: its taps still feed the drafter): one
      // token per forward pass; the pick overwrites the anchor in place (the forward has already
      // copied it into its own input buffer).
      ev.record(Events::Start, s);
      const auto out =
          target_.forward(d_block, 1, Qwen3Device::Logits::Last,
                          drafter_ ? std::span<const int>(taps_) : std::span<const int>{}, graphs_);
      ev.record(Events::Verified, s);
      mask(out.logits, 1);
      sampler_->pick_keyed(out.logits, sp, opt.seed, anchor_pos + 1, d_block);
      fetch(3);
      const auto t0 = Clock::now();
      res.times.verify_ms += ev.ms(Events::Start, Events::Verified);
      res.acceptance_lengths.push_back(1);
      going = emit({host_round_[2]});
      if (going && drafter_) drafter_->commit(out.features, 1);
      res.times.accept_ms += ev.ms(Events::Verified, Events::Fetched) + ms_since(t0);
      continue;
    }

    // Draft: K tokens after the anchor (read on the device from d_block[0]), with a fresh noise
    // counter per round; greedy takes the argmax of each slot, sampling draws from the filtered
    // q (kept for the verification), as FlashMapBlockDrafter::propose does.
    ev.record(Events::Start, s);
    drafter_->draft(d_block, opt.seed, uint64_t(res.rounds), draft_logits_.data());
    mask(draft_logits_.data(), K);
    if (sp.greedy()) {
      argmax_rows(draft_logits_.data(), K, V, d_block + 1, s);
      check(cudaGetLastError(), "argmax_rows (draft)");
    } else {
      sampler_->filtered_probs(draft_logits_.data(), K, sp, q_.data());
      if (keyed)
        sampler_->sample_keyed(q_.data(), K, opt.seed, anchor_pos + 1, d_block + 1);
      else
        sampler_->sample(q_.data(), K, d_block + 1);
    }
    ev.record(Events::Drafted, s);

    // Verify: anchor + block in one target forward (features of every row for the commit); a
    // block cut near the end runs eagerly (graphs are kept for the full size).
    const auto out =
        target_.forward(d_block, room + 1, Qwen3Device::Logits::All, taps_, graphs_ && room == K);
    ev.record(Events::Verified, s);
    mask(out.logits, room + 1);

    // Accept on the device, then the round's one copy to the host.
    if (sp.greedy()) {
      sampler_->verify_greedy(out.logits, d_block + 1, room, d_result);
    } else {
      sampler_->filtered_probs(out.logits, room + 1, sp, p_.data());
      if (keyed)
        sampler_->verify_keyed(p_.data(), d_block + 1, room, opt.seed, anchor_pos + 1, d_result);
      else
        sampler_->verify_sampled(p_.data(), q_.data(), d_block + 1, room, d_result);
    }
    fetch(size_t(K) + 3);
    const auto t0 = Clock::now();
    res.times.draft_ms += ev.ms(Events::Start, Events::Drafted);
    res.times.verify_ms += ev.ms(Events::Drafted, Events::Verified);
    res.times.accept_ms += ev.ms(Events::Verified, Events::Fetched) + ev.take_commit();

    const int accepted = host_round_[0];
    const int32_t bonus = host_round_[1];
    FLASHMAP_ASSERT(accepted >= 0 && accepted <= room && bonus >= 0 && bonus < V);
    for (int k = 0; k < accepted; ++k) ++res.accepted_at[size_t(k)];
    std::vector<int32_t> fresh(host_round_ + 3, host_round_ + 3 + accepted);
    fresh.push_back(bonus);
    size_t committed = fresh.size();
    for (size_t i = 0; i < fresh.size(); ++i)
      if (is_stop(fresh[i])) {
        committed = i + 1;
        break;
      }
    res.acceptance_lengths.push_back(int(committed));
    going = emit(fresh);
    // Keep the anchor and the accepted drafts; the bonus token is the next anchor.
    target_.truncate(anchor_pos + accepted + 1);
    if (going) {
      ev.record(Events::CommitBegin, s);
      drafter_->commit(out.features, accepted + 1);
      check(cudaMemcpyAsync(d_block, d_round + 1, sizeof(int32_t), cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync D2D (next anchor)");
      ev.record(Events::CommitEnd, s);
      ev.commit_pending = true;
    }
    res.times.accept_ms += ms_since(t0);
  }
  if (ev.commit_pending) {
    ctx.sync();
    res.times.accept_ms += ev.take_commit();
  }
  res.times.total_ms = ms_since(t_start);
  return res;
}

}  // namespace flashmap::cuda
