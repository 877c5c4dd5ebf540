// The one-step noise factor L (L Lᵀ = EᵀE, FlashMapModel::noise_factor) costs V·H² multiply-adds
// (2.5 TFLOP at Qwen3-8B's 151,936 × 4096 embedding), every time a drafter loads. It depends on
// the target's embedding alone, so it is kept on disk, keyed by the embedding's bytes: a later
// load of the same target reads it (64 MB at H = 4096) instead of forming it again.
//
// Where: $FLASHMAP_CACHE_DIR, else $XDG_CACHE_HOME/flashmap, else $HOME/.cache/flashmap;
// FLASHMAP_CACHE_DIR=off (or no home) turns it off. A file that is truncated, corrupt or for
// another embedding is ignored with a warning on stderr, never used; writes go through a
// temporary file and a rename, so that a reader never sees half a file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace flashmap::noise_cache {

// The cache folder ("" when off).
std::string dir();
// XXH3-64 of the embedding's dtype, shape and bytes.
uint64_t key(const Weight& embedding);
std::string path(const std::string& dir, uint64_t key, int64_t hidden);
// L [H, H] row-major from the file for this key and shape; none when the file is missing or not
// valid (then with a warning naming the file and what is wrong).
std::optional<std::vector<float>> load(const std::string& dir, uint64_t key, int64_t hidden,
                                       int64_t vocab);
// Best effort: a failure to write is a warning, not an error (the factor is in memory).
void store(const std::string& dir, uint64_t key, int64_t hidden, int64_t vocab,
           const std::vector<float>& factor);

}  // namespace flashmap::noise_cache
