#include "io/hf_config.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/config_json.h"
#include "io/files.h"

namespace flashmap {

using json = nlohmann::json;

json parse_config_json(const std::string& text, const std::string& path) {
  check_json_depth(text, path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  FLASHMAP_CHECK(j.is_object(), "{}: not a JSON object", path);
  return j;
}

json read_config_json(const std::string& path) {
  return parse_config_json(read_regular_file(path, kMaxConfigFileBytes), path);
}

static json read_json(const std::string& path) {
  return read_config_json(path);
}

namespace {

// Upper bounds of the size fields, each several times the largest released model's, so that a
// config cannot ask for absurd buffers before its weights are read, and sizes computed from a few
// of them (weight shapes, caches, logits) stay far from int64 overflow.
constexpr int kMaxVocab = 1 << 22;         // 4M tokens (the largest vocabularies: ~262k)
constexpr int kMaxHidden = 1 << 16;        // hidden sizes (largest: ~25k)
constexpr int kMaxIntermediate = 1 << 18;  // MLP widths (largest dense: ~53k)
constexpr int kMaxLayers = 1024;           // (largest: ~126)
constexpr int kMaxHeads = 1024;            // attention heads (largest: 128)
constexpr int kMaxHeadDim = 1024;          // (largest: 256)
constexpr int kMaxPositions = 1 << 24;     // context length (largest: ~10M)
constexpr int kMaxSteps = 1024;            // drafter jumps (the reference's grids: 1..4)

// Reads fields of one config file with errors that name the file and the field.
struct Fields {
  const json& j;
  const std::string& path;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  // A required integer in [lo, hi].
  int integer(const char* key, int lo, int hi) const {
    FLASHMAP_CHECK(has(key), "{}: missing field '{}'", path, key);
    return integer_or(key, 0, lo, hi);
  }
  // An optional integer in [lo, hi]; `fallback` when absent or null (checked by the caller).
  int integer_or(const char* key, int fallback, int lo, int hi) const {
    if (!has(key)) return fallback;
    const auto& v = j[key];
    FLASHMAP_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", path, key,
                   v.dump());
    // Unsigned JSON numbers above INT64_MAX would wrap in get<int64_t>().
    FLASHMAP_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(hi),
                   "{}: field '{}' = {} is out of range [{}, {}]", path, key, v.dump(), lo, hi);
    const auto x = v.get<int64_t>();
    FLASHMAP_CHECK(x >= lo && x <= hi, "{}: field '{}' = {} is out of range [{}, {}]", path, key, x,
                   lo, hi);
    return int(x);
  }
  // An optional finite number > 0 (scales, epsilons, RoPE bases).
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j[key];
    FLASHMAP_CHECK(v.is_number(), "{}: field '{}' must be a number, got {}", path, key, v.dump());
    const double x = v.get<double>();
    FLASHMAP_CHECK(std::isfinite(x) && x > 0, "{}: field '{}' must be a finite number > 0, got {}",
                   path, key, v.dump());
    return x;
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    FLASHMAP_CHECK(j[key].is_boolean(), "{}: field '{}' must be true or false, got {}", path, key,
                   j[key].dump());
    return j[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    FLASHMAP_CHECK(j[key].is_string(), "{}: field '{}' must be a string, got {}", path, key,
                   j[key].dump());
    return j[key].get<std::string>();
  }
};

// Sliding-window attention is not implemented, and running a model that slides with full
// attention would silently compute something else, so such configs are refused. transformers'
// Qwen3Config makes layer i slide when use_sliding_window keeps sliding_window and
// i >= max_window_layers, unless layer_types names each layer's kind; a window at least as long
// as the context never slides.
void check_sliding_window(const Fields& f, const Qwen3Config& c) {
  const std::string& path = f.path;
  const bool use = f.boolean_or("use_sliding_window", false);
  const int window = f.integer_or("sliding_window", 0, 1, INT32_MAX);  // 0: none
  const bool slides = use && window > 0 && window < c.max_position_embeddings;
  if (f.has("layer_types")) {
    const auto& types = f.j["layer_types"];
    FLASHMAP_CHECK(types.is_array() && types.size() == size_t(c.num_hidden_layers),
                   "{}: field 'layer_types' must list the kind of each of the {} layers", path,
                   c.num_hidden_layers);
    for (size_t i = 0; i < types.size(); ++i) {
      const auto& t = types[i];
      FLASHMAP_CHECK(t.is_string() && (t == "full_attention" || t == "sliding_attention"),
                     "{}: field 'layer_types' has {} at layer {}: only \"full_attention\" is "
                     "supported",
                     path, t.dump(), i);
      FLASHMAP_CHECK(t == "full_attention" || (use && window >= c.max_position_embeddings),
                     "{}: field 'layer_types' has \"sliding_attention\" at layer {}: "
                     "sliding-window attention is not supported",
                     path, i);
    }
    return;
  }
  if (!slides) return;
  const int first = f.integer_or("max_window_layers", 28, 0, INT32_MAX);
  FLASHMAP_CHECK(first >= c.num_hidden_layers,
                 "{}: field 'use_sliding_window' is true with sliding_window {} < "
                 "max_position_embeddings {} (layers {}..{} slide): sliding-window attention is "
                 "not supported",
                 path, window, c.max_position_embeddings, first, c.num_hidden_layers - 1);
}

}  // namespace

// A Qwen3 config object (a whole config.json, or speculators' nested transformer_layer_config);
// `path` names where it is in errors.
// The quantization of a release whose weights Checkpoint reads (io/safetensors.h): Qwen's FP8
// (e4m3, 128 × 128 blocks of weight scales, activations left in full precision here) or AWQ
// (4-bit, zero points, GEMM packing); any other is refused naming it.
static std::string quantization_method(const json& q, const std::string& path) {
  FLASHMAP_CHECK(q.is_object(), "{}: field 'quantization_config' must be an object", path);
  const std::string where = path + ": quantization_config";
  Fields f{q, where};
  const std::string method = f.string_or("quant_method", "");
  if (method == "fp8") {
    FLASHMAP_CHECK(f.string_or("fmt", "e4m3") == "e4m3",
                   "{}: fmt '{}' is not supported (FP8 checkpoints of e4m3 weights are)", where,
                   f.string_or("fmt", ""));
    FLASHMAP_CHECK(f.has("weight_block_size") && q["weight_block_size"] == json::array({128, 128}),
                   "{}: weight_block_size {} is not supported (FP8 with one scale per 128 × 128 "
                   "block is)",
                   where, f.has("weight_block_size") ? q["weight_block_size"].dump() : "absent");
    return method;
  }
  if (method == "awq") {
    FLASHMAP_CHECK(f.integer_or("bits", 4, 1, 64) == 4,
                   "{}: bits {} is not supported (AWQ 4-bit is)", where,
                   f.integer_or("bits", 4, 1, 64));
    FLASHMAP_CHECK(f.boolean_or("zero_point", true),
                   "{}: zero_point false is not supported (AWQ with zero points is)", where);
    const std::string version = f.string_or("version", "gemm");
    FLASHMAP_CHECK(version == "gemm" || version == "GEMM",
                   "{}: version '{}' is not supported (AWQ's GEMM packing is)", where, version);
    return method;
  }
  throw Error(
      fmt::format("{}: quant_method '{}' is not supported (fp8 with 128 × 128 blocks and "
                  "awq 4-bit GEMM are)",
                  where, method));
}

static Qwen3Config qwen3_from_json(const json& j, const std::string& path) {
  Fields f{j, path};
  const std::string type = f.string_or("model_type", "");
  FLASHMAP_CHECK(type == "qwen3", "{}: model_type is '{}', this engine runs 'qwen3' targets", path,
                 type);
  Qwen3Config c;
  c.vocab_size = f.integer("vocab_size", 1, kMaxVocab);
  c.hidden_size = f.integer("hidden_size", 1, kMaxHidden);
  c.intermediate_size = f.integer("intermediate_size", 1, kMaxIntermediate);
  c.num_hidden_layers = f.integer("num_hidden_layers", 1, kMaxLayers);
  c.num_attention_heads = f.integer("num_attention_heads", 1, kMaxHeads);
  c.num_key_value_heads =
      f.integer_or("num_key_value_heads", c.num_attention_heads, 1, c.num_attention_heads);
  c.head_dim = f.integer_or("head_dim", c.hidden_size / c.num_attention_heads, 1, kMaxHeadDim);
  FLASHMAP_CHECK(c.head_dim >= 1 && c.head_dim <= kMaxHeadDim,
                 "{}: head_dim (hidden_size {} / num_attention_heads {}) = {} is out of range [1, "
                 "{}]; give head_dim",
                 path, c.hidden_size, c.num_attention_heads, c.head_dim, kMaxHeadDim);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 40960, 1, kMaxPositions);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.name_or_path = f.string_or("_name_or_path", "");
  if (f.has("rope_theta")) {
    c.rope_theta = f.number_or("rope_theta", 1e4);
  } else if (f.has("rope_parameters")) {
    const auto& rp = j["rope_parameters"];
    FLASHMAP_CHECK(rp.is_object(), "{}: field 'rope_parameters' must be an object", path);
    Fields r{rp, path};
    const auto rope_type = r.string_or("rope_type", "default");
    FLASHMAP_CHECK(rope_type == "default",
                   "{}: rope_parameters.rope_type '{}' is not supported (only 'default')", path,
                   rope_type);
    c.rope_theta = r.number_or("rope_theta", 1e4);
  }
  if (f.has("rope_scaling")) {
    const auto& rs = j["rope_scaling"];
    // Not rs.value("rope_type", ...): a non-string rope_type would throw json's type_error.
    const bool plain =
        rs.is_object() && (!rs.contains("rope_type") || rs["rope_type"] == "default");
    FLASHMAP_CHECK(rs.is_null() || plain, "{}: rope_scaling {} is not supported", path, rs.dump());
  }
  if (f.has("quantization_config"))
    c.quantization = quantization_method(j["quantization_config"], path);
  FLASHMAP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                 "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path,
                 c.num_attention_heads, c.num_key_value_heads);
  FLASHMAP_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", path, c.head_dim);
  check_sliding_window(f, c);
  FLASHMAP_CHECK(!c.attention_bias, "{}: attention_bias true is not supported", path);
  const std::string act = f.string_or("hidden_act", "silu");
  FLASHMAP_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (only 'silu')", path, act);
  return c;
}

Qwen3Config Qwen3Config::from_file(const std::string& path) {
  return qwen3_from_json(read_json(path), path);
}

Qwen3Config Qwen3Config::from_json_text(const std::string& text, const std::string& path) {
  return qwen3_from_json(parse_config_json(text, path), path);
}

// A list of layer indices (z-lab target_layer_ids, speculators aux_hidden_state_layer_ids).
static std::vector<int> layer_ids(const json& ids, const std::string& path, const char* field) {
  FLASHMAP_CHECK(ids.is_array() && !ids.empty() && ids.size() <= size_t(kMaxLayers),
                 "{}: field '{}' must be a list of 1 to {} layer indices", path, field, kMaxLayers);
  std::vector<int> out;
  for (auto& v : ids) {
    FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                       (v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kMaxLayers)
                                               : v.get<int64_t>() < kMaxLayers),
                   "{}: field '{}' has a bad entry {} (expected a layer index in [0, {}))", path,
                   field, v.dump(), kMaxLayers);
    out.push_back(int(v.get<int64_t>()));
  }
  return out;
}

static bool has_architecture(const json& j, const std::string& name) {
  if (!j.contains("architectures") || !j["architectures"].is_array()) return false;
  for (auto& a : j["architectures"])
    if (a == name) return true;
  return false;
}

bool DFlashConfig::is_dflash(const std::string& dir) {
  const auto path = (std::filesystem::path(dir) / "config.json").string();
  const json j = read_json(path);
  return j.contains("speculators_model_type") || j.contains("dflash_config") ||
         has_architecture(j, "DFlashDraftModel") || has_architecture(j, "DFlash2DraftModel");
}

DFlashConfig DFlashConfig::from_file(const std::string& path) {
  return from_json_text(read_regular_file(path, kMaxConfigFileBytes), path);
}

DFlashConfig DFlashConfig::from_json_text(const std::string& text, const std::string& path) {
  const json j = parse_config_json(text, path);
  Fields f{j, path};
  DFlashConfig c;
  c.path = path;
  if (f.has("speculators_model_type")) {
    // speculators/models/dflash/config.py: DFlashSpeculatorConfig.
    c.format = Format::Speculators;
    const std::string type = f.string_or("speculators_model_type", "");
    FLASHMAP_CHECK(type == "dflash",
                   "{}: field 'speculators_model_type' is \"{}\": only \"dflash\" drafters are "
                   "supported (not dflash2, dspark, eagle3, ...)",
                   path, type);
    FLASHMAP_CHECK(f.has("transformer_layer_config") && j["transformer_layer_config"].is_object(),
                   "{}: missing object field 'transformer_layer_config'", path);
    c.layers = qwen3_from_json(j["transformer_layer_config"], path + ": transformer_layer_config");
    c.block_size = f.integer_or("block_size", 8, 2, kMaxBlockSize);
    FLASHMAP_CHECK(f.has("aux_hidden_state_layer_ids"),
                   "{}: missing field 'aux_hidden_state_layer_ids'", path);
    // speculators' id i is hidden_states[i], the output of layer i - 1; 0 is the embedding.
    for (int id : layer_ids(j["aux_hidden_state_layer_ids"], path, "aux_hidden_state_layer_ids")) {
      FLASHMAP_CHECK(id >= 1,
                     "{}: field 'aux_hidden_state_layer_ids' has 0 (the embedding output), "
                     "which is not supported",
                     path);
      c.target_layer_ids.push_back(id - 1);
    }
    FLASHMAP_CHECK(f.has("mask_token_id"), "{}: missing field 'mask_token_id'", path);
    c.mask_token_id = f.integer("mask_token_id", 0, c.layers.vocab_size - 1);
    c.draft_vocab_size =
        f.integer_or("draft_vocab_size", c.layers.vocab_size, 1, c.layers.vocab_size);
    c.target_hidden_size = f.integer_or("target_hidden_size", 0, 1, kMaxHidden);
    FLASHMAP_CHECK(!f.boolean_or("sample_from_anchor", false),
                   "{}: field 'sample_from_anchor' is true (B proposals from every block row): "
                   "not supported, only the reference's default false",
                   path);
    return c;
  }
  // dflash/model.py: DFlashDraftModel (config_class Qwen3Config), fields looked up in
  // dflash_config first, then at the top level (_draft_value, :127-132).
  FLASHMAP_CHECK(!has_architecture(j, "DFlash2DraftModel"),
                 "{}: field 'architectures' names DFlash2DraftModel, a different model: only "
                 "DFlashDraftModel is supported",
                 path);
  FLASHMAP_CHECK(has_architecture(j, "DFlashDraftModel") || f.has("dflash_config"),
                 "{}: not a DFlash drafter (no 'speculators_model_type', no 'dflash_config', "
                 "'architectures' lacks DFlashDraftModel)",
                 path);
  c.format = Format::ZLab;
  c.layers = qwen3_from_json(j, path);
  const json empty = json::object();
  const json& dc = f.has("dflash_config") ? j["dflash_config"] : empty;
  FLASHMAP_CHECK(dc.is_object(), "{}: field 'dflash_config' must be an object", path);
  const std::string dc_path = path + ": dflash_config";
  Fields d{dc, dc_path};
  auto pick = [&](const char* key) -> const Fields& { return d.has(key) ? d : f; };
  c.block_size = pick("block_size").integer_or("block_size", 16, 2, kMaxBlockSize);
  FLASHMAP_CHECK(pick("mask_token_id").has("mask_token_id"),
                 "{}: missing field 'mask_token_id' (dflash_config or top level)", path);
  c.mask_token_id = pick("mask_token_id").integer("mask_token_id", 0, c.layers.vocab_size - 1);
  if (pick("target_layer_ids").has("target_layer_ids")) {
    const Fields& src = pick("target_layer_ids");
    c.target_layer_ids = layer_ids(src.j["target_layer_ids"], src.path, "target_layer_ids");
  } else {
    // build_target_layer_ids (dflash/model.py:25-34): Python's round(), which rounds halves to
    // even (std::nearbyint in the default rounding mode; std::lround would round them up).
    const int n = f.integer("num_target_layers", 1, kMaxLayers), k = c.layers.num_hidden_layers;
    if (k == 1) {
      c.target_layer_ids = {n / 2};
    } else {
      for (int i = 0; i < k; ++i)
        c.target_layer_ids.push_back(int(std::nearbyint(1.0 + i * double(n - 4) / double(k - 1))));
    }
    // Fewer than 4 target layers make the formula's later ids negative (Python would read them
    // from the end); the engine taps layers by index.
    for (int id : c.target_layer_ids)
      FLASHMAP_CHECK(id >= 0,
                     "{}: field 'num_target_layers' = {} gives the target layer id {} for {} "
                     "drafter layers (the default ids need at least 4 target layers): give "
                     "target_layer_ids",
                     path, n, id, k);
  }
  c.input_embedding_scale = pick("input_embedding_scale").number_or("input_embedding_scale", 1.0);
  c.output_multiplier = pick("output_multiplier").number_or("output_multiplier", 1.0);
  {
    const Fields& src = pick("final_logit_softcapping");
    if (src.has("final_logit_softcapping")) {
      FLASHMAP_CHECK(src.j["final_logit_softcapping"].is_number(),
                     "{}: field 'final_logit_softcapping' must be a number", src.path);
      c.final_logit_softcapping = src.j["final_logit_softcapping"].get<double>();
      FLASHMAP_CHECK(std::isfinite(c.final_logit_softcapping),
                     "{}: field 'final_logit_softcapping' must be finite", src.path);
    }
  }
  // is_causal true would make full-attention layers causal within the block (:363-367).
  FLASHMAP_CHECK(!pick("is_causal").boolean_or("is_causal", false),
                 "{}: field 'is_causal' true is not supported", path);
  c.draft_vocab_size = c.layers.vocab_size;
  return c;
}

void DFlashConfig::check_target(const Qwen3Config& t, const std::string& target_dir) const {
  const bool spec = format == Format::Speculators;
  FLASHMAP_CHECK(
      layers.vocab_size == t.vocab_size, "{}: field '{}vocab_size' is {} but the target {} has {}",
      path, spec ? "transformer_layer_config." : "", layers.vocab_size, target_dir, t.vocab_size);
  // The block is embedded by the target's embedding and read by its lm_head.
  FLASHMAP_CHECK(layers.hidden_size == t.hidden_size,
                 "{}: field '{}hidden_size' is {} but the target {} has hidden_size {}", path,
                 spec ? "transformer_layer_config." : "", layers.hidden_size, target_dir,
                 t.hidden_size);
  FLASHMAP_CHECK(target_hidden_size == 0 || target_hidden_size == t.hidden_size,
                 "{}: field 'target_hidden_size' is {} but the target {} has hidden_size {}", path,
                 target_hidden_size, target_dir, t.hidden_size);
  for (int id : target_layer_ids)
    FLASHMAP_CHECK(id < t.num_hidden_layers - 1,
                   "{}: field '{}' has {} but the target {} has {} layers (taps: outputs of "
                   "layers 0..{}; the last layer's output is normed and not supported)",
                   path, spec ? "aux_hidden_state_layer_ids" : "target_layer_ids",
                   spec ? id + 1 : id, target_dir, t.num_hidden_layers, t.num_hidden_layers - 2);
}

std::map<int, std::vector<double>> FlashMapConfig::default_jump_grids() {
  // DEFAULT_JUMP_GRIDS of configuration_flashmap.py (decoding-error schedule at V = 151936).
  return {{1, {0.0, 1.0}},
          {2, {0.0, 0.8172569274902344, 1.0}},
          {3, {0.0, 0.8010796308517456, 0.8310279846191406, 1.0}},
          {4, {0.0, 0.7906050682067871, 0.8172569274902344, 0.8379518389701843, 1.0}}};
}

FlashMapConfig FlashMapConfig::from_file(const std::string& path) {
  return from_json_text(read_regular_file(path, kMaxConfigFileBytes), path);
}

FlashMapConfig FlashMapConfig::from_json_text(const std::string& text, const std::string& path) {
  const json j = parse_config_json(text, path);
  Fields f{j, path};
  const std::string type = f.string_or("model_type", "");
  FLASHMAP_CHECK(type == "flashmap", "{}: model_type is '{}', expected 'flashmap'", path, type);
  FlashMapConfig c;
  c.target_model = f.string_or("target_model", c.target_model);
  c.target_hidden_size = f.integer_or("target_hidden_size", c.target_hidden_size, 1, kMaxHidden);
  c.vocab_size = f.integer_or("vocab_size", c.vocab_size, 1, kMaxVocab);
  if (f.has("target_layer_ids")) {
    const auto& ids = j["target_layer_ids"];
    FLASHMAP_CHECK(ids.is_array() && !ids.empty() && ids.size() <= size_t(kMaxLayers),
                   "{}: field 'target_layer_ids' must be a list of 1 to {} layer indices", path,
                   kMaxLayers);
    c.target_layer_ids.clear();
    for (auto& v : ids) {
      // Checked as JSON numbers: get<int>() would wrap 2^40 to 0.
      FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                         (v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(kMaxLayers)
                                                 : v.get<int64_t>() < kMaxLayers),
                     "{}: field 'target_layer_ids' has a bad entry {} (expected a layer index in "
                     "[0, {}))",
                     path, v.dump(), kMaxLayers);
      c.target_layer_ids.push_back(int(v.get<int64_t>()));
    }
  }
  c.block_size = f.integer_or("block_size", c.block_size, 1, kMaxBlockSize);
  c.hidden_size = f.integer_or("hidden_size", c.hidden_size, 1, kMaxHidden);
  c.num_hidden_layers = f.integer_or("num_hidden_layers", c.num_hidden_layers, 1, kMaxLayers);
  c.num_attention_heads = f.integer_or("num_attention_heads", c.num_attention_heads, 1, kMaxHeads);
  c.intermediate_size = f.integer_or("intermediate_size", c.intermediate_size, 1, kMaxIntermediate);
  c.cond_dim = f.integer_or("cond_dim", c.cond_dim, 1, kMaxHidden);
  c.time_embed_dim = f.integer_or("time_embed_dim", c.time_embed_dim, 1, kMaxHidden);
  c.time_scale = f.number_or("time_scale", c.time_scale);
  c.rope_theta = f.number_or("rope_theta", c.rope_theta);
  c.rms_norm_eps = f.number_or("rms_norm_eps", c.rms_norm_eps);
  c.qk_norm_eps = f.number_or("qk_norm_eps", c.qk_norm_eps);
  c.layer_norm_eps = f.number_or("layer_norm_eps", c.layer_norm_eps);
  c.noise_gate = f.string_or("noise_gate", c.noise_gate);
  FLASHMAP_CHECK(c.noise_gate == "jump" || c.noise_gate == "constant",
                 "{}: field 'noise_gate' must be \"jump\" or \"constant\", got \"{}\"", path,
                 c.noise_gate);
  c.time_schedule = f.string_or("time_schedule", c.time_schedule);
  c.num_steps = f.integer_or("num_steps", c.num_steps, 1, kMaxSteps);
  FLASHMAP_CHECK(c.hidden_size % c.num_attention_heads == 0 && c.head_dim() % 2 == 0,
                 "{}: hidden_size {} must split into num_attention_heads {} heads of even size",
                 path, c.hidden_size, c.num_attention_heads);
  FLASHMAP_CHECK(c.time_embed_dim % 2 == 0, "{}: field 'time_embed_dim' must be even", path);
  if (f.has("jump_grids")) {
    const auto& g = j["jump_grids"];
    FLASHMAP_CHECK(g.is_object() && !g.empty(),
                   "{}: field 'jump_grids' must be an object {{\"steps\": [times]}}", path);
    for (auto& [key, times] : g.items()) {
      int steps = 0;
      try {
        size_t used = 0;
        steps = std::stoi(key, &used);
        FLASHMAP_CHECK(used == key.size() && steps >= 1 && steps <= kMaxSteps, "");
      } catch (...) {
        throw Error(fmt::format("{}: jump_grids key '{}' is not a number of steps in [1, {}]", path,
                                key, kMaxSteps));
      }
      FLASHMAP_CHECK(times.is_array() && times.size() == size_t(steps) + 1,
                     "{}: jump_grids['{}'] must list {} times", path, key, steps + 1);
      std::vector<double> ts;
      for (auto& t : times) {
        FLASHMAP_CHECK(t.is_number(), "{}: jump_grids['{}'] has a non-number {}", path, key,
                       t.dump());
        ts.push_back(t.get<double>());
      }
      FLASHMAP_CHECK(ts.front() == 0.0 && ts.back() == 1.0,
                     "{}: jump_grids['{}'] must run from 0 to 1", path, key);
      for (size_t i = 1; i < ts.size(); ++i)
        FLASHMAP_CHECK(ts[i] > ts[i - 1], "{}: jump_grids['{}'] must increase", path, key);
      c.jump_grids[steps] = ts;
    }
  } else {
    c.jump_grids = default_jump_grids();
  }
  return c;
}

GenerationConfig GenerationConfig::from_dir(const std::string& dir) {
  GenerationConfig g;
  const auto path = (std::filesystem::path(dir) / "generation_config.json").string();
  std::error_code ec;  // a FIFO or a dangling link is present, and refused by read_json
  if (std::filesystem::symlink_status(path, ec).type() == std::filesystem::file_type::not_found)
    return g;
  return from_json_text(read_regular_file(path, kMaxConfigFileBytes), path);
}

GenerationConfig GenerationConfig::from_json_text(const std::string& text,
                                                  const std::string& path) {
  GenerationConfig g;
  const json j = parse_config_json(text, path);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    // A token id in [0, 2^31): get<int>() would wrap larger ones into other ids.
    auto id_of = [&](const json& v) {
      FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                         (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                                 : v.get<int64_t>() <= INT32_MAX),
                     "{}: field 'eos_token_id' has a bad entry {} (expected a token id)", path,
                     v.dump());
      return int(v.get<int64_t>());
    };
    if (e.is_number_integer()) {
      g.eos_token_ids.push_back(id_of(e));
    } else {
      FLASHMAP_CHECK(e.is_array(), "{}: field 'eos_token_id' must be an integer or a list", path);
      for (auto& v : e) g.eos_token_ids.push_back(id_of(v));
    }
  }
  auto number = [&](const char* key, double lo, double hi, bool lo_open) -> std::optional<double> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    FLASHMAP_CHECK(it->is_number(), "{}: field '{}' must be a number, got {}", path, key,
                   it->dump());
    const double v = it->get<double>();
    FLASHMAP_CHECK(std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi,
                   "{}: field '{}' = {} is out of range {}{}, {}]", path, key, v,
                   lo_open ? "(" : "[", lo, hi);
    return v;
  };
  // A logits processor in transformers, applied with or without do_sample.
  g.repetition_penalty = number("repetition_penalty", 0, 10, true);
  if (auto ds = j.find("do_sample"); ds != j.end() && ds->is_boolean() && !ds->get<bool>())
    return g;
  g.temperature = number("temperature", 0, 1e6, false);
  g.top_p = number("top_p", 0, 1, true);
  g.min_p = number("min_p", 0, 1, false);
  if (auto k = number("top_k", -1, double(INT32_MAX), false)) {
    FLASHMAP_CHECK(*k == std::floor(*k), "{}: field 'top_k' = {} is not an integer", path, *k);
    g.top_k = *k < 0 ? 0 : int(*k);
  }
  return g;
}

const std::vector<double>& FlashMapConfig::grid(int steps) const {
  auto it = jump_grids.find(steps);
  if (it == jump_grids.end()) {
    std::vector<int> keys;
    for (auto& [k, _] : jump_grids) keys.push_back(k);
    throw Error(fmt::format("steps must be one of {} (the drafter's jump_grids), got {}",
                            fmt::join(keys, ", "), steps));
  }
  return it->second;
}

Qwen3Config qwen3_shape(const std::string& shape) {
  Qwen3Config c;
  if (shape == "qwen3-8b") {
    // Qwen/Qwen3-8B's config.json (untied lm_head): the target the device goals are set for.
    c.vocab_size = 151936, c.hidden_size = 4096, c.intermediate_size = 12288;
    c.num_hidden_layers = 36, c.num_attention_heads = 32, c.num_key_value_heads = 8,
    c.head_dim = 128;
  } else if (shape == "qwen3-0.6b") {
    c.vocab_size = 151936, c.hidden_size = 1024, c.intermediate_size = 3072;
    c.num_hidden_layers = 28, c.num_attention_heads = 16, c.num_key_value_heads = 8,
    c.head_dim = 128;
  } else if (shape == "tiny") {
    c.vocab_size = 4096, c.hidden_size = 256, c.intermediate_size = 768;
    c.num_hidden_layers = 4, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
  } else {
    throw Error(
        fmt::format("--shape: unknown shape '{}' (known: qwen3-8b, qwen3-0.6b, tiny)", shape));
  }
  c.rope_theta = 1e6;
  return c;
}

// The drafter shapes flashmap_shape and dflash_shape know.
constexpr const char* kDraftShapes =
    "flashmap-qwen3-8b, flashmap-tiny, dflash-qwen3-8b, dflash-tiny";

FlashMapConfig flashmap_shape(const std::string& shape) {
  FlashMapConfig c;  // FlashMapConfig.__init__'s defaults are the Qwen3-8B drafter's
  if (shape == "flashmap-tiny") {
    // For --shape tiny (checks of the benchmark itself).
    c.target_model = "tiny", c.target_hidden_size = 256, c.vocab_size = 4096;
    c.target_layer_ids = {1, 2};
    c.hidden_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 4;
    c.intermediate_size = 256, c.cond_dim = 64, c.time_embed_dim = 64;
  } else {
    FLASHMAP_CHECK(shape == "flashmap-qwen3-8b", "--draft-shape: unknown shape '{}' (known: {})",
                   shape, kDraftShapes);
  }
  c.jump_grids = FlashMapConfig::default_jump_grids();
  return c;
}

bool is_dflash_shape(const std::string& shape) {
  return shape.rfind("dflash-", 0) == 0;
}

DFlashConfig dflash_shape(const std::string& shape) {
  DFlashConfig c;
  c.path = "--draft-shape " + shape;
  if (shape == "dflash-qwen3-8b") {
    // z-lab/Qwen3-8B-DFlash-b16's config.json: Qwen3-8B's layer, five of them.
    c.layers = qwen3_shape("qwen3-8b");
    c.layers.num_hidden_layers = 5;
    c.target_layer_ids = {1, 9, 17, 25, 33};
    c.mask_token_id = 151669;
  } else {
    FLASHMAP_CHECK(shape == "dflash-tiny", "--draft-shape: unknown shape '{}' (known: {})", shape,
                   kDraftShapes);
    c.layers = qwen3_shape("tiny");
    c.layers.num_hidden_layers = 2;
    c.target_layer_ids = {1, 2};
    c.mask_token_id = c.layers.vocab_size - 1;
  }
  c.block_size = 16;
  c.draft_vocab_size = c.layers.vocab_size;
  return c;
}

}  // namespace flashmap
