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
#include <memory>
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

  // Batched drafting over the target's paged KV blocks (a proposer that returns true from
  // paged()): every sequence's context lives in one pool addressed by the target's block tables
  // (no lanes), commits of many sequences are one pass, and a round's drafts are one pass. The
  // backend makes the pool beside its KV cache, with the same number of blocks.
  virtual bool paged() const { return false; }
  // 0: a draft's queries follow the anchor and read the context only (paged::plan_draft, the
  // context its committed tokens and the anchor). B > 0: a draft is a block of B rows from the
  // anchor on, written to the pool at those positions (paged::plan_block, the context its
  // committed tokens): the tables must hold B positions past the committed ones.
  virtual int paged_block() const { return 0; }
  // Bytes of a pool block; of the batch buffers for up to max_bucket sequences.
  virtual int64_t paged_block_bytes(int32_t /*block_tokens*/) const { return 0; }
  virtual int64_t batch_bytes(int /*max_bucket*/) const { return 0; }
  // The pool (replacing any earlier one) and the batch buffers; drop_pool frees the pool (its
  // backend goes).
  virtual void make_pool(int32_t /*blocks*/, int32_t /*block_tokens*/, int /*max_bucket*/) {}
  virtual void drop_pool() {}
  // The rows of d_features that a paged::CommitPlan image d_commit (n rows) names enter the pool.
  virtual void commit_paged(const float* /*d_features*/, const int32_t* /*d_commit*/,
                            int64_t /*n*/) {}
  // paged::BlockPool's copies-on-write (device (src, dst, tokens) triples) in the pool, run with
  // the target's before the step that writes the copied blocks.
  virtual void copy_blocks(const int32_t* /*d_copies*/, int /*n*/) {}
  // Logits [bucket·K, V] of every sequence of a paged::plan_draft image: anchors d_anchors
  // [bucket], noise (seed, counter) pairs d_rng [2·bucket].
  virtual void draft_paged(const int32_t* /*d_image*/, int /*bucket*/, const int32_t* /*d_anchors*/,
                           const uint64_t* /*d_rng*/, float* /*d_logits*/) {}
};

// The FlashMap drafter with `steps` jumps (0: its num_steps; else a key of its jump_grids, or
// flashmap::Error); graphs: each draft a replayed CUDA graph (else the same kernels eagerly);
// paged: batched drafts over a pool of the target's blocks where the drafter's heads allow it
// (FlashMapModel::pages), else a context slab per lane.
class FlashMapDeviceProposer : public DeviceProposer {
 public:
  explicit FlashMapDeviceProposer(FlashMapModel& model, int steps = 0, bool graphs = true,
                                  bool paged = true);
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

  bool paged() const override { return paged_; }
  int64_t paged_block_bytes(int32_t block_tokens) const override;
  int64_t batch_bytes(int max_bucket) const override;
  void make_pool(int32_t blocks, int32_t block_tokens, int max_bucket) override;
  void drop_pool() override { pool_.reset(); }
  void commit_paged(const float* d_features, const int32_t* d_commit, int64_t n) override;
  void copy_blocks(const int32_t* d_copies, int n) override;
  void draft_paged(const int32_t* d_image, int bucket, const int32_t* d_anchors,
                   const uint64_t* d_rng, float* d_logits) override;

 private:
  FlashMapModel& model_;
  int steps_;
  bool graphs_;
  bool paged_;
  std::unique_ptr<PagedFlashMapContext> pool_;
  std::vector<FlashMapDeviceContext> lanes_;
  std::vector<int> free_;  // removed lanes' ids
};

// The DFlash drafter (cuda/dflash_cuda.h): one pass over [anchor, mask × (B − 1)] gives the
// logits of B − 1 proposals (K = B − 1). It drafts the full block every round: a round that
// verifies fewer drafts reads its first rows (the CPU backend drafts a shorter block there, as
// the reference's loop does; either way the output is the target's).
class DFlashDeviceProposer : public DeviceProposer {
 public:
  // paged: batched drafts over a pool of the target's blocks where the drafter's heads allow it
  // (DFlashModel::pages), else a context slab per lane.
  explicit DFlashDeviceProposer(DFlashModel& model, bool paged = true)
      : model_(model), paged_(paged && model.pages()) {}
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

  bool paged() const override { return paged_; }
  int paged_block() const override { return model_.block_size(); }
  int64_t paged_block_bytes(int32_t block_tokens) const override {
    return paged_ ? model_.paged_block_bytes(block_tokens) : 0;
  }
  int64_t batch_bytes(int max_bucket) const override {
    return paged_ ? model_.batch_bytes(max_bucket) : 0;
  }
  void make_pool(int32_t blocks, int32_t block_tokens, int max_bucket) override;
  void drop_pool() override { pool_.reset(); }
  void commit_paged(const float* d_features, const int32_t* d_commit, int64_t n) override;
  void copy_blocks(const int32_t* d_copies, int n) override;
  void draft_paged(const int32_t* d_image, int bucket, const int32_t* d_anchors,
                   const uint64_t* d_rng, float* d_logits) override;

 private:
  DFlashModel& model_;
  bool paged_;
  std::unique_ptr<PagedDFlashContext> pool_;
  std::vector<DFlashDeviceContext> lanes_;
  std::vector<int> free_;  // removed lanes' ids
};

}  // namespace flashmap::cuda
