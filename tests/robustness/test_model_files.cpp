// Hostile model and tokenizer files: every narrowed or size-giving field is
// range-checked with an error naming the file and the field, before anything is allocated from
// it. (FIFOs and devices named like model files are tested from the shell: special_files.sh.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "error_of.h"
#include "flashmap/tokenizer.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "specdec/random_models.h"

namespace {

using namespace flashmap;
using flashmap::testing::error_of;
using json = nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A folder of its own per test (ctest runs tests in parallel processes).
fs::path temp_dir() {
  auto d =
      fs::temp_directory_path() / ("flashmap-robustness-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// The tiny fixture's target config with `patch` merged in (null values delete fields).
json qwen3_with(const json& patch) {
  json c = {{"model_type", "qwen3"},    {"vocab_size", 1024},     {"hidden_size", 64},
            {"intermediate_size", 160}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"head_dim", 24},         {"max_position_embeddings", 4096},
            {"rope_theta", 10000.0}};
  if (patch.is_object()) c.merge_patch(patch);
  return c;
}

// The error of loading a Qwen3 config with `patch` applied, with the file's path cut to "PATH".
std::string qwen3_error(const json& patch) {
  const std::string path = write(temp_dir() / "config.json", qwen3_with(patch).dump());
  std::string msg = error_of([&] { Qwen3Config::from_file(path); });
  if (msg.rfind(path, 0) == 0) msg = "PATH" + msg.substr(path.size());
  return msg;
}

std::string flashmap_error(const json& patch) {
  json c = {{"model_type", "flashmap"}};
  if (patch.is_object()) c.merge_patch(patch);
  const std::string path = write(temp_dir() / "config.json", c.dump());
  std::string msg = error_of([&] { FlashMapConfig::from_file(path); });
  if (msg.rfind(path, 0) == 0) msg = "PATH" + msg.substr(path.size());
  return msg;
}

TEST(ModelFiles, DrafterBlockSizeIsBounded) {
  // 10^6 once allocated 6.7 GB and hung.
  EXPECT_EQ(flashmap_error({{"block_size", 1000000}}),
            "PATH: field 'block_size' = 1000000 is out of range [1, 1024]");
  EXPECT_EQ(flashmap_error({{"block_size", 0}}),
            "PATH: field 'block_size' = 0 is out of range [1, 1024]");
  EXPECT_EQ(flashmap_error({{"block_size", 1024}}), "<no error>");
}

TEST(ModelFiles, DrafterFieldsAreNotNarrowedSilently) {
  // 2^40 used to load as layer 0.
  EXPECT_EQ(flashmap_error({{"target_layer_ids", {1, 1099511627776}}}),
            "PATH: field 'target_layer_ids' has a bad entry 1099511627776 (expected a layer index "
            "in [0, 1024))");
  EXPECT_EQ(flashmap_error({{"target_layer_ids", {-1}}}),
            "PATH: field 'target_layer_ids' has a bad entry -1 (expected a layer index in [0, "
            "1024))");
  EXPECT_EQ(flashmap_error({{"hidden_size", 4294967296}}),
            "PATH: field 'hidden_size' = 4294967296 is out of range [1, 65536]");
  EXPECT_EQ(flashmap_error({{"vocab_size", 18446744073709551615u}}),
            "PATH: field 'vocab_size' = 18446744073709551615 is out of range [1, 4194304]");
  EXPECT_EQ(flashmap_error({{"num_steps", 0}}),
            "PATH: field 'num_steps' = 0 is out of range [1, 1024]");
  EXPECT_EQ(flashmap_error({{"time_scale", 0}}),
            "PATH: field 'time_scale' must be a finite number > 0, got 0");
  EXPECT_EQ(flashmap_error({{"jump_grids", {{"2147483647", {0, 1}}}}}),
            "PATH: jump_grids key '2147483647' is not a number of steps in [1, 1024]");
}

TEST(ModelFiles, TargetSizesAreBounded) {
  EXPECT_EQ(qwen3_error({}), "<no error>");
  EXPECT_EQ(qwen3_error({{"vocab_size", 1000000000}}),
            "PATH: field 'vocab_size' = 1000000000 is out of range [1, 4194304]");
  EXPECT_EQ(qwen3_error({{"hidden_size", 2147483647}}),
            "PATH: field 'hidden_size' = 2147483647 is out of range [1, 65536]");
  EXPECT_EQ(qwen3_error({{"intermediate_size", 0}}),
            "PATH: field 'intermediate_size' = 0 is out of range [1, 262144]");
  EXPECT_EQ(qwen3_error({{"num_hidden_layers", 1000000}}),
            "PATH: field 'num_hidden_layers' = 1000000 is out of range [1, 1024]");
  EXPECT_EQ(qwen3_error({{"num_attention_heads", -4}}),
            "PATH: field 'num_attention_heads' = -4 is out of range [1, 1024]");
  EXPECT_EQ(qwen3_error({{"num_key_value_heads", 8}}),
            "PATH: field 'num_key_value_heads' = 8 is out of range [1, 4]");
  EXPECT_EQ(qwen3_error({{"num_key_value_heads", 3}}),
            "PATH: num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  EXPECT_EQ(qwen3_error({{"head_dim", 25}}), "PATH: head_dim 25 must be even for RoPE");
  EXPECT_EQ(qwen3_error({{"head_dim", 4096}}),
            "PATH: field 'head_dim' = 4096 is out of range [1, 1024]");
  EXPECT_EQ(qwen3_error({{"head_dim", nullptr}, {"hidden_size", 2}}),
            "PATH: head_dim (hidden_size 2 / num_attention_heads 4) = 0 is out of range [1, 1024]; "
            "give head_dim");
  EXPECT_EQ(qwen3_error({{"max_position_embeddings", 1099511627776}}),
            "PATH: field 'max_position_embeddings' = 1099511627776 is out of range [1, 16777216]");
  EXPECT_EQ(qwen3_error({{"rope_theta", 0}}),
            "PATH: field 'rope_theta' must be a finite number > 0, got 0");
  EXPECT_EQ(qwen3_error({{"rope_theta", -1e4}}),
            "PATH: field 'rope_theta' must be a finite number > 0, got -10000.0");
  EXPECT_EQ(qwen3_error({{"rms_norm_eps", 0}}),
            "PATH: field 'rms_norm_eps' must be a finite number > 0, got 0");
  // A mistyped field is an error naming it, never json's own exception ("internal error").
  EXPECT_EQ(qwen3_error({{"rope_scaling", {{"rope_type", 5}}}}),
            "PATH: rope_scaling {\"rope_type\":5} is not supported");
  EXPECT_EQ(qwen3_error({{"vocab_size", "1024"}}),
            "PATH: field 'vocab_size' must be an integer, got \"1024\"");
}

TEST(ModelFiles, InfiniteNumbersAreRefused) {
  // nlohmann::json refuses 1e999 rather than reading infinity; the range check is the second net.
  const auto path = write(temp_dir() / "config.json",
                          R"({"model_type":"qwen3","vocab_size":1024,"hidden_size":64,
                              "intermediate_size":160,"num_hidden_layers":4,
                              "num_attention_heads":4,"rope_theta":1e999})");
  EXPECT_THAT(error_of([&] { Qwen3Config::from_file(path); }),
              HasSubstr("config.json: not valid JSON ([json.exception.out_of_range.406] number "
                        "overflow parsing '1e999')"));
}

TEST(ModelFiles, SlidingWindowIsRefused) {
  // transformers slides layers >= max_window_layers when use_sliding_window keeps the window.
  EXPECT_EQ(qwen3_error(
                {{"use_sliding_window", true}, {"sliding_window", 1024}, {"max_window_layers", 2}}),
            "PATH: field 'use_sliding_window' is true with sliding_window 1024 < "
            "max_position_embeddings 4096 (layers 2..3 slide): sliding-window attention is not "
            "supported");
  EXPECT_EQ(
      qwen3_error({{"layer_types",
                    {"full_attention", "full_attention", "sliding_attention", "full_attention"}}}),
      "PATH: field 'layer_types' has \"sliding_attention\" at layer 2: sliding-window "
      "attention is not supported");
  EXPECT_EQ(qwen3_error({{"layer_types", {"full_attention"}}}),
            "PATH: field 'layer_types' must list the kind of each of the 4 layers");
  EXPECT_EQ(
      qwen3_error({{"layer_types",
                    {"full_attention", "full_attention", "chunked_attention", "full_attention"}}}),
      "PATH: field 'layer_types' has \"chunked_attention\" at layer 2: only "
      "\"full_attention\" is supported");
  // What Qwen3 checkpoints ship: a window that is off, or that no layer uses, or as long as the
  // context, is full attention.
  EXPECT_EQ(qwen3_error({{"use_sliding_window", false}, {"sliding_window", 1024}}), "<no error>");
  EXPECT_EQ(
      qwen3_error(
          {{"use_sliding_window", true}, {"sliding_window", 1024}, {"max_window_layers", 28}}),
      "<no error>");
  EXPECT_EQ(qwen3_error({{"use_sliding_window", true}, {"sliding_window", 4096}}), "<no error>");
  EXPECT_EQ(
      qwen3_error({{"layer_types",
                    {"full_attention", "full_attention", "full_attention", "full_attention"}}}),
      "<no error>");
}

TEST(ModelFiles, EosIdsAreNotNarrowedSilently) {
  const auto d = temp_dir();
  write(d / "generation_config.json", R"({"eos_token_id": [2, 1099511627776]})");
  EXPECT_EQ(error_of([&] { GenerationConfig::from_dir(d.string()); }),
            (d / "generation_config.json").string() +
                ": field 'eos_token_id' has a bad entry 1099511627776 (expected a token id)");
}

TEST(ModelFiles, GenerationConfigSamplingDefaults) {
  const auto d = temp_dir();
  const auto path = (d / "generation_config.json").string();
  // Qwen3's file.
  write(d / "generation_config.json",
        R"({"do_sample": true, "eos_token_id": [151645, 151643], "temperature": 0.6,
            "top_k": 20, "top_p": 0.95})");
  auto g = GenerationConfig::from_dir(d.string());
  EXPECT_EQ(g.temperature, 0.6);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_EQ(g.top_p, 0.95);
  EXPECT_FALSE(g.min_p);
  // do_sample false: greedy, the values are not defaults (transformers' reading).
  write(d / "generation_config.json", R"({"do_sample": false, "temperature": 0.6, "top_k": 20})");
  g = GenerationConfig::from_dir(d.string());
  EXPECT_FALSE(g.temperature);
  EXPECT_FALSE(g.top_k);
  write(d / "generation_config.json", R"({"top_k": -1, "min_p": 0.05, "temperature": null})");
  g = GenerationConfig::from_dir(d.string());
  EXPECT_EQ(g.top_k, 0);
  EXPECT_EQ(g.min_p, 0.05);
  EXPECT_FALSE(g.temperature);
  // Bad values name the file and the field.
  write(d / "generation_config.json", R"({"top_p": 0})");
  EXPECT_EQ(error_of([&] { GenerationConfig::from_dir(d.string()); }),
            path + ": field 'top_p' = 0 is out of range (0, 1]");
  write(d / "generation_config.json", R"({"temperature": "hot"})");
  EXPECT_EQ(error_of([&] { GenerationConfig::from_dir(d.string()); }),
            path + ": field 'temperature' must be a number, got \"hot\"");
  write(d / "generation_config.json", R"({"top_k": 2.5})");
  EXPECT_EQ(error_of([&] { GenerationConfig::from_dir(d.string()); }),
            path + ": field 'top_k' = 2.5 is not an integer");
  write(d / "generation_config.json", R"({"temperature": -1})");
  EXPECT_EQ(error_of([&] { GenerationConfig::from_dir(d.string()); }),
            path + ": field 'temperature' = -1 is out of range [0, 1000000]");
}

TEST(ModelFiles, DeepJsonIsRefusedBeforeParsing) {
  const auto d = temp_dir();
  const auto path = write(d / "config.json",
                          "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  EXPECT_EQ(error_of([&] { Qwen3Config::from_file(path); }),
            path + ": JSON nested deeper than 64 levels");
}

TEST(ModelFiles, SafetensorsHeaderLengthIsBounded) {
  const auto d = temp_dir();
  // Longer than the file: refused without reading it.
  {
    std::ofstream out(d / "a.safetensors", std::ios::binary);
    const uint64_t n = uint64_t(1) << 62;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_EQ(error_of([&] { SafetensorsFile((d / "a.safetensors").string()); }),
            (d / "a.safetensors").string() +
                ": header length 4611686018427387904 runs past the end of the file (10 bytes): "
                "truncated or not a safetensors file");
  // Inside the file but over the format's 100 MB: a sparse file, so nothing is written.
  {
    std::ofstream out(d / "b.safetensors", std::ios::binary);
    const uint64_t n = 100'000'001;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  fs::resize_file(d / "b.safetensors", 100'000'100);
  EXPECT_EQ(error_of([&] { SafetensorsFile((d / "b.safetensors").string()); }),
            (d / "b.safetensors").string() +
                ": header length 100000001 is over the safetensors limit of 100000000 bytes");
  fs::remove(d / "b.safetensors");
  // A nested header.
  {
    const std::string header = std::string(100000, '[') + std::string(100000, ']');
    std::ofstream out(d / "c.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  EXPECT_EQ(error_of([&] { SafetensorsFile((d / "c.safetensors").string()); }),
            (d / "c.safetensors").string() + ": header: JSON nested deeper than 64 levels");
}

TEST(ModelFiles, TokenizerIdsAreBounded) {
  const auto d = temp_dir();
  auto tokenizer = [](const json& vocab) {
    return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}}},
                {"decoder", {{"type", "ByteLevel"}}}}
        .dump();
  };
  // One token with a large id once sized every table to it (2^30 ids: tens of GB).
  write(d / "tokenizer.json", tokenizer({{"a", 1073741823}}));
  EXPECT_EQ(error_of([&] { Tokenizer::from_dir(d.string()); }),
            "tokenizer file '" + (d / "tokenizer.json").string() +
                "': model.vocab[\"a\"]: id 1073741823 out of range [0, 16777216)");
  write(d / "tokenizer.json", tokenizer({{"a", 0}, {"b", 16000000}}));
  EXPECT_EQ(error_of([&] { Tokenizer::from_dir(d.string()); }),
            "tokenizer file '" + (d / "tokenizer.json").string() +
                "': model.vocab: token id 16000000 is far beyond the 2 tokens listed");
  write(d / "tokenizer.json", std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_EQ(error_of([&] { Tokenizer::from_dir(d.string()); }),
            "tokenizer file '" + (d / "tokenizer.json").string() +
                "': JSON nested deeper than 64 levels");
}

// z-lab's default tap ids, build_target_layer_ids(N, k) = round(1 + i (N - 4) / (k - 1)): with
// fewer than 4 target layers they were negative and indexed before the target's layer table.
TEST(ModelFiles, DFlashDefaultLayerIdsAreInTheTarget) {
  json c = json::parse(std::ifstream("tests/fixtures/dflash/zlab/config.json"));
  c["dflash_config"].erase("target_layer_ids");
  c["num_hidden_layers"] = 3;
  c.erase("layer_types");
  auto ids = [&](int target_layers) {
    c["num_target_layers"] = target_layers;
    return DFlashConfig::from_json_text(c.dump(), "config.json").target_layer_ids;
  };
  // Python's round() takes halves to even: 1 + 31 / 2 = 16.5 is 16 (std::lround gave 17).
  EXPECT_EQ(ids(35), (std::vector<int>{1, 16, 32}));
  EXPECT_EQ(ids(36), (std::vector<int>{1, 17, 33}));
  EXPECT_EQ(ids(4), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(ids(3), (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(error_of([&] { ids(2); }),
            "config.json: field 'num_target_layers' = 2 gives the target layer id -1 for 3 "
            "drafter layers (the default ids need at least 4 target layers): give "
            "target_layer_ids");
  EXPECT_THAT(error_of([&] { ids(1); }), HasSubstr("gives the target layer id -2"));
}

TEST(ModelFiles, EmbeddingNoiseNeedsAVocabularyAsLargeAsTheHiddenSize) {
  // The Gram matrix EᵀE is H x H whatever V is: with V < H it is singular, and allocating it for
  // a tiny embedding file with a huge hidden size is refused before it happens.
  const auto pair = flashmap::testing::write_random_pair(
      "robustness-small-vocab-" + std::to_string(::getpid()), 16, 64, 2, 4, 1);
  Qwen3Model target(pair.target);
  FlashMapModel drafter(pair.draft, target);
  EXPECT_EQ(error_of([&] { drafter.noise_factor(); }),
            pair.target +
                ": the target's vocabulary (16 tokens) is smaller than its hidden size 64, so EᵀE "
                "is singular and one-step noise cannot be drawn in embedding space");
  EXPECT_FALSE(drafter.has_noise_factor());
}

}  // namespace
