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
// The benches themselves are in src/bench (flashmap_bench); this file parses their options.
#include <flashmap/engine.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cpu_shape.h"
#include "bench/device_shape.h"
#include "bench/pair.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/text_io.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "io/hf_config.h"

namespace flashmap::cli {

using json = nlohmann::json;

namespace {

// The options of `flashmap bench`; run_bench hands each bench its own part of them.
struct BenchArgs {
  ModelOptions model;
  std::string shape, draft_shape, json_out;
  std::string prompt_file;  // JSON Lines of text, chat or id prompts instead of random ones
  std::vector<std::string> vs_drafts;  // more drafters timed beside --draft in the same run
  std::vector<std::string> trees;      // draft-tree shapes timed for each drafter row
  std::vector<std::string> cuts;       // draft cuts (EngineOptions::draft_cut) timed for each
  float temperature = 0.0f;
  int draft_vocab = 0;  // --draft-shape dflash-*: its own lm_head over that many target ids
  bool no_sweep = false;
  int reps = 3, max_new_tokens = 128, prompts = 4, context = 512, block = 16, prefill = 32;
};

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
      return bench::bench_device_shape({.device = a.model.device,
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
  if (!a.shape.empty())
    return bench::bench_cpu_shape({.shape = a.shape,
                                   .draft_shape = a.draft_shape,
                                   .draft_vocab = a.draft_vocab,
                                   .target = a.model.target,
                                   .draft = a.model.draft,
                                   .weights = a.model.weights,
                                   .compute = a.model.compute,
                                   .json_out = a.json_out,
                                   .steps = a.model.steps,
                                   .no_sweep = a.no_sweep,
                                   .context = a.context,
                                   .block = a.block,
                                   .prefill = a.prefill,
                                   .reps = a.reps,
                                   .max_new_tokens = a.max_new_tokens});
  a.model.resolve();
  FLASHMAP_CHECK(!a.model.draft.empty(), "bench needs a drafter (--draft) or --shape");
  // Text prompts are tokenized with --tokenizer, else the target's own tokenizer where it has
  // one (resolve() picks it); a file of ids needs none.
  const auto read_prompts = [&a](const Qwen3Config& tc) {
    const auto text = a.model.tokenizer.empty() ? nullptr : open_text(a.model.tokenizer);
    return read_prompt_file(a.prompt_file, text.get(), tc.vocab_size, tc.max_position_embeddings,
                            a.max_new_tokens);
  };
  bench::bench_pair({.engine = a.model.engine_options(0),
                     .vs_drafts = a.vs_drafts,
                     .trees = a.trees,
                     .cuts = a.cuts,
                     .prompt_file = a.prompt_file,
                     .read_prompts = read_prompts,
                     .json_out = a.json_out,
                     .temperature = a.temperature,
                     .reps = a.reps,
                     .max_new_tokens = a.max_new_tokens,
                     .prompts = a.prompts});
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
                  "--shape: a random drafter of a released shape as well "
                  "(flashmap-qwen3-8b, dflash-qwen3-8b), its draft, commit and round timed")
      ->check(non_empty())
      ->needs(shape);
  sub->add_option("--draft-vocab", args->draft_vocab,
                  "--draft-shape dflash-*: a reduced draft vocabulary, the drafter's own lm_head "
                  "over N target ids (speculators' draft_vocab_size) instead of the target's")
      ->check(CLI::Range(1, INT32_MAX))
      ->needs("--draft-shape");
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
