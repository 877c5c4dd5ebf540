#include "cuda/proposers.h"

#include "core/check.h"

namespace flashmap::cuda {

// --- FlashMapDeviceProposer

FlashMapDeviceProposer::FlashMapDeviceProposer(FlashMapModel& model, int steps, bool graphs,
                                               bool paged)
    : model_(model),
      steps_(steps > 0 ? steps : model.config().num_steps),
      graphs_(graphs),
      paged_(paged && model.pages()) {
  model_.grid(steps_);  // throws naming the supported step counts
}

int64_t FlashMapDeviceProposer::paged_block_bytes(int32_t block_tokens) const {
  return paged_ ? model_.paged_block_bytes(block_tokens) : 0;
}

int64_t FlashMapDeviceProposer::batch_bytes(int max_bucket) const {
  return paged_ ? model_.batch_bytes(max_bucket, steps_) : 0;
}

void FlashMapDeviceProposer::make_pool(int32_t blocks, int32_t block_tokens, int max_bucket) {
  FLASHMAP_CHECK(paged_, "make_pool: this proposer drafts per lane");
  pool_.reset();  // its graphs go first
  model_.reserve_batch(max_bucket, steps_);
  pool_ = model_.new_paged(blocks, block_tokens);
}

void FlashMapDeviceProposer::commit_paged(const float* d_features, const int32_t* d_commit,
                                          int64_t n) {
  FLASHMAP_ASSERT(pool_);
  model_.commit_paged(*pool_, d_features, d_commit, n);
}

void FlashMapDeviceProposer::copy_blocks(const int32_t* d_copies, int n) {
  FLASHMAP_ASSERT(pool_);
  model_.copy_blocks(*pool_, d_copies, n);
}

void FlashMapDeviceProposer::draft_paged(const int32_t* d_image, int bucket,
                                         const int32_t* d_anchors, const uint64_t* d_rng,
                                         float* d_logits) {
  FLASHMAP_ASSERT(pool_);
  model_.draft_batch(*pool_, d_image, bucket, d_anchors, d_rng, steps_, d_logits,
                     graphs_ ? FlashMapModel::Exec::Graph : FlashMapModel::Exec::Eager);
}

std::span<const int> FlashMapDeviceProposer::target_layer_ids() const {
  return model_.config().target_layer_ids;
}

namespace {
// The table's row for a new context (made before the table takes it: all or nothing).
template <typename Ctx>
int add_to(std::vector<Ctx>& lanes, std::vector<int>& free, Ctx ctx) {
  if (free.empty()) {
    lanes.push_back(std::move(ctx));
    return int(lanes.size()) - 1;
  }
  const int i = free.back();
  free.pop_back();
  lanes[size_t(i)] = std::move(ctx);
  return i;
}
template <typename Ctx>
void remove_from(std::vector<Ctx>& lanes, std::vector<int>& free, int lane) {
  FLASHMAP_ASSERT(lane >= 0 && size_t(lane) < lanes.size());
  lanes[size_t(lane)] = Ctx();  // its buffers (and captured drafts) go now
  free.push_back(lane);
}
}  // namespace

int FlashMapDeviceProposer::add_lane(int64_t capacity) {
  // Committed tokens + the anchor's slot.
  return add_to(lanes_, free_, model_.new_context(capacity + 1));
}

void FlashMapDeviceProposer::remove_lane(int lane) {
  remove_from(lanes_, free_, lane);
}

void FlashMapDeviceProposer::reset(int lane) {
  model_.reset(lanes_.at(size_t(lane)));
}

void FlashMapDeviceProposer::commit(int lane, const float* d_features, int64_t n) {
  model_.extend_context(lanes_.at(size_t(lane)), d_features, n);
}

void FlashMapDeviceProposer::draft(int lane, const int32_t* d_anchor, uint64_t seed,
                                   uint64_t counter, float* d_logits) {
  FlashMapModel::Noise noise;
  noise.kind = FlashMapModel::Noise::Draw;
  noise.seed = seed;
  noise.counter = counter;
  model_.draft(lanes_.at(size_t(lane)), d_anchor, steps_, noise, d_logits,
               graphs_ ? FlashMapModel::Exec::Graph : FlashMapModel::Exec::Eager);
}

// --- DFlashDeviceProposer

std::span<const int> DFlashDeviceProposer::target_layer_ids() const {
  return model_.config().target_layer_ids;
}

int DFlashDeviceProposer::add_lane(int64_t capacity) {
  return add_to(lanes_, free_, model_.new_context(capacity));
}

void DFlashDeviceProposer::remove_lane(int lane) {
  remove_from(lanes_, free_, lane);
}

void DFlashDeviceProposer::reset(int lane) {
  model_.reset(lanes_.at(size_t(lane)));
}

void DFlashDeviceProposer::commit(int lane, const float* d_features, int64_t n) {
  model_.extend_context(lanes_.at(size_t(lane)), d_features, n);
}

void DFlashDeviceProposer::draft(int lane, const int32_t* d_anchor, uint64_t, uint64_t,
                                 float* d_logits) {
  model_.draft(lanes_.at(size_t(lane)), d_anchor, d_logits);
}

void DFlashDeviceProposer::make_pool(int32_t blocks, int32_t block_tokens, int max_bucket) {
  FLASHMAP_CHECK(paged_, "make_pool: this proposer drafts per lane");
  pool_.reset();
  model_.reserve_batch(max_bucket);
  pool_ = model_.new_paged(blocks, block_tokens);
}

void DFlashDeviceProposer::commit_paged(const float* d_features, const int32_t* d_commit,
                                        int64_t n) {
  FLASHMAP_ASSERT(pool_);
  model_.commit_paged(*pool_, d_features, d_commit, n);
}

void DFlashDeviceProposer::copy_blocks(const int32_t* d_copies, int n) {
  FLASHMAP_ASSERT(pool_);
  model_.copy_blocks(*pool_, d_copies, n);
}

void DFlashDeviceProposer::draft_paged(const int32_t* d_image, int bucket, const int32_t* d_anchors,
                                       const uint64_t*, float* d_logits) {
  FLASHMAP_ASSERT(pool_);
  model_.draft_batch(*pool_, d_image, bucket, d_anchors, d_logits);
}

}  // namespace flashmap::cuda
