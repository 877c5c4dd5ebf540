// Typed views of the Hugging Face config files the engine reads. Every field is checked for
// presence, type and range (sizes have upper bounds, so that nothing sized from them can overflow
// or ask for absurd memory before the weights are checked); a bad one throws flashmap::Error
// naming the file and the field.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace flashmap {

// Largest drafter block (K tokens proposed per round; the reference's default is 16): K·vocab
// logits and K+1-token verify passes are allocated per round.
inline constexpr int kMaxBlockSize = 1024;

// transformers' Qwen3Config (model_type "qwen3").
struct Qwen3Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // defaults to hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // flat field, or rope_parameters.rope_theta (transformers 5)
  int max_position_embeddings = 40960;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string name_or_path;

  static Qwen3Config from_file(const std::string& path);
};

// FlashMapConfig of flashmap==0.1.0 (configuration_flashmap.py), with the same defaults.
struct FlashMapConfig {
  std::string target_model = "Qwen/Qwen3-8B";
  int target_hidden_size = 4096;
  int vocab_size = 151936;
  std::vector<int> target_layer_ids = {1, 9, 17, 25, 33};
  int block_size = 16;
  int hidden_size = 2048;
  int num_hidden_layers = 6;
  int num_attention_heads = 16;
  int intermediate_size = 8192;
  int cond_dim = 256;
  int time_embed_dim = 256;
  double time_scale = 1000.0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  double qk_norm_eps = 1e-5;
  double layer_norm_eps = 1e-6;
  std::string noise_gate = "jump";  // "jump" or "constant"
  std::string time_schedule = "decoding_error";
  int num_steps = 1;
  // steps -> [0 = t_0 < ... < t_n = 1]; DEFAULT_JUMP_GRIDS when the file has none.
  std::map<int, std::vector<double>> jump_grids;
  // The jump grid for `steps`; throws flashmap::Error listing the supported step counts.
  const std::vector<double>& grid(int steps) const;

  int head_dim() const { return hidden_size / num_attention_heads; }
  static FlashMapConfig from_file(const std::string& path);
  static std::map<int, std::vector<double>> default_jump_grids();
};

// generation_config.json: the ids that end generation and the checkpoint's sampling defaults.
struct GenerationConfig {
  std::vector<int> eos_token_ids;
  // Sampling values the file gives (Qwen3: temperature 0.6, top_k 20, top_p 0.95). With
  // "do_sample": false they are left out (greedy), as transformers does; without do_sample they
  // count (as vLLM reads them). Out-of-range values are an Error naming the file and field.
  std::optional<double> temperature, top_p, min_p;
  std::optional<int> top_k;
  std::optional<double> repetition_penalty;  // (0, 10]; read whatever do_sample says
  // Missing file -> empty config.
  static GenerationConfig from_dir(const std::string& dir);
};

// A Qwen3 shape by name for benchmarks with random weights: "qwen3-8b" (Qwen/Qwen3-8B's
// config.json), "qwen3-0.6b", "tiny"; flashmap::Error on any other.
Qwen3Config qwen3_shape(const std::string& shape);

}  // namespace flashmap
