// Small random Qwen3 targets and FlashMap drafters written to a temp folder, for tests that need
// shapes the committed fixtures do not have (a vocabulary small enough to enumerate).
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace flashmap::testing {

struct RandomPair {
  std::string target, draft;
};

inline RandomPair write_random_pair(const std::string& name, int vocab, int hidden, int layers,
                                    int block, uint64_t seed, int max_positions = 4096) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("flashmap-" + name);
  fs::remove_all(root);
  fs::create_directories(root / "target");
  fs::create_directories(root / "draft");
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorData> tensors;
  auto mat = [&](const std::string& n, int64_t rows, int64_t cols, float scale = 1.0f) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = scale * normal(gen) / std::sqrt(float(cols));
    tensors.push_back(make_tensor(n, {rows, cols}, v));
  };
  auto vec = [&](const std::string& n, int64_t len, float base, float noise) {
    std::vector<float> v(static_cast<size_t>(len));
    for (auto& x : v) x = base + noise * normal(gen);
    tensors.push_back(make_tensor(n, {len}, v));
  };
  const int heads = 2, kv = 1, hd = hidden / heads, inter = 2 * hidden;
  mat("model.embed_tokens.weight", vocab, hidden, 8.0f);
  mat("lm_head.weight", vocab, hidden, 3.0f);
  vec("model.norm.weight", hidden, 1.0f, 0.2f);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    vec(p + "input_layernorm.weight", hidden, 1.0f, 0.2f);
    vec(p + "post_attention_layernorm.weight", hidden, 1.0f, 0.2f);
    vec(p + "self_attn.q_norm.weight", hd, 1.0f, 0.2f);
    vec(p + "self_attn.k_norm.weight", hd, 1.0f, 0.2f);
    mat(p + "self_attn.q_proj.weight", heads * hd, hidden);
    mat(p + "self_attn.k_proj.weight", kv * hd, hidden);
    mat(p + "self_attn.v_proj.weight", kv * hd, hidden);
    mat(p + "self_attn.o_proj.weight", hidden, heads * hd);
    mat(p + "mlp.gate_proj.weight", inter, hidden);
    mat(p + "mlp.up_proj.weight", inter, hidden);
    mat(p + "mlp.down_proj.weight", hidden, inter);
  }
  write_safetensors((root / "target/model.safetensors").string(), tensors);
  nlohmann::json tc = {{"model_type", "qwen3"},       {"vocab_size", vocab},
                       {"hidden_size", hidden},       {"intermediate_size", inter},
                       {"num_hidden_layers", layers}, {"num_attention_heads", heads},
                       {"num_key_value_heads", kv},   {"head_dim", hd},
                       {"rope_theta", 10000.0},       {"max_position_embeddings", max_positions}};
  std::ofstream(root / "target/config.json") << tc.dump(2);

  tensors.clear();
  const int D = 16, dh = 2, cond = 8, temb = 8;
  const std::vector<int> ids = {0};
  mat("fc.weight", D, hidden);
  vec("hidden_norm.weight", D, 1.0f, 0.1f);
  mat("anchor_proj.weight", D, hidden);
  vec("anchor_proj.bias", D, 0.0f, 0.1f);
  vec("anchor_norm.weight", D, 1.0f, 0.1f);
  vec("state_norm.weight", hidden, 1.0f, 0.1f);
  vec("noise_norm.weight", hidden, 1.0f, 0.1f);
  vec("noise_gate", 1, 0.5f, 0.0f);
  mat("x_embed.weight", D, hidden);
  vec("x_embed.bias", D, 0.0f, 0.1f);
  for (const char* te : {"time_embed", "jump_embed"}) {
    mat(std::string(te) + ".linear_1.weight", cond, temb);
    vec(std::string(te) + ".linear_1.bias", cond, 0.0f, 0.1f);
    mat(std::string(te) + ".linear_2.weight", cond, cond);
    vec(std::string(te) + ".linear_2.bias", cond, 0.0f, 0.1f);
  }
  for (const char* a : {"self_attn", "cross_attn", "mlp"}) {
    mat(std::string("layers.0.") + a + "_adaln.linear.weight", 3 * D, cond);
    vec(std::string("layers.0.") + a + "_adaln.linear.bias", 3 * D, 0.0f, 0.3f);
  }
  for (const char* a : {"self_attn", "cross_attn"}) {
    for (const char* w : {"q_proj", "k_proj", "v_proj", "o_proj"})
      mat(std::string("layers.0.") + a + "." + w + ".weight", D, D);
    vec(std::string("layers.0.") + a + ".q_norm.weight", D / dh, 1.0f, 0.1f);
    vec(std::string("layers.0.") + a + ".k_norm.weight", D / dh, 1.0f, 0.1f);
  }
  mat("layers.0.mlp.fc1.weight", 2 * D, D);
  vec("layers.0.mlp.fc1.bias", 2 * D, 0.0f, 0.1f);
  mat("layers.0.mlp.fc2.weight", D, 2 * D);
  vec("layers.0.mlp.fc2.bias", D, 0.0f, 0.1f);
  mat("final_adaln.linear.weight", 3 * D, cond);
  vec("final_adaln.linear.bias", 3 * D, 0.0f, 0.3f);
  mat("head.weight", hidden, D, 3.0f);
  vec("head.bias", hidden, 0.0f, 0.1f);
  write_safetensors((root / "draft/model.safetensors").string(), tensors);
  nlohmann::json dc = {
      {"model_type", "flashmap"}, {"target_hidden_size", hidden}, {"vocab_size", vocab},
      {"target_layer_ids", ids},  {"block_size", block},          {"hidden_size", D},
      {"num_hidden_layers", 1},   {"num_attention_heads", dh},    {"intermediate_size", 2 * D},
      {"cond_dim", cond},         {"time_embed_dim", temb}};
  std::ofstream(root / "draft/config.json") << dc.dump(2);
  return {(root / "target").string(), (root / "draft").string()};
}

// A random z-lab DFlash drafter (one layer, block 4, mask id 6, tapping layer 0) for the 8-token
// target of `pair` (write_random_pair(..., vocab 8, hidden 8, ...)), in a folder beside it;
// returns the folder.
inline std::filesystem::path write_random_dflash(const RandomPair& pair, uint64_t seed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(pair.target).parent_path() / "dflash";
  fs::create_directories(dir);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorData> tensors;
  auto mat = [&](const std::string& n, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = 2.0f * normal(gen) / std::sqrt(float(cols));
    tensors.push_back(make_tensor(n, {rows, cols}, v));
  };
  auto vec = [&](const std::string& n, int64_t len) {
    std::vector<float> v(static_cast<size_t>(len));
    for (auto& x : v) x = 1.0f + 0.2f * normal(gen);
    tensors.push_back(make_tensor(n, {len}, v));
  };
  const int H = 8, heads = 2, kv = 1, hd = 4, inter = 16;
  mat("fc.weight", H, H);
  vec("hidden_norm.weight", H);
  vec("norm.weight", H);
  const std::string p = "layers.0.";
  vec(p + "input_layernorm.weight", H);
  vec(p + "post_attention_layernorm.weight", H);
  vec(p + "self_attn.q_norm.weight", hd);
  vec(p + "self_attn.k_norm.weight", hd);
  mat(p + "self_attn.q_proj.weight", heads * hd, H);
  mat(p + "self_attn.k_proj.weight", kv * hd, H);
  mat(p + "self_attn.v_proj.weight", kv * hd, H);
  mat(p + "self_attn.o_proj.weight", H, heads * hd);
  mat(p + "mlp.gate_proj.weight", inter, H);
  mat(p + "mlp.up_proj.weight", inter, H);
  mat(p + "mlp.down_proj.weight", H, inter);
  write_safetensors((dir / "model.safetensors").string(), tensors);
  nlohmann::json c = {{"architectures", {"DFlashDraftModel"}},
                      {"model_type", "qwen3"},
                      {"block_size", 4},
                      {"dflash_config", {{"mask_token_id", 6}, {"target_layer_ids", {0}}}},
                      {"num_target_layers", 2},
                      {"hidden_size", H},
                      {"intermediate_size", inter},
                      {"num_hidden_layers", 1},
                      {"num_attention_heads", heads},
                      {"num_key_value_heads", kv},
                      {"head_dim", hd},
                      {"vocab_size", 8},
                      {"rope_theta", 10000.0},
                      {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-6},
                      {"layer_types", {"full_attention"}}};
  std::ofstream(dir / "config.json") << c.dump(2);
  return dir;
}

}  // namespace flashmap::testing
