#include "cli/options.h"

#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/check.h"

namespace flashmap::cli {

namespace {

// The folder holding the default pair's target/ and draft/, first found of: $FLASHMAP_HOME/
// models/default; <exe dir>/../share/flashmap/models/default (where `cmake --install` puts it);
// the source tree's models/default, but only for the binary in the build tree that was compiled
// with it (FLASHMAP_BUILD_DIR), so that an installed or copied binary never reads the source tree.
std::filesystem::path default_pair_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto has_pair = [&](const fs::path& dir) {
    return fs::is_regular_file(dir / "target" / "config.json", ec);
  };
  if (const char* home = std::getenv("FLASHMAP_HOME"); home != nullptr && *home != '\0') {
    const fs::path dir = fs::path(home) / "models" / "default";
    FLASHMAP_CHECK(has_pair(dir),
                   "FLASHMAP_HOME={}: no default pair there ({} has no target/config.json); "
                   "point it at a folder with models/default, or pass --target",
                   home, dir.string());
    return dir;
  }
  std::string looked;  // the folders tried, for the message
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed =
        exe.parent_path().parent_path() / "share" / "flashmap" / "models" / "default";
    if (has_pair(installed)) return installed;
    looked = installed.string();
#if defined(FLASHMAP_BUILD_DIR) && defined(FLASHMAP_SOURCE_DIR)
    if (fs::equivalent(exe.parent_path(), FLASHMAP_BUILD_DIR, ec)) {
      const fs::path source = fs::path(FLASHMAP_SOURCE_DIR) / "models" / "default";
      if (has_pair(source)) return source;
      looked += ", " + source.string();
    }
#endif
  } else {
    looked = "nowhere: /proc/self/exe is unreadable";
  }
  throw Error(fmt::format(
      "no default model pair (looked in {}); pass --target (and --draft), or set FLASHMAP_HOME "
      "to a folder with models/default/target and models/default/draft",
      looked));
}

}  // namespace

std::string default_target_dir() {
  return (default_pair_dir() / "target").string();
}
std::string default_draft_dir() {
  return (default_pair_dir() / "draft").string();
}

void ModelOptions::resolve() {
  std::error_code ec;  // an unreadable folder is reported when it is read, not thrown here
  if (target.empty()) {
    target = default_target_dir();
    if (draft.empty() && !no_draft) draft = default_draft_dir();
    if (tokenizer.empty() && std::filesystem::exists(target + "/tokenizer.json", ec))
      tokenizer = target;
  }
  if (no_draft) draft.clear();
  if (tokenizer.empty()) {
    const std::string folder = target_folder(target);  // a GGUF's folder holds its tokenizer
    if (std::filesystem::exists(folder + "/tokenizer.json", ec)) tokenizer = folder;
  }
}

CLI::Validator non_empty(const std::string& message) {
  return CLI::Validator(
      [message](std::string& value) { return value.empty() ? message : std::string(); }, "");
}

void add_model_options(CLI::App& app, ModelOptions& m) {
  app.add_option("--target", m.target,
                 "target model folder (Hugging Face, model_type qwen3), or a Qwen3 GGUF file "
                 "(read in place; docs/COMMANDS.md); "
                 "default: the built-in pair ($FLASHMAP_HOME/models/default, else "
                 "<exe dir>/../share/flashmap/models/default, else the source tree's for a "
                 "build-tree binary)")
      ->check(non_empty());
  auto* draft = app.add_option("--draft", m.draft,
                               "drafter folder: FlashMap (model_type flashmap) or DFlash (z-lab or "
                               "speculators format); or ngram: prompt lookup, no drafter model")
                    ->check(non_empty());
  app.add_flag("--no-draft", m.no_draft, "decode with the target alone")->excludes(draft);
  app.add_option("--tokenizer", m.tokenizer, "folder with tokenizer.json (default: the target's)")
      ->check(non_empty());
  // Given: >= 1 (0 and below would quietly mean the default); membership in the drafter's
  // jump_grids is checked when it is loaded.
  app.add_option("--steps", m.steps,
                 "jumps per draft (one of the drafter's jump_grids; default: "
                 "its num_steps)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--threads", m.threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(1, kMaxThreads));
  // Checked (with whether this build and machine have it) before any model loads.
  app.add_option("--device", m.device,
                 "cpu (default), cuda or cuda:N (a GPU; needs a build with the CUDA backend)")
      ->check(non_empty());
  app.add_option("--weights", m.weights,
                 "how the CPU holds linear weights: native (their file dtype; default), q8 "
                 "(int8, llama.cpp's Q8_0 blocks) or q4 (4-bit, llama.cpp's Q4_0 blocks), "
                 "quantized at load")
      ->check(CLI::IsMember({"native", "q8", "q4"}));
  app.add_option("--compute", m.compute,
                 "CPU arithmetic: fp32 (default, the reference) or bf16 (AMX tiles or AVX512-BF16 "
                 "dot products: activations and weights rounded to bf16, fp32 sums)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--draft-tree", m.draft_tree,
                 "draft trees verified in one pass (CPU): off (default), paths:N (N noise draws), "
                 "topk:B (top-k expansion to B nodes), paths:N+topk:B, or auto (each round's "
                 "tree or none by measured tokens/s)")
      ->check(non_empty());
  app.add_option("--draft-cut", m.draft_cut,
                 "how many of a round's drafts are verified (CPU): auto (default: under the "
                 "adaptive speculation policy, those whose expected tokens pay for their rows, "
                 "measured; else all), on (measured, under any policy) or off (all)")
      ->check(non_empty());
  // Ranges and --ngram-min <= --ngram-max are checked by the engine (one message for the CLI and
  // Python alike).
  app.add_option("--ngram-min", m.ngram_min,
                 "--draft ngram: the shortest n-gram to match (default 1)");
  app.add_option("--ngram-max", m.ngram_max,
                 "--draft ngram or --hybrid-ngram: the longest n-gram to match, tried first "
                 "(default 4)");
  app.add_option("--ngram-block", m.ngram_block,
                 "--draft ngram: drafts per round, at most (default 8)");
  app.add_option("--hybrid-ngram", m.hybrid_ngram,
                 "with a FlashMap or DFlash drafter: a round whose last N tokens or more occurred "
                 "earlier drafts their continuation by prompt lookup instead (0: off)");
  app.add_option("--draft-window", m.draft_window,
                 "with a FlashMap or DFlash drafter: it attends to the target features of the "
                 "last N context positions only (0: off, the whole context; CPU)");
}

EngineOptions ModelOptions::engine_options(int64_t sampled_vocab) const {
  // --steps against the drafter's kind: checked where the drafter loads (models/drafter.h).
  return {.target = target,
          .draft = draft,
          .device = device,
          .steps = steps,
          .draft_tree = draft_tree,
          .draft_cut = draft_cut,
          .ngram_min = ngram_min,
          .ngram_max = ngram_max,
          .ngram_block = ngram_block,
          .hybrid_ngram = hybrid_ngram,
          .draft_window = draft_window,
          .weights = weights,
          .compute = compute,
          .sampled_vocab = sampled_vocab,
          .threads = threads};
}

uint64_t SamplingOptions::resolved_seed() const {
  if (seed >= 0) return uint64_t(seed);
  return (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
}

SamplingParams SamplingOptions::params(const SamplingParams& defaults) const {
  SamplingParams p = defaults;
  auto given = [](const CLI::Option* o) { return !o || o->count() > 0; };
  if (given(temperature_opt)) p.temperature = temperature;
  if (given(top_k_opt)) p.top_k = top_k;
  if (given(top_p_opt)) p.top_p = top_p;
  if (given(min_p_opt)) p.min_p = min_p;
  return p;
}

void add_sampling_options(CLI::App& app, SamplingOptions& s) {
  const char* from = " (default: the target's generation_config.json, else ";
  s.temperature_opt = app.add_option("--temperature", s.temperature,
                                     std::string("sampling temperature") + from + "0: greedy)");
  s.top_k_opt = app.add_option("--top-k", s.top_k,
                               std::string("keep the k most likely tokens") + from + "0: off)");
  s.top_p_opt = app.add_option("--top-p", s.top_p,
                               std::string("nucleus sampling mass in (0, 1]") + from + "1)");
  s.min_p_opt = app.add_option(
      "--min-p", s.min_p,
      std::string("drop tokens below min_p times the top probability") + from + "0)");
  app.add_option("--seed", s.seed, "random seed (default: random)")
      ->check(CLI::Range(int64_t(0), INT64_MAX));
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      FLASHMAP_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "");
      ids.push_back(int32_t(v));
    } catch (...) {
      throw Error(fmt::format("{}: '{}' is not a token id (expected comma-separated integers)",
                              what, item));
    }
    i = j + 1;
  }
  return ids;
}

}  // namespace flashmap::cli
