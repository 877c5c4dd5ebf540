// The CUDA backend's block proposers (what its engine::Proposer runs, src/cuda/backend.h): the
// logits of the K slots after a sequence's anchor, on the device, from the target's features of
// every committed token. The FlashMap and DFlash drafters here; a scripted one in the tests.
//
// A proposer keeps its per-sequence contexts in a table of its own, by lane: a backend adds a
// lane per sequence buffer set it makes (add_lane), resets it for each new sequence that takes
// it, names it in every call and removes it when the backend goes (so that backends made one
// after another over one proposer do not pile up contexts). A lane's device buffers keep their
// addresses for its life, so the CUDA graphs captured for it stay valid from one sequence to the
// next.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/dflash_cuda.h"
#include "cuda/flashmap_cuda.h"

namespace flashmap::cuda {

class DeviceProposer {
 public:
  virtual ~DeviceProposer() = default;
  virtual int block_size() const = 0;
  virtual int64_t vocab() const = 0;
  // The target layers whose outputs it reads, and the width of a feature row.
  virtual std::span<const int> target_layer_ids() const = 0;
  virtual int64_t feature_dim() const = 0;
  // Whether its blocks depend on noise (several draws give several candidate blocks).
  virtual bool has_noise() const { return true; }
  // A new lane, empty, for up to `capacity` committed tokens; its id (a removed lane's id may
  // come back). All or nothing: a failed one throws and leaves no lane.
  virtual int add_lane(int64_t capacity) = 0;
  // Frees a lane's context; its id may be given to a later add_lane.
  virtual void remove_lane(int lane) = 0;
  // Empties a lane for a new sequence.
  virtual void reset(int lane) = 0;
  // Appends the target's features d_features [n, feature_dim()] of the next n committed tokens.
  virtual void commit(int lane, const float* d_features, int64_t n) = 0;
  // Logits [K, V] of the block after the anchor, which it reads from d_anchor on the device;
  // (seed, counter) name the draft's noise (a new counter every draft of a sequence).
  virtual void draft(int lane, const int32_t* d_anchor, uint64_t seed, uint64_t counter,
                     float* d_logits) = 0;
};

// The FlashMap drafter with `steps` jumps (0: its num_steps; else a key of its jump_grids, or
// flashmap::Error); graphs: each draft a replayed CUDA graph (else the same kernels eagerly).
class FlashMapDeviceProposer : public DeviceProposer {
 public:
  explicit FlashMapDeviceProposer(FlashMapModel& model, int steps = 0, bool graphs = true);
  int block_size() const override { return model_.block_size(); }
  int64_t vocab() const override { return model_.vocab(); }
  std::span<const int> target_layer_ids() const override;
  int64_t feature_dim() const override { return model_.feature_dim(); }
  int add_lane(int64_t capacity) override;
  void remove_lane(int lane) override;
  void reset(int lane) override;
  void commit(int lane, const float* d_features, int64_t n) override;
  void draft(int lane, const int32_t* d_anchor, uint64_t seed, uint64_t counter,
             float* d_logits) override;
  int steps() const { return steps_; }

 private:
  FlashMapModel& model_;
  int steps_;
  bool graphs_;
  std::vector<DeviceDraftContext> lanes_;
  std::vector<int> free_;  // removed lanes' ids
};

// The DFlash drafter (cuda/dflash_cuda.h): one pass over [anchor, mask × (B − 1)] gives the
// logits of B − 1 proposals (K = B − 1). It drafts the full block every round: a round that
// verifies fewer drafts reads its first rows (the CPU backend drafts a shorter block there, as
// the reference's loop does; either way the output is the target's).
class DFlashDeviceProposer : public DeviceProposer {
 public:
  explicit DFlashDeviceProposer(DFlashModel& model) : model_(model) {}
  int block_size() const override { return model_.block_size() - 1; }
  int64_t vocab() const override { return model_.vocab(); }
  std::span<const int> target_layer_ids() const override;
  int64_t feature_dim() const override { return model_.feature_dim(); }
  bool has_noise() const override { return false; }
  int add_lane(int64_t capacity) override;
  void remove_lane(int lane) override;
  void reset(int lane) override;
  void commit(int lane, const float* d_features, int64_t n) override;
  void draft(int lane, const int32_t* d_anchor, uint64_t seed, uint64_t counter,
             float* d_logits) override;

 private:
  DFlashModel& model_;
  std::vector<DFlashDeviceContext> lanes_;
  std::vector<int> free_;  // removed lanes' ids
};

}  // namespace flashmap::cuda
