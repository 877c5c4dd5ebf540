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
  // quantization_config.quant_method: "" (none), "fp8" or "awq" (others are refused).
  std::string quantization;

  static Qwen3Config from_file(const std::string& path);
  // The same from the text of a config (`path` names it in errors).
  static Qwen3Config from_json_text(const std::string& text, const std::string& path);
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
  // The same from the text of a config (`path` names it in errors).
  static FlashMapConfig from_json_text(const std::string& text, const std::string& path);
  static std::map<int, std::vector<double>> default_jump_grids();
};

// A DFlash block drafter's config.json in either format (docs/DFLASH.md §3), normalized:
// z-lab's release (a Qwen3 config with architectures ["DFlashDraftModel"] and dflash_config) or
// speculators' (speculators_model_type "dflash", the drafter's Qwen3 config nested in
// transformer_layer_config).
struct DFlashConfig {
  enum class Format { ZLab, Speculators };
  Format format = Format::ZLab;
  std::string path;  // the file, for errors
  // The drafter's decoder stack (vocab_size: the target's vocabulary).
  Qwen3Config layers;
  int block_size = 16;
  int mask_token_id = 0;
  // Target taps in the engine's convention: the output of decoder layer id (transformers'
  // hidden_states[id + 1]); speculators' aux_hidden_state_layer_ids are these + 1.
  std::vector<int> target_layer_ids;
  // The draft vocabulary (speculators may reduce it: own lm_head and d2t); = vocab_size if not.
  int draft_vocab_size = 0;
  // z-lab's optional scalars (dflash/model.py _draft_value), defaults 1, 1, 0 (off).
  double input_embedding_scale = 1.0, output_multiplier = 1.0, final_logit_softcapping = 0.0;
  // speculators: target_hidden_size when given (null: the drafter's hidden_size).
  int target_hidden_size = 0;

  bool reduced_vocab() const { return draft_vocab_size != layers.vocab_size; }
  // Throws naming the file and field when the drafter does not fit `target` (vocabulary, hidden
  // size, tapped layers: only outputs of layers 0 .. N-2, the last one being normed in HF).
  void check_target(const Qwen3Config& target, const std::string& target_dir) const;

  static DFlashConfig from_file(const std::string& path);
  static DFlashConfig from_json_text(const std::string& text, const std::string& path);
  // Whether config.json in `dir` describes a DFlash drafter (either format).
  static bool is_dflash(const std::string& dir);
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
  // The text of a generation_config.json (`path` names it in errors).
  static GenerationConfig from_json_text(const std::string& text, const std::string& path);
};

// A Qwen3 shape by name for benchmarks with random weights: "qwen3-8b" (Qwen/Qwen3-8B's
// config.json), "qwen3-0.6b", "tiny"; flashmap::Error on any other.
Qwen3Config qwen3_shape(const std::string& shape);
// A FlashMap drafter's shape by name, for benchmarks with random weights:
// "flashmap-qwen3-8b" (the released drafter for Qwen3-8B: the reference config's defaults),
// "flashmap-tiny" (for the "tiny" target).
FlashMapConfig flashmap_shape(const std::string& shape);
// A DFlash drafter's shape by name, for benchmarks with random weights: "dflash-qwen3-8b"
// (z-lab's Qwen3-8B-DFlash-b16: 5 Qwen3 layers of the target's width, block 16, taps 1, 9, 17,
// 25, 33), "dflash-tiny" (for the "tiny" target).
DFlashConfig dflash_shape(const std::string& shape);
// Whether a --draft-shape name is a DFlash drafter's (dflash_shape) rather than FlashMap's.
bool is_dflash_shape(const std::string& shape);

}  // namespace flashmap
