#include "paged/draft_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "core/check.h"

namespace flashmap::paged {

namespace {
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t blocks_for(int64_t positions, int32_t block_tokens) {
  return (positions + block_tokens - 1) / block_tokens;
}

// The first of table entries [from, to) that is no block whose slots fit int32, or -1. The device
// indexes its pools with int32 slots, and a -1 there (the tables' padding) would read or write
// outside the pool.
int64_t bad_block(std::span<const int32_t> table, int64_t from, int64_t to, int32_t block_tokens) {
  for (int64_t k = from; k < to; ++k) {
    const int32_t b = table[size_t(k)];
    if (b < 0 || int64_t(b) * block_tokens > kInt32Max - block_tokens + 1) return k;
  }
  return -1;
}

int32_t slot_of(std::span<const int32_t> table, int64_t pos, int32_t block_tokens) {
  return int32_t(int64_t(table[size_t(pos / block_tokens)]) * block_tokens + pos % block_tokens);
}

// Sequence i's table entries [from, to) must be blocks whose slots fit int32.
void check_blocks(const char* who, size_t i, std::span<const int32_t> table, int64_t from,
                  int64_t to, int32_t block_tokens) {
  const int64_t bad = bad_block(table, from, to, block_tokens);
  FLASHMAP_CHECK(bad < 0,
                 "{}: sequence {} has block {} at table index {}, outside the int32 slots of "
                 "block_tokens {}",
                 who, i, table[size_t(bad)], bad, block_tokens);
}

size_t widest_table(std::span<const DraftSeq> seqs) {
  size_t stride = 1;
  for (const DraftSeq& s : seqs) stride = std::max(stride, s.table.size());
  return stride;
}
}  // namespace

StepPlan plan_draft(std::span<const DraftSeq> seqs, int K, int32_t block_tokens,
                    std::span<const int32_t> buckets) {
  const size_t stride = widest_table(seqs);
  // The draft's queries are not context: nothing is written (row_slot stays −1), and the block
  // rows are invisible (row_mask stays 0) so that each row sees the context alone.
  StepPlan p = padded_plan("plan_draft", "K", seqs.size(), K, block_tokens, stride, buckets);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftSeq& s = seqs[i];
    FLASHMAP_CHECK(s.context >= 1 && s.context <= kInt32Max - K,
                   "plan_draft: sequence {} has context {} outside [1, 2^31 - 1 - K = {}]", i,
                   s.context, kInt32Max - K);
    const int64_t blocks = blocks_for(s.context, block_tokens);
    FLASHMAP_CHECK(int64_t(s.table.size()) >= blocks,
                   "plan_draft: sequence {} has a table of {} blocks but context {} needs {}", i,
                   s.table.size(), s.context, blocks);
    check_blocks("plan_draft", i, s.table, 0, blocks, block_tokens);

    p.seq_base[i] = int32_t(s.context);
    p.seq_rows[i] = K;
    std::copy(s.table.begin(), s.table.end(), p.tables.begin() + int64_t(i * stride));
    for (int j = 0; j < K; ++j) p.row_pos[i * size_t(K) + size_t(j)] = int32_t(s.context + j);
  }
  return p;
}

StepPlan plan_block(std::span<const DraftSeq> seqs, int B, int32_t block_tokens,
                    std::span<const int32_t> buckets) {
  const size_t stride = widest_table(seqs);
  StepPlan p = padded_plan("plan_block", "B", seqs.size(), B, block_tokens, stride, buckets);
  // Every block row sees the whole block: B bits per row.
  std::vector<uint32_t> all(size_t(p.mask_words), 0);
  for (int j = 0; j < B; ++j) all[size_t(j / 32)] |= 1u << (j % 32);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftSeq& s = seqs[i];
    FLASHMAP_CHECK(s.context >= 0 && s.context <= kInt32Max - B,
                   "plan_block: sequence {} has context {} outside [0, 2^31 - 1 - B = {}]", i,
                   s.context, kInt32Max - B);
    const int64_t blocks = blocks_for(s.context + B, block_tokens);
    FLASHMAP_CHECK(int64_t(s.table.size()) >= blocks,
                   "plan_block: sequence {} has a table of {} blocks but context {} and its block "
                   "of {} need {}",
                   i, s.table.size(), s.context, B, blocks);
    check_blocks("plan_block", i, s.table, 0, blocks, block_tokens);
    p.seq_base[i] = int32_t(s.context);
    p.seq_rows[i] = B;
    std::copy(s.table.begin(), s.table.end(), p.tables.begin() + int64_t(i * stride));
    for (int j = 0; j < B; ++j) {
      const size_t r = i * size_t(B) + size_t(j);
      p.row_pos[r] = int32_t(s.context + j);
      p.row_slot[r] = slot_of(s.table, s.context + j, block_tokens);
      std::copy(all.begin(), all.end(), p.row_mask.begin() + int64_t(r * size_t(p.mask_words)));
    }
  }
  return p;
}

int32_t anchor_slot(std::span<const int32_t> table, int64_t context, int32_t block_tokens) {
  FLASHMAP_CHECK(block_tokens >= 1, "anchor_slot: block_tokens {} must be at least 1",
                 block_tokens);
  FLASHMAP_CHECK(context >= 1 && context <= kInt32Max,
                 "anchor_slot: context {} outside [1, 2^31 - 1]", context);
  const int64_t pos = context - 1, index = pos / block_tokens;
  FLASHMAP_CHECK(int64_t(table.size()) > index,
                 "anchor_slot: a table of {} blocks does not hold context {} (needs {})",
                 table.size(), context, index + 1);
  FLASHMAP_CHECK(bad_block(table, index, index + 1, block_tokens) < 0,
                 "anchor_slot: the table has block {} at table index {}, outside the int32 slots "
                 "of block_tokens {}",
                 table[size_t(index)], index, block_tokens);
  return slot_of(table, pos, block_tokens);
}

std::vector<int32_t> CommitPlan::image() const {
  FLASHMAP_ASSERT(int64_t(rows.size()) == n && int64_t(positions.size()) == n &&
                  int64_t(slots.size()) == n);
  std::vector<int32_t> img;
  img.reserve(3 * size_t(n));
  img.insert(img.end(), rows.begin(), rows.end());
  img.insert(img.end(), positions.begin(), positions.end());
  img.insert(img.end(), slots.begin(), slots.end());
  return img;
}

CommitPlan plan_commit(std::span<const CommitSeq> seqs, int32_t block_tokens,
                       int64_t feature_rows) {
  FLASHMAP_CHECK(block_tokens >= 1, "plan_commit: block_tokens {} must be at least 1",
                 block_tokens);
  FLASHMAP_CHECK(feature_rows >= 0 && feature_rows <= kInt32Max,
                 "plan_commit: feature_rows {} outside [0, 2^31 - 1]", feature_rows);
  int64_t n = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const CommitSeq& s = seqs[i];
    FLASHMAP_CHECK(s.count >= 0, "plan_commit: sequence {} has count {} below 0", i, s.count);
    if (s.rows.empty()) {
      FLASHMAP_CHECK(s.first_row >= 0 && s.first_row <= feature_rows - s.count,
                     "plan_commit: sequence {} has first_row {} + count {} outside the "
                     "feature_rows {}",
                     i, s.first_row, s.count, feature_rows);
    } else {
      FLASHMAP_CHECK(int64_t(s.rows.size()) == s.count,
                     "plan_commit: sequence {} names {} rows for count {}", i, s.rows.size(),
                     s.count);
      for (int32_t r : s.rows)
        FLASHMAP_CHECK(r >= 0 && r < feature_rows,
                       "plan_commit: sequence {} names row {} outside the feature_rows {}", i, r,
                       feature_rows);
    }
    FLASHMAP_CHECK(s.position >= 0 && s.position <= kInt32Max - s.count,
                   "plan_commit: sequence {} has position {} outside [0, 2^31 - 1 - count]", i,
                   s.position);
    // A sequence committing nothing writes nothing, so its table is not read.
    if (s.count == 0) continue;
    const int64_t blocks = blocks_for(s.position + s.count, block_tokens);
    FLASHMAP_CHECK(int64_t(s.table.size()) >= blocks,
                   "plan_commit: sequence {} has a table of {} blocks but position {} + count {} "
                   "need {}",
                   i, s.table.size(), s.position, s.count, blocks);
    check_blocks("plan_commit", i, s.table, s.position / block_tokens, blocks, block_tokens);
    n += s.count;
    FLASHMAP_CHECK(n <= kInt32Max, "plan_commit: {} rows to commit do not fit int32", n);
  }

  CommitPlan p;
  p.n = int32_t(n);
  p.rows.reserve(size_t(n));
  p.positions.reserve(size_t(n));
  p.slots.reserve(size_t(n));
  // (slot, sequence, row within it), for finding rows that write one slot.
  std::vector<std::tuple<int32_t, size_t, int>> writes;
  writes.reserve(size_t(n));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const CommitSeq& s = seqs[i];
    for (int k = 0; k < s.count; ++k) {
      const int64_t pos = s.position + k;
      p.rows.push_back(s.rows.empty() ? int32_t(s.first_row + k) : s.rows[size_t(k)]);
      p.positions.push_back(int32_t(pos));
      p.slots.push_back(slot_of(s.table, pos, block_tokens));
      writes.emplace_back(p.slots.back(), i, k);
    }
  }

  // Two rows writing one slot would race on the device and leave one sequence drafting from the
  // other's context.
  std::sort(writes.begin(), writes.end());
  for (size_t k = 1; k < writes.size(); ++k) {
    const auto [slot, a, ra] = writes[k - 1];
    const auto [next, b, rb] = writes[k];
    if (slot != next) continue;
    FLASHMAP_CHECK(a != b,
                   "plan_commit: sequence {} writes slot {} (block {}, row {}) from its rows {} "
                   "and {}: its table holds a block twice",
                   a, slot, slot / block_tokens, slot % block_tokens, ra, rb);
    throw Error(fmt::format(
        "plan_commit: sequences {} and {} both write slot {} (block {}, row {}): a block they "
        "share must be copied before either writes (BlockPool::grow)",
        a, b, slot, slot / block_tokens, slot % block_tokens));
  }
  return p;
}

std::vector<int32_t> plan_keep_path(std::span<const int32_t> table, int64_t base,
                                    std::span<const int32_t> path, int32_t block_tokens) {
  FLASHMAP_CHECK(block_tokens >= 1, "plan_keep_path: block_tokens {} must be at least 1",
                 block_tokens);
  FLASHMAP_CHECK(base >= 0, "plan_keep_path: base {} below 0", base);
  std::vector<int32_t> pairs;
  if (path.empty()) return pairs;
  for (size_t j = 0; j < path.size(); ++j)
    FLASHMAP_CHECK(path[j] >= int32_t(j) && (j == 0 || path[j] > path[j - 1]),
                   "plan_keep_path: the path's node {} at depth {} does not follow a trie's "
                   "numbering (increasing, at least its depth)",
                   path[j], j);
  const int64_t last = base + 1 + path.back();
  FLASHMAP_CHECK(last <= kInt32Max && int64_t(table.size()) > last / block_tokens,
                 "plan_keep_path: a table of {} blocks does not hold position {}", table.size(),
                 last);
  const int64_t bad = bad_block(table, 0, last / block_tokens + 1, block_tokens);
  FLASHMAP_CHECK(bad < 0, "plan_keep_path: the table has block {} at table index {}",
                 bad < 0 ? 0 : table[size_t(bad)], bad);
  for (size_t j = 0; j < path.size(); ++j) {
    if (path[j] == int32_t(j)) continue;
    pairs.push_back(slot_of(table, base + 1 + path[j], block_tokens));
    pairs.push_back(slot_of(table, base + 1 + int64_t(j), block_tokens));
  }
  return pairs;
}

}  // namespace flashmap::paged
