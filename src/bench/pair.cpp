// `flashmap bench --target T --draft D`: every configuration through its own engine on the
// device, the target alone first, then each drafter at each tree, cut and step count; a row of
// per-round phase times and tokens/s for each.
#include "bench/pair.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/timing.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "specdec/tree.h"

namespace flashmap::bench {

using json = nlohmann::json;

void bench_pair(const PairBench& a) {
  json out;
  out["threads"] = ThreadPool::global().size();
  // Every configuration through its own engine on the device: the target alone, then the
  // drafter at each step count of its jump_grids (or --steps).
  EngineOptions eo = a.engine;
  eo.spec_policy = SpecPolicyKind::Always;
  // Every drafter is opened by its config before any timing, so that a wrong folder among
  // several fails at once rather than after minutes of decoding.
  std::vector<std::string> drafts{eo.draft};
  std::vector<std::string> trees = a.trees;
  if (trees.empty()) trees.push_back(eo.draft_tree);
  for (const auto& t : trees)
    if (t != "auto") (void)TreeShape::parse(t, "--draft-trees");
  drafts.insert(drafts.end(), a.vs_drafts.begin(), a.vs_drafts.end());
  std::vector<std::optional<FlashMapConfig>> flashmap_configs;
  for (const auto& d : drafts) {
    if (d == "ngram") {  // no folder: the n-gram drafter's row is like DFlash's, one per tree
      flashmap_configs.emplace_back();
    } else if (DFlashConfig::is_dflash(d)) {
      (void)DFlashConfig::from_file(d + "/config.json");
      flashmap_configs.emplace_back();
    } else {
      flashmap_configs.emplace_back(FlashMapConfig::from_file(d + "/config.json"));
      if (eo.steps > 0) flashmap_configs.back()->grid(eo.steps);  // names jump_grids
    }
  }
  FLASHMAP_CHECK(eo.steps == 0 || std::any_of(flashmap_configs.begin(), flashmap_configs.end(),
                                              [](const auto& c) { return c.has_value(); }),
                 "--steps: a DFlash drafter drafts in one pass (no steps); drop --steps");
  // The --ngram-* options reach the n-gram drafter's engine, --hybrid-ngram (with
  // --ngram-max) the hybrid rows' only: the other engines refuse them.
  const auto other_than_ngram = [](EngineOptions o) {
    o.ngram_min = EngineOptions{}.ngram_min;
    o.ngram_max = EngineOptions{}.ngram_max;
    o.ngram_block = EngineOptions{}.ngram_block;
    o.hybrid_ngram = 0;
    return o;
  };
  // A prompt file is read against the target's config before any weights load.
  std::vector<std::vector<int32_t>> prompts;
  if (!a.prompt_file.empty())
    prompts = a.read_prompts(Qwen3Config::from_file(target_folder(eo.target) + "/config.json"));
  EngineOptions alone_opt = other_than_ngram(eo);
  alone_opt.draft.clear();
  alone_opt.steps = 0;
  alone_opt.draft_tree = "off";
  alone_opt.draft_window = 0;  // --draft-window is the trained drafters' rows'
  // One engine at a time: each holds its own copy of the target's packed weights (16 GB at
  // Qwen3-8B in bf16), so the target-alone engine goes before the drafters' come.
  auto alone_engine = std::make_unique<Engine>(alone_opt);
  const int V = int(alone_engine->target_info().vocab_size);
  if (!prompts.empty()) {
    out["prompt_file"] = a.prompt_file;
  } else {
    Rng rng(7);
    for (int i = 0; i < a.prompts; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 16; ++j) p.push_back(int32_t(rng.next() % uint64_t(V)));
      prompts.push_back(p);
    }
  }
  fmt::print("# flashmap bench: {} + {} on {} ({} prompts{} x {} tokens, {}, {} threads)\n\n",
             eo.target, fmt::join(drafts, " | "), alone_engine->device(), prompts.size(),
             a.prompt_file.empty() ? "" : " of " + a.prompt_file, a.max_new_tokens,
             a.temperature > 0 ? fmt::format("temperature {}", a.temperature) : "greedy",
             ThreadPool::global().size());
  out["device"] = alone_engine->device();
  const json alone = run_decode(*alone_engine, prompts, a.max_new_tokens, a.reps, a.temperature);
  alone_engine.reset();
  out["target_alone"] = alone;
  fmt::print(
      "| decoding | tau | tokens/s | speedup | round ms | draft ms | verify ms | accept ms "
      "|\n|---|---|---|---|---|---|---|---|\n");
  auto row = [&](const std::string& name, const json& r) {
    fmt::print("| {} | {:.2f} | {:.1f} | {:.2f}x | {:.3f} | {:.3f} | {:.3f} | {:.3f} |\n", name,
               r["tau"].get<double>(), r["tokens_per_s"].get<double>(),
               r["tokens_per_s"].get<double>() / alone["tokens_per_s"].get<double>(),
               r["round_ms"].get<double>(), r["draft_ms_per_round"].get<double>(),
               r["verify_ms_per_round"].get<double>(), r["accept_ms_per_round"].get<double>());
  };
  row("target alone", alone);
  std::vector<std::string> cuts = a.cuts;
  if (cuts.empty()) cuts.push_back(eo.draft_cut);
  for (size_t d = 0; d < drafts.size(); ++d)
    for (const std::string& tree : trees)
      for (const std::string& cut : cuts) {
        // With several drafters (trees) the rows and JSON keys carry the drafter's index (the
        // first is --draft, then each --vs-draft in order) and the tree's shape.
        std::string tag = drafts.size() > 1 ? fmt::format(" [{}]", d) : "";
        std::string key = drafts.size() > 1 ? fmt::format("draft{}_", d) : "";
        if (tree != "off") {
          tag += ", tree " + tree;
          key += "tree_" + tree + "_";
        }
        // The rounds run under the Always policy, where "auto" verifies every draft.
        if (cut != "auto" && cut != "off") {
          tag += ", cut " + cut;
          key += "cut_" + cut + "_";
        }
        const bool ngram = drafts[d] == "ngram";
        // --hybrid-ngram N: each trained drafter's rows, then the same with hybrid rounds.
        std::vector<int> hybrids{0};
        if (!ngram && eo.hybrid_ngram > 0) hybrids.push_back(eo.hybrid_ngram);
        for (const int h : hybrids) {
          EngineOptions so = other_than_ngram(eo);
          if (ngram) {
            so = eo;
            so.hybrid_ngram = 0;
            so.draft_window = 0;
          } else if (h > 0) {
            so.hybrid_ngram = h;
            so.ngram_max = eo.ngram_max;
          }
          so.draft = drafts[d];
          so.draft_tree = tree;
          so.draft_cut = cut;
          const std::string htag = h > 0 ? fmt::format(", hybrid {}", h) : "";
          const std::string hkey = h > 0 ? fmt::format("hybrid{}_", h) : "";
          if (!flashmap_configs[d]) {
            so.steps = 0;
            Engine engine(so);
            const json r = run_decode(engine, prompts, a.max_new_tokens, a.reps, a.temperature);
            out[key + hkey + (ngram ? "ngram" : "dflash")] = r;
            row((ngram ? "n-gram" : "DFlash") + tag + htag, r);
            continue;
          }
          for (const auto& [steps, grid] : flashmap_configs[d]->jump_grids) {
            if (eo.steps > 0 && steps != eo.steps) continue;
            so.steps = steps;
            Engine engine(so);
            const json r = run_decode(engine, prompts, a.max_new_tokens, a.reps, a.temperature);
            out[fmt::format("{}{}flashmap_steps{}", key, hkey, steps)] = r;
            row(fmt::format("FlashMap, {} step{}{}{}", steps, steps > 1 ? "s" : "", tag, htag), r);
          }
        }
      }
  write_json(out, a.json_out);
}

}  // namespace flashmap::bench
