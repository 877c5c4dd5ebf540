// `flashmap bench`: speed of the target forward and of the round loop.
//   flashmap bench                         the built-in pair: target-alone vs speculative
//   flashmap bench --target T --draft D    any pair
//   flashmap bench --shape qwen3-0.6b      random bf16 weights at a real shape, made in memory:
//                                          decode / verify-17 ms against measured bandwidth, and
//                                          tokens/s as a function of acceptance length (scripted)
//   flashmap bench --shape qwen3-0.6b --target DIR
//                                          the same on the weights of the Qwen3 folder DIR,
//                                          which must have that shape (bench/vs_llama_cpp.py
//                                          times it and llama.cpp on one folder); --no-sweep
//                                          keeps to the decode / verify timings
//   flashmap bench --device cuda --shape qwen3-8b
//                                          the same on the GPU (CUDA builds): random device
//                                          weights, HBM bandwidth, decode and verify with graphs
#include <flashmap/engine.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/bench.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/text_io.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "cpu/backend.h"
#include "engine/device_bench.h"
#include "engine/generate.h"
#include "io/hf_config.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "specdec/tree.h"

namespace flashmap::cli {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_of(const std::function<void()>& f, int reps) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];  // median
}

// Per-round phase times and tokens/s of one decoding configuration over the prompts, through
// an engine (a batch of one per prompt).
json run_decode(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_new,
                int reps, float temperature) {
  double tokens = 0, rounds = 0, total = 0, draft = 0, verify = 0, accept = 0, prefill = 0;
  std::vector<int> lengths;
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestParams p;
      p.prompt = prompts[i];
      p.max_tokens = max_new;
      p.seed = uint64_t(i);
      p.sampling.temperature = temperature;  // unseeded: rejection sampling / sample-and-match
      const auto res = engine.generate(p);
      tokens += double(res.ids.size());
      rounds += res.rounds;
      total += res.times.total_ms;
      draft += res.times.draft_ms;
      verify += res.times.verify_ms;
      accept += res.times.accept_ms;
      prefill += res.times.prefill_ms;
      lengths.insert(lengths.end(), res.acceptance_lengths.begin(), res.acceptance_lengths.end());
    }
  double tau = 0;
  for (int a : lengths) tau += a;
  tau /= std::max<size_t>(lengths.size(), 1);
  const double loop = total - draft - verify - prefill;
  return {{"tokens_per_s", 1000.0 * tokens / total},
          {"tau", tau},
          {"round_ms", (total - prefill) / std::max(rounds, 1.0)},
          {"draft_ms_per_round", draft / std::max(rounds, 1.0)},
          {"verify_ms_per_round", verify / std::max(rounds, 1.0)},
          {"accept_ms_per_round", accept / std::max(rounds, 1.0)},
          {"loop_overhead_pct", 100.0 * loop / std::max(total - prefill, 1e-9)},
          {"tokens", tokens},
          {"rounds", rounds}};
}

void write_json(const json& out, const std::string& path) {
  if (path.empty()) return;
  std::ofstream f(path);
  FLASHMAP_CHECK(f.good(), "--json: cannot write {}", path);
  f << out.dump(2) << "\n";
}

namespace {

// --prompt-file: JSON Lines, one prompt per line, each an object with one of "prompt" (text,
// encoded as is), "chat" (one user message through the chat template, thinking off) or
// "prompt_ids" (ids); blank lines are skipped. The bounds keep a wrong file (a model's
// safetensors, say) from being read into memory whole or decoded for hours.
std::vector<std::vector<int32_t>> read_prompt_file(const std::string& path, const TextCodec* text,
                                                   int64_t vocab, int64_t max_positions,
                                                   int max_new) {
  constexpr std::uintmax_t kMaxBytes = 64u << 20;
  constexpr size_t kMaxPrompts = 10000;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  FLASHMAP_CHECK(!ec, "--prompt-file {}: cannot read it ({})", path, ec.message());
  FLASHMAP_CHECK(bytes <= kMaxBytes, "--prompt-file {}: {} bytes, more than the {} MiB allowed",
                 path, bytes, kMaxBytes >> 20);
  std::ifstream f(path, std::ios::binary);
  FLASHMAP_CHECK(f.good(), "--prompt-file {}: cannot open it", path);
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (size_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = fmt::format("--prompt-file {} line {}", path, n);
    FLASHMAP_CHECK(prompts.size() < kMaxPrompts, "{}: more than {} prompts", at, kMaxPrompts);
    const json j = json::parse(line, nullptr, false);
    FLASHMAP_CHECK(j.is_object(), "{}: not a JSON object", at);
    const int kinds =
        int(j.contains("prompt")) + int(j.contains("chat")) + int(j.contains("prompt_ids"));
    FLASHMAP_CHECK(kinds == 1, "{}: give exactly one of \"prompt\", \"chat\", \"prompt_ids\"", at);
    std::vector<int32_t> ids;
    if (j.contains("prompt_ids")) {
      FLASHMAP_CHECK(j["prompt_ids"].is_array(), "{}: \"prompt_ids\" must be an array", at);
      for (const auto& v : j["prompt_ids"]) {
        FLASHMAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab,
                       "{}: \"prompt_ids\" holds {}, not an id in [0, {})", at, v.dump(), vocab);
        ids.push_back(v.get<int32_t>());
      }
    } else {
      const char* key = j.contains("chat") ? "chat" : "prompt";
      FLASHMAP_CHECK(j[key].is_string(), "{}: \"{}\" must be a string", at, key);
      FLASHMAP_CHECK(text != nullptr,
                     "{}: text prompts need tokenizer files (the target has no tokenizer.json: "
                     "give --tokenizer DIR, or \"prompt_ids\")",
                     at);
      const std::string& s = j[key].get_ref<const std::string&>();
      ids = text->encode(j.contains("chat") ? chat_prompt(*text, s, "", false) : s);
    }
    FLASHMAP_CHECK(!ids.empty(), "{}: an empty prompt", at);
    FLASHMAP_CHECK(int64_t(ids.size()) + max_new <= max_positions,
                   "{}: {} prompt tokens + --max-new-tokens {} exceed the target's {} positions",
                   at, ids.size(), max_new, max_positions);
    prompts.push_back(std::move(ids));
  }
  FLASHMAP_CHECK(!prompts.empty(), "--prompt-file {}: no prompts in it", path);
  return prompts;
}

void run_bench(BenchArgs& a) {
  check_device(a.model.device);
  if (a.model.device != "cpu") {
    FLASHMAP_CHECK(a.shape.empty() || a.model.target.empty(),
                   "--shape with --target runs on the CPU only (drop --device {} or --target)",
                   a.model.device);
    FLASHMAP_CHECK(!a.no_sweep, "--no-sweep is for the CPU --shape bench (drop --device {})",
                   a.model.device);
    FLASHMAP_CHECK((a.draft_shape.empty() && a.model.draft.empty()) || a.shape.empty(),
                   "--shape with a drafter runs on the CPU only (drop --device {})",
                   a.model.device);
    if (!a.shape.empty())
      return bench_device_shape({.device = a.model.device,
                                 .shape = a.shape,
                                 .json_out = a.json_out,
                                 .context = a.context,
                                 .block = a.block,
                                 .reps = a.reps,
                                 .max_new_tokens = a.max_new_tokens});
  }
  // The process-wide pool is made once, on first use: --threads sizes it before the bandwidth
  // probe and the --shape models compute on it (the engines below then find it that size).
  if (a.model.threads > 0) ThreadPool::configure_global(a.model.threads);
  json out;
  out["threads"] = ThreadPool::global().size();
  if (!a.shape.empty()) return bench_cpu_shape(a);
  {
    a.model.resolve();
    FLASHMAP_CHECK(!a.model.draft.empty(), "bench needs a drafter (--draft) or --shape");
    // Every configuration through its own engine on the device: the target alone, then the
    // drafter at each step count of its jump_grids (or --steps).
    EngineOptions eo = a.model.engine_options(0);
    eo.device = a.model.device;
    eo.spec_policy = SpecPolicyKind::Always;
    // Every drafter is opened by its config before any timing, so that a wrong folder among
    // several fails at once rather than after minutes of decoding.
    std::vector<std::string> drafts{a.model.draft};
    std::vector<std::string> trees = a.trees;
    if (trees.empty()) trees.push_back(a.model.draft_tree);
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
        if (a.model.steps > 0) flashmap_configs.back()->grid(a.model.steps);  // names jump_grids
      }
    }
    FLASHMAP_CHECK(
        a.model.steps == 0 || std::any_of(flashmap_configs.begin(), flashmap_configs.end(),
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
    if (!a.prompt_file.empty()) {
      const auto tc = Qwen3Config::from_file(a.model.target + "/config.json");
      // The target's own tokenizer where it has one (a file of ids needs none), else --tokenizer.
      std::error_code ec;
      const bool own = std::filesystem::exists(a.model.target + "/tokenizer.json", ec);
      const auto text = !a.model.tokenizer.empty() ? open_text(a.model.tokenizer)
                        : own                      ? open_text(a.model.target)
                                                   : nullptr;
      prompts = read_prompt_file(a.prompt_file, text.get(), tc.vocab_size,
                                 tc.max_position_embeddings, a.max_new_tokens);
    }
    EngineOptions alone_opt = other_than_ngram(eo);
    alone_opt.draft.clear();
    alone_opt.steps = 0;
    alone_opt.draft_tree = "off";
    alone_opt.draft_window = 0;  // --draft-window is the trained drafters' rows'
    Engine alone_engine(alone_opt);
    const int V = int(alone_engine.target_info().vocab_size);
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
               a.model.target, fmt::join(drafts, " | "), alone_engine.device(), prompts.size(),
               a.prompt_file.empty() ? "" : " of " + a.prompt_file, a.max_new_tokens,
               a.temperature > 0 ? fmt::format("temperature {}", a.temperature) : "greedy",
               ThreadPool::global().size());
    out["device"] = alone_engine.device();
    const json alone = run_decode(alone_engine, prompts, a.max_new_tokens, a.reps, a.temperature);
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
    if (cuts.empty()) cuts.push_back(a.model.draft_cut);
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
          if (!ngram && a.model.hybrid_ngram > 0) hybrids.push_back(a.model.hybrid_ngram);
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
              if (a.model.steps > 0 && steps != a.model.steps) continue;
              so.steps = steps;
              Engine engine(so);
              const json r = run_decode(engine, prompts, a.max_new_tokens, a.reps, a.temperature);
              out[fmt::format("{}{}flashmap_steps{}", key, hkey, steps)] = r;
              row(fmt::format("FlashMap, {} step{}{}{}", steps, steps > 1 ? "s" : "", tag, htag),
                  r);
            }
          }
        }
  }
  write_json(out, a.json_out);
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand("bench", "Measure decoding speed (target alone vs speculative)");
  add_model_options(*sub, args->model);
  // Ranges: --reps 0 would take the median of nothing, --context -1 truncate a cache to -1, and
  // huge counts allocate before anything runs; the context is also held to the shape's
  // max_position_embeddings in run_bench.
  auto* shape = sub->add_option("--shape", args->shape,
                                "random bf16 target at a real shape: qwen3-8b (meant for --device "
                                "cuda), qwen3-0.6b, tiny; with --target, that folder's weights "
                                "(of this shape) instead")
                    ->check(non_empty());
  sub->add_option("--context", args->context, "context length for --shape decode timing (512)")
      ->check(CLI::Range(0, INT32_MAX))
      ->needs(shape);
  sub->add_option("--block", args->block, "block size K for --shape (16)")
      ->check(CLI::Range(1, kMaxBlockSize))
      ->needs(shape);
  sub->add_option("--draft-shape", args->draft_shape,
                  "--shape: a random FlashMap drafter of a released shape as well "
                  "(flashmap-qwen3-8b), its draft, commit and round timed")
      ->check(non_empty())
      ->needs(shape);
  sub->add_option("--prefill", args->prefill, "--shape: prompt length of the prefill timing (32)")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(shape);
  sub->add_flag("--no-sweep", args->no_sweep,
                "--shape: time decode and verify only, without the tokens/s sweep over acceptance "
                "lengths")
      ->needs(shape);
  sub->add_option("--vs-draft", args->vs_drafts,
                  "another drafter (FlashMap, DFlash or ngram) to time beside --draft on the same "
                  "target and prompts, in the same run; repeatable")
      ->check(non_empty())
      ->excludes(shape);
  sub->add_option("--draft-trees", args->trees,
                  "draft-tree shapes to time for each drafter, comma-separated (off, paths:N, "
                  "topk:B, paths:N+topk:B; default: --draft-tree's)")
      ->delimiter(',')
      ->excludes(shape);
  sub->add_option("--draft-cuts", args->cuts,
                  "draft cuts to time for each drafter, comma-separated (off, on; default: "
                  "--draft-cut's; the rounds always speculate, so auto is off)")
      ->delimiter(',')
      ->excludes(shape);
  sub->add_option("--temperature", args->temperature,
                  "sampling temperature of the decoding runs (0: greedy; unseeded above)")
      ->check(CLI::Range(0.0f, 100.0f))
      ->excludes(shape);
  sub->add_option("--reps", args->reps, "repetitions (median or sum; 3)")
      ->check(CLI::Range(1, 100000));
  auto* prompts_opt = sub->add_option("--prompts", args->prompts, "number of random prompts (4)")
                          ->check(CLI::Range(1, 100000))
                          ->excludes(shape);
  sub->add_option("--prompt-file", args->prompt_file,
                  "JSON Lines of prompts instead of random ones: {\"prompt\": TEXT}, {\"chat\": "
                  "TEXT} (chat template, thinking off) or {\"prompt_ids\": [...]} per line")
      ->check(non_empty())
      ->excludes(shape)
      ->excludes(prompts_opt);
  sub->add_option("--max-new-tokens", args->max_new_tokens, "tokens per prompt (128)")
      ->check(CLI::Range(1, INT32_MAX));
  sub->add_option("--json", args->json_out, "also write the figures as JSON to this file")
      ->check(non_empty());
  sub->callback([args] { run_bench(*args); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
