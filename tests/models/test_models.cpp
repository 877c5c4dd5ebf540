// Model-level invariants that the parity fixtures do not cover: batch invariance (what makes
// speculative greedy decoding exactly equal to target-alone decoding), cache truncation, and
// drafter/target compatibility errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "error_of.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "temp_dir.h"

using namespace flashmap;
using flashmap::testing::error_of;
using flashmap::testing::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {
const std::string kA = "tests/fixtures/tiny-a";
const std::string kTarget = kA + "/target";
const std::vector<int32_t> kPrompt = {5, 17, 300, 2, 999, 41, 7};
const std::vector<int32_t> kBlock = {11, 12, 13, 14, 15, 16, 17, 18, 19};

std::vector<float> run(const Qwen3Model& m, KVCache& c, std::span<const int32_t> toks,
                       std::vector<float>* features = nullptr, std::span<const int> taps = {}) {
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, toks};
  m.forward({&s, 1}, Qwen3Model::Logits::All, taps, out);
  if (features) *features = out.features;
  return out.logits;
}
}  // namespace

TEST(Qwen3, VerifyPassIsBitIdenticalToStepByStep) {
  // fp32 weights, and bf16 weights (whose multi-row path widens weight tiles once).
  for (const std::string& dir : {kTarget, kA + "/target_bf16"}) {
    SCOPED_TRACE(dir);
    Qwen3Model m(dir);
    const int64_t V = m.config().vocab_size;
    KVCache a = m.new_cache(), b = m.new_cache();
    run(m, a, kPrompt);
    run(m, b, kPrompt);
    const auto block = run(m, a, kBlock);
    for (size_t i = 0; i < kBlock.size(); ++i) {
      const auto step = run(m, b, std::span(kBlock).subspan(i, 1));
      ASSERT_EQ(0, std::memcmp(step.data(), block.data() + int64_t(i) * V, size_t(V) * 4))
          << "row " << i;
    }
  }
}

TEST(Qwen3, BatchOfDifferentLengthsEqualsOneByOne) {
  Qwen3Model m(kTarget);
  const int64_t V = m.config().vocab_size;
  KVCache a = m.new_cache(), b = m.new_cache();
  run(m, a, kPrompt);
  const auto alone_b = run(m, b, kBlock);
  const auto alone_a = run(m, a, std::span(kBlock).first(3));
  KVCache a2 = m.new_cache(), b2 = m.new_cache();
  run(m, a2, kPrompt);
  Qwen3Model::SeqInput batch[] = {{&a2, std::span(kBlock).first(3)}, {&b2, kBlock}};
  Qwen3Model::Output out;
  m.forward(batch, Qwen3Model::Logits::All, {}, out);
  ASSERT_EQ(out.logits.size(), size_t(12 * V));
  EXPECT_EQ(0, std::memcmp(out.logits.data(), alone_a.data(), alone_a.size() * 4));
  EXPECT_EQ(0, std::memcmp(out.logits.data() + 3 * V, alone_b.data(), alone_b.size() * 4));
}

TEST(Qwen3, TruncateThenReforwardEqualsFresh) {
  Qwen3Model m(kTarget);
  KVCache a = m.new_cache(), b = m.new_cache();
  run(m, a, kPrompt);
  run(m, a, kBlock);
  a.truncate(int64_t(kPrompt.size()) + 2);  // keep two of the block
  const auto again = run(m, a, std::span(kBlock).subspan(2, 3));
  std::vector<int32_t> all = kPrompt;
  all.insert(all.end(), kBlock.begin(), kBlock.begin() + 5);
  const auto fresh = run(m, b, all);
  const int64_t V = m.config().vocab_size;
  EXPECT_EQ(0, std::memcmp(again.data(), fresh.data() + int64_t(all.size() - 3) * V, 3 * V * 4));
}

TEST(Qwen3, TokenOutsideVocabulary) {
  Qwen3Model m(kTarget);
  KVCache c = m.new_cache();
  std::vector<int32_t> bad = {1, 5000};
  try {
    run(m, c, bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("token id 5000 is outside the vocabulary"));
  }
}

// A config whose quantization_config does not describe its weights names both.
TEST(Qwen3, QuantizationConfigMustDescribeTheWeights) {
  const auto load_with = [](const std::string& from, const nlohmann::json& q) {
    TempDir d("flashmap-quant-config");
    fs::copy_file(from + "/model.safetensors", d.path / "model.safetensors");
    auto cfg = nlohmann::json::parse(std::ifstream(from + "/config.json"));
    if (q.is_null())
      cfg.erase("quantization_config");
    else
      cfg["quantization_config"] = q;
    std::ofstream(d.path / "config.json") << cfg.dump();
    return error_of([&] { Qwen3Model m(d.path.string()); });
  };
  const nlohmann::json fp8 = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const std::string quant = "tests/fixtures/quant";
  EXPECT_THAT(load_with(kTarget, fp8),
              HasSubstr("config.json's quantization_config says fp8, but the weights are none"));
  EXPECT_THAT(load_with(quant + "/fp8", nullptr),
              HasSubstr("config.json's quantization_config says none, but the weights are fp8"));
  EXPECT_THAT(load_with(quant + "/awq", fp8),
              HasSubstr("config.json's quantization_config says fp8, but the weights are awq"));
  EXPECT_EQ(load_with(quant + "/fp8", fp8), "<no error>");
}

TEST(FlashMap, BatchedDraftEqualsSeparateDrafts) {
  Qwen3Model m(kTarget);
  FlashMapModel d(kA + "/draft", m);
  const int64_t K = d.block_size(), V = m.config().vocab_size;
  std::vector<float> feats;
  KVCache c = m.new_cache();
  run(m, c, kPrompt, &feats, d.target_layer_ids());
  auto ctx_of = [&](int64_t n) {
    FlashMapContext ctx = d.new_context();
    d.extend_context(ctx, feats.data(), n);
    return ctx;
  };
  for (int steps : {1, 2}) {
    FlashMapContext c1 = ctx_of(3), c2 = ctx_of(6), c3 = ctx_of(3), c4 = ctx_of(6);
    Rng r1(1), r2(2), r3(1), r4(2);
    using N = FlashMapModel::Noise;
    FlashMapModel::Request both[] = {{&c1, 7, {N::Draw, nullptr, &r1}},
                                     {&c2, 9, {N::Draw, nullptr, &r2}}};
    std::vector<float> batched(size_t(2 * K * V)), one(size_t(K * V)), two(size_t(K * V));
    d.draft(both, steps, batched.data());
    FlashMapModel::Request a{&c3, 7, {N::Draw, nullptr, &r3}}, b{&c4, 9, {N::Draw, nullptr, &r4}};
    d.draft({&a, 1}, steps, one.data());
    d.draft({&b, 1}, steps, two.data());
    EXPECT_EQ(0, std::memcmp(batched.data(), one.data(), one.size() * 4)) << steps;
    EXPECT_EQ(0, std::memcmp(batched.data() + K * V, two.data(), two.size() * 4)) << steps;
  }
}

// A checkpoint held in memory (the benchmarks' random weights at released shapes) loads into
// the same models as the folder it was copied from, and frees each packed tensor's bytes (a
// random Qwen3-8B would otherwise be held twice in memory).
static std::unique_ptr<Checkpoint> copy_in_memory(const std::string& dir) {
  Checkpoint folder(dir);
  std::vector<TensorData> t;
  for (const auto& name : folder.names()) {
    const TensorView& v = folder.get(name);
    const auto* b = static_cast<const uint8_t*>(v.data);
    t.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(b, b + v.nbytes())});
  }
  return Checkpoint::from_tensors(std::move(t), "in memory " + dir);
}

TEST(FlashMap, ModelsFromMemoryEqualModelsFromTheirFolder) {
  Qwen3Model folder_target(kTarget);
  Qwen3Model memory_target(folder_target.config(), copy_in_memory(kTarget));
  // Packed linear weights are gone from memory; the embedding stays for row lookups.
  EXPECT_EQ(memory_target.checkpoint().get("model.layers.0.mlp.up_proj.weight").data, nullptr);
  EXPECT_NE(memory_target.checkpoint().get("model.embed_tokens.weight").data, nullptr);
  FlashMapModel folder_draft(kA + "/draft", folder_target);
  FlashMapModel memory_draft(folder_draft.config(), copy_in_memory(kA + "/draft"), memory_target);
  std::vector<float> f1, f2;
  KVCache c1 = folder_target.new_cache(), c2 = memory_target.new_cache();
  const auto l1 = run(folder_target, c1, kPrompt, &f1, folder_draft.target_layer_ids());
  const auto l2 = run(memory_target, c2, kPrompt, &f2, memory_draft.target_layer_ids());
  ASSERT_EQ(l1.size(), l2.size());
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * 4));
  EXPECT_EQ(f1, f2);
  const int64_t K = folder_draft.block_size(), V = folder_target.config().vocab_size;
  FlashMapContext x1 = folder_draft.new_context(), x2 = memory_draft.new_context();
  folder_draft.extend_context(x1, f1.data(), int64_t(kPrompt.size()));
  memory_draft.extend_context(x2, f2.data(), int64_t(kPrompt.size()));
  Rng r1(3), r2(3);
  using N = FlashMapModel::Noise;
  FlashMapModel::Request a{&x1, 7, {N::Draw, nullptr, &r1}}, b{&x2, 7, {N::Draw, nullptr, &r2}};
  std::vector<float> d1(size_t(K * V)), d2(size_t(K * V));
  folder_draft.draft({&a, 1}, 2, d1.data());
  memory_draft.draft({&b, 1}, 2, d2.data());
  EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), d1.size() * 4));
}

TEST(FlashMap, DrafterThatDoesNotFitTheTarget) {
  Qwen3Model other("tests/fixtures/tiny-c/target");
  try {
    FlashMapModel d(kA + "/draft", other);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.json"));
    EXPECT_THAT(e.what(), HasSubstr("vocab_size"));
  }
  // target_layer_ids beyond the target's layers.
  const auto dir = fs::temp_directory_path() / "flashmap-draft-layers";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kA + "/draft/model.safetensors", dir / "model.safetensors");
  auto cfg = nlohmann::json::parse(std::ifstream(kA + "/draft/config.json"));
  cfg["target_layer_ids"] = {0, 3};
  std::ofstream(dir / "config.json") << cfg.dump();
  Qwen3Model m(kTarget);
  try {
    FlashMapModel d(dir.string(), m);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("target_layer_ids 0, 3 need more than the target's 4 layers"));
  }
}

TEST(FlashMap, StepsNotInJumpGrids) {
  Qwen3Model m(kTarget);
  FlashMapModel d(kA + "/draft", m);
  try {
    d.grid(7);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("steps must be one of 1, 2, 3, 4"));
  }
}
