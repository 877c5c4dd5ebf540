// `flashmap bench --shape S` on the CPU: a Qwen3 target of a released shape (random bf16 weights
// made in memory, or the folder --target of that shape) and, with --draft-shape or --draft, its
// FlashMap or DFlash drafter. Every phase of a speculative round is timed against a limit measured
// in the same run (read bandwidth for the streaming phases, the arithmetic peak of the mode — fp32
// FMA, bf16 or int8 dot products — for the compute-bound ones), and the projected tokens/s over
// acceptance lengths τ comes from the measured round.
#include "bench/cpu_shape.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "bench/generate.h"
#include "bench/timing.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "cpu/backend.h"
#include "cpu/proposers.h"
#include "io/hf_config.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "ops/gemm.h"
#include "ops/roofline.h"

namespace flashmap::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Peak resident set of this process so far, in GB.
double max_rss_gb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) * 1024.0 / 1e9;
}

// Uniform values in [-√3, √3)·scale (unit variance before the scale), as bf16; in blocks of 2^20
// seeded by their index, so the weights do not depend on the thread count.
void fill_random_bf16(uint16_t* p, int64_t n, float scale, uint64_t seed) {
  const int64_t block = int64_t(1) << 20, blocks = (n + block - 1) / block;
  ThreadPool::global().parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      Rng rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(k));
      const int64_t end = std::min(n, (k + 1) * block);
      for (int64_t i = k * block; i < end; ++i) {
        const float u = float(int32_t(uint32_t(rng.next() >> 32))) * (1.7320508f / 2147483648.0f);
        p[i] = f32_to_bf16(u * scale);
      }
    }
  });
}

// A checkpoint of random bf16 tensors made in memory: matrices scaled by 1/√in (nn.Linear's
// variance), vectors set to one value (norm weights 1, biases 0).
struct RandomTensors {
  std::vector<TensorData> t;
  uint64_t seed;
  void mat(const std::string& name, int64_t rows, int64_t cols) {
    TensorData d{name, DType::BF16, {rows, cols}, {}};
    d.bytes.resize(size_t(rows * cols) * 2);
    fill_random_bf16(reinterpret_cast<uint16_t*>(d.bytes.data()), rows * cols,
                     1.0f / std::sqrt(float(cols)), seed++);
    t.push_back(std::move(d));
  }
  void vec(const std::string& name, int64_t n, float value = 1.0f) {
    t.push_back(make_tensor(name, {n}, std::vector<float>(size_t(n), value), DType::BF16));
  }
  // The tensors of a Qwen3 decoder layer, names from `prefix`.
  void qwen3_layer(const std::string& p, const Qwen3Config& c) {
    const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size;
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
};

std::unique_ptr<Qwen3Model> random_target(const Qwen3Config& c, ops::WeightFormat format,
                                          double& make_s) {
  const auto t0 = Clock::now();
  RandomTensors r{{}, 1};
  const int64_t H = c.hidden_size;
  r.mat("model.embed_tokens.weight", c.vocab_size, H);
  r.mat("lm_head.weight", c.vocab_size, H);
  r.vec("model.norm.weight", H);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    r.qwen3_layer(fmt::format("model.layers.{}.", l), c);
  make_s = seconds_since(t0);
  return std::make_unique<Qwen3Model>(
      c, Checkpoint::from_tensors(std::move(r.t), "random " + std::to_string(H)), nullptr, format);
}

// The tensors FlashMapModel::load_weights reads, at config c's shape.
std::unique_ptr<FlashMapModel> random_drafter(const FlashMapConfig& c, const Qwen3Model& target,
                                              ops::WeightFormat format, double& make_s) {
  const auto t0 = Clock::now();
  RandomTensors r{{}, 1000};
  const int64_t D = c.hidden_size, TH = c.target_hidden_size, hd = c.head_dim();
  auto lin = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    r.mat(name + ".weight", out, in);
    if (bias) r.vec(name + ".bias", out, 0.0f);
  };
  r.mat("fc.weight", D, int64_t(c.target_layer_ids.size()) * TH);
  r.vec("hidden_norm.weight", D);
  lin("anchor_proj", D, TH, true);
  r.vec("anchor_norm.weight", D);
  r.vec("state_norm.weight", TH);
  r.vec("noise_norm.weight", TH);
  r.vec("noise_gate", 1, 0.5f);
  lin("x_embed", D, TH, true);
  for (const char* te : {"time_embed", "jump_embed"}) {
    lin(fmt::format("{}.linear_1", te), c.cond_dim, c.time_embed_dim, true);
    lin(fmt::format("{}.linear_2", te), c.cond_dim, c.cond_dim, true);
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    for (const char* m : {"self_attn_adaln", "cross_attn_adaln", "mlp_adaln"})
      lin(p + m + ".linear", 3 * D, c.cond_dim, true);
    for (const char* a : {"self_attn", "cross_attn"}) {
      for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
        lin(p + a + "." + proj, D, D, false);
      r.vec(p + a + ".q_norm.weight", hd);
      r.vec(p + a + ".k_norm.weight", hd);
    }
    lin(p + "mlp.fc1", c.intermediate_size, D, true);
    lin(p + "mlp.fc2", D, c.intermediate_size, true);
  }
  lin("final_adaln.linear", 3 * D, c.cond_dim, true);
  lin("head", TH, D, true);
  make_s = seconds_since(t0);
  return std::make_unique<FlashMapModel>(
      c, Checkpoint::from_tensors(std::move(r.t), "random flashmap " + std::to_string(D)), target,
      nullptr, format);
}

// The tensors DFlashModel reads at config c's shape: z-lab's release format, and with a reduced
// vocabulary speculators' own lm_head, d2t and t2d.
std::unique_ptr<DFlashModel> random_dflash(const DFlashConfig& c, const Qwen3Model& target,
                                           ops::WeightFormat format, double& make_s) {
  const auto t0 = Clock::now();
  RandomTensors r{{}, 2000};
  const int64_t H = c.layers.hidden_size, TH = target.config().hidden_size;
  r.mat("fc.weight", H, int64_t(c.target_layer_ids.size()) * TH);
  r.vec("hidden_norm.weight", H);
  r.vec("norm.weight", H);
  for (int i = 0; i < c.layers.num_hidden_layers; ++i)
    r.qwen3_layer(fmt::format("layers.{}.", i), c.layers);
  if (c.reduced_vocab()) {
    // speculators' reduced vocabulary: its own lm_head over the first draft_vocab_size target
    // ids (d2t: offsets 0; t2d: those ids marked).
    const int64_t DV = c.draft_vocab_size, V = c.layers.vocab_size;
    r.mat("lm_head.weight", DV, H);
    r.t.push_back({"d2t", DType::I64, {DV}, std::vector<uint8_t>(size_t(DV) * 8, 0)});
    std::vector<uint8_t> marked(size_t(V), 0);
    std::fill_n(marked.begin(), DV, uint8_t(1));
    r.t.push_back({"t2d", DType::Bool, {V}, std::move(marked)});
  }
  make_s = seconds_since(t0);
  return std::make_unique<DFlashModel>(
      c, Checkpoint::from_tensors(std::move(r.t), "random dflash " + std::to_string(H)), target,
      nullptr, format);
}

// How a weight is held: an integer format by ggml's name of its blocks (a GGUF's Q6_K head stays
// Q6_K under --weights q4), else the dtype of its file.
std::string held_as(const Weight& w) {
  const ops::PackedWeight* p = w.packed.get();
  if (!p || !p->integer()) return std::string(dtype_name(w.dtype));
  return p->q8 ? "Q8_0" : p->q4 ? "Q4_0" : p->q4k ? "Q4_K" : p->q5k ? "Q5_K" : "Q6_K";
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

// The same decoding configuration on CPU models in memory (scripted proposers).
json run_scripted(const Qwen3Model& target, const BlockProposer* proposer,
                  const std::vector<std::vector<int32_t>>& prompts, int max_new, int reps) {
  EngineOptions o;
  o.spec_policy = SpecPolicyKind::Always;
  Engine engine(std::make_unique<cpu::CpuBackend>(target, proposer), o);
  return run_decode(engine, prompts, max_new, reps);
}

// Multiply-adds of one token through the target's linear layers (lm_head excluded): what a
// prefill row costs, attention over a short prompt being small next to it.
double linear_macs_per_token(const Qwen3Config& c) {
  const double H = c.hidden_size, q = double(c.num_attention_heads) * c.head_dim,
               kv = double(c.num_key_value_heads) * c.head_dim, I = c.intermediate_size;
  return double(c.num_hidden_layers) * (H * q * 2 + H * kv * 2 + 3 * H * I);
}

// Multiply-adds of one block row through the drafter for one jump: its DiT layers (self- and
// cross-attention projections of the block, MLP), the state and head projections, and the
// borrowed lm_head; the context's keys and values are projected once, at commit.
double draft_macs_per_row(const FlashMapConfig& c, int64_t vocab) {
  const double D = c.hidden_size, TH = c.target_hidden_size, I = c.intermediate_size;
  const double layer = 4 * D * D + 2 * D * D + 2 * D * I;
  return double(c.num_hidden_layers) * layer + 2 * D * TH + double(vocab) * TH;
}

// The target's tapped features at `positions` positions, F values each: uniform in [−1, 1).
std::vector<float> random_features(int64_t positions, int64_t F) {
  std::vector<float> features(size_t(positions * F));
  Rng rng(11);
  for (auto& x : features) x = float(int32_t(uint32_t(rng.next() >> 32))) / 2147483648.0f;
  return features;
}

// A draft's time, its multiply-adds' rate and that rate's share of the arithmetic peak.
json draft_time(double ms, double macs, double peak_gflops) {
  const double gflops = 2 * macs / (ms * 1e-3) / 1e9;
  return {{"ms", ms}, {"gflops", gflops}, {"fraction_of_fma_peak", gflops / peak_gflops}};
}

// A verified block's commit: K + 1 positions' features (from `block`) into a fork of the
// context, so every repetition starts from the same length; and the fork's copy alone, to take
// out of the commit's time.
template <class Model, class Context>
void time_commit(const Model& draft, const Context& ctx, const float* block, int K, int reps,
                 json& j) {
  j["commit_ms"] = ms_of(
      [&] {
        Context c2 = draft.fork_context(ctx, ctx.length);
        draft.extend_context(c2, block, K + 1);
      },
      reps);
  j["fork_copy_ms"] = ms_of([&] { (void)draft.fork_context(ctx, ctx.length); }, reps);
}

// The drafter's timings at a context of `context` positions: the first draft right after load
// (while the noise factor is formed in the background), the factor's readiness, steady drafts
// of 1…4 jumps and the commit of a verified block (its context features projected).
json time_drafter(const FlashMapModel& draft, const Qwen3Config& tc, const CpuShapeBench& a,
                  Clock::time_point loaded, double fma_gflops) {
  const FlashMapConfig& c = draft.config();
  const int K = c.block_size;
  const int64_t V = tc.vocab_size;
  const int64_t F = int64_t(c.target_layer_ids.size()) * c.target_hidden_size;
  const std::vector<float> features = random_features(a.context + K + 1, F);
  FlashMapContext ctx = draft.new_context();
  auto t0 = Clock::now();
  draft.extend_context(ctx, features.data(), a.context);
  const double context_ms = 1000 * seconds_since(t0);
  std::vector<float> logits(size_t(K) * size_t(V));
  Rng rng(5);
  auto draft_once = [&](int steps) {
    FlashMapModel::Request r{&ctx, 7, {FlashMapModel::Noise::Draw, nullptr, &rng}};
    draft.draft({&r, 1}, steps, logits.data());
  };
  json j;
  const bool ready_at_first = draft.noise_factor_ready();
  t0 = Clock::now();
  draft_once(1);
  j["first_draft_ms"] = 1000 * seconds_since(t0);
  j["first_draft_after_load_s"] = seconds_since(loaded);
  j["first_draft_noise"] = ready_at_first ? "embedding" : "vocabulary";
  j["context_extend_ms"] = context_ms;
  // Steady state is timed once the factor exists (its background run would share the cores).
  t0 = Clock::now();
  const bool has = draft.has_noise_factor();
  j["noise_factor_wait_s"] = seconds_since(t0);
  j["noise_factor_ready_after_load_s"] = seconds_since(loaded);
  j["noise_factor"] = has ? (draft.noise_factor_from_cache() ? "disk cache" : "formed") : "none";
  json steps = json::object();
  for (const auto& [n, grid] : c.jump_grids) {
    (void)grid;
    // Every jump after the first also reads its state through the embedding (softmax · E).
    const double macs =
        K * (n * draft_macs_per_row(c, V) + (n - 1) * double(V) * c.target_hidden_size);
    steps[std::to_string(n)] =
        draft_time(ms_of([&, n = n] { draft_once(n); }, a.reps), macs, fma_gflops);
  }
  j["draft"] = steps;
  time_commit(draft, ctx, features.data() + a.context * F, K, a.reps, j);
  return j;
}

// The DFlash drafter's timings at a context of `context` positions: the first draft right after
// load, steady drafts (one pass over the block: the anchor and K − 1 masks through its layers,
// the K − 1 rows through an lm_head) and the commit of a verified block (its context
// features projected into every layer's keys and values). The same fields as time_drafter's,
// the pass as draft "1".
json time_dflash(const DFlashModel& draft, const Qwen3Config& tc, const CpuShapeBench& a,
                 Clock::time_point loaded, double peak_gflops) {
  const DFlashConfig& c = draft.config();
  const int K = c.block_size;
  const int64_t V = tc.vocab_size;
  const int64_t F = int64_t(c.target_layer_ids.size()) * tc.hidden_size;
  const std::vector<float> features = random_features(a.context + K + 1, F);
  DFlashContext ctx = draft.new_context();
  auto t0 = Clock::now();
  draft.extend_context(ctx, features.data(), a.context);
  json j;
  j["context_extend_ms"] = 1000 * seconds_since(t0);
  std::vector<float> logits(size_t(K - 1) * size_t(V));
  auto draft_once = [&] {
    DFlashModel::Request r{&ctx, 7};
    draft.draft({&r, 1}, K, logits.data());
  };
  t0 = Clock::now();
  draft_once();
  j["first_draft_ms"] = 1000 * seconds_since(t0);
  j["first_draft_after_load_s"] = seconds_since(loaded);
  // The block's rows through the layers (attention to the context aside) and K − 1 of them
  // through the lm_head (the target's, or the drafter's own over its reduced vocabulary).
  const double macs = K * linear_macs_per_token(c.layers) +
                      double(K - 1) * double(c.draft_vocab_size) * tc.hidden_size;
  j["draft"] = {{"1", draft_time(ms_of(draft_once, a.reps), macs, peak_gflops)}};
  time_commit(draft, ctx, features.data() + a.context * F, K, a.reps, j);
  return j;
}

}  // namespace

void bench_cpu_shape(const CpuShapeBench& a) {
  json out;
  out["threads"] = ThreadPool::global().size();
  FLASHMAP_CHECK(a.steps == 0, "--shape times every step count of the drafter: drop --steps");
  FLASHMAP_CHECK(a.draft_shape.empty() || a.draft.empty(),
                 "--draft-shape makes a random drafter: drop --draft (or --draft-shape)");
  // The folder's weights (of that shape) or random ones made in memory.
  const bool from_folder = !a.target.empty();
  const std::string folder = from_folder ? target_folder(a.target) : "";  // a GGUF's, too
  const auto cfg = from_folder ? folder_config(folder, a.shape) : qwen3_shape(a.shape);
  // The timed steps run a.block + 1 tokens at position a.context, in a cache of context + 64.
  FLASHMAP_CHECK(int64_t(a.context) + a.block + 64 <= cfg.max_position_embeddings,
                 "--context {} (+ --block {} + 64 positions of room) exceeds the {} positions "
                 "of shape {}",
                 a.context, a.block, cfg.max_position_embeddings, a.shape);
  FLASHMAP_CHECK(8 + int64_t(a.max_new_tokens) + a.block + 1 <= cfg.max_position_embeddings,
                 "--max-new-tokens {} (after an 8-token prompt, + --block {} + 1) exceeds the {} "
                 "positions of shape {}",
                 a.max_new_tokens, a.block, cfg.max_position_embeddings, a.shape);
  FLASHMAP_CHECK(a.prefill + 64 <= cfg.max_position_embeddings,
                 "--prefill {} exceeds the {} positions of shape {}", a.prefill,
                 cfg.max_position_embeddings, a.shape);
  // The drafter's shape is checked against the target's before gigabytes of weights are made.
  std::optional<FlashMapConfig> draft_cfg;
  std::optional<DFlashConfig> dflash_cfg;
  const std::string draft_what =
      !a.draft_shape.empty() ? "--draft-shape " + a.draft_shape : "--draft " + a.draft;
  const std::string draft_config = (std::filesystem::path(a.draft) / "config.json").string();
  if (!a.draft_shape.empty() && is_dflash_shape(a.draft_shape))
    dflash_cfg = dflash_shape(a.draft_shape);
  else if (!a.draft_shape.empty())
    draft_cfg = flashmap_shape(a.draft_shape);
  else if (!a.draft.empty() && DFlashConfig::is_dflash(a.draft))
    dflash_cfg = DFlashConfig::from_file(draft_config);
  else if (!a.draft.empty())
    draft_cfg = FlashMapConfig::from_file(draft_config);
  if (draft_cfg)
    FLASHMAP_CHECK(
        draft_cfg->vocab_size == cfg.vocab_size && draft_cfg->target_hidden_size == cfg.hidden_size,
        "{} drafts for a target with vocab_size {} and hidden_size {}, not shape {} "
        "({} and {})",
        draft_what, draft_cfg->vocab_size, draft_cfg->target_hidden_size, a.shape, cfg.vocab_size,
        cfg.hidden_size);
  FLASHMAP_CHECK(
      a.draft_vocab == 0 || (dflash_cfg && !a.draft_shape.empty()),
      "--draft-vocab reduces the vocabulary of a DFlash --draft-shape (dflash-qwen3-8b)");
  if (a.draft_vocab > 0) {
    FLASHMAP_CHECK(a.draft_vocab <= cfg.vocab_size,
                   "--draft-vocab {}: more ids than the target's vocabulary of {}", a.draft_vocab,
                   cfg.vocab_size);
    dflash_cfg->draft_vocab_size = a.draft_vocab;
  }
  if (dflash_cfg) dflash_cfg->check_target(cfg, "of shape " + a.shape);
  const int draft_block = draft_cfg    ? draft_cfg->block_size
                          : dflash_cfg ? dflash_cfg->block_size
                                       : 0;
  FLASHMAP_CHECK(draft_block == 0 || draft_block == a.block,
                 "{} drafts blocks of {}: set --block {}", draft_what, draft_block, draft_block);
  fmt::print("# flashmap bench --shape {}{}{} ({} threads, {} kernels)\n\n", a.shape,
             from_folder ? " --target " + a.target : std::string(),
             !a.draft_shape.empty() ? " --draft-shape " + a.draft_shape
             : !a.draft.empty()     ? " --draft " + a.draft
                                    : std::string(),
             ThreadPool::global().size(), ops::isa_name(ops::active_isa()));
  const double gbps = ops::read_bandwidth_gbps(ThreadPool::global());
  // Loaded as the engine's CPU backend loads a target: a model option that changes how targets
  // load (their weight format, the compute mode) applies here too.
  const auto format = ops::weight_format(a.weights, a.compute);
  const bool bf16 = format == ops::WeightFormat::Bf16;
  const double fp32_peak = ops::fma_peak_gflops(ThreadPool::global());
  // The arithmetic limit of the mode the products run in: fp32 FMAs, bf16 dot products, or the
  // int8 dot products of q8/q4 weights where the kernel takes them.
  const bool integer = ops::is_integer(format);
  const double int8_peak = integer ? ops::int8_dot_peak_gops(ThreadPool::global()) : 0;
  const double peak = bf16            ? ops::bf16_dot_peak_gflops(ThreadPool::global())
                      : int8_peak > 0 ? int8_peak
                                      : fp32_peak;
  double make_s = 0, draft_make_s = 0;
  auto t0 = Clock::now();
  std::unique_ptr<Qwen3Model> target_ptr =
      from_folder ? std::make_unique<Qwen3Model>(folder, nullptr, format)
                  : random_target(cfg, format, make_s);
  const double target_load_s = seconds_since(t0) - make_s;
  const Qwen3Model& target = *target_ptr;
  const double rss_target = max_rss_gb();
  // The drafter: FlashMap or DFlash (at most one of them).
  std::unique_ptr<FlashMapModel> flashmap;
  std::unique_ptr<DFlashModel> dflash;
  const bool random_draft = !a.draft_shape.empty();
  t0 = Clock::now();
  if (draft_cfg)
    flashmap = random_draft ? random_drafter(*draft_cfg, target, format, draft_make_s)
                            : std::make_unique<FlashMapModel>(a.draft, target, nullptr, format);
  if (dflash_cfg)
    dflash = random_draft ? random_dflash(*dflash_cfg, target, format, draft_make_s)
                          : std::make_unique<DFlashModel>(a.draft, target, nullptr, format);
  const bool drafter = flashmap || dflash;
  const auto loaded = Clock::now();
  const double draft_load_s = seconds_since(t0) - draft_make_s;
  // Bytes a decode step reads: packed, the linear layers (lm_head included, tied or not); else
  // every weight as read (a GGUF's blocks dequantized) but the embedding table (one row of it),
  // unless the table is also the lm_head.
  const bool tied = target.config().tie_word_embeddings;
  double bytes = double(target.packed_bytes());
  if (bytes == 0) {
    bytes = double(target.checkpoint().bytes()) -
            (tied ? 0.0 : double(target.checkpoint().get("model.embed_tokens.weight").nbytes()));
  }
  const double file_bytes = double(target.weight_bytes());
  out["shape"] = a.shape;
  out["draft_shape"] = a.draft_shape.empty() ? json(nullptr) : json(a.draft_shape);
  out["draft_vocab"] = dflash_cfg  ? json(dflash_cfg->draft_vocab_size)
                       : draft_cfg ? json(draft_cfg->vocab_size)
                                   : json(nullptr);
  out["target"] = from_folder ? json(a.target) : json(nullptr);
  out["isa"] = ops::isa_name(ops::active_isa());
  const ops::WeightFormat wf = target.weight_format();
  out["weights"] = ops::weight_format_name(wf);
  out["lm_head_dtype"] = held_as(target.lm_head());
  out["tied_embeddings"] = tied;
  out["context"] = a.context;
  out["read_bandwidth_gbps"] = gbps;
  out["compute"] = bf16 ? "bf16" : "fp32";
  out["fma_peak_gflops"] = fp32_peak;
  out["arithmetic_peak_gflops"] = peak;  // the mode's: fp32 FMA, bf16 dot or int8 dot peak
  out["target_weight_bytes"] = file_bytes;
  out["target_make_random_s"] = make_s;
  out["target_load_s"] = target_load_s;
  out["max_rss_gb_after_target"] = rss_target;
  out["weight_bytes_per_step"] = bytes;

  fmt::print("| measure | value | limit |\n|---|---|---|\n");
  fmt::print("| read bandwidth (all threads) | {:.1f} GB/s | |\n", gbps);
  fmt::print("| fp32 FMA peak (all threads) | {:.0f} GFLOP/s | |\n", fp32_peak);
  if (bf16)
    fmt::print("| bf16 dot-product peak (all threads; the limit below) | {:.0f} GFLOP/s | |\n",
               peak);
  if (int8_peak > 0)
    fmt::print("| int8 dot-product peak (all threads; the limit below) | {:.0f} GOP/s | |\n", peak);
  // A load packs every weight once: reading its bytes and writing the packed copy is the least
  // it can cost from memory (a cold disk is slower still; random weights are made in memory).
  const double load_limit_s = 2 * file_bytes / (gbps * 1e9);
  fmt::print(
      "| target load ({:.1f} GB{}) | {:.1f} s{} | {:.1f} s (read + write once at bandwidth) |\n",
      file_bytes / 1e9, from_folder ? "" : ", random", target_load_s,
      from_folder ? "" : fmt::format(" after {:.1f} s making them", make_s), load_limit_s);
  fmt::print("| max RSS after target load | {:.2f} GB | {:.2f} GB (weights) |\n", rss_target,
             file_bytes / 1e9);

  // Decode and verify-K+1 at position a.context of a synthetic context (its values do not
  // change the cost), with the drafter's taps when there is one, as the engine asks for them.
  KVCache base = target.new_cache();
  const int64_t kv = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  for (auto* side : {&base.k, &base.v})
    for (auto& layer : *side) layer.assign(size_t((a.context + 64) * kv), 0.01f);
  base.length = a.context;
  const std::vector<int> taps = flashmap ? flashmap->target_layer_ids()
                                : dflash ? dflash->target_layer_ids()
                                         : std::vector<int>{};
  // One output reused across steps, as the engine's backend reuses it (a fresh 10 MB of logits
  // per step would time the kernel's page clearing too).
  Qwen3Model::Output step_out;
  auto step = [&](int n) {
    std::vector<int32_t> toks(size_t(n), 7);
    return ms_of(
        [&] {
          base.truncate(a.context);
          Qwen3Model::SeqInput s{&base, toks};
          target.forward({&s, 1}, Qwen3Model::Logits::All, taps, step_out);
        },
        a.reps);
  };
  json drafter_json;
  if (drafter) {
    const double rss = max_rss_gb();
    out["draft_make_random_s"] = draft_make_s;
    out["draft_load_s"] = draft_load_s;
    out["max_rss_gb_after_drafter"] = rss;
    fmt::print(
        "| drafter load | {:.1f} s{} | |\n", draft_load_s,
        a.draft_shape.empty() ? "" : fmt::format(" after {:.1f} s making them", draft_make_s));
    fmt::print("| max RSS after drafter load | {:.2f} GB | |\n", rss);
    // Right after load, before the target steps: what the first request meets.
    drafter_json = flashmap ? time_drafter(*flashmap, cfg, a, loaded, peak)
                            : time_dflash(*dflash, cfg, a, loaded, peak);
    out["drafter"] = drafter_json;
    out["drafter"]["kind"] = flashmap ? "flashmap" : "dflash";
    fmt::print(
        "| first draft after load{} | {:.0f} ms, {:.1f} s after load | 1 s |\n",
        flashmap ? fmt::format(" ({} noise)", drafter_json["first_draft_noise"].get<std::string>())
                 : std::string(),
        drafter_json["first_draft_ms"].get<double>(),
        drafter_json["first_draft_after_load_s"].get<double>());
    if (flashmap)
      fmt::print("| noise factor ready ({}) | {:.1f} s after load | |\n",
                 drafter_json["noise_factor"].get<std::string>(),
                 drafter_json["noise_factor_ready_after_load_s"].get<double>());
  }
  const double decode = step(1), verify = step(a.block + 1);
  const double eff = bytes / (decode * 1e-3) / 1e9;
  const double verify_flops =
      2 * (a.block + 1) * (linear_macs_per_token(cfg) + double(cfg.vocab_size) * cfg.hidden_size);
  // Verify's limit: the weights streamed once, or its multiply-adds at the arithmetic peak.
  const double verify_limit = std::max(decode, verify_flops / (peak * 1e9) * 1e3);
  out["decode_ms"] = decode;
  out[fmt::format("verify{}_ms", a.block + 1)] = verify;
  out["decode_effective_gbps"] = eff;
  out["decode_fraction_of_bandwidth"] = eff / gbps;
  out["verify_over_decode"] = verify / decode;
  out["verify_limit_ms"] = verify_limit;
  fmt::print("| decode, 1 token at context {} | {:.1f} ms | {:.0f}% of bandwidth ({:.1f} GB/s) |\n",
             a.context, decode, 100 * eff / gbps, eff);
  fmt::print(
      "| verify, {} tokens | {:.1f} ms ({:.2f}x decode) | {:.1f} ms: {:.0f}% of the larger of "
      "decode and {:.0f} GFLOP at the arithmetic peak |\n",
      a.block + 1, verify, verify / decode, verify_limit, 100 * verify_limit / verify,
      verify_flops / 1e9);
  {
    // Prefill: a.prefill tokens from an empty cache, the last row's logits (and the taps).
    std::vector<int32_t> toks(size_t(a.prefill), 7);
    KVCache cache = target.new_cache();
    const double ms = ms_of(
        [&] {
          cache.truncate(0);
          Qwen3Model::SeqInput s{&cache, toks};
          target.forward({&s, 1}, Qwen3Model::Logits::Last, taps, step_out);
        },
        a.reps);
    const double gflops = 2 * a.prefill * linear_macs_per_token(cfg) / (ms * 1e-3) / 1e9;
    out["prefill_tokens"] = a.prefill;
    out["prefill_ms"] = ms;
    out["prefill_tokens_per_s"] = 1000.0 * a.prefill / ms;
    out["prefill_fraction_of_fma_peak"] = gflops / peak;
    fmt::print(
        "| prefill, {} tokens | {:.0f} ms ({:.1f} tokens/s, {:.0f} GFLOP/s) | {:.0f}% of "
        "the arithmetic peak |\n",
        a.prefill, ms, 1000.0 * a.prefill / ms, gflops, 100 * gflops / peak);
  }
  if (drafter) {
    const auto& d = drafter_json;
    for (const auto& [n, s] : d["draft"].items()) {
      const double ms = s["ms"].get<double>();
      fmt::print("| draft, {} | {:.0f} ms ({:.2f}x decode) | {:.0f}% of the arithmetic peak |\n",
                 flashmap ? fmt::format("{} step{}", n, n == "1" ? "" : "s")
                 : dflash->config().reduced_vocab()
                     ? fmt::format("one pass of {} rows, draft vocabulary {}", a.block,
                                   dflash->config().draft_vocab_size)
                     : fmt::format("one pass of {} rows", a.block),
                 ms, ms / decode, 100 * s["fraction_of_fma_peak"].get<double>());
    }
    const double commit = d["commit_ms"].get<double>() - d["fork_copy_ms"].get<double>();
    fmt::print("| commit {} positions to the drafter's context | {:.1f} ms | |\n", a.block + 1,
               commit);
    fmt::print("\n");
    // What a round costs, measured by phase: one draft (1 step), the verify, the commit. τ is
    // the user's (the tokens a round commits, 1 … K + 1): tokens/s = τ / round.
    const double round = d["draft"]["1"]["ms"].get<double>() + verify + commit;
    out["round_ms"] = round;
    json table = json::array();
    fmt::print("| τ (tokens per round) | tokens/s | speed-up vs target alone |\n|---|---|---|\n");
    fmt::print("| target alone | {:.2f} | 1.00x |\n", 1000.0 / decode);
    std::vector<double> taus;
    for (int t = 1; t <= 10; ++t) taus.push_back(t);
    taus.insert(taus.begin() + 6, 6.5);
    for (double tau : taus) {
      const double tps = 1000.0 * tau / round;
      table.push_back({{"tau", tau}, {"tokens_per_s", tps}, {"speedup", tps * decode / 1000}});
      fmt::print("| {:g} | {:.2f} | {:.2f}x |\n", tau, tps, tps * decode / 1000);
    }
    out["projected"] = table;
    fmt::print(
        "\nround = draft ({}) {:.0f} ms + verify {:.0f} ms + commit {:.1f} ms = {:.0f} "
        "ms\n\n",
        flashmap ? "1 step" : "one pass", d["draft"]["1"]["ms"].get<double>(), verify, commit,
        round);
  } else {
    fmt::print("\n");
  }
  if (a.no_sweep || drafter) return write_json(out, a.json_out);

  // Tokens/s against acceptance length: the scripted drafter proposes the target's own greedy
  // continuation, corrupted from slot j on, so each round commits j + 1 tokens.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  const auto script = generate(target, nullptr, prompt, o).ids;
  const json alone = run_scripted(target, nullptr, {prompt}, a.max_new_tokens, 1);
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
    json r = run_scripted(target, &d, {prompt}, a.max_new_tokens, 1);
    r["corrupt_from"] = j;
    fmt::print("| scripted, {} right | {:.2f} | {:.2f} | {:.2f}x | {:.1f} | {:.2f}% |\n", j,
               r["tau"].get<double>(), r["tokens_per_s"].get<double>(),
               r["tokens_per_s"].get<double>() / alone["tokens_per_s"].get<double>(),
               r["round_ms"].get<double>(), r["loop_overhead_pct"].get<double>());
    sweep.push_back(r);
  }
  out["scripted"] = sweep;
  write_json(out, a.json_out);
}

}  // namespace flashmap::bench
