#include "models/drafter.h"

#include "core/check.h"
#include "io/hf_config.h"

namespace flashmap {

DrafterKind drafter_kind(const std::string& draft_dir, int steps) {
  if (draft_dir.empty()) {
    FLASHMAP_CHECK(steps == 0, "--steps needs a drafter (--draft)");
    return DrafterKind::None;
  }
  if (DFlashConfig::is_dflash(draft_dir)) {
    FLASHMAP_CHECK(steps == 0, "--steps applies to FlashMap drafters; {} is a DFlash drafter",
                   draft_dir);
    return DrafterKind::DFlash;
  }
  return DrafterKind::FlashMap;
}

}  // namespace flashmap
