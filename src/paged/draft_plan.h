// The host-side layouts of the drafter's two steps over a paged cache whose block tables the
// target and the drafter share.
//
// The drafter keeps its context (the cross-attention keys and values it derives from the target's
// features) in a pool of its own, with the target's block geometry: position p's context lives at
// the same slot as the target's key of position p, table[p / block_tokens] * block_tokens +
// p % block_tokens. So one table per sequence serves both caches and the drafter needs no
// bookkeeping of its own; a block that BlockPool copies on write must be copied in both pools.
//
// plan_draft lays out a batched draft (K query rows per sequence reading the context through the
// tables) as a StepPlan, so that the device's step reader serves it unchanged. plan_commit lists
// the rows of a target forward whose features enter the context: after a verify only the accepted
// rows, after a prefill chunk all of them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "paged/step_plan.h"

namespace flashmap::paged {

struct DraftSeq {
  std::span<const int32_t> table;  // its block table (covers at least `context` positions)
  // Positions the draft attends to. plan_draft: the committed tokens and the anchor (>= 1), the
  // anchor at position context - 1. plan_block: the committed tokens (the block follows them).
  int64_t context = 0;
};

// Sequence i's K query rows are [i * K, i * K + K), row j at RoPE position context + j. Every row
// attends to exactly the `context` cached positions and to none of the step's rows: seq_base =
// context, seq_rows = K, row_mask all 0. The draft's queries are not context, so no row writes the
// cache (row_slot -1 everywhere). R = K; table_stride, the tables' -1 padding, batch and bucket as
// plan_step lays them out; padding sequences have base 0, rows 0 and row_pos 0.
// Throws flashmap::Error naming the sequence and parameter: K < 1, block_tokens < 1, no sequences
// or more than the largest bucket, context < 1 or context + K beyond int32, a table shorter than
// the context's blocks or holding a negative (or int32-overflowing) block among them.
StepPlan plan_draft(std::span<const DraftSeq> seqs, int K, int32_t block_tokens,
                    std::span<const int32_t> buckets);

// A batched draft whose block rows are positions of the context (the DFlash drafter: [anchor,
// mask × (B − 1)] at positions context … context + B − 1, each row attending to the whole context
// and the whole block, its keys written to the drafter's pool and overwritten by later commits):
// sequence i's B rows [i * B, i * B + B) at RoPE positions context + j, written to the slots of
// those positions (the table must hold context + B positions), row_mask all B bits, seq_base =
// context, seq_rows = B, R = B. Padding and validation as plan_draft (context >= 0 here).
StepPlan plan_block(std::span<const DraftSeq> seqs, int B, int32_t block_tokens,
                    std::span<const int32_t> buckets);

// The slot that the anchor's context (position context - 1) is written to, through the table.
// Throws on context < 1, block_tokens < 1, or a table that does not hold that position.
int32_t anchor_slot(std::span<const int32_t> table, int64_t context, int32_t block_tokens);

struct CommitSeq {
  std::span<const int32_t> table;  // after the target's truncate: covers position + count
  int64_t first_row = 0;           // its first row in the forward's feature output
  int64_t position = 0;            // the position of that row's token
  int count = 0;                   // rows to commit (0: none)
  // Empty: the rows are first_row, first_row + 1, …; else row k is rows[k] (count of them): a
  // draft tree's anchor and accepted path, wherever their rows sat in the forward.
  std::span<const int32_t> rows = {};
};

// The committed rows, compacted: entry k takes feature row rows[k], rotates it at RoPE position
// positions[k] and stores the result at pool slot slots[k].
struct CommitPlan {
  int32_t n = 0;                                // the sum of the counts
  std::vector<int32_t> rows, positions, slots;  // [n] each
  // rows, positions, slots back to back (3n int32), for one upload.
  std::vector<int32_t> image() const;
};

// Sequence by sequence, each sequence's rows in order: row first_row + k at position
// position + k. Throws flashmap::Error naming the sequence and parameter: count < 0, first_row < 0
// or first_row + count beyond feature_rows, position < 0, a table that does not hold positions
// [position, position + count) or holds a negative block there, two rows writing one slot (a block
// shared without a copy, or a table holding a block twice), or values beyond int32.
CommitPlan plan_commit(std::span<const CommitSeq> seqs, int32_t block_tokens, int64_t feature_rows);

// A draft tree's accepted path kept as a block (what the CPU's KV cache keep_rows does): node
// path[j] (tree row path[j] + 1, cached at position base + 1 + path[j]) moves to position
// base + 1 + j. Returns the (source slot, destination slot) pairs, through the table, of the
// nodes that move (path[j] != j), in path order, the order they must be applied in: pair j may
// overwrite a slot that an earlier pair reads (path[j'] = j for some j' < j), never one that a
// later pair reads (path[j] >= j > every earlier destination's depth).
// Throws flashmap::Error naming the parameter: a path not strictly increasing from >= 0, or a
// table that does not hold position base + 1 + path.back().
std::vector<int32_t> plan_keep_path(std::span<const int32_t> table, int64_t base,
                                    std::span<const int32_t> path, int32_t block_tokens);

}  // namespace flashmap::paged
