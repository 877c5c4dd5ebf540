// `flashmap parity DIR`: recomputes every tensor of a fixture folder (tools/make_fixtures.py,
// outputs of flashmap==0.1.0 in fp32) with this engine and compares them.
#include <flashmap/engine.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/generate.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "cpu/proposers.h"
#include "io/files.h"
#include "models/flashmap.h"
#include "models/qwen3.h"

namespace flashmap::cli {
namespace fs = std::filesystem;

namespace {

struct Diff {
  double max_abs = 0, max_ref = 0, max_rel = 0;
  int64_t rows = 0, argmax_agree = 0;
};

// max|Δ|, max|ref|, max|Δ|/max|ref|, and (row_len > 0) rows whose argmax agrees.
Diff compare_floats(const std::vector<float>& want, const std::vector<float>& got,
                    int64_t row_len) {
  Diff d;
  for (size_t i = 0; i < want.size(); ++i) {
    const double delta = std::fabs(double(want[i]) - double(got[i]));
    d.max_abs = std::isnan(delta) ? INFINITY : std::max(d.max_abs, delta);
    d.max_ref = std::max(d.max_ref, std::fabs(double(want[i])));
  }
  d.max_rel = d.max_abs / std::max(d.max_ref, 1e-30);
  if (row_len > 0) {
    d.rows = int64_t(want.size()) / row_len;
    for (int64_t r = 0; r < d.rows; ++r) {
      const auto w = want.begin() + r * row_len, g = got.begin() + r * row_len;
      d.argmax_agree +=
          (std::max_element(w, w + row_len) - w) == (std::max_element(g, g + row_len) - g);
    }
  }
  return d;
}

struct Report {
  bool ok = true;
  void row(const std::string& name, const std::string& shape, const std::string& abs_err,
           const std::string& rel_err, const std::string& argmax, bool pass) {
    fmt::print("{:<24} {:>12} {:>11} {:>11} {:>12}  {}\n", name, shape, abs_err, rel_err, argmax,
               pass ? "ok" : "FAIL");
    ok = ok && pass;
  }
  // Float tensors: max|Δ| ≤ 1e-4·max(1, max|ref|); logits (rows > 0) also need the same
  // argmax in every row.
  void floats(const std::string& name, const TensorView& ref, const std::vector<float>& got,
              int64_t row_len = 0) {
    const auto want = ref.to_f32();
    if (want.size() != got.size()) {
      row(name, shape_str(ref.shape), "-", "-", fmt::format("size {}", got.size()), false);
      return;
    }
    const auto d = compare_floats(want, got, row_len);
    const bool pass =
        d.max_abs <= 1e-4 * std::max(1.0, d.max_ref) && (row_len == 0 || d.argmax_agree == d.rows);
    row(name, shape_str(ref.shape), fmt::format("{:.3g}", d.max_abs),
        fmt::format("{:.3g}", d.max_rel),
        row_len ? fmt::format("{}/{}", d.argmax_agree, d.rows) : "-", pass);
  }
  void ids(const std::string& name, const TensorView& ref, const std::vector<int32_t>& got) {
    const auto want = ref.to_i64();
    size_t same = 0;
    while (same < want.size() && same < got.size() && want[same] == got[same]) ++same;
    const bool pass = same == want.size() && got.size() == want.size();
    row(name, shape_str(ref.shape), "-", "-", fmt::format("{}/{} equal", same, want.size()), pass);
  }
};

void run_parity_checked(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  FLASHMAP_CHECK(fs::is_directory(root, ec), "{}: not a fixture folder", dir);
  const std::string expected_path = (root / "expected.json").string();
  FLASHMAP_CHECK(fs::symlink_status(expected_path, ec).type() != fs::file_type::not_found,
                 "{}: missing expected.json", dir);
  const std::string expected_text = read_regular_file(expected_path, kMaxConfigFileBytes);
  check_json_depth(expected_text, expected_path);
  const auto expected = nlohmann::json::parse(expected_text);
  FLASHMAP_CHECK(expected.is_object(), "{}: not a JSON object", expected_path);
  SafetensorsFile ref((root / "expected.safetensors").string());

  Qwen3Model target((root / "target").string());
  FlashMapModel drafter((root / "draft").string(), target);
  const auto& dc = drafter.config();
  const int64_t V = target.config().vocab_size, K = dc.block_size;
  const int64_t TH = target.config().hidden_size;

  std::vector<int32_t> prompt;
  for (auto id : ref.get("prompt_ids").to_i64()) {
    FLASHMAP_CHECK(id >= 0 && id <= INT32_MAX, "{}: prompt_ids has {}, not a token id", dir, id);
    prompt.push_back(int32_t(id));
  }
  const int64_t P = int64_t(prompt.size());
  FLASHMAP_CHECK(P == expected.value("prompt_len", P), "{}: prompt_len disagrees with prompt_ids",
                 dir);

  fmt::print("fixture {}: vocab {}, target hidden {}, block {}, prompt {}\n", dir, V, TH, K, P);
  fmt::print("{:<24} {:>12} {:>11} {:>11} {:>12}\n", "tensor", "shape", "max|d|", "max rel",
             "argmax");
  Report report;

  KVCache cache = target.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput seq{&cache, prompt};
  target.forward({&seq, 1}, Qwen3Model::Logits::All, drafter.target_layer_ids(), out);
  report.floats("target_logits", ref.get("target_logits"), out.logits, V);
  report.floats("target_features", ref.get("target_features"), out.features);
  const std::vector<float> features = out.features;

  report.floats("uniform_embeds", ref.get("uniform_embeds"), drafter.uniform_embeds());
  report.floats("noise_factor", ref.get("noise_factor"), drafter.noise_factor());

  auto draft_with = [&](FlashMapModel::Noise noise, int steps) {
    FlashMapContext ctx = drafter.new_context();
    drafter.extend_context(ctx, features.data(), P - 1);
    std::vector<float> logits(size_t(K * V));
    FlashMapModel::Request req{&ctx, prompt.back(), noise};
    drafter.draft({&req, 1}, steps, logits.data());
    return logits;
  };
  for (const auto& [steps, grid] : dc.jump_grids) {
    const auto name = fmt::format("draft_logits_steps{}", steps);
    if (!ref.contains(name)) continue;
    const auto x0 = ref.get(fmt::format("noise_x0_steps{}", steps)).to_f32();
    // The drafter reads K·V noise values: a shorter tensor would be read past its end.
    FLASHMAP_CHECK(int64_t(x0.size()) == K * V, "{}: noise_x0_steps{} has {} values, expected {}",
                   dir, steps, x0.size(), K * V);
    report.floats(name, ref.get(name),
                  draft_with({FlashMapModel::Noise::Vocab, x0.data(), nullptr}, steps), V);
  }
  const auto z = ref.get("noise_z").to_f32();
  FLASHMAP_CHECK(int64_t(z.size()) == K * TH, "{}: noise_z has {} values, expected {}", dir,
                 z.size(), K * TH);
  report.floats("draft_logits_z", ref.get("draft_logits_z"),
                draft_with({FlashMapModel::Noise::Embed, z.data(), nullptr}, 1), V);

  // Loading checks: a bf16 copy (reference logits from the same bf16 weights in fp32) and a
  // sharded copy of the target.
  for (const char* extra : {"target_bf16", "target_sharded"}) {
    const fs::path sub = root / extra;
    if (!fs::is_directory(sub, ec)) continue;
    Qwen3Model copy(sub.string());
    KVCache c2 = copy.new_cache();
    Qwen3Model::SeqInput s2{&c2, prompt};
    Qwen3Model::Output o2;
    copy.forward({&s2, 1}, Qwen3Model::Logits::All, {}, o2);
    const bool own = fs::exists(sub / "expected.safetensors", ec);
    SafetensorsFile sub_ref(own ? (sub / "expected.safetensors").string()
                                : (root / "expected.safetensors").string());
    report.floats(std::string(extra) + "/target_logits", sub_ref.get("target_logits"), o2.logits,
                  V);
  }

  // Generation: target-alone greedy equals transformers' generate; speculative greedy equals
  // spec_generate, with and without a stop token.
  if (ref.contains("greedy_ids")) {
    const int n = int(ref.get("greedy_ids").numel());
    GenerateOptions opt;
    opt.max_new_tokens = n;
    report.ids("greedy_ids", ref.get("greedy_ids"), generate(target, nullptr, prompt, opt).ids);
    FlashMapProposer block(drafter, dc.num_steps);
    report.ids("spec_ids", ref.get("spec_ids"), generate(target, &block, prompt, opt).ids);
    opt.stop_ids = {expected.at("stop_token").get<int32_t>()};
    report.ids("spec_ids_stop", ref.get("spec_ids_stop"),
               generate(target, &block, prompt, opt).ids);
  }

  FLASHMAP_CHECK(report.ok, "{}: parity FAILED", dir);
  fmt::print("parity ok\n");
}

void run_parity(const std::string& dir) {
  try {
    run_parity_checked(dir);
  } catch (const nlohmann::json::exception& e) {  // expected.json lacks a field or has bad JSON
    throw Error(fmt::format("{}/expected.json: {}", dir, e.what()));
  }
}

void register_cmd(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "parity", "Check this engine against a fixture folder made with the reference package");
  auto dir = std::make_shared<std::string>();
  sub->add_option("dir", *dir, "fixture folder (tools/make_fixtures.py)")
      ->required()
      ->check(non_empty());
  sub->callback([dir] { run_parity(*dir); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
