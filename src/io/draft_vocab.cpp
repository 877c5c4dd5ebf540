#include "io/draft_vocab.h"

#include "core/check.h"

namespace flashmap {

std::vector<int64_t> draft_to_target_ids(const TensorView& d2t, const TensorView& t2d,
                                         int64_t draft_vocab, int64_t vocab) {
  FLASHMAP_CHECK(d2t.shape == std::vector<int64_t>{draft_vocab},
                 "{}: tensor 'd2t' has shape {}, expected [draft_vocab_size {}]", d2t.file,
                 shape_str(d2t.shape), draft_vocab);
  FLASHMAP_CHECK(t2d.shape == std::vector<int64_t>{vocab},
                 "{}: tensor 't2d' has shape {}, expected [vocab_size {}]", t2d.file,
                 shape_str(t2d.shape), vocab);
  FLASHMAP_CHECK(d2t.dtype == DType::I64 || d2t.dtype == DType::I32,
                 "{}: tensor 'd2t' has dtype {}, expected I64", d2t.file, dtype_name(d2t.dtype));
  FLASHMAP_CHECK(t2d.dtype == DType::Bool, "{}: tensor 't2d' has dtype {}, expected BOOL", t2d.file,
                 dtype_name(t2d.dtype));
  const auto offsets = d2t.to_i64();
  const auto* marked = static_cast<const uint8_t*>(t2d.data);
  int64_t count = 0;
  for (int64_t t = 0; t < vocab; ++t) count += marked[t] != 0;
  FLASHMAP_CHECK(count == draft_vocab,
                 "{}: tensor 't2d' marks {} target ids, but draft_vocab_size is {}", t2d.file,
                 count, draft_vocab);
  // draft id of each target id, -1 while unmapped: finds a second draft id mapped to it.
  std::vector<int64_t> from(static_cast<size_t>(vocab), -1), ids;
  ids.reserve(static_cast<size_t>(draft_vocab));
  for (int64_t j = 0; j < draft_vocab; ++j) {
    const int64_t off = offsets[size_t(j)];
    // Checked before adding: a hostile offset near INT64_MAX would overflow.
    FLASHMAP_CHECK(off >= -j && off < vocab - j,
                   "{}: tensor 'd2t' maps draft id {} to target id {} + {}, outside [0, {})",
                   d2t.file, j, j, off, vocab);
    const int64_t t = j + off;
    FLASHMAP_CHECK(marked[t],
                   "{}: tensor 'd2t' maps draft id {} to target id {}, which 't2d' "
                   "does not mark",
                   d2t.file, j, t);
    FLASHMAP_CHECK(from[size_t(t)] < 0,
                   "{}: tensor 'd2t' maps draft ids {} and {} to the same target id {} (the "
                   "draft vocabulary must be a subset of the target's, one to one)",
                   d2t.file, from[size_t(t)], j, t);
    from[size_t(t)] = j;
    ids.push_back(t);
  }
  return ids;
}

}  // namespace flashmap
