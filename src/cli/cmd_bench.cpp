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

#include "cli/commands.h"
#include "cli/options.h"
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
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct BenchArgs {
  ModelOptions model;
  std::string shape, json_out;
  std::vector<std::string> vs_drafts;  // more drafters timed beside --draft in the same run
  std::vector<std::string> trees;      // draft-tree shapes timed for each drafter row
  float temperature = 0.0f;
  bool no_sweep = false;
  int reps = 3, max_new_tokens = 128, prompts = 4, context = 512, block = 16;
};

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

// Read bandwidth of this machine with all threads (the roofline a decode step is held to).
double measure_read_gbps() {
  const size_t n = size_t(1) << 28;  // 1 GiB of floats
  std::vector<float> buf(n, 1.0f);
  ThreadPool& pool = ThreadPool::global();
  // One partial sum per 64 Ki-float chunk, written by the thread that read it (keeps the reads
  // from being optimized away without sharing a cache line between threads).
  std::vector<float> sums((n >> 16) + 1, 0.0f);
  auto run = [&] {
    pool.parallel_for(int64_t(n), 1 << 16, [&](int64_t b, int64_t e) {
      typedef float v16 __attribute__((vector_size(64)));
      v16 acc = {};
      for (int64_t i = b; i + 16 <= e; i += 16) {
        v16 x;
        std::memcpy(&x, buf.data() + i, 64);
        acc += x;
      }
      float s = 0;
      for (int j = 0; j < 16; ++j) s += acc[j];
      sums[size_t(b >> 16)] = s;
    });
  };
  const double ms = ms_of(run, 3);
  return double(n) * 4 / (ms * 1e-3) / 1e9;
}

// Random bf16 weights for a Qwen3 config, held in memory.
std::unique_ptr<Qwen3Model> random_target(const Qwen3Config& c, ops::WeightFormat format) {
  std::vector<TensorData> t;
  Rng rng(1);
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    TensorData d{name, DType::BF16, {rows, cols}, {}};
    d.bytes.resize(size_t(rows * cols) * 2);
    const float scale = 1.0f / std::sqrt(float(cols));
    auto* p = reinterpret_cast<uint16_t*>(d.bytes.data());
    for (int64_t i = 0; i < rows * cols; ++i) {
      // Uniform in [-√3, √3)·scale (unit variance), cheap enough for a billion values.
      const float u = float(int32_t(uint32_t(rng.next() >> 32))) * (1.7320508f / 2147483648.0f);
      p[i] = f32_to_bf16(u * scale);
    }
    t.push_back(std::move(d));
  };
  auto vec = [&](const std::string& name, int64_t n) {
    t.push_back(make_tensor(name, {n}, std::vector<float>(size_t(n), 1.0f), DType::BF16));
  };
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
  mat("model.embed_tokens.weight", c.vocab_size, H);
  mat("lm_head.weight", c.vocab_size, H);
  vec("model.norm.weight", H);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    vec(p + "input_layernorm.weight", H);
    vec(p + "post_attention_layernorm.weight", H);
    vec(p + "self_attn.q_norm.weight", hd);
    vec(p + "self_attn.k_norm.weight", hd);
    mat(p + "self_attn.q_proj.weight", c.num_attention_heads * hd, H);
    mat(p + "self_attn.k_proj.weight", c.num_key_value_heads * hd, H);
    mat(p + "self_attn.v_proj.weight", c.num_key_value_heads * hd, H);
    mat(p + "self_attn.o_proj.weight", H, c.num_attention_heads * hd);
    mat(p + "mlp.gate_proj.weight", I, H);
    mat(p + "mlp.up_proj.weight", I, H);
    mat(p + "mlp.down_proj.weight", H, I);
  }
  return std::make_unique<Qwen3Model>(
      c, Checkpoint::from_tensors(std::move(t), "random " + std::to_string(H)), nullptr, format);
}

// The fields of a Qwen3 config that set the cost of a step; the ones of `got` that differ from
// `want`, as "name got (want)" (empty when it has the shape).
std::vector<std::string> shape_mismatches(const Qwen3Config& got, const Qwen3Config& want) {
  std::vector<std::string> diff;
  auto cmp = [&](const char* name, int64_t g, int64_t w) {
    if (g != w) diff.push_back(fmt::format("{} {} (shape: {})", name, g, w));
  };
  cmp("vocab_size", got.vocab_size, want.vocab_size);
  cmp("hidden_size", got.hidden_size, want.hidden_size);
  cmp("intermediate_size", got.intermediate_size, want.intermediate_size);
  cmp("num_hidden_layers", got.num_hidden_layers, want.num_hidden_layers);
  cmp("num_attention_heads", got.num_attention_heads, want.num_attention_heads);
  cmp("num_key_value_heads", got.num_key_value_heads, want.num_key_value_heads);
  cmp("head_dim", got.head_dim, want.head_dim);
  return diff;
}

// The config of --shape S --target DIR, once it is known to have shape S (checked before
// gigabytes of weights are read).
Qwen3Config folder_config(const std::string& dir, const std::string& shape) {
  const std::filesystem::path cfg_path = std::filesystem::path(dir) / "config.json";
  std::error_code ec;
  FLASHMAP_CHECK(std::filesystem::is_directory(dir, ec), "--target {}: not a folder", dir);
  FLASHMAP_CHECK(std::filesystem::exists(cfg_path, ec), "--target {}: no config.json", dir);
  const auto got = Qwen3Config::from_file(cfg_path.string());
  const auto diff = shape_mismatches(got, qwen3_shape(shape));
  FLASHMAP_CHECK(diff.empty(), "--target {} is not of shape {}: {}", dir, shape,
                 fmt::join(diff, ", "));
  return got;
}

// Per-round phase times and tokens/s of one decoding configuration over the prompts, through
// an engine (a batch of one per prompt).
json run_decode(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_new,
                int reps, float temperature = 0.0f) {
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

// The same on CPU models in memory (--shape: random weights, scripted proposers).
json run_decode(const Qwen3Model& target, const BlockProposer* proposer,
                const std::vector<std::vector<int32_t>>& prompts, int max_new, int reps) {
  EngineOptions o;
  o.spec_policy = SpecPolicyKind::Always;
  Engine engine(std::make_unique<cpu::CpuBackend>(target, proposer), o);
  return run_decode(engine, prompts, max_new, reps);
}

void write_json(const json& out, const std::string& path) {
  if (path.empty()) return;
  std::ofstream f(path);
  FLASHMAP_CHECK(f.good(), "--json: cannot write {}", path);
  f << out.dump(2) << "\n";
}

void run_bench(BenchArgs& a) {
  check_device(a.model.device);
  if (a.model.device != "cpu") {
    FLASHMAP_CHECK(a.shape.empty() || a.model.target.empty(),
                   "--shape with --target runs on the CPU only (drop --device {} or --target)",
                   a.model.device);
    FLASHMAP_CHECK(!a.no_sweep, "--no-sweep is for the CPU --shape bench (drop --device {})",
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
  std::unique_ptr<Qwen3Model> target_ptr;
  if (!a.shape.empty()) {
    FLASHMAP_CHECK(a.model.steps == 0 && a.model.draft.empty(),
                   "--shape times the target with its own scripted drafter: drop --draft and "
                   "--steps");
    // The folder's weights (of that shape) or random ones made in memory.
    const bool from_folder = !a.model.target.empty();
    const auto cfg = from_folder ? folder_config(a.model.target, a.shape) : qwen3_shape(a.shape);
    // The timed steps run a.block + 1 tokens at position a.context, in a cache of context + 64.
    FLASHMAP_CHECK(int64_t(a.context) + a.block + 64 <= cfg.max_position_embeddings,
                   "--context {} (+ --block {} + 64 positions of room) exceeds the {} positions "
                   "of shape {}",
                   a.context, a.block, cfg.max_position_embeddings, a.shape);
    FLASHMAP_CHECK(8 + int64_t(a.max_new_tokens) + a.block + 1 <= cfg.max_position_embeddings,
                   "--max-new-tokens {} (after an 8-token prompt, + --block {} + 1) exceeds the {} "
                   "positions of shape {}",
                   a.max_new_tokens, a.block, cfg.max_position_embeddings, a.shape);
    fmt::print("# flashmap bench --shape {}{} ({} threads)\n\n", a.shape,
               from_folder ? " --target " + a.model.target : std::string(),
               ThreadPool::global().size());
    const double gbps = measure_read_gbps();
    // Loaded as the engine's CPU backend loads a target: a model option that changes how targets
    // load (e.g. their weight format) applies here too.
    const auto format = ops::parse_weight_format(a.model.weights);
    target_ptr = from_folder ? std::make_unique<Qwen3Model>(a.model.target, nullptr, format)
                             : random_target(cfg, format);
    const Qwen3Model& target = *target_ptr;
    // Bytes a decode step reads: every weight but the embedding table (one row of it), unless
    // the table is also the lm_head.
    const bool tied = target.embedding().data == target.lm_head().data;
    const double emb_bytes =
        tied ? 0.0 : double(target.checkpoint().get("model.embed_tokens.weight").nbytes());
    // Packed, the linear layers are what a step streams (lm_head included, tied or not).
    const double bytes = target.packed_bytes() > 0 ? double(target.packed_bytes())
                                                   : double(target.weight_bytes()) - emb_bytes;
    // A synthetic context of a.context positions (its values do not change the cost).
    KVCache base = target.new_cache();
    const int64_t kv = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    for (auto* side : {&base.k, &base.v})
      for (auto& layer : *side) layer.assign(size_t((a.context + 64) * kv), 0.01f);
    base.length = a.context;
    // One output reused across steps, as the engine's backend reuses it (a fresh 10 MB of logits
    // per step would time the kernel's page clearing too).
    Qwen3Model::Output step_out;
    auto step = [&](int n) {
      std::vector<int32_t> toks(size_t(n), 7);
      return ms_of(
          [&] {
            base.truncate(a.context);
            Qwen3Model::SeqInput s{&base, toks};
            target.forward({&s, 1}, Qwen3Model::Logits::All, {}, step_out);
          },
          a.reps);
    };
    const double decode = step(1), verify = step(a.block + 1);
    const double eff = bytes / (decode * 1e-3) / 1e9;
    out["shape"] = a.shape;
    out["target"] = from_folder ? json(a.model.target) : json(nullptr);
    const bool q8 = target.weight_format() == ops::WeightFormat::Q8;
    out["weights"] = ops::weight_format_name(target.weight_format());
    out["lm_head_dtype"] =
        q8 ? std::string("Q8_0") : std::string(dtype_name(target.lm_head().dtype));
    out["tied_embeddings"] = tied;
    out["context"] = a.context;
    out["read_bandwidth_gbps"] = gbps;
    out["weight_bytes_per_step"] = bytes;
    out["decode_ms"] = decode;
    out[fmt::format("verify{}_ms", a.block + 1)] = verify;
    out["decode_effective_gbps"] = eff;
    out["decode_fraction_of_bandwidth"] = eff / gbps;
    out["verify_over_decode"] = verify / decode;
    fmt::print("| measure | value |\n|---|---|\n");
    fmt::print("| measured read bandwidth | {:.1f} GB/s |\n", gbps);
    fmt::print(
        "| decode, 1 token at context {} | {:.1f} ms ({:.1f} GB/s = {:.0f}% of bandwidth) |\n",
        a.context, decode, eff, 100 * eff / gbps);
    fmt::print("| verify, {} tokens | {:.1f} ms ({:.2f}x decode) |\n\n", a.block + 1, verify,
               verify / decode);
    if (a.no_sweep) return write_json(out, a.json_out);

    // Tokens/s against acceptance length: the scripted drafter proposes the target's own greedy
    // continuation, corrupted from slot j on, so each round commits j + 1 tokens.
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
    GenerateOptions o;
    o.max_new_tokens = a.max_new_tokens;
    const auto script = generate(target, nullptr, prompt, o).ids;
    const json alone = run_decode(target, nullptr, {prompt}, a.max_new_tokens, 1);
    out["target_alone"] = alone;
    fmt::print(
        "| drafter | tau | tokens/s | speedup | round ms | loop overhead "
        "|\n|---|---|---|---|---|---|\n");
    fmt::print("| none (target alone) | 1.00 | {:.2f} | 1.00x | {:.1f} | {:.2f}% |\n",
               alone["tokens_per_s"].get<double>(), alone["round_ms"].get<double>(),
               alone["loop_overhead_pct"].get<double>());
    json sweep = json::array();
    // 0, 1, 2, then every few slots, always ending on the full block.
    std::vector<int> rights;
    for (int j = 0; j < a.block; j += (j < 2 ? 1 : (a.block > 8 ? 3 : 2))) rights.push_back(j);
    rights.push_back(a.block);
    for (const int j : rights) {
      ScriptedProposer d(a.block, cfg.vocab_size, script, j);
      json r = run_decode(target, &d, {prompt}, a.max_new_tokens, 1);
      r["corrupt_from"] = j;
      fmt::print("| scripted, {} right | {:.2f} | {:.2f} | {:.2f}x | {:.1f} | {:.2f}% |\n", j,
                 r["tau"].get<double>(), r["tokens_per_s"].get<double>(),
                 r["tokens_per_s"].get<double>() / alone["tokens_per_s"].get<double>(),
                 r["round_ms"].get<double>(), r["loop_overhead_pct"].get<double>());
      sweep.push_back(r);
    }
    out["scripted"] = sweep;
  } else {
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
      if (DFlashConfig::is_dflash(d)) {
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
    EngineOptions alone_opt = eo;
    alone_opt.draft.clear();
    alone_opt.steps = 0;
    alone_opt.draft_tree = "off";
    Engine alone_engine(alone_opt);
    const int V = int(alone_engine.target_info().vocab_size);
    std::vector<std::vector<int32_t>> prompts;
    Rng rng(7);
    for (int i = 0; i < a.prompts; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 16; ++j) p.push_back(int32_t(rng.next() % uint64_t(V)));
      prompts.push_back(p);
    }
    fmt::print("# flashmap bench: {} + {} on {} ({} prompts x {} tokens, {}, {} threads)\n\n",
               a.model.target, fmt::join(drafts, " | "), alone_engine.device(), a.prompts,
               a.max_new_tokens,
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
    for (size_t d = 0; d < drafts.size(); ++d)
      for (const std::string& tree : trees) {
        // With several drafters (trees) the rows and JSON keys carry the drafter's index (the
        // first is --draft, then each --vs-draft in order) and the tree's shape.
        std::string tag = drafts.size() > 1 ? fmt::format(" [{}]", d) : "";
        std::string key = drafts.size() > 1 ? fmt::format("draft{}_", d) : "";
        if (tree != "off") {
          tag += ", tree " + tree;
          key += "tree_" + tree + "_";
        }
        EngineOptions so = eo;
        so.draft = drafts[d];
        so.draft_tree = tree;
        if (!flashmap_configs[d]) {
          so.steps = 0;
          Engine engine(so);
          const json r = run_decode(engine, prompts, a.max_new_tokens, a.reps, a.temperature);
          out[key + "dflash"] = r;
          row("DFlash" + tag, r);
          continue;
        }
        for (const auto& [steps, grid] : flashmap_configs[d]->jump_grids) {
          if (a.model.steps > 0 && steps != a.model.steps) continue;
          so.steps = steps;
          Engine engine(so);
          const json r = run_decode(engine, prompts, a.max_new_tokens, a.reps, a.temperature);
          out[fmt::format("{}flashmap_steps{}", key, steps)] = r;
          row(fmt::format("FlashMap, {} step{}{}", steps, steps > 1 ? "s" : "", tag), r);
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
  sub->add_flag("--no-sweep", args->no_sweep,
                "--shape: time decode and verify only, without the tokens/s sweep over acceptance "
                "lengths")
      ->needs(shape);
  sub->add_option("--vs-draft", args->vs_drafts,
                  "another drafter (FlashMap or DFlash) to time beside --draft on the same target "
                  "and prompts, in the same run; repeatable")
      ->check(non_empty())
      ->excludes(shape);
  sub->add_option("--draft-trees", args->trees,
                  "draft-tree shapes to time for each drafter, comma-separated (off, paths:N, "
                  "topk:B, paths:N+topk:B; default: --draft-tree's)")
      ->delimiter(',')
      ->excludes(shape);
  sub->add_option("--temperature", args->temperature,
                  "sampling temperature of the decoding runs (0: greedy; unseeded above)")
      ->check(CLI::Range(0.0f, 100.0f))
      ->excludes(shape);
  sub->add_option("--reps", args->reps, "repetitions (median or sum; 3)")
      ->check(CLI::Range(1, 100000));
  sub->add_option("--prompts", args->prompts, "number of random prompts (4)")
      ->check(CLI::Range(1, 100000))
      ->excludes(shape);
  sub->add_option("--max-new-tokens", args->max_new_tokens, "tokens per prompt (128)")
      ->check(CLI::Range(1, INT32_MAX));
  sub->add_option("--json", args->json_out, "also write the figures as JSON to this file")
      ->check(non_empty());
  sub->callback([args] { run_bench(*args); });
}

}  // namespace

FLASHMAP_COMMAND(register_cmd);

}  // namespace flashmap::cli
