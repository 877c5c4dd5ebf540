// Lossless speculative decoding on the device: the round loop of flashmap::generate
// (src/spec/decoder.cpp, the specification) with the target (Qwen3Device), the drafter
// (FlashMapDevice) and the sampler (cuda::Sampler) on one GPU stream. A round enqueues the draft
// of K tokens after the anchor, the verify forward of anchor + block and the acceptance (greedy
// or rejection sampling), then copies one small struct to the host — the accepted count, the
// token after them and the drafted tokens — and synchronizes once. The host then commits: it
// truncates the target's KV cache to the anchor and the accepted drafts and extends the
// drafter's context with their features; the next anchor (the bonus token) never leaves the
// device. Without a drafter it decodes with the target alone, one token per forward.
//
//   Qwen3Device target(ctx, cpu_target);
//   FlashMapDevice fm(ctx, cpu_drafter, target.embedding(), target.lm_head(), V, H);
//   FlashMapDeviceDrafter drafter(fm, steps);
//   GenerateResult r = DeviceDecoder(target, &drafter).generate(prompt, options);
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/device.h"
#include "cuda/sampling.h"
#include "spec/decoder.h"

namespace flashmap::cuda {

class Qwen3Device;
class FlashMapDevice;
class DeviceDraftContext;

// What the round loop needs of a drafter on the device (flashmap::Drafter of src/spec/drafter.h,
// on device pointers): the logits of a block, from which the loop takes each slot's argmax
// (greedy) or a draw from its filtered distribution q, as FlashMapBlockDrafter::propose does.
class DeviceDrafter {
 public:
  virtual ~DeviceDrafter() = default;
  virtual int block_size() const = 0;
  virtual int64_t vocab() const = 0;
  // The target layers whose outputs it reads, and the width of a feature row.
  virtual std::span<const int> target_layer_ids() const = 0;
  virtual int64_t feature_dim() const = 0;
  // Starts a sequence: an empty context for up to `max_positions` committed tokens.
  virtual void begin(int64_t max_positions) = 0;
  // Appends the target's features d_features [n, feature_dim()] of the next n committed tokens.
  virtual void commit(const float* d_features, int64_t n) = 0;
  // Logits [K, V] of the block after the anchor, which it reads from d_anchor on the device.
  // (seed, counter) name the draft's noise; the loop passes a new counter every round.
  virtual void draft(const int32_t* d_anchor, uint64_t seed, uint64_t counter, float* d_logits) = 0;
};

// FlashMapBlockDrafter on the device: the FlashMap drafter with `steps` jumps (0: its
// num_steps; else a key of its jump_grids, or flashmap::Error), noise drawn on the device.
// graphs: each draft is a replayed CUDA graph (else the same kernels eagerly).
class FlashMapDeviceDrafter : public DeviceDrafter {
 public:
  explicit FlashMapDeviceDrafter(FlashMapDevice& model, int steps = 0, bool graphs = true);
  ~FlashMapDeviceDrafter() override;
  int block_size() const override;
  int64_t vocab() const override;
  std::span<const int> target_layer_ids() const override;
  int64_t feature_dim() const override;
  void begin(int64_t max_positions) override;
  void commit(const float* d_features, int64_t n) override;
  void draft(const int32_t* d_anchor, uint64_t seed, uint64_t counter, float* d_logits) override;
  int steps() const { return steps_; }

 private:
  FlashMapDevice& model_;
  int steps_;
  bool graphs_;
  // Kept across sequences (reset, not reallocated) so that its captured drafts stay valid.
  std::unique_ptr<DeviceDraftContext> ctx_;
};

class DeviceDecoder {
 public:
  // `drafter` may be null (target alone); it must draft for this target (same vocabulary, its
  // feature rows the target's taps). graphs: replay CUDA graphs for the target's fixed-size
  // forwards (verify of K + 1 tokens, the target-alone decode step); false runs the same kernels
  // eagerly (the same results bit for bit).
  DeviceDecoder(Qwen3Device& target, DeviceDrafter* drafter, bool graphs = true);
  ~DeviceDecoder();
  DeviceDecoder(const DeviceDecoder&) = delete;
  DeviceDecoder& operator=(const DeviceDecoder&) = delete;

  // Checks what flashmap::validate_request checks, and that the device KV cache holds the
  // longest verify pass (prompt + max_new_tokens − 1 + K positions); flashmap::Error otherwise.
  void validate(std::span<const int32_t> prompt, const GenerateOptions& options) const;

  // flashmap::generate on the device: the same options (seed: the sampler's uniforms and the
  // drafter's noise), the same result (ids, acceptance lengths, accepted_at, rounds,
  // finish_reason, phase times). The target's KV cache and the drafter's context restart empty.
  // Phase times come from CUDA events around each phase's device work (accept also counts the
  // host's bookkeeping); prefill is the prompt's forward.
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& options);

  int block_size() const { return K_; }
  Sampler& sampler() { return *sampler_; }

 private:
  struct Events;

  Qwen3Device& target_;
  DeviceDrafter* drafter_;
  int K_ = 0;
  bool graphs_ = true;
  int64_t V_ = 0;
  std::vector<int> taps_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Events> events_;
  // [accepted, token, anchor, draft_1 … draft_K]: the verify result followed by the verify
  // block, so one copy brings a round to the host and the block is the forward's input.
  DeviceBuffer<int32_t> round_;
  int32_t* host_round_ = nullptr;             // pinned mirror of round_
  DeviceBuffer<float> draft_logits_, q_, p_;  // [K, V], [K, V], [K + 1, V]
};

}  // namespace flashmap::cuda
