// One batched decoding step's inputs for a paged KV cache, as flat arrays for one upload.
//
// A step runs one target forward over B sequences, each with R row slots (1 for a plain decode,
// K + 1 for an anchor and K drafts, 1 + nodes for a draft tree). Sequence i's rows are
// [i * R, i * R + R); a sequence with fewer rows leaves padding rows. B is padded up to a bucket,
// so that a CUDA graph captured for the bucket replays for every batch size in it; padding
// sequences have 0 rows. The step's rows (its "block rows") are written to the cache at positions
// base .. base + rows - 1 in row order, and each row attends to all `base` cached positions plus
// the block rows its mask names.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashmap::paged {

struct StepSeq {
  std::span<const int32_t> table;  // its block table (after BlockPool::grow to base + rows)
  int64_t base = 0;                // positions already in its cache (keys every row sees)
  int rows = 0;                    // 1 <= rows <= R
  // Empty: a chain (row r sees block rows 0..r, RoPE position base + r). Else a tree: parents[r]
  // is row r's parent row (parents[0] == -1 for the anchor; 0 <= parents[r] < r otherwise), row r
  // sees its ancestors-or-self among the block rows, and its RoPE position is base + depth(r)
  // (depth(0) = 0). Either way row r is stored at cache position base + r.
  std::span<const int32_t> parents;
};

struct StepPlan {
  int32_t batch = 0, bucket = 0, R = 0, mask_words = 0;  // mask_words = ceil(R / 32)
  int32_t table_stride = 0;  // the longest table among the sequences (at least 1)
  int32_t block_tokens = 0;
  std::vector<int32_t> row_pos;   // [bucket*R] RoPE position; padding rows 0
  std::vector<int32_t> row_slot;  // [bucket*R] physical KV slot the row writes: table[p / bt] * bt
                                  // + p % bt for p = base + r; -1 for padding rows (no write)
  std::vector<int32_t> seq_base;  // [bucket] base (0 for padding sequences)
  std::vector<int32_t> seq_rows;  // [bucket] rows (0 for padding)
  // [bucket*R*mask_words] bit j of row r (word j / 32, bit j % 32): row r sees block row j;
  // padding rows all 0.
  std::vector<uint32_t> row_mask;
  std::vector<int32_t> tables;  // [bucket*table_stride] the tables, each padded with -1

  // The image's header: the scalar fields, as int32 at these indices.
  enum Header : int32_t {
    kBatch,
    kBucket,
    kR,
    kMaskWords,
    kTableStride,
    kBlockTokens,
    kHeaderFields
  };
  // Where each array starts in image(), in int32 elements (each a multiple of 16: 64 bytes), and
  // the image's length. The tables come last, so every offset depends only on bucket and R: a
  // graph captured for a bucket finds the arrays at fixed addresses although table_stride (and
  // so `total`) changes from step to step.
  struct Offsets {
    int64_t row_pos, row_slot, seq_base, seq_rows, row_mask, tables, total;
  };
  Offsets offsets() const;
  // One contiguous int32 image of all of the above, for a single host-to-device copy: the header,
  // then each array at its offset (row_mask's words bit-cast); the gaps between are 0.
  std::vector<int32_t> image() const;
};

// Validates the sequences (rows in [1, R], parents well-formed, tables long enough for
// base + rows, no two rows of the step writing the same KV slot) and lays out the step for the
// smallest bucket that holds them. Throws flashmap::Error naming the sequence and parameter.
StepPlan plan_step(std::span<const StepSeq> seqs, int R, int32_t block_tokens,
                   std::span<const int32_t> buckets);

// What every plan starts from (plan_step, plan_draft, plan_block): `batch` sequences padded to
// their bucket, R rows each, tables table_stride entries wide, every array at its padding value
// (row_slot and tables −1, the rest 0). `who` names the caller and `rows` its row count in the
// errors: R or block_tokens below 1, no sequences or more than the largest bucket, sizes past
// int32.
StepPlan padded_plan(const char* who, const char* rows, size_t batch, int R, int32_t block_tokens,
                     size_t table_stride, std::span<const int32_t> buckets);

// The smallest bucket >= batch from an ascending list; throws when batch exceeds the largest.
int32_t bucket_for(int32_t batch, std::span<const int32_t> buckets);

// The default buckets for up to max_batch sequences: 1, 2, 4, 8, then multiples of 8 up to 32,
// of 16 up to 128, of 32 beyond, ending at max_batch itself: the steps widen with the batch, so
// that the padding stays a modest fraction of a batch while the graphs to capture stay few.
std::vector<int32_t> default_buckets(int32_t max_batch);

}  // namespace flashmap::paged
