#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "error_of.h"
#include "io/hf_config.h"

using namespace flashmap;
using flashmap::testing::error_of;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

std::string write(const std::string& name, const std::string& text) {
  auto p = fs::temp_directory_path() / ("flashmap-cfg-" + name + ".json");
  std::ofstream(p) << text;
  return p.string();
}

const char* kQwen =
    R"({"model_type":"qwen3","vocab_size":100,"hidden_size":32,"intermediate_size":64,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,
        "rope_parameters":{"rope_type":"default","rope_theta":1000000.0}})";

}  // namespace

TEST(Qwen3Config, ReadsRopeParameters) {
  auto c = Qwen3Config::from_file(write("ok", kQwen));
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
}

TEST(Qwen3Config, MissingAndWrongTypedFields) {
  auto msg = error_of([] {
    Qwen3Config::from_file(write("missing", R"({"model_type":"qwen3","vocab_size":10})"));
  });
  EXPECT_THAT(msg, HasSubstr("missing field 'hidden_size'"));
  EXPECT_THAT(msg, HasSubstr("flashmap-cfg-missing.json"));
  std::string bad = kQwen;
  bad.replace(bad.find("\"hidden_size\":32"), 16, "\"hidden_size\":\"32\"");
  EXPECT_THAT(error_of([&] { Qwen3Config::from_file(write("typed", bad)); }),
              HasSubstr("field 'hidden_size' must be an integer"));
  EXPECT_THAT(error_of([] { Qwen3Config::from_file(write("llama", R"({"model_type":"llama"})")); }),
              HasSubstr("model_type is 'llama'"));
  EXPECT_THAT(error_of([] { Qwen3Config::from_file(write("json", "{oops")); }),
              HasSubstr("not valid JSON"));
}

TEST(FlashMapConfig, DefaultsMatchReference) {
  auto c = FlashMapConfig::from_file(write("fm", R"({"model_type":"flashmap"})"));
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  EXPECT_EQ(c.noise_gate, "jump");
  EXPECT_DOUBLE_EQ(c.qk_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.jump_grids.at(2)[1], 0.8172569274902344);
  EXPECT_EQ(c.jump_grids.size(), 4u);
}

TEST(FlashMapConfig, BadFields) {
  EXPECT_THAT(
      error_of([] {
        FlashMapConfig::from_file(write("gate", R"({"model_type":"flashmap","noise_gate":"x"})"));
      }),
      HasSubstr("'noise_gate'"));
  EXPECT_THAT(error_of([] {
                FlashMapConfig::from_file(
                    write("grid", R"({"model_type":"flashmap","jump_grids":{"2":[0,1]}})"));
              }),
              HasSubstr("jump_grids['2'] must list 3 times"));
  EXPECT_THAT(error_of([] {
                FlashMapConfig::from_file(
                    write("ids", R"({"model_type":"flashmap","target_layer_ids":[1,"a"]})"));
              }),
              HasSubstr("'target_layer_ids' has a bad entry"));
}
