// `flashmap bench --device cuda --shape S`: the device kernels at a real shape with random
// weights made on the device (no checkpoint, no download). Decoding rounds on the device are
// measured through the engine by `flashmap bench --device cuda --target T --draft D`. Built into
// flashmap_bench only when the CUDA backend is.
#include "bench/cuda_shape.h"

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/timing.h"
#include "core/check.h"
#include "core/rng.h"
#include "cuda/device.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/flashmap_kernels.h"
#include "cuda/qwen3_cuda.h"
#include "io/hf_config.h"
#include "paged/block_pool.h"
#include "paged/draft_plan.h"
#include "paged/step_plan.h"

namespace flashmap::bench {

using json = nlohmann::json;
// The device's models and helpers by their short names, as in src/cuda: declared here, they hide
// the CPU models of the same names in flashmap.
using cuda::check;
using cuda::Context;
using cuda::DeviceBuffer;
using cuda::FlashMapModel;
using cuda::measure_read_gbps;
using cuda::Qwen3Model;
namespace drafter = cuda::drafter;

// `bench --device cuda --shape S`: the target with random bf16 weights made on the device, the
// GPU's measured read bandwidth, and decode / verify times with CUDA graphs (and without, for
// reference), at a context of a.context tokens prefilled on the device.
void run_cuda_shape(const DeviceShapeBench& a) {
  FLASHMAP_CHECK(
      !a.shape.empty(),
      "--device {}: bench needs --shape (qwen3-8b, qwen3-0.6b, tiny); a --target/--draft "
      "pair on the GPU is `flashmap generate --device cuda`",
      a.device);
  FLASHMAP_CHECK(a.context >= 0 && a.block >= 1, "--context must be >= 0 and --block >= 1");
  const auto cfg = qwen3_shape(a.shape);
  // The device cache holds the context, the decoding runs' new tokens and a block of room.
  FLASHMAP_CHECK(
      int64_t(a.context) + a.max_new_tokens + a.block + 64 <= cfg.max_position_embeddings,
      "--context {} + --max-new-tokens {} (+ --block {} + 64 positions of room) exceeds "
      "the {} positions of shape {}",
      a.context, a.max_new_tokens, a.block, cfg.max_position_embeddings, a.shape);
  Context ctx(a.device);
  fmt::print("# flashmap bench --device {} --shape {} on {}\n\n", a.device, a.shape, ctx.name());
  const double gbps = measure_read_gbps(ctx);  // 2 GiB, far past the 50 MB L2

  const int K = a.block;
  // Room for the timed steps and for the decoding runs below (prompt = the context).
  auto dev = Qwen3Model::random(ctx, cfg, 1, a.context + a.max_new_tokens + K + 64);
  // Bytes a decode step reads: every weight but the embedding table (one row of it).
  const double bytes = double(dev->weight_bytes() - dev->embedding_bytes());

  struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    Events() {
      check(cudaEventCreate(&a), "cudaEventCreate");
      check(cudaEventCreate(&b), "cudaEventCreate");
    }
    ~Events() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    float ms() const {
      float t = 0;
      check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
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
    dev->forward_host(ids, Qwen3Model::Logits::None, {}, false);  // warm-up
    dev->truncate(0);
    check(cudaEventRecord(ev.a, s), "cudaEventRecord");
    dev->forward_host(ids, Qwen3Model::Logits::None, {}, false);
    check(cudaEventRecord(ev.b, s), "cudaEventRecord");
    ctx.sync();
    prefill_ms = ev.ms();
  }
  const DeviceBuffer<int32_t> step_ids(ctx, std::vector<int32_t>(size_t(K + 1), 7));
  // ms per call of `one`: batches of 10 back-to-back calls timed with events (so host launch
  // cost counts where it is not hidden), median of a.reps batches, after 3 warm-up calls (the
  // first graph call also captures).
  auto median_ms = [&](const std::function<void()>& one) {
    for (int i = 0; i < 3; ++i) one();
    ctx.sync();
    std::vector<double> t;
    for (int r = 0; r < std::max(a.reps, 1); ++r) {
      check(cudaEventRecord(ev.a, s), "cudaEventRecord");
      for (int i = 0; i < 10; ++i) one();
      check(cudaEventRecord(ev.b, s), "cudaEventRecord");
      ctx.sync();
      t.push_back(ev.ms() / 10.0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  // A forward of n tokens at position a.context.
  auto time_step = [&](int n, bool graph) {
    return median_ms([&] {
      dev->truncate(a.context);
      dev->forward(step_ids.data(), n, Qwen3Model::Logits::All, {}, graph);
    });
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
  write_json(out, a.json_out);  // the target's figures stand even if the later parts fail

  // The batched step (what `serve --device cuda` runs each round): B sequences at context
  // a.context each in a paged KV cache, one forward for all of them, decode (1 row each) and
  // verify (K + 1 rows each) through CUDA graphs. The keys' values do not change the cost, so
  // the sequences' first a.context positions are held without being computed.
  const std::vector<int> batches = {1, 8, 32, 64};
  std::map<int, std::pair<double, double>> step_ms;  // batch -> (decode, verify) step ms
  {
    const int max_b = batches.back();
    const int32_t bt = 16;
    const int64_t per = int64_t(a.context) + K + 1;
    const int32_t blocks = int32_t(max_b * ((per + bt - 1) / bt) + 8);
    auto kv = dev->new_paged(blocks, bt);
    paged::BlockPool pool(blocks, bt);
    std::vector<int> seqs;
    std::vector<paged::BlockCopy> copies;
    for (int i = 0; i < max_b; ++i) {
      seqs.push_back(pool.open(per));
      pool.grow(seqs.back(), a.context, copies);
    }
    const auto buckets = paged::default_buckets(max_b);
    json table = json::array();
    fmt::print(
        "| batch | decode step ms | tokens/s | verify-{} step ms | verify / decode | bytes read "
        "per decode step | share of bandwidth |\n|---|---|---|---|---|---|---|\n",
        K + 1);
    for (const int B : batches) {
      double ms[2] = {0, 0};
      for (const int R : {1, K + 1}) {
        std::vector<paged::StepSeq> ss;
        for (int i = 0; i < B; ++i) pool.grow(seqs[size_t(i)], a.context + R, copies);
        for (int i = 0; i < B; ++i) ss.push_back({pool.table(seqs[size_t(i)]), a.context, R, {}});
        const auto plan = paged::plan_step(ss, R, bt, buckets);
        const auto image = plan.image();
        const std::vector<int32_t> ids(size_t(plan.bucket) * size_t(R), 7);
        check(cudaMemcpyAsync(dev->step_image(int64_t(image.size())), image.data(),
                              image.size() * 4, cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync H2D (step)");
        check(cudaMemcpyAsync(dev->step_ids(int64_t(ids.size())), ids.data(), ids.size() * 4,
                              cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync H2D (ids)");
        ms[R == 1 ? 0 : 1] = median_ms(
            [&] { dev->forward_step(*kv, plan.bucket, R, Qwen3Model::Logits::All, {}, true); });
        for (int i = 0; i < B; ++i) pool.truncate(seqs[size_t(i)], a.context);
      }
      step_ms[B] = {ms[0], ms[1]};
      // A decode step reads the weights once and every sequence's keys and values once.
      const double kv_bytes = double(B) * double(a.context + 1) * double(dev->paged_block_bytes(1));
      const double read = bytes + kv_bytes;
      const double share = read / (ms[0] * 1e-3) / 1e9 / gbps;
      table.push_back({{"batch", B},
                       {"decode_step_ms", ms[0]},
                       {"decode_tokens_per_s", 1000.0 * B / ms[0]},
                       {fmt::format("verify{}_step_ms", K + 1), ms[1]},
                       {"verify_over_decode", ms[1] / ms[0]},
                       {"decode_bytes", read},
                       {"decode_fraction_of_bandwidth", share}});
      fmt::print("| {} | {:.2f} | {:.0f} | {:.2f} | {:.2f}x | {:.2f} GB | {:.0f}% |\n", B, ms[0],
                 1000.0 * B / ms[0], ms[1], ms[1] / ms[0], read / 1e9, 100 * share);
    }
    fmt::print("\n");
    out["batched"] = table;
    write_json(out, a.json_out);
  }

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
    auto fm = FlashMapModel::random(ctx, dc, dev->embedding(), dev->lm_head(), cfg.vocab_size,
                                    cfg.hidden_size, 5);
    auto dctx = fm->new_context(a.context + K + 64);
    if (a.context > 0) {
      dev->truncate(0);
      const auto o = dev->forward_host(ids, Qwen3Model::Logits::None, dc.target_layer_ids, false);
      fm->extend_context(dctx, o.features, a.context);
    }
    DeviceBuffer<float> draft_logits(size_t(K) * size_t(cfg.vocab_size));
    fmt::print(
        "| drafter ({} layers, hidden {}, block {}) | draft ms | round ms (draft + verify) | "
        "break-even tau |\n|---|---|---|---|\n",
        dc.num_hidden_layers, dc.hidden_size, K);
    json drafts = json::array();
    for (const auto& [steps, grid] : dc.jump_grids) {
      FlashMapModel::Noise noise;  // drawn on the device (Philox), fixed (seed, counter)
      noise.seed = 11;
      const double draft = median_ms([&] {
        fm->draft(dctx, int32_t(7), steps, noise, draft_logits.data(), FlashMapModel::Exec::Graph);
      });
      const double round = draft + verify;
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
    write_json(out, a.json_out);

    // The batched draft (what `serve --device cuda` runs each round): B sequences' blocks in one
    // pass over a paged context of a.context positions each, one step; the commit of K + 1 rows
    // per sequence (a fully accepted block) in one pass; a round = draft + verify step + commit,
    // and its break-even acceptance length against the decode step of the same batch.
    if (fm->pages()) {
      const int max_b = batches.back();
      const int32_t bt = 16;
      const int64_t per = int64_t(a.context) + K + 2;
      const int32_t blocks = int32_t(max_b * ((per + bt - 1) / bt) + 8);
      auto pool = fm->new_paged(blocks, bt);
      paged::BlockPool tables(blocks, bt);
      std::vector<int> seqs;
      std::vector<paged::BlockCopy> copies;
      for (int i = 0; i < max_b; ++i) {
        seqs.push_back(tables.open(per));
        tables.grow(seqs.back(), per, copies);
      }
      fm->reserve_batch(max_b, 1);
      const auto buckets = paged::default_buckets(max_b);
      DeviceBuffer<float> logits(size_t(max_b) * size_t(K) * size_t(cfg.vocab_size));
      DeviceBuffer<int32_t> anchors(ctx, std::vector<int32_t>(size_t(max_b), 7));
      std::vector<uint64_t> rng(2 * size_t(max_b));
      for (size_t i = 0; i < rng.size(); ++i) rng[i] = i;
      DeviceBuffer<uint64_t> d_rng(ctx, rng);
      DeviceBuffer<float> feats(size_t(max_b) * size_t(K + 1) * size_t(fm->feature_dim()));
      drafter::fill(feats.data(), int64_t(feats.size()), 0.5f, s);
      json table = json::array();
      fmt::print(
          "| batch | batched draft ms (1 step) | commit ms ({} rows each) | round ms (draft + "
          "verify step + commit) | break-even tau |\n|---|---|---|---|---|\n",
          K + 1);
      for (const int B : batches) {
        std::vector<paged::DraftSeq> ds;
        std::vector<paged::CommitSeq> cs;
        for (int i = 0; i < B; ++i) {
          ds.push_back({tables.table(seqs[size_t(i)]), int64_t(a.context) + 1});
          cs.push_back({tables.table(seqs[size_t(i)]), int64_t(i) * (K + 1), a.context, K + 1});
        }
        const auto plan = paged::plan_draft(ds, K, bt, buckets);
        DeviceBuffer<int32_t> image(ctx, plan.image());
        const auto commit = paged::plan_commit(cs, bt, int64_t(B) * (K + 1));
        DeviceBuffer<int32_t> commit_image(ctx, commit.image());
        const double draft = median_ms([&] {
          fm->draft_batch(*pool, image.data(), plan.bucket, anchors.data(), d_rng.data(), 1,
                          logits.data(), FlashMapModel::Exec::Graph);
        });
        const double commit_ms = median_ms(
            [&] { fm->commit_paged(*pool, feats.data(), commit_image.data(), commit.n); });
        const auto [dec, ver] = step_ms.at(B);
        const double round = draft + ver + commit_ms;
        table.push_back({{"batch", B},
                         {"draft_ms", draft},
                         {"commit_ms", commit_ms},
                         {"round_ms_estimate", round},
                         {"break_even_tau", round / dec}});
        fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |\n", B, draft, commit_ms, round,
                   round / dec);
      }
      fmt::print("\n");
      out["drafter"]["batched"] = table;
    }

  } catch (const std::exception& e) {
    out["drafter_error"] = e.what();
    write_json(out, a.json_out);
    throw;
  }
  write_json(out, a.json_out);
}

}  // namespace flashmap::bench
