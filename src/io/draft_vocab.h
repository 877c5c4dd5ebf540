// speculators' reduced draft vocabulary (docs/DFLASH.md §3): d2t [draft_vocab] holds offsets,
// target id = draft id + d2t[draft id]; t2d [vocab] marks the target ids in the draft vocabulary.
#pragma once

#include <cstdint>
#include <vector>

#include "io/safetensors.h"

namespace flashmap {

// The target id of each draft id, after checking that d2t and t2d describe the same subset of
// the target vocabulary one to one: shapes [draft_vocab] and [vocab], d2t an integer tensor, t2d
// BOOL marking exactly draft_vocab ids, every mapped id in range, marked in t2d and distinct
// (speculators builds them sorted, but its loader does not require it, nor does the readout).
// Throws flashmap::Error naming the file, the tensor and the first bad entry.
std::vector<int64_t> draft_to_target_ids(const TensorView& d2t, const TensorView& t2d,
                                         int64_t draft_vocab, int64_t vocab);

}  // namespace flashmap
