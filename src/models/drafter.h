// Which kind of drafter a folder holds, decided once for every backend, with the options whose
// meaning depends on the kind checked here (the CPU and CUDA loaders both call this).
#pragma once

#include <string>

namespace flashmap {

enum class DrafterKind { None, FlashMap, DFlash };

// draft_dir empty: none. steps (FlashMap jumps; 0: the drafter's num_steps) must be 0 without a
// drafter and with a DFlash one; throws flashmap::Error naming the option.
DrafterKind drafter_kind(const std::string& draft_dir, int steps);

}  // namespace flashmap
