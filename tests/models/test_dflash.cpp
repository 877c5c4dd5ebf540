// DFlash drafter parity against tests/fixtures/dflash (tools/make_dflash_fixtures.py, reference
// dflash==0.1.0 and speculators==0.9.0): target features, projected context, block hidden
// states and logits of one drafting round for both file formats; config errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "error_of.h"
#include "io/safetensors.h"
#include "models/dflash.h"
#include "models/qwen3.h"

using flashmap::testing::error_of;

using namespace flashmap;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {
const std::string kDir = "tests/fixtures/dflash";
const std::string kTarget = "tests/fixtures/tiny-a/target";

// max |a - ref| / max |ref|
double rel_diff(const float* a, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return diff / scale;
}

struct Expected {
  SafetensorsFile f{kDir + "/expected.safetensors"};
  std::vector<float> f32(const std::string& n) const { return f.get(n).to_f32(); }
  std::vector<int64_t> i64(const std::string& n) const { return f.get(n).to_i64(); }
};

// One round after prefilling the prompt: context = the prompt's features, block at position P.
struct Round {
  std::vector<float> logits, hidden;
};
Round draft_round(const DFlashModel& d, const std::vector<float>& features, int64_t P,
                  int32_t anchor) {
  DFlashContext ctx = d.new_context();
  d.extend_context(ctx, features.data(), P);
  const int B = d.block_size();
  Round r;
  r.logits.resize(size_t((B - 1) * d.vocab_size()));
  r.hidden.resize(size_t(B * d.config().layers.hidden_size));
  DFlashModel::Request req{&ctx, anchor};
  d.draft({&req, 1}, B, r.logits.data(), r.hidden.data());
  EXPECT_EQ(ctx.length, P);  // the block is not kept
  return r;
}

}  // namespace

TEST(DFlash, TargetFeaturesMatchReference) {
  Expected e;
  Qwen3Model target(kTarget);
  const auto prompt = e.i64("prompt_ids");
  std::vector<int32_t> toks(prompt.begin(), prompt.end());
  KVCache cache = target.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&cache, toks};
  const std::vector<int> taps = {0, 2};  // z-lab ids = speculators [1, 3] - 1
  target.forward({&s, 1}, Qwen3Model::Logits::Last, taps, out);
  EXPECT_LE(rel_diff(out.features.data(), e.f32("context_features")), 1e-5);
  const int64_t V = target.config().vocab_size;
  EXPECT_EQ(std::max_element(out.logits.begin(), out.logits.begin() + V) - out.logits.begin(),
            e.i64("anchor_id")[0]);
}

TEST(DFlash, ConfigsNormalizeBothFormats) {
  const auto z = DFlashConfig::from_file(kDir + "/zlab/config.json");
  const auto s = DFlashConfig::from_file(kDir + "/speculators/config.json");
  EXPECT_EQ(z.format, DFlashConfig::Format::ZLab);
  EXPECT_EQ(s.format, DFlashConfig::Format::Speculators);
  for (const auto* c : {&z, &s}) {
    EXPECT_EQ(c->target_layer_ids, (std::vector<int>{0, 2}));
    EXPECT_EQ(c->block_size, 4);
    EXPECT_EQ(c->mask_token_id, 1000);
    EXPECT_EQ(c->layers.hidden_size, 64);
    EXPECT_EQ(c->layers.head_dim, 16);
    EXPECT_EQ(c->layers.num_hidden_layers, 2);
    EXPECT_DOUBLE_EQ(c->layers.rope_theta, 20011.0);
  }
  EXPECT_FALSE(z.reduced_vocab());
  EXPECT_TRUE(s.reduced_vocab());
  EXPECT_EQ(s.draft_vocab_size, 640);
  EXPECT_TRUE(DFlashConfig::is_dflash(kDir + "/zlab"));
  EXPECT_FALSE(DFlashConfig::is_dflash(kTarget));
}

TEST(DFlash, ZLabBlockMatchesReference) {
  Expected e;
  Qwen3Model target(kTarget);
  DFlashModel d(kDir + "/zlab", target);
  const auto features = e.f32("context_features");
  const int64_t P = int64_t(e.i64("prompt_ids").size());
  std::vector<float> projected(size_t(P * 64));
  d.project_context(features.data(), P, projected.data());
  EXPECT_LE(rel_diff(projected.data(), e.f32("zlab.projected_context")), 1e-4);

  const auto r = draft_round(d, features, P, int32_t(e.i64("anchor_id")[0]));
  EXPECT_LE(rel_diff(r.hidden.data(), e.f32("zlab.block_hidden")), 1e-4);
  EXPECT_LE(rel_diff(r.logits.data(), e.f32("zlab.block_logits")), 1e-4);
  const auto ids = e.i64("zlab.draft_ids");
  const int64_t V = d.vocab_size();
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::max_element(r.logits.begin() + i * V, r.logits.begin() + (i + 1) * V) -
                  (r.logits.begin() + i * V),
              ids[size_t(i)]);
}

TEST(DFlash, SpeculatorsBlockMatchesReferenceThroughD2t) {
  Expected e;
  Qwen3Model target(kTarget);
  DFlashModel d(kDir + "/speculators", target);
  const auto features = e.f32("context_features");
  const int64_t P = int64_t(e.i64("prompt_ids").size());
  const auto r = draft_round(d, features, P, int32_t(e.i64("anchor_id")[0]));
  EXPECT_LE(rel_diff(r.hidden.data(), e.f32("speculators.block_hidden")), 1e-4);
  // Our logits are over target ids: gather the draft vocabulary's through d2t.
  const auto& d2t = d.weights().d2t_ids;
  ASSERT_EQ(d2t.size(), 640u);
  const int64_t V = d.vocab_size();
  std::vector<float> gathered;
  int64_t outside = 0;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t t : d2t) gathered.push_back(r.logits[size_t(i * V + t)]);
    for (int64_t t = 0; t < V; ++t) outside += std::isinf(r.logits[size_t(i * V + t)]);
  }
  EXPECT_EQ(outside, 3 * (V - 640));
  EXPECT_LE(rel_diff(gathered.data(), e.f32("speculators.block_logits")), 1e-4);
  const auto ids = e.i64("speculators.draft_ids_target");
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::max_element(r.logits.begin() + i * V, r.logits.begin() + (i + 1) * V) -
                  (r.logits.begin() + i * V),
              ids[size_t(i)]);
}

TEST(DFlash, ExtendInPiecesEqualsOnce) {
  Expected e;
  Qwen3Model target(kTarget);
  DFlashModel d(kDir + "/zlab", target);
  const auto features = e.f32("context_features");
  DFlashContext a = d.new_context(), b = d.new_context();
  d.extend_context(a, features.data(), 11);
  d.extend_context(b, features.data(), 4);
  d.extend_context(b, features.data() + 4 * 128, 7);
  const int64_t n = 11 * 2 * 16;
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(0, std::memcmp(a.k[l].data(), b.k[l].data(), size_t(n) * 4));
    EXPECT_EQ(0, std::memcmp(a.v[l].data(), b.v[l].data(), size_t(n) * 4));
  }
}

namespace {
// A copy of a fixture folder with its config.json edited.
std::string edited(const std::string& fmt_name, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path src = fs::path(kDir) / fmt_name;
  const fs::path dst = fs::temp_directory_path() /
                       ("flashmap_dflash_" + fmt_name + "_" + std::to_string(::getpid()));
  fs::create_directories(dst);
  fs::copy_file(src / "model.safetensors", dst / "model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json j;
  std::ifstream(src / "config.json") >> j;
  edit(j);
  std::ofstream(dst / "config.json") << j.dump(2);
  return dst.string();
}
}  // namespace

TEST(DFlash, ConfigErrorsNameFileAndField) {
  Qwen3Model target(kTarget);
  auto load = [&](const std::string& dir) { return error_of([&] { DFlashModel d(dir, target); }); };
  std::string dir = edited("speculators", [](auto& j) { j["speculators_model_type"] = "dflash2"; });
  EXPECT_THAT(load(dir), HasSubstr("speculators_model_type"));
  EXPECT_THAT(load(dir), HasSubstr(dir + "/config.json"));
  dir = edited("speculators", [](auto& j) { j["aux_hidden_state_layer_ids"] = {1, 4}; });
  EXPECT_THAT(load(dir), HasSubstr("'aux_hidden_state_layer_ids' has 4"));
  dir = edited("speculators", [](auto& j) { j["sample_from_anchor"] = true; });
  EXPECT_THAT(load(dir), HasSubstr("sample_from_anchor"));
  dir = edited("speculators", [](auto& j) { j["transformer_layer_config"]["hidden_size"] = 32; });
  EXPECT_THAT(load(dir), HasSubstr("transformer_layer_config.hidden_size"));
  dir = edited("zlab", [](auto& j) { j["dflash_config"]["target_layer_ids"] = {0, 3}; });
  EXPECT_THAT(load(dir), HasSubstr("'target_layer_ids' has 3"));
  dir = edited("zlab", [](auto& j) { j["hidden_size"] = 32; });
  EXPECT_THAT(load(dir), HasSubstr("'hidden_size' is 32"));
  dir = edited("zlab", [](auto& j) {
    j["layer_types"] = {"full_attention", "sliding_attention"};
    j["use_sliding_window"] = true;
    j["sliding_window"] = 16;
  });
  EXPECT_THAT(load(dir), HasSubstr("sliding"));
  dir = edited("zlab", [](auto& j) { j["architectures"] = {"DFlash2DraftModel"}; });
  EXPECT_THAT(load(dir), HasSubstr("DFlash2DraftModel"));
  dir = edited("speculators", [](auto& j) { j["draft_vocab_size"] = 600; });
  EXPECT_THAT(load(dir), HasSubstr("lm_head.weight"));
  for (const char* name : {"zlab", "speculators"})
    fs::remove_all(fs::temp_directory_path() /
                   (std::string("flashmap_dflash_") + name + "_" + std::to_string(::getpid())));
}

// The z-lab greedy loop (dflash/model.py:179-324, docs/DFLASH.md §4) with our target and drafter:
// the output must equal the reference's (= the target's greedy decode), and each round's drafts
// the reference's, which checks the context cache across rounds and the shorter last blocks.
TEST(DFlash, ZLabGreedyLoopMatchesReference) {
  Qwen3Model target(kTarget);
  DFlashModel d(kDir + "/zlab", target);
  nlohmann::json expected;
  std::ifstream(kDir + "/expected.json") >> expected;
  const int64_t V = target.config().vocab_size;
  const std::vector<int> taps = d.target_layer_ids();
  auto argmax = [&](const float* row) { return int32_t(std::max_element(row, row + V) - row); };
  for (const auto& run : expected["zlab_greedy"]) {
    const auto prompt = run["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = run["output_ids"].get<std::vector<int32_t>>();
    const auto want_drafts = run["draft_ids_per_round"].get<std::vector<std::vector<int32_t>>>();
    const auto want_accept = run["acceptance_lengths"].get<std::vector<int>>();
    const int64_t max_length = int64_t(prompt.size()) + run["max_new_tokens"].get<int64_t>();
    SCOPED_TRACE(::testing::PrintToString(prompt));

    KVCache cache = target.new_cache();
    DFlashContext ctx = d.new_context();
    Qwen3Model::Output out;
    Qwen3Model::SeqInput s{&cache, prompt};
    target.forward({&s, 1}, Qwen3Model::Logits::All, taps, out);
    std::vector<int32_t> output = prompt;
    output.push_back(argmax(out.logits.data() + (int64_t(prompt.size()) - 1) * V));
    std::vector<float> features = out.features;
    int64_t new_features = int64_t(prompt.size());
    std::vector<std::vector<int32_t>> drafts;
    std::vector<int> accepts;
    int64_t start = int64_t(prompt.size());
    while (start + 1 < max_length) {
      const int block = int(std::min<int64_t>(d.block_size(), max_length - start));
      d.extend_context(ctx, features.data(), new_features);
      ASSERT_EQ(ctx.length, start);
      std::vector<float> logits(size_t((block - 1) * V));
      DFlashModel::Request req{&ctx, output.back()};
      d.draft({&req, 1}, block, logits.data());
      std::vector<int32_t> verify = {output.back()};
      for (int i = 0; i < block - 1; ++i) verify.push_back(argmax(logits.data() + i * V));
      drafts.emplace_back(verify.begin() + 1, verify.end());
      Qwen3Model::SeqInput v{&cache, verify};
      target.forward({&v, 1}, Qwen3Model::Logits::All, taps, out);
      int a = 0;
      while (a < block - 1 && verify[size_t(a + 1)] == argmax(out.logits.data() + a * V)) ++a;
      for (int i = 1; i <= a; ++i) output.push_back(verify[size_t(i)]);
      output.push_back(argmax(out.logits.data() + a * V));
      accepts.push_back(a + 1);
      start += a + 1;
      cache.truncate(start);
      const int64_t F = int64_t(taps.size()) * target.config().hidden_size;
      features.assign(out.features.begin(), out.features.begin() + (a + 1) * F);
      new_features = a + 1;
    }
    output.resize(std::min<size_t>(output.size(), size_t(max_length)));
    EXPECT_EQ(output, want);
    EXPECT_EQ(accepts, want_accept);
    EXPECT_EQ(drafts, want_drafts);
  }
}
