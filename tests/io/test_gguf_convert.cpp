// `flashmap convert` of Qwen3 GGUF targets (fixtures by tools/make_gguf_fixtures.py):
//   - tiny-a's F32 target written as llama.cpp's converter writes it converts back to the same
//     tensors byte for byte and the same config;
//   - a Q4_K_M-mix GGUF converts to tensors whose F32 bytes hash as the `gguf` package's
//     dequantize hashes them, with the config its metadata describes, and a tokenizer (from
//     `tokenizer.ggml.*`) that encodes and decodes as the folder the vocabulary came from does,
//     with its chat template;
//   - files that are not a Qwen3 this engine can convert fail naming the field.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "error_of.h"
#include "flashmap/tokenizer.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/gguf_convert.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "temp_dir.h"

using namespace flashmap;
using flashmap::testing::error_of;
using flashmap::testing::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kDir = "tests/fixtures/gguf";

json read_json(const fs::path& p) {
  return json::parse(std::ifstream(p));
}

}  // namespace

TEST(GgufConvert, AnF32TargetConvertsBackByteForByte) {
  TempDir tmp;
  const auto out = (tmp.path / "tiny-a").string();
  const auto r = convert_gguf(kDir + "/tiny-a-f32.gguf", out, false);
  EXPECT_TRUE(r.dequantized.empty());
  EXPECT_FALSE(r.tokenizer);
  const Checkpoint want("tests/fixtures/tiny-a/target"), got(out);
  EXPECT_EQ(got.names(), want.names());
  for (const auto& name : want.names()) {
    SCOPED_TRACE(name);
    const TensorView &a = want.get(name), &b = got.get(name);
    ASSERT_EQ(b.dtype, a.dtype);
    ASSERT_EQ(b.shape, a.shape);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0);
  }
  const auto c0 = Qwen3Config::from_file("tests/fixtures/tiny-a/target/config.json");
  const auto c1 = Qwen3Config::from_file(out + "/config.json");
  EXPECT_EQ(c1.vocab_size, c0.vocab_size);
  EXPECT_EQ(c1.hidden_size, c0.hidden_size);
  EXPECT_EQ(c1.intermediate_size, c0.intermediate_size);
  EXPECT_EQ(c1.num_hidden_layers, c0.num_hidden_layers);
  EXPECT_EQ(c1.num_attention_heads, c0.num_attention_heads);
  EXPECT_EQ(c1.num_key_value_heads, c0.num_key_value_heads);
  EXPECT_EQ(c1.head_dim, c0.head_dim);
  EXPECT_EQ(c1.rms_norm_eps, c0.rms_norm_eps);  // 1e-06 again, not the float32 nearest it
  EXPECT_EQ(c1.rope_theta, c0.rope_theta);
  EXPECT_EQ(c1.max_position_embeddings, c0.max_position_embeddings);
  EXPECT_EQ(c1.tie_word_embeddings, c0.tie_word_embeddings);
  // No end-of-sequence id in the file: an empty generation config, as the source's.
  EXPECT_EQ(GenerationConfig::from_dir(out).eos_token_ids,
            GenerationConfig::from_dir("tests/fixtures/tiny-a/target").eos_token_ids);
  // OUT exists now: replaced only with force.
  EXPECT_THAT(error_of([&] { convert_gguf(kDir + "/tiny-a-f32.gguf", out, false); }),
              HasSubstr("exists; pass --force to replace it"));
  EXPECT_NO_THROW(convert_gguf(kDir + "/tiny-a-f32.gguf", out, true));
}

TEST(GgufConvert, AQ4KMTargetDequantizesAsTheGgufPackageAndKeepsItsTokenizer) {
  TempDir tmp;
  const auto out = (tmp.path / "q4km").string();
  // Through the command's entry point: a .gguf IN is detected by its magic.
  ConvertOptions o;
  o.in = kDir + "/qwen3-q4km.gguf";
  o.out = out;
  const auto r = convert_checkpoint(o);
  EXPECT_EQ(r.source, "gguf");
  EXPECT_TRUE(r.tokenizer);
  EXPECT_TRUE(r.chat_template);
  const json expected = read_json(kDir + "/qwen3-q4km_expected.json");
  const Checkpoint got(out);
  EXPECT_EQ(got.names().size(), expected["tensors"].size());
  size_t dequantized = 0;
  for (const auto& [name, e] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorView& t = got.get(name, e["shape"].get<std::vector<int64_t>>());
    ASSERT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(XXH3_64bits(t.data, t.nbytes()), e["xxh3_64"].get<uint64_t>());
    dequantized += e["type"] != "F32";
  }
  EXPECT_EQ(r.dequantized.size(), dequantized);

  const json& ec = expected["config"];
  const auto c = Qwen3Config::from_file(out + "/config.json");
  EXPECT_EQ(c.vocab_size, ec["vocab_size"]);
  EXPECT_EQ(c.hidden_size, ec["hidden_size"]);
  EXPECT_EQ(c.intermediate_size, ec["intermediate_size"]);
  EXPECT_EQ(c.num_hidden_layers, ec["num_hidden_layers"]);
  EXPECT_EQ(c.num_attention_heads, ec["num_attention_heads"]);
  EXPECT_EQ(c.num_key_value_heads, ec["num_key_value_heads"]);
  EXPECT_EQ(c.head_dim, ec["head_dim"]);
  EXPECT_EQ(c.rms_norm_eps, ec["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.rope_theta, ec["rope_theta"].get<double>());
  EXPECT_FALSE(c.tie_word_embeddings);
  // The end-of-sequence token of the source folder.
  EXPECT_EQ(GenerationConfig::from_dir(out).eos_token_ids, std::vector<int>{0});

  // The tokenizer encodes and decodes as the one the vocabulary came from.
  const std::string src = "models/default/target";
  const Tokenizer want = Tokenizer::from_dir(src), have = Tokenizer::from_dir(out);
  for (const std::string text :
       {"Tell me a fortune", "  leading spaces,\ttabs\n\nand newlines  ", "It's 42, isn't it?",
        "ünïcödé — 東京 🙂 and <|endoftext|> inside", "x<|endoftext|><|endoftext|>y",
        ""}) {
    SCOPED_TRACE(text);
    const auto ids = want.encode(text);
    EXPECT_EQ(have.encode(text), ids);
    EXPECT_EQ(have.decode(ids), want.decode(ids));
    EXPECT_EQ(have.decode(ids, true), want.decode(ids, true));
  }
  EXPECT_TRUE(have.is_special(0));
  const json tc = read_json(out + "/tokenizer_config.json");
  EXPECT_EQ(tc["chat_template"], read_json(src + "/tokenizer_config.json")["chat_template"]);
  EXPECT_EQ(tc["eos_token"], "<|endoftext|>");
}

TEST(GgufConvert, WhatDoesNotConvertIsRefusedNamingTheField) {
  TempDir tmp;
  const auto out = (tmp.path / "out").string();
  // Not a Qwen3: the quantization fixture's architecture is "test".
  EXPECT_THAT(error_of([&] { convert_gguf(kDir + "/quants.gguf", out, false); }),
              HasSubstr("metadata 'general.architecture' = \"test\": only Qwen3"));
  // A GGUF given to --from speculators.
  ConvertOptions o;
  o.in = kDir + "/tiny-a-f32.gguf";
  o.out = out;
  o.from = ConvertSource::Speculators;
  EXPECT_THAT(error_of([&] { convert_checkpoint(o); }), HasSubstr("--from auto"));
  // A file that is not GGUF.
  o.in = "tests/fixtures/tiny-a/target/config.json";
  o.from = ConvertSource::Auto;
  EXPECT_THAT(error_of([&] { convert_checkpoint(o); }),
              HasSubstr("not a folder (nor a GGUF file)"));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(is_gguf_file("tests/fixtures/tiny-a/target/config.json"));
  EXPECT_TRUE(is_gguf_file(kDir + "/qwen3-q4km.gguf"));
}

// The Q4_K_M fixture with bytes changed in place (same lengths, so the file stays well-formed):
// each change is refused naming the metadata key or the tensor.
TEST(GgufConvert, HostileMetadataIsRefusedNamingIt) {
  std::ifstream in(kDir + "/qwen3-q4km.gguf", std::ios::binary);
  const std::string original{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  struct Case {
    std::string find, replace, expect;
  };
  const std::vector<Case> cases = {
      {"qwen2", "qwenX", "metadata 'tokenizer.ggml.pre' = \"qwenX\": only Qwen's pre-tokenizer"},
      {"<|endoftext|>", "\xff|endoftext|>",
       "metadata 'tokenizer.ggml.tokens'[0] is not valid UTF-8"},
      {"blk.1.ffn_up", "blk.1.ffn_xx", "tensor 'blk.1.ffn_xx.weight' is not one of a 2-layer"},
      {"blk.1.ffn_up", "blk.7.ffn_up", "tensor 'blk.7.ffn_up.weight' is not one of a 2-layer"},
      {"gpt2", "bert", "metadata 'tokenizer.ggml.model' = \"bert\": only byte-level BPE"},
  };
  TempDir tmp;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.find + " -> " + c.replace);
    std::string bytes = original;
    const size_t at = bytes.find(c.find);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, c.find.size(), c.replace);
    const auto path = (tmp.path / "hostile.gguf").string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    const auto out = (tmp.path / "out").string();
    const std::string e = error_of([&] { convert_gguf(path, out, false); });
    EXPECT_THAT(e, HasSubstr(c.expect));
    EXPECT_THAT(e, HasSubstr("hostile.gguf"));
    EXPECT_FALSE(fs::exists(out));
  }
}

// A GGUF read in place (--target model.gguf): the folder links to the file, F32 tensors are
// views of its mapping with the bytes of the folder it was written from, quantized ones
// dequantize when looked up to what the `gguf` package's dequantize gives, and go when dropped.
TEST(GgufInPlace, AnF32TargetReadsTheSameTensorsThroughTheLink) {
  TempDir tmp;
  const auto out = (tmp.path / "linked").string();
  const auto r = convert_gguf(kDir + "/tiny-a-f32.gguf", out, false, GgufTensors::Link);
  EXPECT_TRUE(r.dequantized.empty());
  EXPECT_TRUE(fs::is_symlink(out + "/model.gguf"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  const Checkpoint want("tests/fixtures/tiny-a/target"), got(out);
  EXPECT_EQ(got.names(), want.names());
  for (const auto& name : want.names()) {
    SCOPED_TRACE(name);
    const TensorView &w = want.get(name), &g = got.get(name);
    EXPECT_EQ(g.shape, w.shape);
    ASSERT_EQ(g.dtype, w.dtype);
    EXPECT_EQ(std::memcmp(g.data, w.data, w.nbytes()), 0);
    EXPECT_EQ(g.file, fs::canonical(kDir + "/tiny-a-f32.gguf").string());
  }
}

TEST(GgufInPlace, QuantizedTensorsDequantizeAsTheGgufPackageWhenLookedUp) {
  TempDir tmp;
  const auto out = (tmp.path / "linked").string();
  const auto r = convert_gguf(kDir + "/qwen3-q4km.gguf", out, false, GgufTensors::Link);
  EXPECT_TRUE(r.tokenizer);
  const json expected = read_json(kDir + "/qwen3-q4km_expected.json");
  Checkpoint got(out);
  EXPECT_EQ(got.names().size(), expected["tensors"].size());
  std::vector<const TensorView*> quantized;
  int64_t f32_bytes = 0;
  for (const auto& [name, e] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorView& t = got.get(name, e["shape"].get<std::vector<int64_t>>());
    ASSERT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(XXH3_64bits(t.data, t.nbytes()), e["xxh3_64"].get<uint64_t>());
    // Once packed, a dequantized copy is freed; looked up again, it is made again.
    got.drop_pages(t);
    if (e["type"] != "F32") {
      EXPECT_EQ(t.data, nullptr);
    }
    const TensorView& again = got.get(name);
    EXPECT_EQ(XXH3_64bits(again.data, again.nbytes()), e["xxh3_64"].get<uint64_t>());
    got.drop_pages(again);
    if (e["type"] != "F32") quantized.push_back(&again);
    f32_bytes += again.nbytes();
  }
  // Sizes come from the shapes: nothing is dequantized again to tell them.
  EXPECT_EQ(got.bytes(), f32_bytes);
  // As the file holds them: ggml's blocks, 144 bytes per 256 weights for Q4_K, 210 for Q6_K.
  int64_t stored = 0;
  for (const auto& [name, e] : expected["tensors"].items()) {
    int64_t n = 1;
    for (int64_t d : e["shape"].get<std::vector<int64_t>>()) n *= d;
    const std::string type = e["type"];
    stored += type == "F32" ? 4 * n : type == "Q4_K" ? n / 256 * 144 : n / 256 * 210;
    EXPECT_TRUE(type == "F32" || type == "Q4_K" || type == "Q6_K") << name << " " << type;
  }
  EXPECT_EQ(got.stored_bytes(), stored);
  for (const TensorView* t : quantized) EXPECT_EQ(t->data, nullptr) << t->name;
  // The metadata files are the converted folder's.
  const auto copied = (tmp.path / "copied").string();
  convert_gguf(kDir + "/qwen3-q4km.gguf", copied, false);
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(read_json(out + "/" + f), read_json(copied + "/" + f)) << f;
}

TEST(GgufInPlace, TheModelFolderIsMadeOncePerFileAndRemadeWhenItChanges) {
  TempDir tmp;
  ::setenv("FLASHMAP_CACHE_DIR", (tmp.path / "cache").c_str(), 1);
  const auto gguf = tmp.path / "model.gguf";
  fs::copy_file(kDir + "/tiny-a-f32.gguf", gguf);
  const std::string dir = gguf_model_folder(gguf.string());
  EXPECT_EQ(fs::path(dir).parent_path(), tmp.path / "cache" / "gguf1");
  EXPECT_EQ(fs::read_symlink(fs::path(dir) / "model.gguf"), fs::canonical(gguf));
  const auto made = fs::last_write_time(fs::path(dir) / "config.json");
  EXPECT_EQ(gguf_model_folder(gguf.string()), dir);  // reused, not rewritten
  EXPECT_EQ(fs::last_write_time(fs::path(dir) / "config.json"), made);
  // Through another path to the same file: the same folder.
  EXPECT_EQ(gguf_model_folder((tmp.path / "." / "model.gguf").string()), dir);
  // A file changed since: a folder of its own.
  fs::last_write_time(gguf, fs::last_write_time(gguf) + std::chrono::seconds(5));
  EXPECT_NE(gguf_model_folder(gguf.string()), dir);
  // What is not a Qwen3 GGUF makes no folder and says why.
  fs::copy_file(kDir + "/quants.gguf", tmp.path / "quants.gguf");
  EXPECT_THAT(error_of([&] { gguf_model_folder((tmp.path / "quants.gguf").string()); }),
              HasSubstr("quants.gguf: metadata 'general.architecture' = \"test\": only Qwen3"));
  EXPECT_THAT(error_of([&] { gguf_model_folder((tmp.path / "absent.gguf").string()); }),
              HasSubstr("absent.gguf: cannot open"));
  ::unsetenv("FLASHMAP_CACHE_DIR");
}

TEST(GgufInPlace, AFolderWhoseModelGgufIsBrokenFailsNamingIt) {
  TempDir tmp;
  const auto out = (tmp.path / "linked").string();
  fs::create_directory(out);
  std::ofstream(out + "/model.gguf") << "GGUF but not much else";
  EXPECT_THAT(error_of([&] { Checkpoint c(out); }), HasSubstr(out + "/model.gguf: "));
  fs::remove(out + "/model.gguf");
  fs::create_symlink(tmp.path / "nowhere.gguf", out + "/model.gguf");
  EXPECT_THAT(error_of([&] { Checkpoint c(out); }), HasSubstr(out + "/model.gguf: "));
  fs::remove(out + "/model.gguf");
  EXPECT_THAT(error_of([&] { Checkpoint c(out); }),
              HasSubstr("no model.safetensors, model.safetensors.index.json or model.gguf"));
}

TEST(GgufInPlace, ASplitTargetReadsAsOneFromItsFirstFile) {
  TempDir tmp;
  ::setenv("FLASHMAP_CACHE_DIR", (tmp.path / "cache").c_str(), 1);
  // Given through a link of another name: the files are found beside the one it points to.
  fs::create_symlink(fs::canonical(kDir + "/tiny-a-split-00001-of-00003.gguf"),
                     tmp.path / "model.gguf");
  const Checkpoint want("tests/fixtures/tiny-a/target");
  const Checkpoint got(gguf_model_folder((tmp.path / "model.gguf").string()));
  EXPECT_EQ(got.names(), want.names());
  std::set<std::string> files;
  for (const auto& name : want.names()) {
    SCOPED_TRACE(name);
    const TensorView &w = want.get(name), &g = got.get(name);
    ASSERT_EQ(g.shape, w.shape);
    EXPECT_EQ(std::memcmp(g.data, w.data, w.nbytes()), 0);
    files.insert(fs::path(g.file).filename().string());
  }
  // Errors about a tensor name the part holding it.
  EXPECT_EQ(files, (std::set<std::string>{"tiny-a-split-00001-of-00003.gguf",
                                          "tiny-a-split-00002-of-00003.gguf",
                                          "tiny-a-split-00003-of-00003.gguf"}));
  // A missing part fails naming it.
  for (const char* part : {"00001", "00002", "00003"})
    fs::copy_file(kDir + "/tiny-a-split-" + part + "-of-00003.gguf",
                  tmp.path / (std::string("copy-") + part + "-of-00003.gguf"));
  fs::remove(tmp.path / "copy-00003-of-00003.gguf");
  EXPECT_THAT(
      error_of([&] { gguf_model_folder((tmp.path / "copy-00001-of-00003.gguf").string()); }),
      HasSubstr("copy-00003-of-00003.gguf: cannot open"));
  ::unsetenv("FLASHMAP_CACHE_DIR");
}
