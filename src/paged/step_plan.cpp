#include "paged/step_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <utility>

#include "core/check.h"

namespace flashmap::paged {

namespace {
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kAlign = 64 / sizeof(int32_t);
int64_t align_up(int64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

StepPlan::Offsets StepPlan::offsets() const {
  const int64_t rows = int64_t(bucket) * R;
  Offsets o{};
  o.row_pos = align_up(kHeaderFields);
  o.row_slot = align_up(o.row_pos + rows);
  o.seq_base = align_up(o.row_slot + rows);
  o.seq_rows = align_up(o.seq_base + bucket);
  o.row_mask = align_up(o.seq_rows + bucket);
  o.tables = align_up(o.row_mask + rows * mask_words);
  o.total = o.tables + int64_t(bucket) * table_stride;
  return o;
}

std::vector<int32_t> StepPlan::image() const {
  const int64_t rows = int64_t(bucket) * R;
  FLASHMAP_ASSERT(int64_t(row_pos.size()) == rows && int64_t(row_slot.size()) == rows &&
                  int64_t(seq_base.size()) == bucket && int64_t(seq_rows.size()) == bucket &&
                  int64_t(row_mask.size()) == rows * mask_words &&
                  int64_t(tables.size()) == int64_t(bucket) * table_stride);
  const Offsets o = offsets();
  std::vector<int32_t> img(size_t(o.total), 0);
  img[kBatch] = batch;
  img[kBucket] = bucket;
  img[kR] = R;
  img[kMaskWords] = mask_words;
  img[kTableStride] = table_stride;
  img[kBlockTokens] = block_tokens;
  std::copy(row_pos.begin(), row_pos.end(), img.begin() + o.row_pos);
  std::copy(row_slot.begin(), row_slot.end(), img.begin() + o.row_slot);
  std::copy(seq_base.begin(), seq_base.end(), img.begin() + o.seq_base);
  std::copy(seq_rows.begin(), seq_rows.end(), img.begin() + o.seq_rows);
  std::transform(row_mask.begin(), row_mask.end(), img.begin() + o.row_mask,
                 [](uint32_t w) { return std::bit_cast<int32_t>(w); });
  std::copy(tables.begin(), tables.end(), img.begin() + o.tables);
  return img;
}

int32_t bucket_for(int32_t batch, std::span<const int32_t> buckets) {
  FLASHMAP_CHECK(!buckets.empty(), "bucket_for: the bucket list is empty");
  for (size_t i = 0; i < buckets.size(); ++i)
    FLASHMAP_CHECK(buckets[i] >= 1 && (i == 0 || buckets[i] > buckets[i - 1]),
                   "bucket_for: buckets must be positive and ascending, but bucket {} at index {} "
                   "is not",
                   buckets[i], i);
  FLASHMAP_CHECK(batch >= 1, "bucket_for: batch {} must be at least 1", batch);
  FLASHMAP_CHECK(batch <= buckets.back(), "bucket_for: batch {} exceeds the largest bucket {}",
                 batch, buckets.back());
  return *std::lower_bound(buckets.begin(), buckets.end(), batch);
}

std::vector<int32_t> default_buckets(int32_t max_batch) {
  FLASHMAP_CHECK(max_batch >= 1, "default_buckets: max_batch {} must be at least 1", max_batch);
  std::vector<int32_t> out;
  for (int64_t b = 1; b < max_batch;) {
    out.push_back(int32_t(b));
    b = b < 8 ? 2 * b : b < 32 ? b + 8 : b < 128 ? b + 16 : b + 32;
  }
  out.push_back(max_batch);
  return out;
}

StepPlan padded_plan(const char* who, const char* rows, size_t batch, int R, int32_t block_tokens,
                     size_t table_stride, std::span<const int32_t> buckets) {
  FLASHMAP_CHECK(R >= 1, "{}: {} {} must be at least 1", who, rows, R);
  FLASHMAP_CHECK(block_tokens >= 1, "{}: block_tokens {} must be at least 1", who, block_tokens);
  FLASHMAP_CHECK(batch > 0, "{}: no sequences", who);
  FLASHMAP_CHECK(int64_t(batch) <= kInt32Max, "{}: {} sequences are too many", who, batch);
  StepPlan p;
  p.batch = int32_t(batch);
  p.bucket = bucket_for(p.batch, buckets);
  FLASHMAP_CHECK(int64_t(p.bucket) * R <= kInt32Max,
                 "{}: bucket {} x {} {} rows do not fit int32 row indices", who, p.bucket, rows, R);
  p.R = R;
  p.mask_words = (R + 31) / 32;
  p.block_tokens = block_tokens;
  FLASHMAP_CHECK(int64_t(table_stride) * p.bucket <= kInt32Max,
                 "{}: tables of {} blocks for {} sequences are too large", who, table_stride,
                 p.bucket);
  p.table_stride = int32_t(table_stride);
  const size_t n = size_t(p.bucket) * size_t(R);
  p.row_pos.assign(n, 0);
  p.row_slot.assign(n, -1);
  p.seq_base.assign(size_t(p.bucket), 0);
  p.seq_rows.assign(size_t(p.bucket), 0);
  p.row_mask.assign(n * size_t(p.mask_words), 0);
  p.tables.assign(size_t(p.bucket) * table_stride, -1);
  return p;
}

StepPlan plan_step(std::span<const StepSeq> seqs, int R, int32_t block_tokens,
                   std::span<const int32_t> buckets) {
  size_t stride = 1;
  for (const StepSeq& s : seqs) stride = std::max(stride, s.table.size());
  StepPlan p = padded_plan("plan_step", "R", seqs.size(), R, block_tokens, stride, buckets);
  const size_t rows = p.row_pos.size(), words = size_t(p.mask_words);

  std::vector<int32_t> depth(static_cast<size_t>(R));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSeq& s = seqs[i];
    FLASHMAP_CHECK(s.rows >= 1 && s.rows <= R,
                   "plan_step: sequence {} has rows {} outside [1, R = {}]", i, s.rows, R);
    FLASHMAP_CHECK(s.base >= 0 && s.base <= kInt32Max - s.rows,
                   "plan_step: sequence {} has base {} outside [0, 2^31 - 1 - rows]", i, s.base);
    const int64_t blocks = (s.base + s.rows + block_tokens - 1) / block_tokens;
    FLASHMAP_CHECK(int64_t(s.table.size()) >= blocks,
                   "plan_step: sequence {} has a table of {} blocks but base {} + rows {} need {} "
                   "(grow it first)",
                   i, s.table.size(), s.base, s.rows, blocks);
    for (size_t k = 0; k < s.table.size(); ++k)
      FLASHMAP_CHECK(
          s.table[k] >= 0 && int64_t(s.table[k]) * block_tokens <= kInt32Max - block_tokens + 1,
          "plan_step: sequence {} has block {} at table index {}, outside the int32 "
          "slots of block_tokens {}",
          i, s.table[k], k, block_tokens);
    const bool tree = !s.parents.empty();
    FLASHMAP_CHECK(!tree || int64_t(s.parents.size()) == s.rows,
                   "plan_step: sequence {} has {} parents for {} rows (empty for a chain)", i,
                   s.parents.size(), s.rows);
    if (tree) {
      FLASHMAP_CHECK(s.parents[0] == -1, "plan_step: sequence {} has parents[0] = {}, not -1", i,
                     s.parents[0]);
      for (int r = 1; r < s.rows; ++r)
        FLASHMAP_CHECK(s.parents[size_t(r)] >= 0 && s.parents[size_t(r)] < r,
                       "plan_step: sequence {} has parents[{}] = {} outside [0, {})", i, r,
                       s.parents[size_t(r)], r);
    }

    p.seq_base[i] = int32_t(s.base);
    p.seq_rows[i] = s.rows;
    std::copy(s.table.begin(), s.table.end(), p.tables.begin() + int64_t(i * stride));
    // A chain is the tree whose row r hangs below row r - 1: one rule for both.
    for (int r = 0; r < s.rows; ++r) {
      const size_t row = i * size_t(R) + size_t(r);
      const int parent = tree ? s.parents[size_t(r)] : r - 1;
      uint32_t* mask = &p.row_mask[row * words];
      if (parent >= 0) {
        depth[size_t(r)] = depth[size_t(parent)] + 1;
        const uint32_t* up = &p.row_mask[(row - size_t(r - parent)) * words];
        std::copy(up, up + words, mask);
      } else {
        depth[size_t(r)] = 0;
      }
      mask[size_t(r) / 32] |= uint32_t(1) << (r % 32);
      const int64_t pos = s.base + r;
      p.row_pos[row] = int32_t(s.base + depth[size_t(r)]);
      p.row_slot[row] =
          int32_t(int64_t(s.table[size_t(pos / block_tokens)]) * block_tokens + pos % block_tokens);
    }
  }

  // Two rows writing one slot would race on the device and leave one sequence reading the
  // other's keys: a shared block that was not copied before the write, or a table holding a block
  // twice.
  std::vector<std::pair<int32_t, int32_t>> writes;  // (slot, row)
  writes.reserve(rows);
  for (size_t row = 0; row < rows; ++row)
    if (p.row_slot[row] >= 0) writes.emplace_back(p.row_slot[row], int32_t(row));
  std::sort(writes.begin(), writes.end());
  for (size_t k = 1; k < writes.size(); ++k) {
    if (writes[k].first != writes[k - 1].first) continue;
    const int32_t slot = writes[k].first;
    const int32_t a = writes[k - 1].second / R, b = writes[k].second / R;
    FLASHMAP_CHECK(a != b,
                   "plan_step: sequence {} writes KV slot {} (block {}, row {}) from rows {} and "
                   "{}: its table holds a block twice",
                   a, slot, slot / block_tokens, slot % block_tokens, writes[k - 1].second % R,
                   writes[k].second % R);
    throw Error(fmt::format(
        "plan_step: sequences {} and {} both write KV slot {} (block {}, row {}): a block they "
        "share must be copied before either writes (BlockPool::grow)",
        a, b, slot, slot / block_tokens, slot % block_tokens));
  }
  return p;
}

}  // namespace flashmap::paged
