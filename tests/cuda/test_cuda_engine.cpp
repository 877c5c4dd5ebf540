// The engine's round loop on the CUDA backend (cuda::make_backend) on the committed fixtures:
// greedy speculative decoding equals the device's own target-alone greedy decoding token for
// token with the FlashMap and DFlash drafters and with a scripted drafter that takes every
// acceptance path; the device's greedy output agrees with the CPU's as far as bf16 logits allow
// (agreement reported); sampled decoding is reproducible from its seed and, at top_k = 1, is
// greedy decoding; long prompts prefill in chunks; logit controls, a grammar and logprobs, run
// on the device, keep speculative output exact and agree with the CPU engine's; copies of a
// cached or shared prefix decode as the request alone. Without a usable GPU every test skips.
#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "../specdec/letters.h"
#include "bench/generate.h"
#include "constrain/constrain.h"
#include "constrain/token_constraint.h"
#include "core/check.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/dflash_cuda.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/proposers.h"
#include "cuda/qwen3_cuda.h"
#include "engine/rounds.h"
#include "gpu_test.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "paged/block_pool.h"
#include "paged/draft_plan.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"

namespace flashmap::cuda {
namespace {

const std::vector<int32_t> kPrompt = {3, 141, 59, 265, 358, 979};
const char* const kFixtures[] = {"tests/fixtures/tiny-a", "tests/fixtures/tiny-b",
                                 "tests/fixtures/tiny-c"};

// Greedy decoding on the device is exact: a step forward's logits do not depend on how many
// rows share it (Qwen3Model::kStepRows, checked by CudaQwen3.StepRowsAreBatchInvariant), so a
// token verified in a block gets the bits a decode step gives it, and speculative output equals
// the device's own target-alone output token for token. No tolerance.
// Device logits against the CPU's fp32 logits: bf16 weights and bf16 GEMM inputs through a whole
// model. 5e-4 is the harness's bound for one bf16 GEMM; a few layers stay well under 1e-3.
constexpr double kLogitsNmse = 1e-3;

using test::Gpu;  // one context per binary (gpu_test.h)

// A fixture pair on the CPU and on the GPU.
struct Pair {
  std::unique_ptr<::flashmap::Qwen3Model> cpu;
  std::unique_ptr<::flashmap::FlashMapModel> cpu_draft;
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<FlashMapModel> draft;
  Pair(Context& ctx, const std::string& dir, int64_t max_positions = 4096,
       int64_t sampled_vocab = 0) {
    cpu = std::make_unique<::flashmap::Qwen3Model>(dir + "/target");
    if (sampled_vocab > 0) cpu->set_sampled_vocab(sampled_vocab);
    cpu_draft = std::make_unique<::flashmap::FlashMapModel>(dir + "/draft", *cpu);
    target = std::make_unique<Qwen3Model>(ctx, *cpu, max_positions);
    draft = std::make_unique<FlashMapModel>(ctx, *cpu_draft, target->embedding(), target->lm_head(),
                                            cpu->config().vocab_size, cpu->config().hidden_size);
  }
};

GenerateOptions greedy(int n, std::vector<int32_t> stop = {}) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_ids = std::move(stop);
  return o;
}

// flashmap::ScriptedProposer on the device: logits one-hot on script[i] for the i-th generated
// position, every slot from `corrupt_from` on replaced by a wrong token, so that the greedy
// acceptance length is chosen by the test. Reads no features; a lane is the count of generated
// tokens committed.
class ScriptedDeviceProposer : public DeviceProposer {
 public:
  ScriptedDeviceProposer(Context& ctx, int K, int64_t V, std::vector<int32_t> script,
                         int corrupt_from)
      : ctx_(ctx), K_(K), V_(V), script_(std::move(script)), corrupt_from_(corrupt_from) {}
  int block_size() const override { return K_; }
  int64_t vocab() const override { return V_; }
  std::span<const int> target_layer_ids() const override { return {}; }
  int64_t feature_dim() const override { return 0; }
  int add_lane(int64_t) override {
    committed_.push_back(-1);
    return int(committed_.size()) - 1;
  }
  void remove_lane(int) override {}  // a count holds nothing
  void reset(int lane) override { committed_.at(size_t(lane)) = -1; }
  void commit(int lane, const float*, int64_t n) override {
    // The first commit holds the prompt; the generated tokens count from the next.
    auto& c = committed_.at(size_t(lane));
    c = c < 0 ? 0 : c + n;
  }
  void draft(int lane, const int32_t*, uint64_t, uint64_t, float* d_logits) override {
    const int64_t next = committed_.at(size_t(lane)) + 1;
    logits_.assign(size_t(K_ * V_), 0.0f);
    for (int k = 0; k < K_; ++k) {
      const int64_t i = next + k;
      int32_t tok = i < int64_t(script_.size()) ? script_[size_t(i)] : 0;
      if (k >= corrupt_from_) tok = int32_t((tok + 1 + k) % V_);
      logits_[size_t(k * V_ + tok)] = 1.0f;
    }
    check(cudaMemcpyAsync(d_logits, logits_.data(), logits_.size() * sizeof(float),
                          cudaMemcpyHostToDevice, ctx_.stream()),
          "cudaMemcpyAsync H2D (scripted logits)");
    ctx_.sync();  // logits_ is reused by the next draft
  }

 private:
  Context& ctx_;
  int K_;
  int64_t V_;
  std::vector<int32_t> script_;
  int corrupt_from_;
  std::vector<float> logits_;
  std::vector<int64_t> committed_;  // by lane
};

// A batch of one through an engine on the device models (every round speculating); `tree`: the
// --draft-tree option, and `nodes` (when given) gets the draft tokens verified per sequence round
// under that shape.
GenerateResult run(Qwen3Model& target, DeviceProposer* proposer, std::span<const int32_t> prompt,
                   const GenerateOptions& o, bool graphs = true, int64_t capacity = 4096,
                   const std::string& tree = "off", double* nodes = nullptr) {
  EngineOptions eo;
  eo.spec_policy = SpecPolicyKind::Always;
  eo.draft_tree = tree;
  Engine engine(make_backend(target, proposer, capacity, graphs), eo);
  auto r = engine.generate(o.request(prompt));
  if (nodes) {
    const auto stats = engine.stats();
    const auto it = stats.trees.find(tree);
    *nodes = it == stats.trees.end() || it->second.sequence_rounds == 0
                 ? 0.0
                 : double(it->second.nodes) / double(it->second.sequence_rounds);
  }
  return r;
}

// The device target's last logits after prompt + prefix (one prefill-shaped forward).
std::vector<float> device_logits(Qwen3Model& t, std::span<const int32_t> prompt,
                                 std::span<const int32_t> prefix) {
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), prefix.begin(), prefix.end());
  t.truncate(0);
  const auto out = t.forward_host(seq, Qwen3Model::Logits::Last);
  std::vector<float> host(size_t(t.config().vocab_size));
  Context& ctx = t.context();
  check(cudaMemcpyAsync(host.data(), out.logits, host.size() * sizeof(float),
                        cudaMemcpyDeviceToHost, ctx.stream()),
        "cudaMemcpyAsync D2H (logits)");
  ctx.sync();
  t.truncate(0);
  return host;
}

std::vector<float> cpu_logits(const ::flashmap::Qwen3Model& m, std::span<const int32_t> prompt,
                              std::span<const int32_t> prefix) {
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), prefix.begin(), prefix.end());
  ::flashmap::KVCache cache = m.new_cache();
  ::flashmap::Qwen3Model::SeqInput in{&cache, seq};
  ::flashmap::Qwen3Model::Output out;
  m.forward({&in, 1}, ::flashmap::Qwen3Model::Logits::Last, {}, out);
  return out.logits;
}

// Top-two margin of a logits row, relative to its largest magnitude.
double relative_margin(const std::vector<float>& x) {
  float a = -INFINITY, b = -INFINITY, big = 0;
  for (float v : x) {
    big = std::max(big, std::abs(v));
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return double(a - b) / std::max(double(big), 1e-30);
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Device decoding `got` must equal the device reference `want` (same target, same request)
// exactly. On a difference, the target's top-2 margin where they part is reported: a tiny one
// points at a kernel that is not batch-invariant, a large one at acceptance. Call it with no
// engine running on `t` (it runs a forward of its own).
void expect_lossless(Qwen3Model& t, std::span<const int32_t> prompt,
                     const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                     const std::string& what) {
  if (got == want) return;
  const size_t i = common_prefix(got, want);
  if (i == got.size() || i == want.size()) {
    ADD_FAILURE() << what << ": one output is a prefix of the other (" << got.size() << " vs "
                  << want.size() << " tokens)";
    return;
  }
  const double m = relative_margin(device_logits(t, prompt, {want.data(), i}));
  ADD_FAILURE() << what << ": diverges at token " << i << " (" << got[i] << " vs " << want[i]
                << ") where the target's top-2 margin is " << m << " of its largest logit";
}
void expect_lossless(Qwen3Model& t, const std::vector<int32_t>& got,
                     const std::vector<int32_t>& want, const std::string& what) {
  expect_lossless(t, kPrompt, got, want, what);
}

// The request's last update, once it finished (finished false after 60 s without an end).
Request::Update wait_end(Request& r) {
  Request::Update u;
  size_t seen = 0;
  for (int t = 0; t < 600 && !(u = r.wait(seen, std::chrono::milliseconds(100))).finished; ++t)
    seen += u.tokens.size();
  return u;
}

class CudaEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Gpu::get().ctx) GTEST_SKIP() << "no usable CUDA GPU: " << Gpu::get().why;
    ctx = Gpu::get().ctx.get();
  }
  Context* ctx = nullptr;
};

TEST_F(CudaEngine, GreedySpeculativeEqualsTargetAlone) {
  for (const char* fx : kFixtures) {
    Pair p(*ctx, fx);
    const auto alone = run(*p.target, nullptr, kPrompt, greedy(64));
    ASSERT_EQ(alone.ids.size(), 64u) << fx;
    EXPECT_EQ(alone.finish_reason, "length");
    EXPECT_EQ(alone.rounds, 63);  // the first token comes from the prefill
    for (int steps : {1, p.cpu_draft->config().num_steps, 4}) {
      FlashMapDeviceProposer d(*p.draft, steps);
      auto opt = greedy(64);
      opt.seed = uint64_t(steps);
      const auto r = run(*p.target, &d, kPrompt, opt);
      const std::string what = fmt::format("{} steps {}", fx, steps);
      expect_lossless(*p.target, r.ids, alone.ids, what);
      // The stats of a speculative run: one acceptance length per round, tokens = first + Σ.
      EXPECT_EQ(r.acceptance_lengths.size(), size_t(r.rounds)) << what;
      int64_t sum = 0;
      for (int a : r.acceptance_lengths) sum += a;
      EXPECT_GE(1 + sum, int64_t(r.ids.size())) << what;
      ASSERT_EQ(r.accepted_at.size(), size_t(d.block_size())) << what;
      for (size_t k = 1; k < r.accepted_at.size(); ++k)
        EXPECT_LE(r.accepted_at[k], r.accepted_at[k - 1]) << what << " slot " << k;
      std::cout << "[ info ] " << what << ": tau " << r.acceptance_length() << " over " << r.rounds
                << " rounds\n";
    }
    // Graphs replay the same kernels: eager and graph runs agree bit for bit.
    FlashMapDeviceProposer eager_d(*p.draft, 1, false), graph_d(*p.draft, 1, true);
    auto opt = greedy(40);
    opt.seed = 9;
    const auto e = run(*p.target, &eager_d, kPrompt, opt, false);
    const auto g = run(*p.target, &graph_d, kPrompt, opt, true);
    EXPECT_EQ(e.ids, g.ids) << fx;
    EXPECT_EQ(e.acceptance_lengths, g.acceptance_lengths) << fx;
  }
}

// Draft trees on the device (the batched drafter's noise draws and top-k expansion, one forward
// with tree masks, sample-and-match, the accepted path's keys kept): greedy output equals the
// target alone for every shape, seeded output equals the seeded target alone, and the rounds
// really verified trees (more nodes per round than a block holds).
TEST_F(CudaEngine, DraftTreesAreLossless) {
  // tiny-b every shape greedy and two seeded; tiny-c (block 5, 3 heads) the mixed shape. tiny-a's
  // drafter heads (12 wide) do not page, so its backend refuses trees.
  const std::vector<std::pair<const char*, std::vector<std::string>>> plans = {
      {kFixtures[1], {"paths:4", "topk:16", "paths:3+topk:24", "topk:1"}},
      {kFixtures[2], {"paths:3+topk:24"}}};
  for (const auto& [fx, shapes] : plans) {
    Pair p(*ctx, fx);
    const auto alone = run(*p.target, nullptr, kPrompt, greedy(48));
    GenerateOptions seeded = greedy(48);
    seeded.sampling.temperature = 1.0f;
    seeded.sampling.top_p = 0.9f;
    seeded.seed = 21;
    seeded.seeded = true;
    const auto seeded_alone = run(*p.target, nullptr, kPrompt, seeded);
    for (const std::string& shape : shapes) {
      FlashMapDeviceProposer d(*p.draft, 1);
      ASSERT_TRUE(d.paged()) << fx;
      double nodes = 0;
      const auto r = run(*p.target, &d, kPrompt, greedy(48), true, 4096, shape, &nodes);
      expect_lossless(*p.target, r.ids, alone.ids, fmt::format("{} {}", fx, shape));
      // 24 nodes (a chain has K <= 16): the device drafted and verified trees, not blocks.
      if (shape == "paths:3+topk:24") {
        EXPECT_GT(nodes, double(d.block_size())) << fx;
      }
      std::cout << "[ info ] " << fx << " " << shape << ": tau " << r.acceptance_length()
                << ", nodes per round " << nodes << "\n";
      if (shape == "paths:4" || shape == "paths:3+topk:24") {
        EXPECT_EQ(run(*p.target, &d, kPrompt, seeded, true, 4096, shape).ids, seeded_alone.ids)
            << fx << " " << shape << " seeded";
      }
    }
  }
  // Sampled without a seed: reproducible from the seed, as blocks are.
  Pair p(*ctx, kFixtures[1]);
  FlashMapDeviceProposer d(*p.draft, 1);
  GenerateOptions o = greedy(32);
  o.sampling.temperature = 1.0f;
  o.seed = 4;
  EXPECT_EQ(run(*p.target, &d, kPrompt, o, true, 4096, "paths:2+topk:8").ids,
            run(*p.target, &d, kPrompt, o, true, 4096, "paths:2+topk:8").ids);
  // A drafter whose heads do not page drafts per lane and refuses trees.
  Pair a(*ctx, kFixtures[0]);
  FlashMapDeviceProposer lanes(*a.draft, 1);
  EXPECT_FALSE(lanes.paged());
  EXPECT_THROW(run(*a.target, &lanes, kPrompt, greedy(8), true, 4096, "topk:8"), Error);
}

TEST_F(CudaEngine, ScriptedDrafterCoversEveryAcceptancePath) {
  Pair p(*ctx, kFixtures[0]);
  const int n = 60, K = 8;
  const int64_t V = p.cpu->config().vocab_size;
  const auto alone = run(*p.target, nullptr, kPrompt, greedy(n)).ids;
  ASSERT_EQ(alone.size(), size_t(n));
  for (int j : {0, 1, 3, K}) {
    ScriptedDeviceProposer d(*ctx, K, V, alone, j);
    const auto r = run(*p.target, &d, kPrompt, greedy(n));
    const std::string what = fmt::format("corrupt_from {}", j);
    expect_lossless(*p.target, r.ids, alone, what);
    // Every round but the last commits exactly the j correct drafts plus the target's token.
    for (size_t i = 0; i + 1 < r.acceptance_lengths.size(); ++i)
      EXPECT_EQ(r.acceptance_lengths[i], j + 1) << "round " << i << ", " << what;
    for (int k = 0; k < K; ++k)
      EXPECT_EQ(r.accepted_at[size_t(k)] > 0, k < j) << "slot " << k << ", " << what;
    EXPECT_EQ(r.finish_reason, "length");
  }
}

TEST_F(CudaEngine, StopTokenAndOvershoot) {
  Pair p(*ctx, kFixtures[0]);
  const int64_t V = p.cpu->config().vocab_size;
  const auto alone = run(*p.target, nullptr, kPrompt, greedy(60)).ids;
  ASSERT_EQ(alone.size(), 60u);
  // A stop token inside a fully accepted block: the output ends right after its first
  // occurrence, as target-alone decoding with the same stop token does.
  const int32_t stop = alone[13];
  const size_t first = size_t(std::find(alone.begin(), alone.end(), stop) - alone.begin());
  ScriptedDeviceProposer full(*ctx, 8, V, alone, 8);
  const auto r = run(*p.target, &full, kPrompt, greedy(60, {stop}));
  EXPECT_EQ(r.ids, std::vector<int32_t>(alone.begin(), alone.begin() + int64_t(first) + 1));
  EXPECT_EQ(r.finish_reason, "stop");
  const auto r2 = run(*p.target, nullptr, kPrompt, greedy(60, {stop}));
  EXPECT_EQ(r2.ids, r.ids);
  EXPECT_EQ(r2.finish_reason, "stop");
  // The last round's overshoot past max_new_tokens is cut.
  for (int n : {1, 2, 9, 10, 17}) {
    const auto c = run(*p.target, &full, kPrompt, greedy(n));
    EXPECT_EQ(c.ids, std::vector<int32_t>(alone.begin(), alone.begin() + n)) << n;
    EXPECT_EQ(c.finish_reason, "length") << n;
  }
}

// The CPU engine decodes in fp32, the device with bf16 weights and GEMM inputs: greedy outputs
// agree until the first position where the logits' difference (NMSE ≤ kLogitsNmse) can flip the
// top two; the agreement is printed for each fixture.
TEST_F(CudaEngine, GreedyAgreesWithCpuWithinBf16) {
  const int n = 64;
  for (const char* fx : kFixtures) {
    Pair p(*ctx, fx);
    const auto cpu = generate(*p.cpu, nullptr, kPrompt, greedy(n)).ids;
    const auto dev = run(*p.target, nullptr, kPrompt, greedy(n)).ids;
    const size_t i = common_prefix(cpu, dev);
    // Logits where they diverge (or at the end), on both engines.
    const std::span<const int32_t> prefix(cpu.data(), std::min(i, cpu.size() - 1));
    const auto c = cpu_logits(*p.cpu, kPrompt, prefix);
    const auto d = device_logits(*p.target, kPrompt, prefix);
    double err = 0, ref = 0;
    for (size_t v = 0; v < c.size(); ++v) {
      err += (double(d[v]) - c[v]) * (double(d[v]) - c[v]);
      ref += double(c[v]) * c[v];
    }
    const double nmse = err / ref, rms = std::sqrt(err / double(c.size()));
    EXPECT_LT(nmse, kLogitsNmse) << fx << " at token " << prefix.size();
    std::cout << "[ info ] " << fx << ": device and CPU greedy agree on " << i << " of " << n
              << " tokens; logits NMSE " << nmse << " there\n";
    if (i < size_t(n)) {
      // A flip needs the logits' error to reach the CPU's top-2 margin: with errors of rms
      // `rms`, a margin above 8·rms is out of reach (probability < 1e-12 for Gaussian errors).
      float a = -INFINITY, b = -INFINITY;
      for (float v : c)
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      EXPECT_LE(double(a - b), 8 * rms)
          << fx << ": diverges at token " << i << " where the CPU's top-2 margin is " << a - b
          << " and the logits' rms error " << rms;
    }
  }
}

TEST_F(CudaEngine, SampledIsReproducibleFromTheSeed) {
  Pair p(*ctx, kFixtures[0]);
  FlashMapDeviceProposer d(*p.draft, 1);
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.95f;
  o.seed = 42;
  const auto a = run(*p.target, &d, kPrompt, o);
  const auto b = run(*p.target, &d, kPrompt, o);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.acceptance_lengths, b.acceptance_lengths);
  o.seed = 43;
  EXPECT_NE(run(*p.target, &d, kPrompt, o).ids, a.ids);
  // Eager drafts and verify passes give the same bits, hence the same run.
  FlashMapDeviceProposer eager(*p.draft, 1, false);
  o.seed = 42;
  EXPECT_EQ(run(*p.target, &eager, kPrompt, o, false).ids, a.ids);
  // Target alone, sampled: reproducible too.
  EXPECT_EQ(run(*p.target, nullptr, kPrompt, o).ids, run(*p.target, nullptr, kPrompt, o).ids);
}

// top_k = 1 leaves one token (the argmax, the lower id on ties): sampled decoding — speculative
// with rejection sampling, or target alone — is then greedy decoding.
TEST_F(CudaEngine, TopK1SamplingIsGreedy) {
  for (const char* fx : kFixtures) {
    Pair p(*ctx, fx);
    const auto greedy_ids = run(*p.target, nullptr, kPrompt, greedy(48)).ids;
    GenerateOptions o = greedy(48);
    o.sampling.temperature = 1.0f;
    o.sampling.top_k = 1;
    o.seed = 5;
    FlashMapDeviceProposer d(*p.draft, 1);
    expect_lossless(*p.target, run(*p.target, &d, kPrompt, o).ids, greedy_ids,
                    fmt::format("{} speculative top_k 1", fx));
    expect_lossless(*p.target, run(*p.target, nullptr, kPrompt, o).ids, greedy_ids,
                    fmt::format("{} alone top_k 1", fx));
  }
}

TEST_F(CudaEngine, BadRequestsAndCapacity) {
  Pair p(*ctx, kFixtures[0]);
  FlashMapDeviceProposer d(*p.draft, 1);
  // A 32-position KV cache per sequence.
  auto gen = [&](std::span<const int32_t> prompt, const GenerateOptions& o) {
    return run(*p.target, &d, prompt, o, true, 32);
  };
  auto err = [&](std::vector<int32_t> prompt, GenerateOptions o) -> std::string {
    try {
      gen(prompt, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_NE(err({}, greedy(5)).find("prompt is empty"), std::string::npos);
  EXPECT_NE(err({1, 5000}, greedy(5)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(err({1}, greedy(0)).find("the number of new tokens must be > 0"), std::string::npos);
  // The engine's context is the cache: 6 + 27 = 33 positions is one more than it holds; 6 + 26
  // fits, and blocks shrink near the end (greedy and seeded, speculating to the last position).
  EXPECT_NE(err(kPrompt, greedy(27)).find("exceeds the context of 32 positions"),
            std::string::npos);
  const auto full = gen(kPrompt, greedy(26));
  EXPECT_EQ(full.ids.size(), 26u);
  EXPECT_EQ(full.finish_reason, "length");
  auto o = greedy(26);
  o.sampling.temperature = 1.0f;
  o.seed = 8;
  o.seeded = true;
  EXPECT_EQ(gen(kPrompt, o).ids.size(), 26u);
  EXPECT_THROW({ FlashMapDeviceProposer bad(*p.draft, 7); }, Error);  // steps not in jump_grids
}

// Seeded sampling on the device: draws keyed by (seed, position), so speculative decoding gives
// exactly the target-alone tokens for the seed (up to a near-tie of keys, which the kernels and
// the CPU order alike except within an ulp of log).
TEST_F(CudaEngine, SeededSpeculativeEqualsTargetAlone) {
  for (const char* fx : kFixtures) {
    Pair p(*ctx, fx);
    FlashMapDeviceProposer d(*p.draft, 1);
    for (SamplingParams sp :
         {SamplingParams{1.0f, 0, 1.0f, 0.0f}, SamplingParams{0.7f, 20, 0.9f, 0.0f}}) {
      GenerateOptions o = greedy(64);
      o.sampling = sp;
      o.seed = 17;
      o.seeded = true;
      const auto alone = run(*p.target, nullptr, kPrompt, o);
      const auto spec = run(*p.target, &d, kPrompt, o);
      EXPECT_EQ(spec.ids, alone.ids) << fx << " T=" << sp.temperature;
    }
  }
}

// Padding ids (past the tokenizer's size) are never drawn on the device either.
TEST_F(CudaEngine, PaddingIdsAreNeverSampled) {
  const int64_t known = 1000;  // the fixtures' vocabulary is 1024
  Pair p(*ctx, kFixtures[0], 4096, known);
  FlashMapDeviceProposer d(*p.draft, 1);
  GenerateOptions o = greedy(300);
  o.sampling.temperature = 5.0f;
  for (bool seeded : {false, true}) {
    o.seeded = seeded;
    o.seed = 4;
    for (DeviceProposer* dr :
         {static_cast<DeviceProposer*>(&d), static_cast<DeviceProposer*>(nullptr)})
      for (int32_t id : run(*p.target, dr, kPrompt, o).ids) ASSERT_LT(id, known);
  }
}

// Serving on the device: sequences of different lengths share rounds, each with its own KV cache
// and drafter context, and each decodes exactly as it does alone (greedy).
TEST_F(CudaEngine, BatchedSequencesEqualEachAlone) {
  Pair p(*ctx, kFixtures[0]);
  FlashMapDeviceProposer d(*p.draft, 1);
  std::vector<std::vector<int32_t>> prompts = {{3, 141, 59}, {7}, {900, 12, 5, 77, 1000, 2, 4, 8}};
  std::vector<int> lengths = {40, 25, 33};
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i)
    alone.push_back(run(*p.target, &d, prompts[i], greedy(lengths[i])).ids);
  EngineOptions eo;
  eo.max_running = 3;
  eo.spec_policy = SpecPolicyKind::Always;
  std::vector<std::vector<int32_t>> got[2];
  uint64_t speculative_rounds = 0;
  {
    Engine engine(make_backend(*p.target, &d, 4096, true), eo);
    EXPECT_GE(engine.max_running(), 1);
    for (int rep = 0; rep < 2; ++rep) {  // twice: the second batch reuses the pooled lanes
      std::vector<std::shared_ptr<Request>> reqs;
      for (size_t i = 0; i < prompts.size(); ++i) {
        RequestParams r;
        r.prompt = prompts[i];
        r.max_tokens = lengths[i];
        reqs.push_back(engine.submit(r));
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        const Request::Update u = wait_end(*reqs[i]);
        ASSERT_TRUE(u.finished) << "request " << i;
        EXPECT_EQ(u.finish_reason, "length");
        got[rep].push_back(reqs[i]->tokens());
      }
    }
    speculative_rounds = engine.stats().speculative_rounds;
  }
  // The engine thread is gone: the diagnostics may run forwards on the target.
  for (int rep = 0; rep < 2; ++rep)
    for (size_t i = 0; i < prompts.size(); ++i)
      expect_lossless(*p.target, prompts[i], got[rep][i], alone[i],
                      fmt::format("batch {} request {}", rep, i));
  EXPECT_GT(speculative_rounds, 0u);
}

// Copies of a prefix on the device (BlockPool::fork): a later turn that starts from a cached
// sequence's blocks (its KV and, drafting, the batched drafter's context, copied on write), and
// requests with one prompt admitted together (copies of the first one's prefill), decode exactly
// as each alone, with the FlashMap and DFlash drafters and without one.
TEST_F(CudaEngine, CopiesOfAPrefixDecodeAsAlone) {
  Pair p(*ctx, kFixtures[0]);
  ::flashmap::DFlashModel cpu_d("tests/fixtures/dflash/zlab", *p.cpu);
  DFlashModel dflash(*ctx, cpu_d, p.target->embedding(), p.target->lm_head(),
                     p.cpu->config().vocab_size, p.cpu->config().hidden_size);
  FlashMapDeviceProposer fm(*p.draft, 1);
  DFlashDeviceProposer df(dflash, true);
  const std::pair<const char*, DeviceProposer*> drafters[] = {
      {"target alone", nullptr}, {"FlashMap", &fm}, {"DFlash", &df}};
  // 37 positions: the copy's first write falls inside a shared block.
  std::vector<int32_t> turn1;
  for (int i = 0; i < 37; ++i) turn1.push_back(int32_t((i * 131 + 7) % 1000));
  RequestParams r1;
  r1.prompt = turn1;
  r1.max_tokens = 24;
  RequestParams r3;  // three admitted at once with one prompt: two start from the first's blocks
  r3.prompt = {11, 22, 33, 44, 55, 66, 77, 88, 99, 100, 200, 300, 400, 500, 600, 700, 800, 900};
  r3.max_tokens = 30;
  for (const auto& [name, d] : drafters) {
    std::vector<int32_t> out1, out2;
    RequestParams r2 = r1;
    std::vector<std::vector<int32_t>> got3;
    {
      EngineOptions eo;
      eo.max_running = 4;
      eo.spec_policy = SpecPolicyKind::Always;
      eo.prefix_cache_mb = 256;
      Engine engine(make_backend(*p.target, d, 4096, true), eo);
      auto q1 = engine.submit(r1);
      ASSERT_TRUE(wait_end(*q1).finished) << name;
      out1 = q1->tokens();
      r2.prompt.insert(r2.prompt.end(), out1.begin(), out1.end());
      r2.prompt.push_back(5);
      auto q2 = engine.submit(r2);
      ASSERT_TRUE(wait_end(*q2).finished) << name;
      out2 = q2->tokens();
      EXPECT_GE(q2->cached_tokens(), int64_t(turn1.size())) << name;
      EXPECT_GE(engine.stats().prefix_cache.hits, 1u) << name;
    }
    {
      // Admitted together (a request's n choices), as the engine's loop admits them.
      auto b = make_backend(*p.target, d, 4096, true);
      engine::RoundLoop loop(*b, {.kind = SpecPolicyKind::Always}, 0);
      std::vector<std::unique_ptr<engine::Sequence>> seqs;
      std::vector<engine::Sequence*> ptrs;
      got3.resize(3);
      for (size_t i = 0; i < got3.size(); ++i) {
        seqs.push_back(std::make_unique<engine::Sequence>(r3));
        seqs.back()->sink = [&got3, i](std::span<const int32_t> t, int,
                                       std::span<const TokenLogprob>) {
          got3[i].insert(got3[i].end(), t.begin(), t.end());
        };
        ptrs.push_back(seqs.back().get());
      }
      loop.admit(ptrs);
      EXPECT_EQ(seqs[1]->cached_tokens, int64_t(r3.prompt.size()) - 1) << name;
      for (int r = 0; r < 100 && !std::all_of(ptrs.begin(), ptrs.end(),
                                              [](const engine::Sequence* q) { return q->done; });
           ++r)
        loop.round(ptrs);
    }
    // Each alone, in one engine without the cache (one backend: each costs a device's worth of
    // KV blocks to set up).
    std::vector<std::vector<int32_t>> alone;
    {
      EngineOptions eo;
      eo.max_running = 1;
      eo.spec_policy = SpecPolicyKind::Always;
      Engine engine(make_backend(*p.target, d, 4096, true), eo);
      for (const RequestParams* r : {&r1, &r2, &r3}) {
        auto q = engine.submit(*r);
        ASSERT_TRUE(wait_end(*q).finished) << name;
        alone.push_back(q->tokens());
      }
    }
    // The engine threads are gone: the diagnostics may run forwards on the target.
    expect_lossless(*p.target, r1.prompt, out1, alone[0], fmt::format("{}: first turn", name));
    expect_lossless(*p.target, r2.prompt, out2, alone[1],
                    fmt::format("{}: turn from the cache", name));
    for (size_t i = 0; i < got3.size(); ++i)
      expect_lossless(*p.target, r3.prompt, got3[i], alone[2],
                      fmt::format("{}: copy {} of one prompt", name, i));
  }
}

// A prompt longer than a prefill chunk (512 tokens) is prefilled piece by piece, its drafter
// context extended per piece: decoding after it is still exact, and lanes are counted from the
// device memory (at most the cap asked for).
TEST_F(CudaEngine, LongPromptsPrefillInChunks) {
  Pair p(*ctx, kFixtures[0]);
  FlashMapDeviceProposer d(*p.draft, 1);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 1300; ++i) prompt.push_back(int32_t((i * 131 + 7) % 1000));
  const auto alone = run(*p.target, nullptr, prompt, greedy(40));
  ASSERT_EQ(alone.ids.size(), 40u);
  const auto spec = run(*p.target, &d, prompt, greedy(40));
  expect_lossless(*p.target, prompt, spec.ids, alone.ids, "1300-token prompt");
  auto backend = make_backend(*p.target, &d, 4096, true, 3);
  EXPECT_EQ(backend->info().max_sequences, 3);
}

// cuda:N with N >= 1: the engine thread (not the one that loaded the models) must allocate and
// launch on GPU N too. Serving on cuda:1 leaves GPU 0's memory as it was and decodes as cuda:0.
TEST_F(CudaEngine, ServingOnASecondGpuStaysOnIt) {
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  auto gpu0_free = [] {
    int was = 0;
    check(cudaGetDevice(&was), "cudaGetDevice");
    check(cudaSetDevice(0), "cudaSetDevice");
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    check(cudaSetDevice(was), "cudaSetDevice");
    return free;
  };
  // Four requests served together (lanes opened on the engine thread); GPU 0's free memory read
  // while the engine still holds them.
  auto serve = [&](const std::string& device, size_t* free0) {
    EngineOptions eo{
        .target = "models/default/target", .draft = "models/default/draft", .device = device};
    eo.max_running = 4;
    Engine engine(eo);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 4; ++i) {
      RequestParams r;
      r.prompt = {3, 141, int32_t(59 + i)};
      r.max_tokens = 24;
      reqs.push_back(engine.submit(r));
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& r : reqs) {
      const Request::Update u = wait_end(*r);
      EXPECT_TRUE(u.finished);
      EXPECT_EQ(u.finish_reason, "length");
      out.push_back(r->tokens());
    }
    *free0 = gpu0_free();
    return out;
  };
  size_t unused = 0, during = 0;
  const auto on0 = serve("cuda:0", &unused);
  const size_t before = gpu0_free();
  const auto on1 = serve("cuda:1", &during);
  EXPECT_EQ(on1, on0);
  // Nothing of the cuda:1 engine may land on GPU 0 (a few MiB of slack for the runtime).
  EXPECT_LE(before - std::min(before, during), size_t(64) << 20);
}

// Targets stored quantized (Qwen's FP8 and AWQ releases, a GGUF read in place) upload their
// dequantized weights as bf16, through the public engine as `--device cuda` loads them: greedy
// speculative output equals the device's own target alone, and agrees with the CPU engine's
// greedy output on its first tokens (bf16 against fp32 weights: the rest may part).
TEST_F(CudaEngine, QuantizedTargetsDecodeLosslessly) {
  const auto greedy_ids = [](const std::string& target, const std::string& draft,
                             const std::string& device) {
    EngineOptions eo{.target = target, .draft = draft, .device = device};
    Engine engine(eo);
    RequestParams r;
    r.prompt = {3, 141, 59, 26, 5};
    r.max_tokens = 32;
    r.sampling.temperature = 0.0f;
    auto req = engine.submit(r);
    EXPECT_TRUE(wait_end(*req).finished) << target;
    return req->tokens();
  };
  for (const std::string target :
       {"tests/fixtures/quant/fp8", "tests/fixtures/quant/awq",
        "tests/fixtures/gguf/tiny-a-split-00001-of-00003.gguf"}) {
    const auto alone = greedy_ids(target, "", "cuda");
    ASSERT_EQ(alone.size(), 32u) << target;
    EXPECT_EQ(greedy_ids(target, "tests/fixtures/tiny-a/draft", "cuda"), alone) << target;
    const auto cpu = greedy_ids(target, "", "cpu");
    EXPECT_GE(common_prefix(cpu, alone), 4u) << target;
  }
}

}  // namespace
}  // namespace flashmap::cuda

namespace flashmap::cuda {
namespace {

// The DFlash drafter on the device (cuda/dflash_cuda.h) against the CPU model it mirrors: the
// block logits after a prompt's context (NMSE within the whole-model bf16 bound, argmax agreement
// reported), then in the engine: greedy speculative output equals the device's own target-alone
// output, batched over a paged context (the backend's default) and per lane. On the random
// fixture drafter and on the trained default one.
TEST_F(CudaEngine, DFlashDraftMatchesCpuAndIsLossless) {
  const std::pair<std::string, std::string> pairs[] = {
      {"tests/fixtures/tiny-a/target", "tests/fixtures/dflash/zlab"},
      {"models/default/target", "models/default/dflash"}};
  for (const auto& [target_dir, draft_dir] : pairs) {
    ::flashmap::Qwen3Model cpu(target_dir);
    ::flashmap::DFlashModel cpu_d(draft_dir, cpu);
    const int64_t V = cpu.config().vocab_size, H = cpu.config().hidden_size;
    Qwen3Model target(*ctx, cpu, 4096);
    DFlashModel dev(*ctx, cpu_d, target.embedding(), target.lm_head(), V, H);
    const int64_t B = dev.block_size(), P = int64_t(kPrompt.size());

    ::flashmap::KVCache c = cpu.new_cache();
    ::flashmap::Qwen3Model::Output out;
    ::flashmap::Qwen3Model::SeqInput s{&c, kPrompt};
    cpu.forward({&s, 1}, ::flashmap::Qwen3Model::Logits::All, cpu_d.target_layer_ids(), out);
    const float* last = out.logits.data() + (P - 1) * V;
    const int32_t anchor = int32_t(std::max_element(last, last + V) - last);
    ::flashmap::DFlashContext cctx = cpu_d.new_context();
    cpu_d.extend_context(cctx, out.features.data(), P);
    std::vector<float> want(size_t((B - 1) * V));
    ::flashmap::DFlashModel::Request req{&cctx, anchor};
    cpu_d.draft({&req, 1}, int(B), want.data());

    DeviceBuffer<float> feats(*ctx, out.features);
    DeviceBuffer<int32_t> d_anchor(*ctx, std::vector<int32_t>{anchor});
    DeviceBuffer<float> d_logits(size_t((B - 1) * V));
    DFlashDeviceContext dctx = dev.new_context(256);
    dev.extend_context(dctx, feats.data(), P);
    dev.draft(dctx, d_anchor.data(), d_logits.data());
    const auto got = d_logits.download(*ctx);
    const double e = test::nmse(got, want);
    int agree = 0;
    for (int64_t k = 0; k < B - 1; ++k) {
      const float* g = got.data() + k * V;
      const float* w = want.data() + k * V;
      agree += std::max_element(g, g + V) - g == std::max_element(w, w + V) - w;
    }
    EXPECT_LE(e, kLogitsNmse) << draft_dir;
    std::cout << "[ info ] " << draft_dir << ": DFlash block logits NMSE " << e << ", argmax "
              << agree << "/" << B - 1 << "\n";

    // Batched over a paged context: two sequences (the prompt, and its first P − 2 tokens with
    // the next prompt token as anchor), their blocks interleaved in one pool, drafted in one
    // padded batch; each against the CPU drafter on its own context.
    {
      constexpr int32_t bt = 16;
      paged::BlockPool blocks(32, bt);
      const std::vector<int64_t> contexts = {P, P - 2};
      const std::vector<int32_t> anchors = {anchor, kPrompt[size_t(P - 2)]};
      std::vector<int> seqs;
      std::vector<paged::BlockCopy> copies;
      for (int64_t c : contexts) seqs.push_back(blocks.open(c + B));
      for (int64_t at = bt;; at += bt) {  // round-robin growth: the tables interleave
        bool grew = false;
        for (size_t i = 0; i < seqs.size(); ++i) {
          const int64_t want_len = std::min(at, contexts[i] + B);
          if (want_len > blocks.length(seqs[i])) {
            blocks.grow(seqs[i], want_len, copies);
            grew = true;
          }
        }
        if (!grew) break;
      }
      ASSERT_TRUE(dev.pages());
      auto pool = dev.new_paged(blocks.num_blocks(), bt);
      std::vector<paged::CommitSeq> cs;
      for (size_t i = 0; i < seqs.size(); ++i)
        cs.push_back({blocks.table(seqs[i]), 0, 0, int(contexts[i])});
      const auto commit = paged::plan_commit(cs, bt, P);
      DeviceBuffer<int32_t> commit_image(*ctx, commit.image());
      dev.commit_paged(*pool, feats.data(), commit_image.data(), commit.n);
      std::vector<paged::DraftSeq> ds;
      for (size_t i = 0; i < seqs.size(); ++i) ds.push_back({blocks.table(seqs[i]), contexts[i]});
      const std::vector<int32_t> buckets = {1, 4};
      const auto plan = paged::plan_block(ds, int(B), bt, buckets);
      DeviceBuffer<int32_t> image(*ctx, plan.image());
      std::vector<int32_t> padded = anchors;
      padded.resize(size_t(plan.bucket), 0);
      DeviceBuffer<int32_t> d_anchors(*ctx, padded);
      DeviceBuffer<float> batch(size_t(plan.bucket) * size_t(B - 1) * size_t(V));
      dev.draft_batch(*pool, image.data(), plan.bucket, d_anchors.data(), batch.data());
      const auto all = batch.download(*ctx);
      for (size_t i = 0; i < seqs.size(); ++i) {
        ::flashmap::DFlashContext ci = cpu_d.new_context();
        cpu_d.extend_context(ci, out.features.data(), contexts[i]);
        std::vector<float> wi(size_t((B - 1) * V));
        ::flashmap::DFlashModel::Request ri{&ci, anchors[i]};
        cpu_d.draft({&ri, 1}, int(B), wi.data());
        const std::vector<float> gi(all.begin() + int64_t(i) * (B - 1) * V,
                                    all.begin() + int64_t(i + 1) * (B - 1) * V);
        EXPECT_LE(test::nmse(gi, wi), kLogitsNmse) << draft_dir << " batched sequence " << i;
      }
    }

    const auto alone = run(target, nullptr, kPrompt, greedy(48));
    for (const bool paged : {true, false}) {
      DFlashDeviceProposer d(dev, paged);
      const auto r = run(target, &d, kPrompt, greedy(48));
      expect_lossless(target, r.ids, alone.ids, draft_dir);
      std::cout << "[ info ] " << draft_dir << (paged ? " batched" : " per lane")
                << ": DFlash tau on the device " << r.acceptance_length() << "\n";
    }
  }
}

}  // namespace
}  // namespace flashmap::cuda

namespace flashmap::cuda {
namespace {

// Logit controls, constraints and logprobs on the device (cuda/controls.h), through the engine.

std::shared_ptr<const constrain::Vocabulary> letters(int64_t V) {
  return ::flashmap::test::letters(V, 5);  // 1 to 5 letters a token
}

const char* const kPattern = "(ab|c)+d[abc]{3,12}(dd|cb)";

// The two requests with controls: penalties, biases and min_tokens holding back a stop token the
// target produces early; and a grammar with a presence penalty. Both ask for logprobs.
std::vector<std::pair<std::string, GenerateOptions>> controlled_requests(
    Qwen3Model& target, const std::vector<int32_t>& plain) {
  const int64_t V = target.config().vocab_size;
  GenerateOptions a = greedy(40, {plain[2]});
  a.controls.repetition_penalty = 1.3f;
  a.controls.frequency_penalty = 0.5f;
  a.controls.presence_penalty = 0.4f;
  a.controls.logit_bias = {{17, 2.5f}, {500, -3.0f}, {901, 1.5f}, {17, 0.75f}};
  a.controls.min_tokens = 12;
  a.logprobs = 5;
  GenerateOptions b = greedy(40, {int32_t(V - 1)});
  b.controls.constraint =
      constrain::constraint_factory(constrain::compile_regex(kPattern), letters(V));
  b.controls.presence_penalty = 0.4f;
  b.logprobs = 3;
  return {{"penalties, bias, min_tokens", a}, {"grammar", b}};
}

bool same_logprob(const TokenLogprob& a, const TokenLogprob& b) {
  if (a.token != b.token || a.rank != b.rank || a.top.size() != b.top.size() ||
      std::memcmp(&a.logprob, &b.logprob, sizeof(float)) != 0)
    return false;
  for (size_t j = 0; j < a.top.size(); ++j)
    if (a.top[j].first != b.top[j].first ||
        std::memcmp(&a.top[j].second, &b.top[j].second, sizeof(float)) != 0)
      return false;
  return true;
}

void expect_same_logprobs(const std::vector<TokenLogprob>& got,
                          const std::vector<TokenLogprob>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_logprob(got[i], want[i]))
        << what << ": token " << i << " logprob " << got[i].logprob << " vs " << want[i].logprob
        << ", rank " << got[i].rank << " vs " << want[i].rank;
}

// Greedy decoding with controls on the device: speculative output equals the device's own
// target-alone output token for token, with the same logprobs bit for bit (a token's row has the
// bits a decode step gives it, CudaQwen3.StepRowsAreBatchInvariant, and the logprobs read the
// raw rows), with the FlashMap drafter and a scripted one that is always right (so the controls
// accept correct drafts). Against the CPU engine (fp32) on the same request: the outputs agree
// until the CPU's controlled top-2 margin is within reach of the bf16 logits' error, and each
// shared token's logprob is within 2·max|Δlogit| of the CPU's (log-sum-exp is 1-Lipschitz in
// the max norm), plus slack for the prefill-shaped forward the bound is measured on.
TEST_F(CudaEngine, ControlsAndLogprobsOnTheDevice) {
  for (const char* fx : kFixtures) {
    Pair p(*ctx, fx);
    const int64_t V = p.cpu->config().vocab_size;
    const auto plain = run(*p.target, nullptr, kPrompt, greedy(6)).ids;
    for (const auto& [name, o] : controlled_requests(*p.target, plain)) {
      const std::string what = fmt::format("{} {}", fx, name);
      const auto alone = run(*p.target, nullptr, kPrompt, o);
      ASSERT_FALSE(alone.ids.empty()) << what;
      ASSERT_EQ(alone.logprobs.size(), alone.ids.size()) << what;
      FlashMapDeviceProposer d(*p.draft, 1);
      ScriptedDeviceProposer right(*ctx, 8, V, alone.ids, 8);
      const auto spec = run(*p.target, &d, kPrompt, o);
      const auto scripted = run(*p.target, &right, kPrompt, o);
      EXPECT_EQ(spec.ids, alone.ids) << what;
      EXPECT_EQ(scripted.ids, alone.ids) << what;
      expect_same_logprobs(spec.logprobs, alone.logprobs, what + " (FlashMap)");
      expect_same_logprobs(scripted.logprobs, alone.logprobs, what + " (scripted)");
      if (alone.ids.size() > 16) {
        EXPECT_GE(scripted.acceptance_length(), 4.0) << what;
      }
      if (o.controls.min_tokens > 0 && alone.finish_reason == "stop") {
        EXPECT_GT(alone.ids.size(), size_t(o.controls.min_tokens)) << what;
      }
      if (o.controls.constraint && alone.finish_reason == "stop") {
        const auto vocab = letters(V);
        std::string text;
        for (int32_t t : alone.ids)
          if (t != V - 1) text += vocab->bytes(t);
        EXPECT_TRUE(std::regex_match(text, std::regex(kPattern))) << what << ": " << text;
      }

      const auto cpu = generate(*p.cpu, nullptr, kPrompt, o);
      const size_t i = common_prefix(cpu.ids, alone.ids);
      std::cout << "[ info ] " << what << ": device and CPU agree on " << i << " of "
                << alone.ids.size() << " tokens\n";
      for (size_t k = 0; k < i; ++k) {
        const std::span<const int32_t> prefix(alone.ids.data(), k);
        const auto c = cpu_logits(*p.cpu, kPrompt, prefix);
        const auto g = device_logits(*p.target, kPrompt, prefix);
        double err = 0;
        for (size_t v = 0; v < c.size(); ++v)
          if (std::isfinite(c[v])) err = std::max(err, std::abs(double(g[v]) - c[v]));
        EXPECT_NEAR(alone.logprobs[k].logprob, cpu.logprobs[k].logprob, 2 * err + 1e-3)
            << what << " token " << k;
        EXPECT_EQ(alone.logprobs[k].token, cpu.logprobs[k].token) << what << " token " << k;
      }
      if (i < std::min(cpu.ids.size(), alone.ids.size())) {
        // Where they part: the CPU's row with the controls the loop applied there.
        const std::span<const int32_t> prefix(cpu.ids.data(), i);
        auto c = cpu_logits(*p.cpu, kPrompt, prefix);
        const auto g = device_logits(*p.target, kPrompt, prefix);
        double err = 0, n = 0;
        for (size_t v = 0; v < c.size(); ++v)
          if (std::isfinite(c[v])) {
            err += (double(g[v]) - c[v]) * (double(g[v]) - c[v]);
            ++n;
          }
        const double rms = std::sqrt(err / std::max(n, 1.0));
        ControlState cs(o.controls, kPrompt, o.stop_ids, V);
        cs.commit(prefix);
        cs.apply(c.data(), {});
        float a = -INFINITY, b = -INFINITY;
        for (float v : c)
          if (v > a) {
            b = a;
            a = v;
          } else if (v > b) {
            b = v;
          }
        // The repetition penalty scales a logit's error by up to r.
        const double scale = std::max(1.0f, o.controls.repetition_penalty);
        EXPECT_LE(double(a - b), 8 * rms * scale)
            << what << ": diverges at token " << i << " where the CPU's controlled top-2 margin is "
            << a - b << " and the logits' rms error " << rms;
      }
    }
  }
}

// All the requests' tokens and logprobs, read as they come.
std::pair<std::vector<int32_t>, std::vector<TokenLogprob>> collect(Request& r) {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  for (int t = 0; t < 600; ++t) {
    Request::Update u = r.wait(tokens.size(), std::chrono::milliseconds(100));
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    logprobs.insert(logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    if (u.finished) break;
  }
  return {tokens, logprobs};
}

// Sequences with different controls share rounds (their programs uploaded together, their raw
// rows copied in turn for the logprobs): each decodes exactly as it does alone, logprobs too.
TEST_F(CudaEngine, BatchedControlsEqualEachAlone) {
  Pair p(*ctx, kFixtures[0]);
  FlashMapDeviceProposer d(*p.draft, 1);
  const auto plain = run(*p.target, nullptr, kPrompt, greedy(6)).ids;
  auto requests = controlled_requests(*p.target, plain);
  GenerateOptions none = greedy(33);
  none.logprobs = 0;
  requests.push_back({"logprobs alone", none});
  GenerateOptions unlogged = requests[0].second;
  unlogged.logprobs = -1;
  requests.push_back({"controls alone", unlogged});
  const std::vector<std::vector<int32_t>> prompts = {kPrompt, {7, 3, 3}, {900, 12, 5, 77}, {4}};
  std::vector<GenerateResult> alone;
  for (size_t i = 0; i < requests.size(); ++i)
    alone.push_back(run(*p.target, &d, prompts[i], requests[i].second));
  EngineOptions eo;
  eo.max_running = 4;
  eo.spec_policy = SpecPolicyKind::Always;
  std::vector<std::pair<std::vector<int32_t>, std::vector<TokenLogprob>>> got;
  {
    Engine engine(make_backend(*p.target, &d, 4096, true), eo);
    std::vector<std::shared_ptr<Request>> reqs;
    for (size_t i = 0; i < requests.size(); ++i)
      reqs.push_back(engine.submit(requests[i].second.request(prompts[i])));
    for (auto& r : reqs) got.push_back(collect(*r));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].first, alone[i].ids) << requests[i].first;
    expect_same_logprobs(got[i].second, alone[i].logprobs, requests[i].first);
  }
}

}  // namespace
}  // namespace flashmap::cuda
