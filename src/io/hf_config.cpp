#include "io/hf_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace flashmap {

using json = nlohmann::json;

static json read_json(const std::string& path) {
  std::ifstream in(path);
  FLASHMAP_CHECK(in.good(), "{}: cannot open", path);
  try {
    json j = json::parse(in);
    FLASHMAP_CHECK(j.is_object(), "{}: not a JSON object", path);
    return j;
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

namespace {

// Reads fields of one config file with errors that name the file and the field.
struct Fields {
  const json& j;
  const std::string& path;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  int integer(const char* key, int lo = 1) const {
    FLASHMAP_CHECK(has(key), "{}: missing field '{}'", path, key);
    return integer_or(key, 0, lo);
  }
  int integer_or(const char* key, int fallback, int lo = 1) const {
    if (!has(key)) return fallback;
    const auto& v = j[key];
    FLASHMAP_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", path, key,
                   v.dump());
    const auto x = v.get<int64_t>();
    FLASHMAP_CHECK(x >= lo && x <= (int64_t(1) << 31) - 1, "{}: field '{}' = {} is out of range",
                   path, key, x);
    return int(x);
  }
  double number_or(const char* key, double fallback, bool positive = true) const {
    if (!has(key)) return fallback;
    const auto& v = j[key];
    FLASHMAP_CHECK(v.is_number(), "{}: field '{}' must be a number, got {}", path, key, v.dump());
    const double x = v.get<double>();
    FLASHMAP_CHECK(!positive || x > 0, "{}: field '{}' must be positive, got {}", path, key, x);
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

}  // namespace

Qwen3Config Qwen3Config::from_file(const std::string& path) {
  const json j = read_json(path);
  Fields f{j, path};
  const std::string type = f.string_or("model_type", "");
  FLASHMAP_CHECK(type == "qwen3", "{}: model_type is '{}', this engine runs 'qwen3' targets", path,
                 type);
  Qwen3Config c;
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.integer_or("head_dim", c.hidden_size / c.num_attention_heads);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 40960);
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
    FLASHMAP_CHECK(
        rs.is_null() || (rs.is_object() && rs.value("rope_type", "default") == "default"),
        "{}: rope_scaling {} is not supported", path, rs.dump());
  }
  FLASHMAP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                 "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path,
                 c.num_attention_heads, c.num_key_value_heads);
  FLASHMAP_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", path, c.head_dim);
  FLASHMAP_CHECK(!c.attention_bias, "{}: attention_bias true is not supported", path);
  const std::string act = f.string_or("hidden_act", "silu");
  FLASHMAP_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (only 'silu')", path, act);
  return c;
}

std::map<int, std::vector<double>> FlashMapConfig::default_jump_grids() {
  // DEFAULT_JUMP_GRIDS of configuration_flashmap.py (decoding-error schedule at V = 151936).
  return {{1, {0.0, 1.0}},
          {2, {0.0, 0.8172569274902344, 1.0}},
          {3, {0.0, 0.8010796308517456, 0.8310279846191406, 1.0}},
          {4, {0.0, 0.7906050682067871, 0.8172569274902344, 0.8379518389701843, 1.0}}};
}

FlashMapConfig FlashMapConfig::from_file(const std::string& path) {
  const json j = read_json(path);
  Fields f{j, path};
  const std::string type = f.string_or("model_type", "");
  FLASHMAP_CHECK(type == "flashmap", "{}: model_type is '{}', expected 'flashmap'", path, type);
  FlashMapConfig c;
  c.target_model = f.string_or("target_model", c.target_model);
  c.target_hidden_size = f.integer_or("target_hidden_size", c.target_hidden_size);
  c.vocab_size = f.integer_or("vocab_size", c.vocab_size);
  if (f.has("target_layer_ids")) {
    const auto& ids = j["target_layer_ids"];
    FLASHMAP_CHECK(ids.is_array() && !ids.empty(),
                   "{}: field 'target_layer_ids' must be a non-empty list of integers", path);
    c.target_layer_ids.clear();
    for (auto& v : ids) {
      FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
                     "{}: field 'target_layer_ids' has a bad entry {}", path, v.dump());
      c.target_layer_ids.push_back(v.get<int>());
    }
  }
  c.block_size = f.integer_or("block_size", c.block_size);
  c.hidden_size = f.integer_or("hidden_size", c.hidden_size);
  c.num_hidden_layers = f.integer_or("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = f.integer_or("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = f.integer_or("intermediate_size", c.intermediate_size);
  c.cond_dim = f.integer_or("cond_dim", c.cond_dim);
  c.time_embed_dim = f.integer_or("time_embed_dim", c.time_embed_dim);
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
  c.num_steps = f.integer_or("num_steps", c.num_steps);
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
        FLASHMAP_CHECK(used == key.size(), "");
      } catch (...) {
        throw Error(fmt::format("{}: jump_grids key '{}' is not a number of steps", path, key));
      }
      FLASHMAP_CHECK(steps >= 1 && times.is_array() && times.size() == size_t(steps) + 1,
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
  if (!std::filesystem::exists(path)) return g;
  const json j = read_json(path);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      g.eos_token_ids.push_back(e.get<int>());
    } else {
      FLASHMAP_CHECK(e.is_array(), "{}: field 'eos_token_id' must be an integer or a list", path);
      for (auto& v : e) {
        FLASHMAP_CHECK(v.is_number_integer(), "{}: field 'eos_token_id' has a bad entry {}", path,
                       v.dump());
        g.eos_token_ids.push_back(v.get<int>());
      }
    }
  }
  return g;
}

}  // namespace flashmap
