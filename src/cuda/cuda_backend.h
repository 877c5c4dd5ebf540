// The CUDA backend of the engine (src/engine/backend.h): the target (Qwen3Model, one KV cache per
// sequence), a block proposer on the device (the FlashMap drafter, or a scripted one in tests)
// and acceptance by the device sampler (cuda::Sampler), all on one stream. A round's tokens stay
// on the device: the proposer writes each sequence's drafts next to its anchor, the verify forward
// reads them there, and acceptance writes [accepted, token, anchor, drafts] that one device→host
// copy per sequence brings back (one synchronization per round). Each sequence's resources (KV
// cache, drafter context, logits and draft buffers, generator state) come from a pool and go
// back to it, so the CUDA graphs captured for them stay valid for the next sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/backend.h"

namespace flashmap::cuda {

class Qwen3Model;
class FlashMapModel;
class DFlashModel;

// A drafter's state for one sequence on the device.
class DeviceDraftState {
 public:
  virtual ~DeviceDraftState() = default;
};

// A block proposer on the device: the logits of the K slots after the anchor, from which the
// backend takes each slot's token as the sequence's sampler says.
class DeviceProposer {
 public:
  virtual ~DeviceProposer() = default;
  virtual int block_size() const = 0;
  virtual int64_t vocab() const = 0;
  // The target layers whose outputs it reads, and the width of a feature row.
  virtual std::span<const int> target_layer_ids() const = 0;
  virtual int64_t feature_dim() const = 0;
  // A state for up to `capacity` committed tokens; reset() empties one for a new sequence.
  virtual std::unique_ptr<DeviceDraftState> begin(int64_t capacity) = 0;
  virtual void reset(DeviceDraftState& state) = 0;
  // Appends the target's features d_features [n, feature_dim()] of the next n committed tokens.
  virtual void commit(DeviceDraftState& state, const float* d_features, int64_t n) = 0;
  // Logits [K, V] of the block after the anchor, which it reads from d_anchor on the device;
  // (seed, counter) name the draft's noise (a new counter every draft of a sequence).
  virtual void draft(DeviceDraftState& state, const int32_t* d_anchor, uint64_t seed,
                     uint64_t counter, float* d_logits) = 0;
};

// The FlashMap drafter with `steps` jumps (0: its num_steps; else a key of its jump_grids, or
// flashmap::Error); graphs: each draft a replayed CUDA graph (else the same kernels eagerly).
class FlashMapDeviceProposer : public DeviceProposer {
 public:
  explicit FlashMapDeviceProposer(FlashMapModel& model, int steps = 0, bool graphs = true);
  int block_size() const override;
  int64_t vocab() const override;
  std::span<const int> target_layer_ids() const override;
  int64_t feature_dim() const override;
  std::unique_ptr<DeviceDraftState> begin(int64_t capacity) override;
  void reset(DeviceDraftState& state) override;
  void commit(DeviceDraftState& state, const float* d_features, int64_t n) override;
  void draft(DeviceDraftState& state, const int32_t* d_anchor, uint64_t seed, uint64_t counter,
             float* d_logits) override;
  int steps() const { return steps_; }

 private:
  FlashMapModel& model_;
  int steps_;
  bool graphs_;
};

// The DFlash drafter (cuda/dflash_cuda.h): one pass over [anchor, mask × (B − 1)] gives the
// logits of B − 1 proposals (K = B − 1). It drafts the full block every round: a round that
// verifies fewer drafts reads its first rows (the CPU backend drafts a shorter block there, as the
// reference's loop does; either way the output is the target's).
class DFlashDeviceProposer : public DeviceProposer {
 public:
  explicit DFlashDeviceProposer(DFlashModel& model) : model_(model) {}
  int block_size() const override;
  int64_t vocab() const override;
  std::span<const int> target_layer_ids() const override;
  int64_t feature_dim() const override;
  std::unique_ptr<DeviceDraftState> begin(int64_t capacity) override;
  void reset(DeviceDraftState& state) override;
  void commit(DeviceDraftState& state, const float* d_features, int64_t n) override;
  void draft(DeviceDraftState& state, const int32_t* d_anchor, uint64_t seed, uint64_t counter,
             float* d_logits) override;

 private:
  DFlashModel& model_;
};

// A backend over device models made elsewhere (tests, benchmarks): they must outlive it.
// proposer may be null (target alone); capacity: positions of each sequence's KV cache (at most
// max_position_embeddings); graphs: replay CUDA graphs for the full-block verify and the
// single-token step (false: the same kernels eagerly, the same results bit for bit).
// Sequences (max_sequences()): as many as the device memory free at start holds, each with
// its full capacity, at most max_lanes (0: no cap); the first one's buffers are made here.
std::unique_ptr<engine::Backend> make_backend(Qwen3Model& target, DeviceProposer* proposer,
                                              int64_t capacity, bool graphs = true,
                                              int max_lanes = 0);

// The engine's factory: loads the folders on the host, uploads them to `device` ("cuda",
// "cuda:N") in bf16 and frees the host copies. capacity 0: the target's max_position_embeddings.
std::unique_ptr<engine::Backend> make_backend(const std::string& device,
                                              const std::string& target_dir,
                                              const std::string& draft_dir, int steps,
                                              int64_t sampled_vocab, int64_t capacity,
                                              int max_lanes = 0);

}  // namespace flashmap::cuda
