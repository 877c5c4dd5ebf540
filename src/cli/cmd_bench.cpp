// `flashmap bench`: speed of the target forward and of the round loop.
//   flashmap bench                         the built-in pair: target-alone vs speculative
//   flashmap bench --target T --draft D    any pair
//   flashmap bench --shape qwen3-0.6b      random bf16 weights at a real shape, made in memory:
//                                          decode / verify-17 ms against measured bandwidth, and
//                                          tokens/s as a function of acceptance length (scripted)
//   flashmap bench --device cuda --shape qwen3-8b
//                                          the same on the GPU (CUDA builds): random device
//                                          weights, HBM bandwidth, decode and verify with graphs
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "spec/decoder.h"

#ifdef FLASHMAP_WITH_CUDA
#include "cuda/decoder_cuda.h"
#include "cuda/device.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/qwen3_cuda.h"
#endif

namespace flashmap::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct BenchArgs {
  ModelOptions model;
  std::string shape, json_out, device = "cpu";
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
std::unique_ptr<Qwen3Model> random_target(const Qwen3Config& c) {
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
      c, Checkpoint::from_tensors(std::move(t), "random " + std::to_string(H)));
}

Qwen3Config shape_config(const std::string& shape) {
  Qwen3Config c;
  if (shape == "qwen3-8b") {
    // Qwen/Qwen3-8B's config.json (untied lm_head): the target of the goal table.
    c.vocab_size = 151936, c.hidden_size = 4096, c.intermediate_size = 12288;
    c.num_hidden_layers = 36, c.num_attention_heads = 32, c.num_key_value_heads = 8,
    c.head_dim = 128;
  } else if (shape == "qwen3-0.6b") {
    c.vocab_size = 151936, c.hidden_size = 1024, c.intermediate_size = 3072;
    c.num_hidden_layers = 28, c.num_attention_heads = 16, c.num_key_value_heads = 8,
    c.head_dim = 128;
  } else if (shape == "tiny") {
    c.vocab_size = 4096, c.hidden_size = 256, c.intermediate_size = 768;
    c.num_hidden_layers = 4, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
  } else {
    throw Error(
        fmt::format("--shape: unknown shape '{}' (known: qwen3-8b, qwen3-0.6b, tiny)", shape));
  }
  c.rope_theta = 1e6;
  return c;
}

// Per-round phase times and tokens/s of one decoding configuration over the prompts.
json run_decode(const Qwen3Model& target, const Drafter* drafter,
                const std::vector<std::vector<int32_t>>& prompts, int max_new, int reps) {
  double tokens = 0, rounds = 0, total = 0, draft = 0, verify = 0, accept = 0, prefill = 0;
  std::vector<int> lengths;
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateOptions o;
      o.max_new_tokens = max_new;
      o.seed = uint64_t(i);
      const auto res = generate(target, drafter, prompts[i], o);
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

#ifdef FLASHMAP_WITH_CUDA
// `bench --device cuda --shape S`: the target with random bf16 weights made on the device, the
// GPU's measured read bandwidth, and decode / verify times with CUDA graphs (and without, for
// reference), at a context of a.context tokens prefilled on the device.
void run_bench_cuda(const BenchArgs& a) {
  FLASHMAP_CHECK(
      !a.shape.empty(),
      "--device {}: bench needs --shape (qwen3-8b, qwen3-0.6b, tiny); a --target/--draft "
      "pair on the GPU is `flashmap generate --device cuda`",
      a.device);
  FLASHMAP_CHECK(a.context >= 0 && a.block >= 1, "--context must be >= 0 and --block >= 1");
  const auto cfg = shape_config(a.shape);
  // The device cache holds the context, the decoding runs' new tokens and a block of room.
  FLASHMAP_CHECK(
      int64_t(a.context) + a.max_new_tokens + a.block + 64 <= cfg.max_position_embeddings,
      "--context {} + --max-new-tokens {} (+ --block {} + 64 positions of room) exceeds "
      "the {} positions of shape {}",
      a.context, a.max_new_tokens, a.block, cfg.max_position_embeddings, a.shape);
  cuda::Context ctx(a.device);
  fmt::print("# flashmap bench --device {} --shape {} on {}\n\n", a.device, a.shape, ctx.name());
  const double gbps = cuda::measure_read_gbps(ctx);  // 2 GiB, far past the 50 MB L2

  const int K = a.block;
  // Room for the timed steps and for the decoding runs below (prompt = the context).
  auto dev = cuda::Qwen3Device::random(ctx, cfg, 1, a.context + a.max_new_tokens + K + 64);
  // Bytes a decode step reads: every weight but the embedding table (one row of it).
  const double bytes = double(dev->weight_bytes() - dev->embedding_bytes());

  struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    Events() {
      cuda::check(cudaEventCreate(&a), "cudaEventCreate");
      cuda::check(cudaEventCreate(&b), "cudaEventCreate");
    }
    ~Events() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    float ms() const {
      float t = 0;
      cuda::check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
      return t;
    }
  } ev;
  const cudaStream_t s = ctx.stream();

  // The context: a.context random ids, prefilled eagerly (its values do not change the cost).
  double prefill_ms = 0;
  std::vector<int32_t> ids(static_cast<size_t>(a.context));
  Rng rng(3);
  for (auto& t : ids) t = int32_t(rng.next() % uint64_t(cfg.vocab_size));
  if (a.context > 0) {
    dev->reserve(std::max(a.context, K + 1), K + 1);
    dev->forward_host(ids, cuda::Qwen3Device::Logits::None, {}, false);  // warm-up
    dev->truncate(0);
    cuda::check(cudaEventRecord(ev.a, s), "cudaEventRecord");
    dev->forward_host(ids, cuda::Qwen3Device::Logits::None, {}, false);
    cuda::check(cudaEventRecord(ev.b, s), "cudaEventRecord");
    ctx.sync();
    prefill_ms = ev.ms();
  }
  const cuda::DeviceBuffer<int32_t> step_ids(ctx, std::vector<int32_t>(size_t(K + 1), 7));
  // ms per forward of n tokens at position a.context: batches of 10 back-to-back steps timed with
  // events (so host launch cost counts where it is not hidden), median of a.reps batches.
  auto time_step = [&](int n, bool graph) {
    auto one = [&] {
      dev->truncate(a.context);
      dev->forward(step_ids.data(), n, cuda::Qwen3Device::Logits::All, {}, graph);
    };
    for (int i = 0; i < 3; ++i) one();  // warm-up; the first graph call also captures
    ctx.sync();
    std::vector<double> t;
    for (int r = 0; r < std::max(a.reps, 1); ++r) {
      cuda::check(cudaEventRecord(ev.a, s), "cudaEventRecord");
      for (int i = 0; i < 10; ++i) one();
      cuda::check(cudaEventRecord(ev.b, s), "cudaEventRecord");
      ctx.sync();
      t.push_back(ev.ms() / 10.0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double decode = time_step(1, true), verify = time_step(K + 1, true);
  const double decode_eager = time_step(1, false), verify_eager = time_step(K + 1, false);
  FLASHMAP_ASSERT(dev->graph_launches() > 0);
  const double eff = bytes / (decode * 1e-3) / 1e9;

  json out;
  out["device"] = a.device;
  out["gpu"] = ctx.name();
  out["shape"] = a.shape;
  out["context"] = a.context;
  out["block"] = K;
  out["read_bandwidth_gbps"] = gbps;
  out["weight_bytes_per_step"] = bytes;
  out["prefill_ms"] = prefill_ms;
  out["decode_ms"] = decode;
  out["decode_eager_ms"] = decode_eager;
  out[fmt::format("verify{}_ms", K + 1)] = verify;
  out[fmt::format("verify{}_eager_ms", K + 1)] = verify_eager;
  out["decode_effective_gbps"] = eff;
  out["decode_fraction_of_bandwidth"] = eff / gbps;
  out["verify_over_decode"] = verify / decode;
  out["target_alone_tokens_per_s"] = 1000.0 / decode;
  out["graphs_captured"] = dev->graphs_captured();  // 2 unless buffers had to regrow
  fmt::print("| measure | value |\n|---|---|\n");
  fmt::print("| measured read bandwidth (same run) | {:.0f} GB/s |\n", gbps);
  fmt::print("| weights read per decode step | {:.2f} GB |\n", bytes / 1e9);
  if (a.context > 0) fmt::print("| prefill, {} tokens | {:.1f} ms |\n", a.context, prefill_ms);
  fmt::print(
      "| decode, 1 token at context {} (CUDA graph) | {:.2f} ms ({:.0f} GB/s = {:.0f}% of "
      "bandwidth; {:.0f} tokens/s) |\n",
      a.context, decode, eff, 100 * eff / gbps, 1000.0 / decode);
  fmt::print("| decode, without graph | {:.2f} ms |\n", decode_eager);
  fmt::print("| verify, {} tokens (CUDA graph) | {:.2f} ms ({:.2f}x decode) |\n", K + 1, verify,
             verify / decode);
  fmt::print("| verify, without graph | {:.2f} ms |\n\n", verify_eager);
  write_json(out, a.json_out);  // the target's figures stand even if the drafter part fails

  // The FlashMap drafter at its default (Qwen3-8B) shape with random weights on the same GPU,
  // conditioned on the target's features of the context: draft ms per step count, and a round
  // estimated as draft + verify (the accept step is one small kernel and an 8-byte copy). The
  // speedup of a round over target-alone decoding at acceptance length tau is
  // tau · decode / round, so tau must exceed round / decode (the break-even below) to pay.
  try {
    FlashMapConfig dc;
    dc.target_hidden_size = cfg.hidden_size;
    dc.vocab_size = cfg.vocab_size;
    dc.block_size = K;
    dc.jump_grids = FlashMapConfig::default_jump_grids();
    if (cfg.num_hidden_layers != 36) {  // 36: the default ids {1, 9, 17, 25, 33} of Qwen3-8B
      dc.target_layer_ids.clear();
      for (int i = 0; i < 5; ++i) {
        const int l = std::min(cfg.num_hidden_layers - 1,
                               int(std::lround(1 + i * (cfg.num_hidden_layers - 2) / 4.0)));
        if (dc.target_layer_ids.empty() || dc.target_layer_ids.back() != l)
          dc.target_layer_ids.push_back(l);
      }
    }
    auto fm = cuda::FlashMapDevice::random(ctx, dc, dev->embedding(), dev->lm_head(),
                                           cfg.vocab_size, cfg.hidden_size, 5);
    auto dctx = fm->new_context(a.context + K + 64);
    if (a.context > 0) {
      dev->truncate(0);
      const auto o =
          dev->forward_host(ids, cuda::Qwen3Device::Logits::None, dc.target_layer_ids, false);
      fm->extend_context(dctx, o.features, a.context);
    }
    cuda::DeviceBuffer<float> draft_logits(size_t(K) * size_t(cfg.vocab_size));
    fmt::print(
        "| drafter ({} layers, hidden {}, block {}) | draft ms | round ms (draft + verify) | "
        "break-even tau |\n|---|---|---|---|\n",
        dc.num_hidden_layers, dc.hidden_size, K);
    json drafts = json::array();
    for (const auto& [steps, grid] : dc.jump_grids) {
      cuda::FlashMapDevice::Noise noise;  // drawn on the device (Philox), fixed (seed, counter)
      noise.seed = 11;
      auto one = [&] {
        fm->draft(dctx, int32_t(7), steps, noise, draft_logits.data(),
                  cuda::FlashMapDevice::Exec::Graph);
      };
      for (int i = 0; i < 3; ++i) one();  // warm-up; the first call also captures
      ctx.sync();
      std::vector<double> t;
      for (int r = 0; r < std::max(a.reps, 1); ++r) {
        cuda::check(cudaEventRecord(ev.a, s), "cudaEventRecord");
        for (int i = 0; i < 10; ++i) one();
        cuda::check(cudaEventRecord(ev.b, s), "cudaEventRecord");
        ctx.sync();
        t.push_back(ev.ms() / 10.0);
      }
      std::sort(t.begin(), t.end());
      const double draft = t[t.size() / 2], round = draft + verify;
      drafts.push_back({{"steps", steps},
                        {"draft_ms", draft},
                        {"round_ms_estimate", round},
                        {"break_even_tau", round / decode}});
      fmt::print("| {} step{} (CUDA graph) | {:.2f} | {:.2f} | {:.2f} |\n", steps,
                 steps > 1 ? "s" : "", draft, round, round / decode);
    }
    fmt::print("\n");
    out["drafter"] = {{"layers", dc.num_hidden_layers},
                      {"hidden", dc.hidden_size},
                      {"target_layer_ids", dc.target_layer_ids},
                      {"drafts", drafts}};

    // Measured rounds of the device decoding loop (DeviceDecoder, CUDA graphs), greedy, the
    // context as the prompt. The drafter is random, so tau stays near 1: these rows measure what
    // a round costs (draft, verify, accept, loop), not the speedup a trained drafter gives.
    const std::vector<int32_t> prompt =
        a.context > 0 ? ids : std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8};
    GenerateOptions go;
    go.max_new_tokens = a.max_new_tokens;
    auto decode_run = [&](cuda::DeviceDrafter* d) {
      cuda::DeviceDecoder dec(*dev, d, true);
      dec.generate(prompt, go);  // warm-up: captures the graphs
      const GenerateResult r = dec.generate(prompt, go);
      const double rounds = std::max(r.rounds, 1), body = r.times.total_ms - r.times.prefill_ms;
      const double loop = body - r.times.draft_ms - r.times.verify_ms;
      return json{{"tokens_per_s", 1000.0 * double(r.ids.size()) / r.times.total_ms},
                  {"tau", r.acceptance_length()},
                  {"round_ms", body / rounds},
                  {"draft_ms_per_round", r.times.draft_ms / rounds},
                  {"verify_ms_per_round", r.times.verify_ms / rounds},
                  {"accept_ms_per_round", r.times.accept_ms / rounds},
                  {"loop_overhead_pct", 100.0 * loop / std::max(body, 1e-9)},
                  {"prefill_ms", r.times.prefill_ms},
                  {"tokens", r.ids.size()},
                  {"rounds", r.rounds}};
    };
    const json alone = decode_run(nullptr);
    out["loop_target_alone"] = alone;
    fmt::print(
        "| decoding loop ({} prompt tokens, {} new, greedy) | tau | tokens/s | speedup | round ms "
        "| draft ms | verify ms | accept ms | loop overhead "
        "|\n|---|---|---|---|---|---|---|---|---|\n",
        prompt.size(), a.max_new_tokens);
    auto row = [&](const std::string& name, const json& r) {
      fmt::print(
          "| {} | {:.2f} | {:.1f} | {:.2f}x | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.2f}% |\n",
          name, r["tau"].get<double>(), r["tokens_per_s"].get<double>(),
          r["tokens_per_s"].get<double>() / alone["tokens_per_s"].get<double>(),
          r["round_ms"].get<double>(), r["draft_ms_per_round"].get<double>(),
          r["verify_ms_per_round"].get<double>(), r["accept_ms_per_round"].get<double>(),
          r["loop_overhead_pct"].get<double>());
    };
    row("target alone", alone);
    for (const auto& [steps, grid] : dc.jump_grids) {
      cuda::FlashMapDeviceDrafter d(*fm, steps, true);
      const json r = decode_run(&d);
      out[fmt::format("loop_flashmap_steps{}", steps)] = r;
      row(fmt::format("random FlashMap drafter, {} step{}", steps, steps > 1 ? "s" : ""), r);
    }
    fmt::print("\n");
  } catch (const std::exception& e) {
    out["drafter_error"] = e.what();
    write_json(out, a.json_out);
    throw;
  }
  write_json(out, a.json_out);
}
#endif

void run_bench(BenchArgs& a) {
  if (a.device != "cpu") {
    FLASHMAP_CHECK(a.device == "cuda" || a.device.starts_with("cuda:"),
                   "--device: expected cpu, cuda or cuda:N, got '{}'", a.device);
#ifdef FLASHMAP_WITH_CUDA
    run_bench_cuda(a);
    return;
#else
    throw Error(
        fmt::format("--device {}: this flashmap binary was built without CUDA (configure with "
                    "-DFLASHMAP_CUDA=ON on a machine with the CUDA toolkit)",
                    a.device));
#endif
  }
  json out;
  out["threads"] = ThreadPool::global().size();
  std::unique_ptr<Qwen3Model> target_ptr;
  std::unique_ptr<FlashMapDrafter> draft_model;
  if (!a.shape.empty()) {
    const auto cfg = shape_config(a.shape);
    // The timed steps run a.block + 1 tokens at position a.context, in a cache of context + 64.
    FLASHMAP_CHECK(int64_t(a.context) + a.block + 64 <= cfg.max_position_embeddings,
                   "--context {} (+ --block {} + 64 positions of room) exceeds the {} positions "
                   "of shape {}",
                   a.context, a.block, cfg.max_position_embeddings, a.shape);
    FLASHMAP_CHECK(8 + int64_t(a.max_new_tokens) + a.block + 1 <= cfg.max_position_embeddings,
                   "--max-new-tokens {} (after an 8-token prompt, + --block {} + 1) exceeds the {} "
                   "positions of shape {}",
                   a.max_new_tokens, a.block, cfg.max_position_embeddings, a.shape);
    FLASHMAP_CHECK(a.model.steps == 0 && a.model.draft.empty() && a.model.target.empty(),
                   "--shape makes its own target and scripted drafter: drop --target, --draft "
                   "and --steps");
    fmt::print("# flashmap bench --shape {} ({} threads)\n\n", a.shape,
               ThreadPool::global().size());
    const double gbps = measure_read_gbps();
    target_ptr = random_target(cfg);
    const Qwen3Model& target = *target_ptr;
    // Bytes a decode step reads: every weight but the embedding table (one row).
    const double bytes =
        double(target.weight_bytes()) - double(cfg.vocab_size) * cfg.hidden_size * 2;
    // A synthetic context of a.context positions (its values do not change the cost).
    KVCache base = target.new_cache();
    const int64_t kv = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
    for (auto* side : {&base.k, &base.v})
      for (auto& layer : *side) layer.assign(size_t((a.context + 64) * kv), 0.01f);
    base.length = a.context;
    auto step = [&](int n) {
      std::vector<int32_t> toks(size_t(n), 7);
      return ms_of(
          [&] {
            base.truncate(a.context);
            Qwen3Model::SeqInput s{&base, toks};
            Qwen3Model::Output o;
            target.forward({&s, 1}, Qwen3Model::Logits::All, {}, o);
          },
          a.reps);
    };
    const double decode = step(1), verify = step(a.block + 1);
    const double eff = bytes / (decode * 1e-3) / 1e9;
    out["shape"] = a.shape;
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
      ScriptedDrafter d(a.block, cfg.vocab_size, script, j);
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
    target_ptr = std::make_unique<Qwen3Model>(a.model.target);
    const Qwen3Model& target = *target_ptr;
    FLASHMAP_CHECK(!a.model.draft.empty(), "bench needs a drafter (--draft) or --shape");
    draft_model = std::make_unique<FlashMapDrafter>(a.model.draft, target);
    if (a.model.steps > 0) draft_model->grid(a.model.steps);  // throws unless in jump_grids
    const int V = target.config().vocab_size;
    std::vector<std::vector<int32_t>> prompts;
    Rng rng(7);
    for (int i = 0; i < a.prompts; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 16; ++j) p.push_back(int32_t(rng.next() % uint64_t(V)));
      prompts.push_back(p);
    }
    fmt::print("# flashmap bench: {} + {} ({} prompts x {} tokens, greedy, {} threads)\n\n",
               a.model.target, a.model.draft, a.prompts, a.max_new_tokens,
               ThreadPool::global().size());
    const json alone = run_decode(target, nullptr, prompts, a.max_new_tokens, a.reps);
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
    for (const auto& [steps, grid] : draft_model->config().jump_grids) {
      if (a.model.steps > 0 && steps != a.model.steps) continue;
      FlashMapBlockDrafter d(*draft_model, steps);
      const json r = run_decode(target, &d, prompts, a.max_new_tokens, a.reps);
      out[fmt::format("flashmap_steps{}", steps)] = r;
      row(fmt::format("FlashMap, {} step{}", steps, steps > 1 ? "s" : ""), r);
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
                                "cuda), qwen3-0.6b, tiny")
                    ->check(non_empty());
  sub->add_option("--device", args->device,
                  "cpu (default) or cuda[:N] (with --shape; needs a build with the CUDA backend)");
  sub->add_option("--context", args->context, "context length for --shape decode timing (512)")
      ->check(CLI::Range(0, INT32_MAX))
      ->needs(shape);
  sub->add_option("--block", args->block, "block size K for --shape (16)")
      ->check(CLI::Range(1, kMaxBlockSize))
      ->needs(shape);
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
