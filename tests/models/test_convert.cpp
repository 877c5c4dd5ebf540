// `flashmap convert` (io/convert.h): speculators' own conversion of the z-lab fixture
// (tests/fixtures/dflash/speculators-full, DFlashConverter of speculators==0.9.0) converts back to
// tests/fixtures/dflash/zlab tensor for tensor and field for field, and the engine drafts with it
// as the reference did; the speculators-style FlashMap layout (this project's definition) converts
// back to tests/fixtures/tiny-a/draft; SpecForge exports are checked and copied; bad input is one
// error naming the file and field or tensor, and nothing is written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "error_of.h"
#include "io/convert.h"
#include "io/draft_vocab.h"
#include "io/safetensors.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "temp_dir.h"

using namespace flashmap;
using flashmap::testing::error_of;
using flashmap::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
const std::string kDFlash = "tests/fixtures/dflash";
const std::string kTarget = "tests/fixtures/tiny-a/target";
const std::string kFlashMapSpec = "tests/fixtures/convert/flashmap-speculators";
const std::string kFlashMapRelease = "tests/fixtures/tiny-a/draft";

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}
void write_json(const fs::path& p, const json& j) {
  std::ofstream(p) << j.dump(2);
}

// A copy of `from` in `to`, whose config.json `edit` may change.
void copy_folder(const std::string& from, const std::string& to,
                 const std::function<void(json&)>& edit = {}) {
  fs::create_directories(to);
  for (auto& e : fs::directory_iterator(from))
    fs::copy_file(e.path(), fs::path(to) / e.path().filename());
  if (edit) {
    json j = read_json(fs::path(to) / "config.json");
    edit(j);
    write_json(fs::path(to) / "config.json", j);
  }
}

// Rewrites model.safetensors of `dir` with `edit` applied to the tensors.
void edit_tensors(const std::string& dir,
                  const std::function<void(std::vector<TensorData>&)>& edit) {
  const auto path = (fs::path(dir) / "model.safetensors").string();
  std::vector<TensorData> ts;
  {
    SafetensorsFile f(path);
    for (auto& [name, v] : f.tensors()) {
      const auto* b = static_cast<const uint8_t*>(v.data);
      ts.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(b, b + v.nbytes())});
    }
  }
  edit(ts);
  write_safetensors(path, ts);
}
TensorData& tensor(std::vector<TensorData>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// Every tensor of `a` and `b`: same names, dtypes, shapes and bytes.
void expect_same_tensors(const std::string& a, const std::string& b) {
  SafetensorsFile fa(a + "/model.safetensors"), fb(b + "/model.safetensors");
  std::vector<std::string> na, nb;
  for (auto& [n, _] : fa.tensors()) na.push_back(n);
  for (auto& [n, _] : fb.tensors()) nb.push_back(n);
  ASSERT_EQ(na, nb);
  for (auto& [n, ta] : fa.tensors()) {
    const auto& tb = fb.get(n);
    EXPECT_EQ(ta.dtype, tb.dtype) << n;
    EXPECT_EQ(ta.shape, tb.shape) << n;
    EXPECT_TRUE(ta.nbytes() == tb.nbytes() && std::memcmp(ta.data, tb.data, ta.nbytes()) == 0)
        << n << " differs";
  }
}

ConvertResult convert(const std::string& in, const std::string& out,
                      ConvertSource from = ConvertSource::Auto, bool force = false,
                      const std::string& target = "") {
  ConvertOptions o;
  o.in = in;
  o.out = out;
  o.from = from;
  o.force = force;
  o.target = target;
  return convert_checkpoint(o);
}

double rel_diff(const float* a, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return diff / scale;
}
}  // namespace

TEST(Convert, SpeculatorsDFlashBecomesTheZLabFixture) {
  TempDir d;
  const auto out = d / "zlab";
  const auto r = convert(kDFlash + "/speculators-full", out);
  EXPECT_EQ(r.source, "speculators");
  EXPECT_EQ(r.kind, "DFlash");
  EXPECT_EQ(r.target, kTarget);  // the config's verifier, a local folder
  EXPECT_EQ(r.tensors, 25u);
  EXPECT_TRUE(r.dropped.empty());
  expect_same_tensors(out, kDFlash + "/zlab");
  // Field for field, but auto_map: the release's points at a dflash.py shipped beside the
  // weights on the hub, which a conversion does not have.
  json want = read_json(kDFlash + "/zlab/config.json");
  want.erase("auto_map");
  EXPECT_EQ(read_json(out + "/config.json"), want);
  EXPECT_EQ(d.entries(), std::vector<std::string>{"zlab"});  // no temporary folder left

  // The engine drafts with it as the reference did with the z-lab fixture.
  SafetensorsFile e(kDFlash + "/expected.safetensors");
  Qwen3Model target(kTarget);
  DFlashModel m(out, target);
  EXPECT_EQ(m.target_layer_ids(), (std::vector<int>{0, 2}));
  const auto features = e.get("context_features").to_f32();
  const int64_t P = e.get("prompt_ids").numel();
  DFlashContext ctx = m.new_context();
  m.extend_context(ctx, features.data(), P);
  const int B = m.block_size();
  std::vector<float> logits(size_t((B - 1) * m.vocab_size()));
  DFlashModel::Request req{&ctx, int32_t(e.get("anchor_id").to_i64()[0])};
  m.draft({&req, 1}, B, logits.data());
  EXPECT_LE(rel_diff(logits.data(), e.get("zlab.block_logits").to_f32()), 1e-4);
  const auto ids = e.get("zlab.draft_ids").to_i64();
  const int64_t V = m.vocab_size();
  for (int64_t i = 0; i < B - 1; ++i)
    EXPECT_EQ(std::max_element(logits.begin() + i * V, logits.begin() + (i + 1) * V) -
                  (logits.begin() + i * V),
              ids[size_t(i)]);
}

TEST(Convert, WithoutATargetNumTargetLayersIsLeftOut) {
  TempDir d;
  copy_folder(kDFlash + "/speculators-full", d / "in", [](json& j) {
    j["speculators_config"]["verifier"]["name_or_path"] = "org/not-here";
  });
  const auto r = convert(d / "in", d / "out", ConvertSource::Speculators);
  EXPECT_EQ(r.target, "");
  json want = read_json(kDFlash + "/zlab/config.json");
  want.erase("auto_map");
  want.erase("num_target_layers");
  EXPECT_EQ(read_json(d / "out/config.json"), want);
  // --target fills it in and checks the fit.
  const auto r2 = convert(d / "in", d / "out", ConvertSource::Speculators, true, kTarget);
  EXPECT_EQ(r2.target, kTarget);
  EXPECT_EQ(read_json(d / "out/config.json")["num_target_layers"], 4);
}

TEST(Convert, FullVocabularyExtrasAreDroppedWithTheReason) {
  TempDir d;
  copy_folder(kDFlash + "/speculators-full", d / "in");
  edit_tensors(d / "in", [](std::vector<TensorData>& ts) {
    ts.push_back(make_tensor("lm_head.weight", {1024, 64}, std::vector<float>(1024 * 64, 0.5f)));
    ts.push_back(make_tensor("verifier_norm.weight", {64}, std::vector<float>(64, 1.0f)));
  });
  const auto r = convert(d / "in", d / "out");
  ASSERT_EQ(r.dropped.size(), 2u);
  EXPECT_THAT(r.dropped[0], HasSubstr("lm_head.weight (full vocabulary"));
  EXPECT_THAT(r.dropped[1], HasSubstr("verifier_norm.weight (training only)"));
  expect_same_tensors(d / "out", kDFlash + "/zlab");
}

// A sharded bf16 checkpoint: one model.safetensors out, every bf16 tensor's bytes as they were.
TEST(Convert, ShardedBf16IsCopiedByteForByte) {
  TempDir d;
  const auto in = d / "in";
  fs::create_directories(in);
  fs::copy_file(kDFlash + "/speculators-full/config.json", in + "/config.json");
  std::vector<TensorData> shard[2];
  json index = {{"weight_map", json::object()}};
  {
    SafetensorsFile f(kDFlash + "/speculators-full/model.safetensors");
    int i = 0;
    for (auto& [name, t] : f.tensors()) {
      const int k = i++ % 2;
      shard[k].push_back(make_tensor(name, t.shape, t.to_f32(), DType::BF16));
      index["weight_map"][name] = fmt::format("model-0000{}-of-00002.safetensors", k + 1);
    }
  }
  for (int k = 0; k < 2; ++k)
    write_safetensors(fmt::format("{}/model-0000{}-of-00002.safetensors", in, k + 1), shard[k]);
  write_json(in + "/model.safetensors.index.json", index);
  const auto r = convert(in, d / "out");
  EXPECT_EQ(r.tensors, 25u);
  SafetensorsFile out(d / "out/model.safetensors");
  EXPECT_EQ(out.tensors().size(), 25u);
  for (auto& s : shard)
    for (auto& t : s) {
      const auto& o = out.get(t.name);
      EXPECT_EQ(o.dtype, DType::BF16) << t.name;
      EXPECT_TRUE(o.nbytes() == t.bytes.size() &&
                  std::memcmp(o.data, t.bytes.data(), o.nbytes()) == 0)
          << t.name;
    }
  Qwen3Model target(kTarget);
  DFlashModel m(d / "out", target);  // and the engine loads it
}

TEST(Convert, SpeculatorsFlashMapBecomesTheReleaseFolder) {
  TempDir d;
  const auto out = d / "draft";
  const auto r = convert(kFlashMapSpec, out);
  EXPECT_EQ(r.kind, "FlashMap");
  EXPECT_EQ(r.tensors, 66u);
  expect_same_tensors(out, kFlashMapRelease);
  EXPECT_EQ(read_json(out + "/config.json"), read_json(kFlashMapRelease + "/config.json"));
  Qwen3Model target(kTarget);
  FlashMapModel m(out, target);
  EXPECT_EQ(m.config().target_layer_ids, (std::vector<int>{0, 2}));
  // And the release folder itself, as SpecForge's layout by analogy: checked and copied.
  const auto r2 = convert(kFlashMapRelease, d / "copy", ConvertSource::SpecForge, false, kTarget);
  EXPECT_EQ(r2.kind, "FlashMap");
  expect_same_tensors(d / "copy", kFlashMapRelease);
  EXPECT_EQ(read_json(d / "copy/config.json"), read_json(kFlashMapRelease + "/config.json"));
}

TEST(Convert, SpecForgeDFlashExportIsCheckedAndCopied) {
  TempDir d;
  // What SpecForge's export adds to the z-lab layout: its default projector_type, and the flat
  // rope_theta that apply_legacy_rope_scaling mirrors.
  copy_folder(kDFlash + "/zlab", d / "sf", [](json& j) {
    j["dflash_config"]["projector_type"] = "dflash";
    j["dflash_config"]["shift_label"] = false;
    j["rope_theta"] = 20011.0;
  });
  const auto r = convert(d / "sf", d / "out", ConvertSource::SpecForge);
  EXPECT_EQ(r.source, "specforge");
  EXPECT_EQ(r.kind, "DFlash");
  expect_same_tensors(d / "out", kDFlash + "/zlab");
  json want = read_json(kDFlash + "/zlab/config.json");
  want["rope_theta"] = 20011.0;
  EXPECT_EQ(read_json(d / "out/config.json"), want);

  copy_folder(kDFlash + "/zlab", d / "domino",
              [](json& j) { j["dflash_config"]["projector_type"] = "domino"; });
  EXPECT_THAT(error_of([&] { convert(d / "domino", d / "x", ConvertSource::SpecForge); }),
              HasSubstr("field 'dflash_config.projector_type' is \"domino\": a Domino/DSpark"));
  copy_folder(kDFlash + "/zlab", d / "shift",
              [](json& j) { j["dflash_config"]["shift_label"] = true; });
  EXPECT_THAT(error_of([&] { convert(d / "shift", d / "x", ConvertSource::SpecForge); }),
              HasSubstr("field 'dflash_config.shift_label' is true"));
  EXPECT_THAT(
      error_of([&] { convert(kDFlash + "/speculators-full", d / "x", ConvertSource::SpecForge); }),
      HasSubstr("a speculators checkpoint, use --from speculators"));
  EXPECT_FALSE(fs::exists(d / "x"));
}

TEST(Convert, AutoRefusesAReleaseFolder) {
  TempDir d;
  EXPECT_THAT(error_of([&] { convert(kDFlash + "/zlab", d / "x"); }),
              HasSubstr("zlab/config.json: already in the z-lab DFlash release format, nothing "
                        "to convert"));
  EXPECT_THAT(error_of([&] { convert(kFlashMapRelease, d / "x"); }),
              HasSubstr("already in the FlashMap release format"));
  EXPECT_THAT(error_of([&] { convert(kTarget, d / "x"); }),
              HasSubstr("target/config.json: not a DFlash or FlashMap drafter"));
  EXPECT_THAT(error_of([&] { parse_convert_source("eagle"); }),
              HasSubstr("--from: unknown source 'eagle'"));
}

TEST(Convert, ReducedVocabularyIsRefusedAfterItsMapIsChecked) {
  TempDir d;
  EXPECT_THAT(error_of([&] { convert(kDFlash + "/speculators", d / "x"); }),
              HasSubstr("speculators/config.json: field 'draft_vocab_size' is 640 < vocab_size "
                        "1024: a reduced vocabulary (own lm_head, d2t/t2d) cannot be expressed "
                        "in the z-lab release format"));
  EXPECT_FALSE(fs::exists(d / "x"));
  // A map that is not a one-to-one subset: named by the converter and by the engine's loader.
  Qwen3Model target(kTarget);
  struct Case {
    std::function<void(std::vector<TensorData>&)> edit;
    std::string error;
  };
  auto set_d2t = [](std::vector<TensorData>& ts, int64_t j, int64_t value) {
    std::memcpy(tensor(ts, "d2t").bytes.data() + 8 * j, &value, 8);
  };
  const std::vector<Case> cases = {
      // draft id 1 onto draft id 0's target id
      {[&](auto& ts) {
         int64_t d0;
         std::memcpy(&d0, tensor(ts, "d2t").bytes.data(), 8);
         set_d2t(ts, 1, d0 - 1);
       },
       "tensor 'd2t' maps draft ids 0 and 1 to the same target id"},
      {[&](auto& ts) { set_d2t(ts, 5, 5000); },
       "tensor 'd2t' maps draft id 5 to target id 5 + 5000, "
       "outside [0, 1024)"},
      {[&](auto& ts) { set_d2t(ts, 3, INT64_MAX); }, "outside [0, 1024)"},
      {[&](auto& ts) {
         auto& t2d = tensor(ts, "t2d").bytes;
         const auto it = std::find(t2d.begin(), t2d.end(), 0);
         *it = 1;
       },
       "tensor 't2d' marks 641 target ids, but draft_vocab_size is 640"},
      {[&](auto& ts) {
         // Move one mark: the count stays 640, but some d2t entry now points at an unmarked id.
         auto& t2d = tensor(ts, "t2d").bytes;
         auto marked = std::find(t2d.begin(), t2d.end(), 1);
         auto unmarked = std::find(t2d.begin(), t2d.end(), 0);
         std::swap(*marked, *unmarked);
       },
       "which 't2d' does not mark"},
      {[&](auto& ts) {
         tensor(ts, "d2t").shape = {320, 2};
       },
       "tensor 'd2t' has shape [320, 2], expected [draft_vocab_size 640]"},
      {[&](auto& ts) { tensor(ts, "t2d").dtype = DType::F32, tensor(ts, "t2d").shape = {256}; },
       "tensor 't2d' has shape [256], expected [vocab_size 1024]"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto dir = d / ("bad" + std::to_string(i));
    copy_folder(kDFlash + "/speculators", dir);
    edit_tensors(dir, cases[i].edit);
    EXPECT_THAT(error_of([&] { convert(dir, d / "x"); }), HasSubstr(cases[i].error)) << i;
    EXPECT_THAT(error_of([&] { DFlashModel m(dir, target); }), HasSubstr(cases[i].error)) << i;
  }
  EXPECT_FALSE(fs::exists(d / "x"));
}

TEST(Convert, ConfigsThatDoNotFitAreRefusedNamingTheField) {
  TempDir d;
  auto bad = [&](const std::string& name, const std::function<void(json&)>& edit,
                 const std::string& target = "") {
    copy_folder(kDFlash + "/speculators-full", d / name, edit);
    return error_of([&] { convert(d / name, d / "x", ConvertSource::Auto, false, target); });
  };
  EXPECT_THAT(bad("eagle3", [](json& j) { j["speculators_model_type"] = "eagle3"; }),
              HasSubstr("field 'speculators_model_type' is \"eagle3\": only \"dflash\" and "
                        "\"flashmap\""));
  EXPECT_THAT(bad("dflash2", [](json& j) { j["speculators_model_type"] = "dflash2"; }),
              HasSubstr("field 'speculators_model_type' is \"dflash2\""));
  EXPECT_THAT(bad("type", [](json& j) { j["speculators_model_type"] = 7; }),
              HasSubstr("field 'speculators_model_type' must be a string"));
  EXPECT_THAT(bad("last_layer",
                  [](json& j) {
                    j["aux_hidden_state_layer_ids"] = {1, 4};
                  }),
              HasSubstr("field 'aux_hidden_state_layer_ids' has 4 but the target "
                        "tests/fixtures/tiny-a/target has 4 layers"));
  EXPECT_THAT(bad(
                  "fits_other", [](json&) {}, "tests/fixtures/tiny-c/target"),
              HasSubstr("field 'transformer_layer_config.vocab_size' is 1024 but the target "
                        "tests/fixtures/tiny-c/target has 1536"));
  EXPECT_THAT(bad("hidden", [](json& j) { j["target_hidden_size"] = 80; }),
              HasSubstr("field 'target_hidden_size' is 80 but the target"));
  EXPECT_THAT(
      bad("narrow",
          [](json& j) {
            j["target_hidden_size"] = 80;
            j["speculators_config"]["verifier"]["name_or_path"] = "org/not-here";
          }),
      HasSubstr("field 'target_hidden_size' is 80, not transformer_layer_config.hidden_size "
                "64: the z-lab format has no field"));
  EXPECT_THAT(bad("anchor", [](json& j) { j["sample_from_anchor"] = true; }),
              HasSubstr("field 'sample_from_anchor' is true"));
  // Shapes follow the config: a config that does not describe the weights.
  EXPECT_THAT(
      bad("shape", [](json& j) { j["transformer_layer_config"]["intermediate_size"] = 97; }),
      HasSubstr("tensor 'layers.0.mlp.down_proj.weight' has shape [64, 96], expected "
                "[64, 97]"));
  EXPECT_THAT(bad("fc", [](json& j) { j["aux_hidden_state_layer_ids"] = {1}; }),
              HasSubstr("tensor 'fc.weight' has shape [64, 128], expected [64, 64]"));
  EXPECT_THAT(bad("layers",
                  [](json& j) {
                    j["transformer_layer_config"]["num_hidden_layers"] = 3;
                    j["transformer_layer_config"].erase("layer_types");
                  }),
              HasSubstr("missing tensor 'layers.2.input_layernorm.weight'"));
  EXPECT_THAT(
      bad("fewer",
          [](json& j) {
            j["transformer_layer_config"]["num_hidden_layers"] = 1;
            j["transformer_layer_config"].erase("layer_types");
          }),
      HasSubstr("tensor 'layers.1.input_layernorm.weight' is not part of a DFlash drafter"));
  copy_folder(kDFlash + "/speculators-full", d / "json");
  std::ofstream(d / "json/config.json") << "{\"speculators_model_type\": \"dflash\",";
  EXPECT_THAT(error_of([&] { convert(d / "json", d / "x"); }),
              HasSubstr("json/config.json: not valid JSON"));
  copy_folder(kDFlash + "/speculators-full", d / "missing");
  edit_tensors(d / "missing", [](std::vector<TensorData>& ts) {
    ts.erase(std::find_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "norm.weight"; }));
  });
  EXPECT_THAT(error_of([&] { convert(d / "missing", d / "x"); }),
              HasSubstr("missing tensor 'norm.weight' (shape [64] for this config)"));
  copy_folder(kDFlash + "/speculators-full", d / "int");
  edit_tensors(d / "int",
               [](std::vector<TensorData>& ts) { tensor(ts, "norm.weight").dtype = DType::I32; });
  EXPECT_THAT(error_of([&] { convert(d / "int", d / "x"); }),
              HasSubstr("tensor 'norm.weight' has dtype I32, expected F32, BF16 or F16"));
  copy_folder(kDFlash + "/speculators-full", d / "no_weights");
  fs::remove(d / "no_weights/model.safetensors");
  EXPECT_THAT(error_of([&] { convert(d / "no_weights", d / "x"); }),
              HasSubstr("no model.safetensors, model.safetensors.index.json or model.gguf"));
  EXPECT_FALSE(fs::exists(d / "x"));
}

TEST(Convert, SpeculatorsFlashMapFieldsAreChecked) {
  TempDir d;
  auto bad = [&](const std::string& name, const std::function<void(json&)>& edit,
                 const std::string& target = kTarget) {
    copy_folder(kFlashMapSpec, d / name, edit);
    return error_of([&] { convert(d / name, d / "x", ConvertSource::Auto, false, target); });
  };
  EXPECT_THAT(bad("zero",
                  [](json& j) {
                    j["aux_hidden_state_layer_ids"] = {0, 3};
                  }),
              HasSubstr("field 'aux_hidden_state_layer_ids' has a bad entry 0"));
  EXPECT_THAT(bad("last",
                  [](json& j) {
                    j["aux_hidden_state_layer_ids"] = {1, 4};
                  }),
              HasSubstr("field 'aux_hidden_state_layer_ids' has 4 but the target"));
  EXPECT_THAT(bad("vocab", [](json& j) { j["draft_vocab_size"] = 512; }),
              HasSubstr("field 'draft_vocab_size' is 512, not vocab_size 1024"));
  EXPECT_THAT(bad("nested", [](json& j) { j["transformer_layer_config"]["block_size"] = 8; }),
              HasSubstr("field 'transformer_layer_config.block_size' belongs at the top level"));
  EXPECT_THAT(bad("hidden", [](json& j) { j["target_hidden_size"] = 80; }),
              HasSubstr("field 'target_hidden_size' is 80 but the target "
                        "tests/fixtures/tiny-a/target has hidden_size 64"));
  // Without a target (tiny-qwen3 is no local folder) the weights still have to fit the config.
  EXPECT_THAT(bad(
                  "shapes", [](json& j) { j["target_hidden_size"] = 80; }, ""),
              HasSubstr("tensor 'anchor_proj.weight' has shape [48, 64], expected [48, 80]"));
  EXPECT_THAT(bad("gate", [](json& j) { j["transformer_layer_config"]["noise_gate"] = "x"; }),
              HasSubstr("(as a FlashMap release config): field 'noise_gate' must be"));
  EXPECT_FALSE(fs::exists(d / "x"));
}

TEST(Convert, NeverOverwritesWithoutForce) {
  TempDir d;
  const auto out = d / "out";
  fs::create_directories(out);
  std::ofstream(out + "/keep") << "mine";
  EXPECT_THAT(error_of([&] { convert(kDFlash + "/speculators-full", out); }),
              HasSubstr("out: exists; pass --force to replace it"));
  EXPECT_TRUE(fs::exists(out + "/keep"));
  // A failed conversion with --force leaves OUT as it was.
  EXPECT_THAT(error_of([&] { convert(kDFlash + "/speculators", out, ConvertSource::Auto, true); }),
              HasSubstr("reduced vocabulary"));
  EXPECT_TRUE(fs::exists(out + "/keep"));
  convert(kDFlash + "/speculators-full", out + "/", ConvertSource::Auto, true);
  EXPECT_FALSE(fs::exists(out + "/keep"));
  expect_same_tensors(out, kDFlash + "/zlab");
  EXPECT_EQ(d.entries(), std::vector<std::string>{"out"});

  copy_folder(kDFlash + "/speculators-full", d / "in");
  EXPECT_THAT(error_of([&] { convert(d / "in", d / "in", ConvertSource::Auto, true); }),
              HasSubstr("IN and OUT are the same folder"));
  EXPECT_THAT(error_of([&] { convert(d / "in", d.path.string(), ConvertSource::Auto, true); }),
              HasSubstr("holds IN"));
  std::ofstream(d / "file") << "x";
  EXPECT_THAT(error_of([&] { convert(d / "in", d / "file", ConvertSource::Auto, true); }),
              HasSubstr("file: exists and is not a folder; not replaced (even with --force)"));
  EXPECT_THAT(error_of([&] { convert(d / "in", d / "no/such/out"); }), HasSubstr("does not exist"));
  EXPECT_THAT(error_of([&] { convert(d / "nothing", d / "x"); }),
              HasSubstr("nothing: not a folder"));
  EXPECT_TRUE(fs::exists(d / "in/model.safetensors"));
}
