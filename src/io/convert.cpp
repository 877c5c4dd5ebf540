#include "io/convert.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "io/config_json.h"
#include "io/draft_vocab.h"
#include "io/files.h"
#include "io/gguf_convert.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace flashmap {

namespace fs = std::filesystem;
using json = nlohmann::json;

ConvertSource parse_convert_source(const std::string& name) {
  if (name == "auto") return ConvertSource::Auto;
  if (name == "speculators") return ConvertSource::Speculators;
  if (name == "specforge") return ConvertSource::SpecForge;
  throw Error(
      fmt::format("--from: unknown source '{}' (expected auto, speculators or specforge)", name));
}

FlashMapConfig speculators_flashmap_config(const json& j, const std::string& path, json* release) {
  const auto has = [&](const json& o, const char* key) {
    return o.contains(key) && !o[key].is_null();
  };
  FLASHMAP_CHECK(j.is_object(), "{}: not a JSON object", path);
  FLASHMAP_CHECK(has(j, "transformer_layer_config") && j["transformer_layer_config"].is_object(),
                 "{}: missing object field 'transformer_layer_config'", path);
  json cfg = j["transformer_layer_config"];
  for (const char* key :
       {"architectures", "block_size", "target_layer_ids", "target_hidden_size", "target_model"})
    FLASHMAP_CHECK(!cfg.contains(key),
                   "{}: field 'transformer_layer_config.{}' belongs at the top level "
                   "(aux_hidden_state_layer_ids, block_size, target_hidden_size, "
                   "speculators_config.verifier)",
                   path, key);
  FLASHMAP_CHECK(has(j, "aux_hidden_state_layer_ids") && j["aux_hidden_state_layer_ids"].is_array(),
                 "{}: missing list field 'aux_hidden_state_layer_ids'", path);
  json ids = json::array();
  for (auto& v : j["aux_hidden_state_layer_ids"]) {
    FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 1024,
                   "{}: field 'aux_hidden_state_layer_ids' has a bad entry {} (expected a layer "
                   "id in [1, 1024]; 0 would be the embedding output)",
                   path, v.dump());
    ids.push_back(v.get<int64_t>() - 1);
  }
  cfg["architectures"] =
      has(j, "architectures") ? j["architectures"] : json::array({"FlashMapDraftModel"});
  if (has(j, "block_size")) cfg["block_size"] = j["block_size"];
  cfg["target_layer_ids"] = ids;
  if (has(j, "target_hidden_size")) cfg["target_hidden_size"] = j["target_hidden_size"];
  if (j.contains("speculators_config") && j["speculators_config"].is_object()) {
    const json& sc = j["speculators_config"];
    if (sc.contains("verifier") && sc["verifier"].is_object() &&
        has(sc["verifier"], "name_or_path"))
      cfg["target_model"] = sc["verifier"]["name_or_path"];
  }
  const FlashMapConfig c =
      FlashMapConfig::from_json_text(cfg.dump(), path + " (as a FlashMap release config)");
  if (has(j, "draft_vocab_size"))
    FLASHMAP_CHECK(j["draft_vocab_size"] == c.vocab_size,
                   "{}: field 'draft_vocab_size' is {}, not vocab_size {}: FlashMap drafters have "
                   "no reduced vocabulary",
                   path, j["draft_vocab_size"].dump(), c.vocab_size);
  if (release) *release = std::move(cfg);
  return c;
}

namespace {

json read_config(const std::string& path) {
  return read_config_json(path);
}

bool has(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

bool names_architecture(const json& j, const std::string& name) {
  if (!j.contains("architectures") || !j["architectures"].is_array()) return false;
  for (auto& a : j["architectures"])
    if (a == name) return true;
  return false;
}

// name -> shape of every tensor a drafter has, from its checked config.
using Shapes = std::map<std::string, std::vector<int64_t>>;

// dflash/model.py:550-581 (and docs/DFLASH.md §3); attention_bias is refused by the config
// parser, so there are no biases.
Shapes dflash_tensors(const DFlashConfig& c) {
  const auto& l = c.layers;
  const int64_t H = l.hidden_size, hd = l.head_dim, I = l.intermediate_size;
  const int64_t TH = c.target_hidden_size > 0 ? c.target_hidden_size : H;
  Shapes s;
  s["fc.weight"] = {H, int64_t(c.target_layer_ids.size()) * TH};
  s["hidden_norm.weight"] = {H};
  s["norm.weight"] = {H};
  for (int i = 0; i < l.num_hidden_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    s[p + "input_layernorm.weight"] = {H};
    s[p + "post_attention_layernorm.weight"] = {H};
    s[p + "self_attn.q_proj.weight"] = {l.num_attention_heads * hd, H};
    s[p + "self_attn.k_proj.weight"] = {l.num_key_value_heads * hd, H};
    s[p + "self_attn.v_proj.weight"] = {l.num_key_value_heads * hd, H};
    s[p + "self_attn.o_proj.weight"] = {H, l.num_attention_heads * hd};
    s[p + "self_attn.q_norm.weight"] = {hd};
    s[p + "self_attn.k_norm.weight"] = {hd};
    s[p + "mlp.gate_proj.weight"] = {I, H};
    s[p + "mlp.up_proj.weight"] = {I, H};
    s[p + "mlp.down_proj.weight"] = {H, I};
  }
  return s;
}

// flashmap==0.1.0 modeling_flashmap.py, as models/flashmap.cpp loads it.
Shapes flashmap_tensors(const FlashMapConfig& c) {
  const int64_t D = c.hidden_size, TH = c.target_hidden_size, hd = c.head_dim();
  const int64_t C = c.cond_dim, T = c.time_embed_dim, I = c.intermediate_size;
  Shapes s;
  auto lin = [&](const std::string& name, int64_t out, int64_t in) {
    s[name + ".weight"] = {out, in};
    s[name + ".bias"] = {out};
  };
  s["fc.weight"] = {D, int64_t(c.target_layer_ids.size()) * TH};
  s["hidden_norm.weight"] = {D};
  lin("anchor_proj", D, TH);
  s["anchor_norm.weight"] = {D};
  s["state_norm.weight"] = {TH};
  s["noise_norm.weight"] = {TH};
  s["noise_gate"] = {1};
  lin("x_embed", D, TH);
  for (const char* e : {"time_embed", "jump_embed"}) {
    lin(std::string(e) + ".linear_1", C, T);
    lin(std::string(e) + ".linear_2", C, C);
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    for (const char* a : {"self_attn_adaln", "cross_attn_adaln", "mlp_adaln"})
      lin(p + a + ".linear", 3 * D, C);
    for (const char* a : {"self_attn", "cross_attn"}) {
      for (const char* m : {".q_proj", ".k_proj", ".v_proj", ".o_proj"})
        s[p + a + m + ".weight"] = {D, D};
      s[p + a + ".q_norm.weight"] = {hd};
      s[p + a + ".k_norm.weight"] = {hd};
    }
    lin(p + "mlp.fc1", I, D);
    lin(p + "mlp.fc2", D, I);
  }
  lin("final_adaln.linear", 3 * D, C);
  lin("head", TH, D);
  return s;
}

// The tensors to copy: every one of `want`, with its shape and a float dtype. A tensor that is
// neither wanted nor in `droppable` (name -> why the release format does without it) is an
// error: converting it away silently could change the drafter.
std::vector<const TensorView*> pick_tensors(const Checkpoint& ckpt, const Shapes& want,
                                            const std::map<std::string, std::string>& droppable,
                                            const std::string& what, ConvertResult& r) {
  std::vector<const TensorView*> out;
  for (auto& [name, shape] : want) {
    FLASHMAP_CHECK(ckpt.contains(name), "{}: missing tensor '{}' (shape {} for this config)",
                   ckpt.dir(), name, shape_str(shape));
    out.push_back(&ckpt.get(name, shape));  // throws naming the file, tensor and both shapes
  }
  for (auto& name : ckpt.names()) {
    if (want.count(name)) continue;
    auto it = droppable.find(name);
    FLASHMAP_CHECK(it != droppable.end(),
                   "{}: tensor '{}' is not part of a {} drafter (another model, or a config "
                   "that does not describe these weights); nothing was written",
                   ckpt.get(name).file, name, what);
    r.dropped.push_back(fmt::format("{} ({})", name, it->second));
  }
  return out;
}

struct Target {
  std::string dir;
  Qwen3Config config;
};

// The target to check against: --target, else a speculators verifier that is a local folder.
std::optional<Target> find_target(const ConvertOptions& o, const json& j) {
  std::string dir = o.target;
  if (dir.empty() && j.contains("speculators_config") && j["speculators_config"].is_object()) {
    const json& sc = j["speculators_config"];
    if (sc.contains("verifier") && sc["verifier"].is_object() &&
        sc["verifier"].contains("name_or_path") && sc["verifier"]["name_or_path"].is_string()) {
      const auto v = sc["verifier"]["name_or_path"].get<std::string>();
      std::error_code ec;
      if (!v.empty() && fs::is_regular_file(fs::path(v) / "config.json", ec)) dir = v;
    }
  }
  if (dir.empty()) return std::nullopt;
  return Target{dir, Qwen3Config::from_file((fs::path(dir) / "config.json").string())};
}

void check_flashmap_target(const FlashMapConfig& c, const Target& t, const std::string& path,
                           const char* ids_field, int id_offset) {
  FLASHMAP_CHECK(c.vocab_size == t.config.vocab_size,
                 "{}: field 'vocab_size' is {} but the target {} has {}", path, c.vocab_size, t.dir,
                 t.config.vocab_size);
  FLASHMAP_CHECK(c.target_hidden_size == t.config.hidden_size,
                 "{}: field 'target_hidden_size' is {} but the target {} has hidden_size {}", path,
                 c.target_hidden_size, t.dir, t.config.hidden_size);
  for (int id : c.target_layer_ids)
    FLASHMAP_CHECK(id < t.config.num_hidden_layers - 1,
                   "{}: field '{}' has {} but the target {} has {} layers (taps: outputs of "
                   "layers 0..{})",
                   path, ids_field, id + id_offset, t.dir, t.config.num_hidden_layers,
                   t.config.num_hidden_layers - 2 + id_offset);
}

struct Output {
  json config;
  std::vector<const TensorView*> tensors;
};

// speculators DFlash -> z-lab release.
Output from_speculators_dflash(const ConvertOptions& o, const json& j, const std::string& path,
                               const Checkpoint& ckpt, ConvertResult& r) {
  const DFlashConfig c = DFlashConfig::from_file(path);  // every field checked, ids - 1
  const auto target = find_target(o, j);
  if (target) {
    c.check_target(target->config, target->dir);
    r.target = target->dir;
  }
  const auto& l = c.layers;
  // The z-lab format has no field for it: fc reads features of the drafter's hidden size.
  FLASHMAP_CHECK(c.target_hidden_size == 0 || c.target_hidden_size == l.hidden_size,
                 "{}: field 'target_hidden_size' is {}, not transformer_layer_config.hidden_size "
                 "{}: the z-lab format has no field for a target of another width",
                 path, c.target_hidden_size, l.hidden_size);
  std::map<std::string, std::string> droppable = {
      {"embed_tokens.weight", "the target's embedding, never used from the file"},
      {"verifier_lm_head.weight", "training only"},
      {"verifier_norm.weight", "training only"},
  };
  if (c.reduced_vocab()) {
    // Checked even though the folder is refused: a broken map is worth knowing about either way.
    const int64_t DV = c.draft_vocab_size, V = l.vocab_size;
    for (const char* name : {"d2t", "t2d", "lm_head.weight"})
      FLASHMAP_CHECK(ckpt.contains(name),
                     "{}: missing tensor '{}' (draft_vocab_size {} < vocab_size {} needs d2t, "
                     "t2d and lm_head.weight)",
                     ckpt.dir(), name, DV, V);
    ckpt.get("lm_head.weight", {DV, l.hidden_size});
    draft_to_target_ids(ckpt.get("d2t"), ckpt.get("t2d"), DV, V);
    throw Error(fmt::format(
        "{}: field 'draft_vocab_size' is {} < vocab_size {}: a reduced vocabulary (own lm_head, "
        "d2t/t2d) cannot be expressed in the z-lab release format, which reads out through the "
        "target's full lm_head; the engine runs speculators folders directly (--draft {})",
        path, DV, V, o.in));
  }
  // Full vocabulary: speculators ignores d2t/t2d (load_vocab_mappings) and replaces lm_head by
  // the verifier's (load_verifier_weights, overwrite_lm_head), so the release format loses nothing.
  droppable["lm_head.weight"] = "full vocabulary: the reference uses the target's lm_head";
  droppable["d2t"] = droppable["t2d"] = "full vocabulary: ignored by the reference";
  Output out;
  out.tensors = pick_tensors(ckpt, dflash_tensors(c), droppable, "DFlash", r);

  json cfg = j["transformer_layer_config"];
  for (const char* key : {"architectures", "auto_map", "dflash_config", "block_size",
                          "num_target_layers", "target_layer_ids", "mask_token_id"})
    FLASHMAP_CHECK(!cfg.contains(key),
                   "{}: field 'transformer_layer_config.{}' is not a Qwen3 layer field (the "
                   "converter writes it from the top level)",
                   path, key);
  if (!cfg.contains("dtype") && j.contains("dtype")) cfg["dtype"] = j["dtype"];
  cfg["architectures"] = json::array({"DFlashDraftModel"});
  cfg["block_size"] = c.block_size;
  cfg["dflash_config"] = {{"mask_token_id", c.mask_token_id},
                          {"target_layer_ids", c.target_layer_ids}};
  if (target) cfg["num_target_layers"] = target->config.num_hidden_layers;
  out.config = std::move(cfg);
  return out;
}

// speculators-style FlashMap (our definition, docs/DFLASH.md "Conversion") -> FlashMap release.
Output from_speculators_flashmap(const ConvertOptions& o, const json& j, const std::string& path,
                                 const Checkpoint& ckpt, ConvertResult& r) {
  json cfg;
  const FlashMapConfig c = speculators_flashmap_config(j, path, &cfg);
  if (const auto target = find_target(o, j)) {
    check_flashmap_target(c, *target, path, "aux_hidden_state_layer_ids", 1);
    r.target = target->dir;
  }
  Output out;
  out.tensors = pick_tensors(ckpt, flashmap_tensors(c), {}, "FlashMap", r);
  out.config = std::move(cfg);
  return out;
}

// A SpecForge DFlash export: the z-lab layout already (specforge/modeling/draft/dflash.py).
Output from_specforge_dflash(const ConvertOptions& o, json j, const std::string& path,
                             const Checkpoint& ckpt, ConvertResult& r) {
  if (has(j, "dflash_config")) {
    FLASHMAP_CHECK(j["dflash_config"].is_object(), "{}: field 'dflash_config' must be an object",
                   path);
    json& dc = j["dflash_config"];
    if (has(dc, "projector_type")) {
      FLASHMAP_CHECK(dc["projector_type"] == "dflash",
                     "{}: field 'dflash_config.projector_type' is {}: a Domino/DSpark drafter "
                     "(its own logit heads), not DFlash",
                     path, dc["projector_type"].dump());
      dc.erase("projector_type");  // SpecForge's default; z-lab has no such field
    }
    if (has(dc, "shift_label")) {
      FLASHMAP_CHECK(dc["shift_label"] == false,
                     "{}: field 'dflash_config.shift_label' is {}: block rows trained on shifted "
                     "labels mean other tokens than DFlash's",
                     path, dc["shift_label"].dump());
      dc.erase("shift_label");
    }
    if (has(dc, "pure_draft_prefix_len")) {
      FLASHMAP_CHECK(dc["pure_draft_prefix_len"] == 0,
                     "{}: field 'dflash_config.pure_draft_prefix_len' is {}: a Domino setting, "
                     "not DFlash",
                     path, dc["pure_draft_prefix_len"].dump());
      dc.erase("pure_draft_prefix_len");
    }
  }
  FLASHMAP_CHECK(names_architecture(j, "DFlashDraftModel"),
                 "{}: field 'architectures' is {}: expected [\"DFlashDraftModel\"] (SpecForge's "
                 "Domino/DSpark drafters are other models)",
                 path, j.contains("architectures") ? j["architectures"].dump() : "missing");
  const DFlashConfig c = DFlashConfig::from_file(path);
  if (const auto target = find_target(o, j)) {
    c.check_target(target->config, target->dir);
    r.target = target->dir;
  }
  Output out;
  out.tensors = pick_tensors(ckpt, dflash_tensors(c), {}, "DFlash", r);
  out.config = std::move(j);
  return out;
}

// By analogy with its DFlash export, a SpecForge FlashMap export is the release layout.
Output from_specforge_flashmap(const ConvertOptions& o, const json& j, const std::string& path,
                               const Checkpoint& ckpt, ConvertResult& r) {
  const FlashMapConfig c = FlashMapConfig::from_file(path);
  if (const auto target = find_target(o, j)) {
    check_flashmap_target(c, *target, path, "target_layer_ids", 0);
    r.target = target->dir;
  }
  Output out;
  out.tensors = pick_tensors(ckpt, flashmap_tensors(c), {}, "FlashMap", r);
  out.config = j;
  return out;
}

// Writes `fill`'s files into a new folder beside `dir` and renames it into place; an existing
// `dir` (allowed by the caller) is swapped out atomically where the kernel can, then removed.
void write_folder(const fs::path& dir, const std::function<void(const std::string&)>& fill) {
  std::string tmpl = dir.string() + ".tmp-XXXXXX";
  FLASHMAP_CHECK(::mkdtemp(tmpl.data()) != nullptr, "{}: cannot create a folder beside it ({})",
                 dir.string(), std::strerror(errno));
  const fs::path tmp = tmpl;
  try {
    fill(tmp.string());
    std::error_code ec;
    if (fs::symlink_status(dir, ec).type() == fs::file_type::not_found) {
      fs::rename(tmp, dir);
      return;
    }
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp);  // now the old folder
      return;
    }
#endif
    // No atomic exchange on this file system: move the old folder aside first.
    std::string old = dir.string() + ".old-XXXXXX";
    FLASHMAP_CHECK(::mkdtemp(old.data()) != nullptr, "{}: cannot create a folder beside it ({})",
                   dir.string(), std::strerror(errno));
    fs::remove(old);
    fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error(fmt::format("{}: {}", dir.string(), e.what()));
  } catch (const Error& e) {
    // A full disk or a file size limit while writing: the folder beside it goes, OUT stays.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error(fmt::format("{}: nothing was written: {}", dir.string(), e.what()));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

void write_folder(const fs::path& dir, const Output& out) {
  write_folder(dir, [&](const std::string& tmp) {
    write_text_file((fs::path(tmp) / "config.json").string(), out.config.dump(2) + "\n");
    write_safetensors((fs::path(tmp) / "model.safetensors").string(), out.tensors,
                      {{"format", "pt"}});
  });
}

// OUT as a folder name, checked: where it goes exists, and replacing it (with `force`) would not
// delete IN.
fs::path checked_output(const std::string& in, const std::string& out_name, bool force) {
  std::error_code ec;
  // "OUT/" names OUT; mkdtemp and rename need the name without the slash.
  fs::path out = fs::path(out_name).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  FLASHMAP_CHECK(!out.empty() && out.filename() != "." && out.filename() != "..",
                 "{}: not a usable output folder name", out_name);
  const auto in_abs = fs::weakly_canonical(fs::absolute(in), ec);
  const auto out_abs = fs::weakly_canonical(fs::absolute(out), ec);
  const auto st = fs::symlink_status(out, ec).type();
  if (st != fs::file_type::not_found) {
    FLASHMAP_CHECK(!fs::equivalent(in, out, ec), "{}: IN and OUT are the same folder", out_name);
    FLASHMAP_CHECK(st == fs::file_type::directory,
                   "{}: exists and is not a folder; not replaced (even with --force)", out_name);
    FLASHMAP_CHECK(force, "{}: exists; pass --force to replace it", out_name);
    // Replacing OUT would delete IN with it.
    const auto rel = in_abs.lexically_relative(out_abs);
    FLASHMAP_CHECK(rel.empty() || *rel.begin() == "..", "{}: holds IN ({}); not replaced", out_name,
                   in);
  }
  const auto parent = out_abs.parent_path();
  FLASHMAP_CHECK(fs::is_directory(parent, ec), "{}: the folder it goes in ({}) does not exist",
                 out_name, parent.string());
  return out;
}

}  // namespace

void write_output_folder(const std::string& in, const std::string& out, bool force,
                         const std::function<void(const std::string&)>& fill) {
  write_folder(checked_output(in, out, force), fill);
}

ConvertResult convert_checkpoint(const ConvertOptions& o) {
  FLASHMAP_CHECK(!o.in.empty() && !o.out.empty(), "convert needs IN and OUT");
  std::error_code ec;
  if (fs::is_regular_file(o.in, ec) && is_gguf_file(o.in)) {
    FLASHMAP_CHECK(o.from == ConvertSource::Auto,
                   "{}: a GGUF file converts with --from auto (the default)", o.in);
    const GgufConvertResult g =
        convert_gguf(o.in, o.out, o.force, o.link ? GgufTensors::Link : GgufTensors::Copy);
    ConvertResult r;
    r.source = "gguf";
    r.kind = "Qwen3";
    r.tensors = g.tensors;
    r.dequantized = g.dequantized;
    r.tokenizer = g.tokenizer;
    r.chat_template = g.chat_template;
    return r;
  }
  FLASHMAP_CHECK(fs::is_directory(o.in, ec), "{}: not a folder (nor a GGUF file)", o.in);
  FLASHMAP_CHECK(!o.link, "{}: --link is for a GGUF target; a drafter folder is copied", o.in);
  const fs::path out = checked_output(o.in, o.out, o.force);  // before anything is read

  const std::string path = (fs::path(o.in) / "config.json").string();
  json j = read_config(path);
  ConvertSource from = o.from;
  const bool speculators = j.contains("speculators_model_type");
  const bool flashmap_release = j.contains("model_type") && j["model_type"] == "flashmap";
  const bool dflash_release = j.contains("dflash_config") ||
                              names_architecture(j, "DFlashDraftModel") ||
                              names_architecture(j, "DFlash2DraftModel");
  if (from == ConvertSource::Auto) {
    FLASHMAP_CHECK(speculators || flashmap_release || dflash_release,
                   "{}: not a DFlash or FlashMap drafter (no 'speculators_model_type', no "
                   "'dflash_config', 'model_type' not \"flashmap\")",
                   path);
    FLASHMAP_CHECK(speculators,
                   "{}: already in the {} release format, nothing to convert (a SpecForge "
                   "export has this layout too: --from specforge checks it and copies it)",
                   path, flashmap_release ? "FlashMap" : "z-lab DFlash");
    from = ConvertSource::Speculators;
  }
  ConvertResult r;
  Output result;
  if (from == ConvertSource::Speculators) {
    FLASHMAP_CHECK(speculators,
                   "{}: no field 'speculators_model_type': not a speculators checkpoint", path);
    FLASHMAP_CHECK(j["speculators_model_type"].is_string(),
                   "{}: field 'speculators_model_type' must be a string, got {}", path,
                   j["speculators_model_type"].dump());
    const auto type = j["speculators_model_type"].get<std::string>();
    r.source = "speculators";
    if (type == "dflash") {
      r.kind = "DFlash";
      const Checkpoint ckpt(o.in);
      result = from_speculators_dflash(o, j, path, ckpt, r);
      r.tensors = result.tensors.size();
      write_folder(out, result);
    } else if (type == "flashmap") {
      r.kind = "FlashMap";
      const Checkpoint ckpt(o.in);
      result = from_speculators_flashmap(o, j, path, ckpt, r);
      r.tensors = result.tensors.size();
      write_folder(out, result);
    } else {
      throw Error(
          fmt::format("{}: field 'speculators_model_type' is \"{}\": only \"dflash\" and "
                      "\"flashmap\" (this project's layout) convert (not eagle3, dflash2, "
                      "dspark, ...)",
                      path, type));
    }
  } else {
    FLASHMAP_CHECK(!speculators,
                   "{}: has 'speculators_model_type': a speculators checkpoint, use --from "
                   "speculators",
                   path);
    r.source = "specforge";
    const Checkpoint ckpt(o.in);
    if (flashmap_release) {
      r.kind = "FlashMap";
      result = from_specforge_flashmap(o, j, path, ckpt, r);
    } else {
      FLASHMAP_CHECK(dflash_release,
                     "{}: not a SpecForge DFlash export (no 'dflash_config', 'architectures' "
                     "lacks DFlashDraftModel) nor a FlashMap drafter",
                     path);
      r.kind = "DFlash";
      result = from_specforge_dflash(o, j, path, ckpt, r);
    }
    r.tensors = result.tensors.size();
    write_folder(out, result);
  }
  return r;
}

}  // namespace flashmap
