// `flashmap convert`: drafter checkpoints of training tools to the release formats this engine
// and the reference packages load (docs/DFLASH.md, "Conversion"), and Qwen3 GGUF targets to
// Hugging Face folders (io/gguf_convert.h).
//
//   speculators DFlash (speculators_model_type "dflash", full vocabulary)
//       -> z-lab DFlash release (dflash==0.1.0 DFlashDraftModel): the drafter's Qwen3 config with
//          dflash_config {mask_token_id, target_layer_ids = aux_hidden_state_layer_ids - 1}.
//   speculators FlashMap (speculators_model_type "flashmap": this project's definition, no
//       published layout) -> FlashMap release (flashmap==0.1.0 FlashMapDraftModel).
//   SpecForge DFlash export (already the z-lab layout) and SpecForge FlashMap (by analogy, the
//       FlashMap release layout) -> checked and copied.
//
// Tensors are copied byte for byte (any dtype), so conversion is lossless. Nothing is written
// unless every check passes; OUT is written to a temporary folder beside it and renamed into
// place, and an existing OUT is replaced only with `force`.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace flashmap {

enum class ConvertSource { Auto, Speculators, SpecForge };

struct ConvertOptions {
  std::string in, out;
  ConvertSource from = ConvertSource::Auto;
  // Target folder to check the drafter against (vocabulary, hidden size, tapped layers) and to
  // take num_target_layers from; empty: speculators' verifier name_or_path when that is a local
  // folder, else unchecked.
  std::string target;
  bool force = false;
  // A GGUF target: OUT links to the file (model.gguf) instead of holding its tensors.
  bool link = false;
};

struct ConvertResult {
  std::string source;                // "speculators" or "specforge"
  std::string kind;                  // "DFlash" or "FlashMap"
  std::string target;                // the target checked against; empty when none was found
  size_t tensors = 0;                // tensors copied
  std::vector<std::string> dropped;  // "name (why)" for tensors the release format has no use for
  // A GGUF target (io/gguf_convert.h): tensors dequantized to F32, and what its metadata gave.
  std::vector<std::string> dequantized;
  bool tokenizer = false, chat_template = false;
};

// "auto", "speculators", "specforge"; flashmap::Error otherwise.
ConvertSource parse_convert_source(const std::string& name);

// A speculators FlashMap config.json (speculators_model_type "flashmap") read as the FlashMap
// release config it converts to, every field checked; `release`, when given, gets that config's
// JSON. Throws flashmap::Error naming `path` and the field.
FlashMapConfig speculators_flashmap_config(const nlohmann::json& j, const std::string& path,
                                           nlohmann::json* release = nullptr);

// Writes the folder `out` whole or not at all: `fill` writes its files into a new folder beside
// it, which then takes its place. `out` is checked first: the folder it goes in exists, and an
// existing `out` is replaced only with `force` and only when that would not delete `in`.
void write_output_folder(const std::string& in, const std::string& out, bool force,
                         const std::function<void(const std::string&)>& fill);

// Converts o.in (a drafter folder, or a Qwen3 GGUF file: io/gguf_convert.h) to o.out; throws
// flashmap::Error naming the file and the field or tensor at fault (OUT is left as it was).
ConvertResult convert_checkpoint(const ConvertOptions& o);

}  // namespace flashmap
