// config.json and generation_config.json as every reader takes them: Qwen3 targets, FlashMap
// drafters, DFlash drafters (z-lab and speculators formats, then checked against a target),
// speculators FlashMap configs (as `flashmap convert` reads them) and generation configs. Each
// input goes through all of them: a config for one is hostile input to the others.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "io/config_json.h"
#include "io/convert.h"
#include "io/hf_config.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = "config.json";
  fuzz::expect_clean("Qwen3Config", [&] {
    const Qwen3Config c = Qwen3Config::from_json_text(text, path);
    FUZZ_REQUIRE(c.head_dim >= 1 && c.head_dim % 2 == 0 && c.num_key_value_heads >= 1 &&
                     c.num_attention_heads % c.num_key_value_heads == 0,
                 "Qwen3Config accepted an inconsistent shape");
  });
  fuzz::expect_clean("FlashMapConfig", [&] {
    const FlashMapConfig c = FlashMapConfig::from_json_text(text, path);
    FUZZ_REQUIRE(!c.jump_grids.empty() && c.block_size >= 1 && c.head_dim() >= 1,
                 "FlashMapConfig accepted an inconsistent shape");
    for (const auto& [steps, grid] : c.jump_grids) (void)c.grid(steps);
  });
  fuzz::expect_clean("DFlashConfig", [&] {
    const DFlashConfig c = DFlashConfig::from_json_text(text, path);
    for (int id : c.target_layer_ids) FUZZ_REQUIRE(id >= 0, "DFlashConfig: target layer {}", id);
    FUZZ_REQUIRE(c.mask_token_id >= 0 && c.mask_token_id < c.layers.vocab_size,
                 "DFlashConfig: mask_token_id {} outside the vocabulary", c.mask_token_id);
    Qwen3Config target = c.layers;
    target.num_hidden_layers = 36;
    fuzz::expect_clean("DFlashConfig::check_target", [&] { c.check_target(target, "target"); });
  });
  fuzz::expect_clean("GenerationConfig", [&] {
    (void)GenerationConfig::from_json_text(text, "generation_config.json");
  });
  fuzz::expect_clean("speculators FlashMap config", [&] {
    const auto j = parse_config_json(text, path);
    nlohmann::json release;
    (void)speculators_flashmap_config(j, path, &release);
    (void)release.dump();
  });
  return 0;
}
