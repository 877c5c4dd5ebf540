// The batched round loop against the single-sequence one: the kernels are batch-invariant, so
// every sequence of a batch must decode exactly as flashmap::generate() decodes it alone,
// whatever else shares its rounds. Plus cancellation and admission control. References are
// computed while no scheduler runs: the models share one thread pool, which takes one caller at
// a time (in the server only the engine thread computes).
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "../specdec/random_models.h"
#include "bench/generate.h"
#include "cpu/backend.h"
#include "engine/rounds.h"
#include "faulty_backend.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "requests.h"

using namespace flashmap;
using namespace flashmap::engine;
using flashmap::cpu::CpuBackend;
using flashmap::engine::test::prompt_of;
using flashmap::engine::test::wait_all;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {
const std::string kA = "tests/fixtures/tiny-a";

std::unique_ptr<Backend> on_cpu(const Qwen3Model& target, const BlockProposer* proposer) {
  return std::make_unique<CpuBackend>(target, proposer);
}

struct Models {
  Qwen3Model target{kA + "/target"};
  FlashMapModel draft{kA + "/draft", target};
  FlashMapProposer drafter{draft, 1};
};
Models& models() {
  static Models m;
  return m;
}

// The request's end (finished false if it did not end within 60 s).
Request::Update finish_of(Request& r) {
  Request::Update u;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t seen = 0;
  while (!(u = r.wait(seen, std::chrono::milliseconds(500))).finished &&
         std::chrono::steady_clock::now() < deadline)
    seen += u.tokens.size();
  // The whole output, not the part after `seen`.
  Request::Update all = r.wait(0, std::chrono::milliseconds(0));
  all.finished = u.finished;
  return all;
}

GenerateResult reference(const RequestParams& p, bool with_drafter) {
  return test::generate_alone(models().target, with_drafter ? &models().drafter : nullptr, p);
}
}  // namespace

TEST(Engine, BatchedGreedyEqualsGenerate) {
  auto& m = models();
  std::vector<RequestParams> params;
  for (int i = 0; i < 6; ++i) {
    RequestParams p;
    p.prompt = prompt_of(3 + 5 * i, i);
    p.max_tokens = 20 + 7 * i;
    p.speculative = i % 3 != 2;  // sequences with and without drafting share rounds
    params.push_back(p);
  }
  std::vector<GenerateResult> wants;
  for (auto& p : params) wants.push_back(reference(p, p.speculative));
  // Always: the acceptance path matches generate()'s only if every round drafts.
  Engine sched(on_cpu(m.target, &m.drafter),
               {.max_running = 8, .max_queue = 8, .spec_policy = SpecPolicyKind::Always});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string reason;
    const auto got = wait_all(*reqs[i], &reason);
    const auto& want = wants[i];
    EXPECT_EQ(got, want.ids) << "request " << i;
    EXPECT_EQ(reason, want.finish_reason);
    if (params[i].speculative) {
      // Same drafts, same verification: the acceptance path matches too.
      EXPECT_EQ(reqs[i]->acceptance_lengths(), want.acceptance_lengths) << "request " << i;
    } else {
      EXPECT_DOUBLE_EQ(reqs[i]->acceptance_length(), 1.0);
    }
  }
  EXPECT_GT(sched.stats().rounds, 0u);
  EXPECT_GT(sched.stats().speculative_rounds, 0u);
}

TEST(Engine, SeededSamplingEqualsGenerate) {
  auto& m = models();
  std::vector<RequestParams> params;
  for (int i = 0; i < 3; ++i) {
    RequestParams p;
    p.prompt = prompt_of(4 + 3 * i, 10 + i);
    p.max_tokens = 24;
    p.sampling = {0.8f, 50, 0.95f, 0.0f};
    p.seed = 1000 + uint64_t(i);
    p.seeded = true;
    params.push_back(p);
  }
  std::vector<std::vector<int32_t>> wants;
  for (auto& p : params) wants.push_back(reference(p, true).ids);
  Engine sched(on_cpu(m.target, &m.drafter),
               {.max_running = 4, .spec_policy = SpecPolicyKind::Always});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(wait_all(*reqs[i]), wants[i]) << "request " << i;
}

TEST(Engine, StopIdsAndLateJoinersMatchGenerate) {
  auto& m = models();
  RequestParams base;
  base.prompt = prompt_of(9, 3);
  base.max_tokens = 40;
  const auto free_run = reference(base, true).ids;
  ASSERT_GE(free_run.size(), 10u);
  // Stop on the 6th generated token: finish "stop", the stop token included, nothing after it.
  RequestParams stopping = base;
  stopping.stop_ids = {free_run[5]};
  // Five requests through two slots: later ones join while others are mid-decode.
  std::vector<std::shared_ptr<Request>> reqs;
  std::vector<RequestParams> params;
  std::vector<GenerateResult> wants;
  for (int i = 0; i < 5; ++i) {
    RequestParams p = i == 2 ? stopping : base;
    p.prompt = i == 2 ? stopping.prompt : prompt_of(2 + i * 4, 20 + i);
    params.push_back(p);
    wants.push_back(reference(p, true));
  }
  Engine sched(on_cpu(m.target, &m.drafter), {.max_running = 2, .max_queue = 8});
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string reason;
    const auto got = wait_all(*reqs[i], &reason);
    const auto& want = wants[i];
    EXPECT_EQ(got, want.ids);
    EXPECT_EQ(reason, want.finish_reason);
  }
  auto got = reqs[2]->tokens();
  EXPECT_EQ(wants[2].finish_reason, "stop");
  EXPECT_EQ(got.back(), free_run[5]);
  EXPECT_LE(got.size(), 6u);
}

TEST(Engine, SpeculationOffAboveSpecMaxBatch) {
  auto& m = models();
  std::vector<RequestParams> params;
  std::vector<std::vector<int32_t>> wants;
  for (int i = 0; i < 3; ++i) {
    RequestParams p;
    p.prompt = prompt_of(5 + i, 40 + i);
    p.max_tokens = 12 + 10 * i;
    params.push_back(p);
    wants.push_back(reference(p, true).ids);
  }
  Engine sched(on_cpu(m.target, &m.drafter),
               {.max_running = 8, .spec_max_batch = 1, .spec_policy = SpecPolicyKind::Batch});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(wait_all(*reqs[i]), wants[i]);  // lossless
  // The longest request ran alone at the end, so it speculated there: both kinds of round.
  const auto st = sched.stats();
  EXPECT_GT(st.speculative_rounds, 0u);
  EXPECT_LT(st.speculative_rounds, st.rounds);
}

TEST(Engine, CancelFreesTheSequence) {
  auto& m = models();
  Engine sched(on_cpu(m.target, &m.drafter), {.max_running = 2});
  RequestParams p;
  p.prompt = prompt_of(6, 1);
  p.max_tokens = 4000;  // far more than the test waits for
  auto r = sched.submit(p);
  auto u = r->wait(0, std::chrono::milliseconds(10000));
  ASSERT_FALSE(u.tokens.empty());
  EXPECT_EQ(sched.stats().running, 1);
  r->cancel();
  std::string reason;
  const auto got = wait_all(*r, &reason);
  EXPECT_EQ(reason, "cancelled");
  EXPECT_LT(got.size(), 4000u);
  sched.drain();
  EXPECT_EQ(sched.stats().running, 0);
  EXPECT_EQ(sched.stats().queued, 0);
  // The slot is free again: a new request completes.
  p.max_tokens = 5;
  auto r2 = sched.submit(p);
  EXPECT_EQ(wait_all(*r2).size(), 5u);
}

// Engine::generate's cancel flag (the Python binding's streams): the sequence ends at the round
// boundary after it is set, with the tokens up to there equal to an uncancelled run's.
TEST(Engine, GenerateCancelsBetweenRounds) {
  auto& m = models();
  Engine engine(on_cpu(m.target, &m.drafter), {.spec_policy = SpecPolicyKind::Always});
  RequestParams p;
  p.prompt = prompt_of(6, 2);
  p.max_tokens = 60;
  const auto full = engine.generate(p);
  ASSERT_EQ(full.ids.size(), 60u);
  std::atomic<bool> cancel{false};
  int calls = 0;
  const auto cut = engine.generate(
      p,
      [&](std::span<const int32_t>) {
        if (++calls == 3) cancel.store(true);
      },
      &cancel);
  EXPECT_EQ(cut.finish_reason, "cancelled");
  EXPECT_EQ(calls, 3);  // the prefill's token and two rounds, none after the flag
  ASSERT_LT(cut.ids.size(), full.ids.size());
  EXPECT_TRUE(std::equal(cut.ids.begin(), cut.ids.end(), full.ids.begin()));
  EXPECT_EQ(cut.rounds, 2);
  // A flag set before the call leaves the prefill's token only.
  const auto none = engine.generate(p, {}, &cancel);
  EXPECT_EQ(none.finish_reason, "cancelled");
  EXPECT_EQ(none.ids.size(), 1u);
  // A backend made elsewhere has no folder: no eos ids, greedy.
  EXPECT_TRUE(engine.defaults().eos_token_ids.empty());
  EXPECT_TRUE(engine.defaults().sampling.greedy());
}

// The defaults every front end asks: the target's generation_config.json, read as transformers
// does (do_sample false: greedy whatever the values), and nothing else.
TEST(Engine, RequestDefaultsComeFromTheGenerationConfig) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("flashmap-defaults-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator("models/default/target"))
    if (e.path().filename() != "generation_config.json")
      fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
  auto defaults_with = [&](const std::string& json) {
    std::ofstream(dir / "generation_config.json") << json;
    return Engine(EngineOptions{.target = dir.string()}).defaults();
  };
  const RequestDefaults qwen3 = defaults_with(
      R"({"do_sample": true, "eos_token_id": [0, 1], "temperature": 0.6, "top_k": 20,
          "top_p": 0.95, "repetition_penalty": 1.05})");
  EXPECT_FLOAT_EQ(qwen3.sampling.temperature, 0.6f);
  EXPECT_EQ(qwen3.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(qwen3.sampling.top_p, 0.95f);
  EXPECT_FLOAT_EQ(qwen3.sampling.min_p, 0.0f);
  EXPECT_FLOAT_EQ(qwen3.repetition_penalty, 1.05f);
  EXPECT_EQ(qwen3.eos_token_ids, (std::vector<int32_t>{0, 1}));
  const RequestParams p = qwen3.request();
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.controls.repetition_penalty, 1.05f);
  EXPECT_EQ(p.stop_ids, (std::vector<int32_t>{0, 1}));

  const RequestDefaults greedy =
      defaults_with(R"({"do_sample": false, "temperature": 0.6, "top_k": 20})");
  EXPECT_TRUE(greedy.sampling.greedy());
  EXPECT_EQ(greedy.sampling.top_k, 0);
  EXPECT_TRUE(greedy.eos_token_ids.empty());

  EXPECT_THAT([&] { defaults_with(R"({"top_p": 2})"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("generation_config.json: field 'top_p'")));
  fs::remove_all(dir);
}

TEST(Engine, EosIdsAndThreadPoolSize) {
  Engine engine(EngineOptions{.target = "models/default/target"});
  EXPECT_EQ(engine.defaults().eos_token_ids, std::vector<int32_t>{0});
  const int n = cpu_threads();
  EXPECT_EQ(set_cpu_threads(n), n);
  EXPECT_THAT([&] { set_cpu_threads(n + 1); },
              ::testing::ThrowsMessage<Error>(HasSubstr("already runs")));
  EXPECT_THROW(set_cpu_threads(0), Error);
  // EngineOptions::threads: the pool's size is taken, another one refused before any model loads.
  const std::string kTarget = "models/default/target";
  EXPECT_EQ(Engine(EngineOptions{.target = kTarget, .threads = n}).defaults().eos_token_ids.size(),
            1u);
  EXPECT_THAT([&] { Engine(EngineOptions{.target = "/nonexistent", .threads = n + 1}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("already runs")));
}

TEST(Engine, AdmissionLimits) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  std::mutex& gate = backend->gate;
  Engine sched(std::move(backend),
               {.max_running = 1, .max_queue = 1, .max_context = 64, .spec_max_batch = 0});
  // Held until the queue is found full: the first request cannot finish (and free its place)
  // before the third is submitted. Released before the engine ends, on every path.
  std::unique_lock hold(gate);
  RequestParams p;
  p.prompt = prompt_of(8, 2);
  p.max_tokens = 57;  // 8 + 57 > 64
  try {
    sched.submit(p);
    FAIL() << "expected a context error";
  } catch (const AdmissionError&) {
    FAIL() << "a too-long request is a bad request, not an admission error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("context of 64"));
  }
  p.max_tokens = 0;
  EXPECT_THROW(sched.submit(p), Error);
  p.prompt.clear();
  p.max_tokens = 4;
  EXPECT_THROW(sched.submit(p), Error);

  p.prompt = prompt_of(8, 2);
  p.max_tokens = 56;
  auto a = sched.submit(p);  // running
  auto b = sched.submit(p);  // queued
  try {
    sched.submit(p);
    FAIL() << "expected queue full";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 429);
  }
  hold.unlock();
  sched.shutdown();
  try {
    sched.submit(p);
    FAIL() << "expected shutting down";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 503);
  }
  // Shutting down finishes what was accepted.
  EXPECT_EQ(wait_all(*a).size(), 56u);
  EXPECT_EQ(wait_all(*b).size(), 56u);
  sched.drain();
  EXPECT_EQ(sched.stats().running, 0);
}

// A sequence that cannot start (its device buffers do not fit) fails alone, with the device's
// message; the requests admitted with it, and the ones running, decode as generate() does.
TEST(Engine, AFailedAdmissionFailsThatRequestOnly) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  // The batch's third open fails; in the retries one at a time, the second sequence's does.
  backend->failing_opens = {2, 4};
  Engine engine(std::move(backend), {.max_running = 4, .spec_max_batch = 0});
  std::vector<RequestParams> params;
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.prompt = prompt_of(5 + i, i);
    p.max_tokens = 12;
    params.push_back(p);
  }
  // Admitted together in one round, then each alone.
  auto reqs = engine.submit_all(params);
  int failed = 0;
  std::vector<Request::Update> ends;
  for (auto& r : reqs) ends.push_back(finish_of(*r));
  engine.drain();  // the references below compute on the pool the engine thread uses
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request::Update& u = ends[i];
    ASSERT_TRUE(u.finished) << i;
    if (u.finish_reason == "error") {
      ++failed;
      EXPECT_THAT(u.error, HasSubstr("out of memory")) << i;
      EXPECT_TRUE(u.tokens.empty()) << i;
      continue;
    }
    EXPECT_EQ(u.tokens, reference(params[i], true).ids) << i;
  }
  EXPECT_EQ(failed, 1);
  EXPECT_TRUE(engine.healthy());
  // The engine goes on serving.
  auto again = engine.submit(params[0]);
  const auto tokens = wait_all(*again);
  engine.drain();
  EXPECT_EQ(tokens, reference(params[0], true).ids);
}

// A backend that gives memory by need (a paged device backend): requests that do not fit now wait
// in the queue for running ones to end instead of failing, the promised positions never exceed
// the budget, every request decodes as generate() does; one that could not fit even alone fails
// with the backend's message instead of blocking the queue.
TEST(Engine, AdmissionByNeedQueuesWhatDoesNotFitYet) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  test::FaultyBackend* b = backend.get();
  // Each request holds prompt + max_tokens + 1 = 5..8 + 40 + 1 positions: two fit in 100.
  b->budget = 100;
  Engine engine(std::move(backend), {.max_running = 4, .spec_max_batch = 0});
  std::vector<RequestParams> params;
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.prompt = prompt_of(5 + i, i);
    p.max_tokens = 40;
    params.push_back(p);
  }
  auto reqs = engine.submit_all(params);
  std::vector<Request::Update> ends;
  for (auto& r : reqs) ends.push_back(finish_of(*r));
  engine.drain();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(ends[i].finished) << i;
    EXPECT_EQ(ends[i].finish_reason, "length") << i << ": " << ends[i].error;
    EXPECT_EQ(ends[i].tokens, reference(params[i], true).ids) << i;
  }
  EXPECT_LE(b->most_held, 100);
  EXPECT_GT(b->most_held, 50) << "two requests never ran together";
  // Too large for the whole budget: fails at once, naming the backend's reason.
  RequestParams big = params[0];
  big.max_tokens = 200;
  auto r = engine.submit(big);
  const Request::Update u = finish_of(*r);
  ASSERT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, "error");
  EXPECT_THAT(u.error, HasSubstr("out of KV memory"));
  // The refusal released nothing it never held: a fitting request still runs.
  auto again = engine.submit(params[1]);
  const auto again_tokens = wait_all(*again);
  engine.drain();
  EXPECT_EQ(again_tokens, reference(params[1], true).ids);
}

// A device fault (a sticky CUDA error) ends serving: the running and queued requests finish
// with the fault's message, new ones get 503 naming it, drain() returns and stats() says so.
TEST(Engine, ADeviceFaultFailsEveryHeldRequestAndRefusesNewOnes) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  backend->fault_at = 3;
  Engine engine(std::move(backend), {.max_running = 2, .max_queue = 8, .spec_max_batch = 0});
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 5; ++i) {
    RequestParams p;
    p.prompt = prompt_of(6, i);
    p.max_tokens = 40;
    // The engine thread runs while these are submitted: once it has failed, a submission is
    // refused (503) instead of held.
    try {
      reqs.push_back(engine.submit(p));
    } catch (const AdmissionError& e) {
      EXPECT_EQ(e.status, 503) << e.what();
    }
  }
  ASSERT_FALSE(reqs.empty());
  for (auto& r : reqs) {
    const Request::Update u = finish_of(*r);
    ASSERT_TRUE(u.finished) << "request " << r->id << " hangs after the fault";
    EXPECT_EQ(u.finish_reason, "error");
    EXPECT_THAT(u.error, HasSubstr("illegal memory access"));
    EXPECT_LT(u.tokens.size(), 40u);
  }
  engine.drain();
  EXPECT_FALSE(engine.healthy());
  const auto st = engine.stats();
  EXPECT_FALSE(st.healthy);
  EXPECT_THAT(st.fault, HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  RequestParams p;
  p.prompt = prompt_of(6, 9);
  p.max_tokens = 4;
  try {
    engine.submit(p);
    FAIL() << "expected 503";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_THAT(e.what(), HasSubstr("illegal memory access"));
  }
}

// A backend that holds fewer sequences than --max-running asks for caps the running ones; the
// rest wait in the queue, and past it get 429.
TEST(Engine, RunningSequencesAreCappedByTheDevice) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  backend->set_lanes(2);
  Engine engine(std::move(backend), {.max_running = 8, .max_queue = 1, .spec_max_batch = 0});
  EXPECT_EQ(engine.max_running(), 2);
  EXPECT_EQ(engine.stats().max_running, 2);
  RequestParams p;
  p.prompt = prompt_of(6, 1);
  p.max_tokens = 30;
  auto a = engine.submit(p), b = engine.submit(p), c = engine.submit(p);
  try {
    engine.submit(p);
    FAIL() << "expected 429";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 429);
    EXPECT_THAT(e.what(), HasSubstr("--max-running 2"));
  }
  std::vector<std::vector<int32_t>> got;
  for (auto* r : {a.get(), b.get(), c.get()}) got.push_back(wait_all(*r));
  engine.drain();
  const auto want = reference(p, true).ids;
  for (const auto& g : got) EXPECT_EQ(g, want);
}

// What a backend cannot do is refused once, at Engine start (options) or at submit (a request's
// field), naming the option or field, never silently ignored.
TEST(Engine, OptionsABackendCannotServeAreRefusedAtStart) {
  auto& m = models();
  auto without = [&] {
    auto b = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
    b->set_caps({.fork = false, .prompt_logprobs = false, .trees = false});
    return b;
  };
  EXPECT_THAT([&] { Engine e(without(), {.prefix_cache_mb = 64}); },
              ThrowsMessage<Error>(HasSubstr("--prefix-cache-mb 64")));
  EXPECT_THAT([&] { Engine e(without(), {.draft_tree = "paths:2"}); },
              ThrowsMessage<Error>(HasSubstr("--draft-tree paths:2")));
  Engine engine(without(), {.spec_max_batch = 0});
  RequestParams p;
  p.prompt = prompt_of(6, 1);
  p.prompt_logprobs = 1;
  EXPECT_THAT([&] { engine.submit(p); }, ThrowsMessage<Error>(HasSubstr("prompt logprobs")));
  p.prompt_logprobs = -1;
  p.max_tokens = 8;
  EXPECT_EQ(wait_all(*engine.submit(p)), reference(p, true).ids);
}

TEST(Engine, TargetAloneEqualsGenerate) {
  auto& m = models();
  std::vector<RequestParams> params;
  std::vector<std::vector<int32_t>> wants;
  for (int i = 0; i < 3; ++i) {
    RequestParams p;
    p.prompt = prompt_of(2 + 6 * i, 60 + i);
    p.max_tokens = 10 + 5 * i;
    params.push_back(p);
    wants.push_back(reference(p, false).ids);
  }
  Engine sched(on_cpu(m.target, nullptr), {.max_running = 4});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(wait_all(*reqs[i]), wants[i]);
}

// ---- The adaptive speculation policy, on a fake clock ----

namespace {
// Round timing the test controls: each reading advances time by `tick` (so a round without
// drafting lasts one tick) and each drafter call adds `draft` (drafting costs that much more).
struct FakeClock {
  std::atomic<int64_t> now_us{0};
  int64_t tick_us = 1000, draft_us = 1000;
  std::function<double()> fn() {
    return [this] { return double(now_us.fetch_add(tick_us)) * 1e-6; };
  }
};

// Forwards to a drafter and bills the fake clock for every propose call.
class BilledDrafter : public BlockProposer {
 public:
  BilledDrafter(const BlockProposer& inner, FakeClock& clock) : inner_(inner), clock_(clock) {}
  int block_size() const override { return inner_.block_size(); }
  std::span<const int> target_layer_ids() const override { return inner_.target_layer_ids(); }
  DraftState begin() const override { return inner_.begin(); }
  void commit(DraftState& state, const float* features, int64_t n,
              std::span<const int32_t> tokens) const override {
    inner_.commit(state, features, n, tokens);
  }
  void propose(std::span<const Seq> batch) const override {
    clock_.now_us += clock_.draft_us;
    inner_.propose(batch);
  }

 private:
  const BlockProposer& inner_;
  FakeClock& clock_;
};

uint64_t spec_rounds(const EngineStats& s) {
  return s.policy_rounds[1][0] + s.policy_rounds[1][1];
}
uint64_t plain_rounds(const EngineStats& s) {
  return s.policy_rounds[0][0] + s.policy_rounds[0][1];
}
}  // namespace

TEST(AdaptivePolicy, WrongDrafterConvergesToTargetAlone) {
  auto& m = models();
  RequestParams p;
  p.prompt = prompt_of(7, 5);
  p.max_tokens = 200;
  const auto want = reference(p, false).ids;
  ASSERT_EQ(want.size(), 200u);
  // The target's own continuation with every slot corrupted: acceptance length exactly 1, so a
  // speculative round commits what a plain one does at twice its (fake) cost.
  ScriptedProposer wrong(4, m.target.config().vocab_size, want, 0);
  FakeClock clock;
  BilledDrafter drafter(wrong, clock);
  // Every draft verified: this is about when rounds speculate (draft_cut.h, which decides on
  // real times, has its own tests).
  Engine sched(on_cpu(m.target, &drafter),
               {.draft_cut = "off", .max_running = 4, .clock = clock.fn()});
  auto r = sched.submit(p);
  EXPECT_EQ(wait_all(*r), want);
  const auto st = sched.stats();
  // ~200 rounds: the first speculates (no estimate), then only explorations 16, 32, 64, 128
  // rounds apart.
  EXPECT_GE(spec_rounds(st), 2u) << "it must explore";
  EXPECT_LE(spec_rounds(st), 7u);
  EXPECT_GE(plain_rounds(st), 190u);
  ASSERT_GE(st.buckets.size(), 1u);
  EXPECT_TRUE(st.buckets[0].has_choice());
  EXPECT_FALSE(st.buckets[0].prefers_spec());
  EXPECT_NEAR(st.buckets[0].plain.tokens_per_second(), 1000.0, 1e-6);  // 1 token per 1 ms
  EXPECT_NEAR(st.buckets[0].spec.tokens_per_second(), 500.0, 1e-6);    // 1 token per 2 ms
}

TEST(AdaptivePolicy, RightDrafterConvergesToSpeculation) {
  auto& m = models();
  RequestParams p;
  p.prompt = prompt_of(7, 6);
  p.max_tokens = 200;
  const auto want = reference(p, false).ids;
  ASSERT_EQ(want.size(), 200u);
  // Always right: every round commits 5 tokens at twice the cost of a plain round's one.
  ScriptedProposer right(4, m.target.config().vocab_size, want, 4);
  FakeClock clock;
  BilledDrafter drafter(right, clock);
  Engine sched(on_cpu(m.target, &drafter),
               {.draft_cut = "off", .max_running = 4, .clock = clock.fn()});
  auto r = sched.submit(p);
  EXPECT_EQ(wait_all(*r), want);
  EXPECT_GT(r->acceptance_length(), 4.0);
  const auto st = sched.stats();
  // ~40 speculative rounds; plain ones: the first measurement and explorations 16, 32 apart.
  EXPECT_GE(spec_rounds(st), 35u);
  EXPECT_GE(plain_rounds(st), 2u) << "it must explore";
  EXPECT_LE(plain_rounds(st), 4u);
  ASSERT_GE(st.buckets.size(), 1u);
  EXPECT_TRUE(st.buckets[0].prefers_spec());
}

TEST(AdaptivePolicy, OutputsEqualGenerateWhateverTheModeSequence) {
  auto& m = models();
  // Greedy and sampled requests under a clock that returns random round times, so that the
  // estimates and hence the modes flip erratically.
  std::vector<RequestParams> params;
  for (int i = 0; i < 6; ++i) {
    RequestParams p;
    p.prompt = prompt_of(3 + 4 * i, 80 + i);
    p.max_tokens = 30 + 9 * i;
    if (i % 2 == 1) {
      p.sampling = {0.8f, 50, 0.95f, 0.0f};
      p.seed = 77 + uint64_t(i);
      p.seeded = true;
    }
    params.push_back(p);
  }
  std::vector<GenerateResult> with, without;
  for (auto& p : params) {
    with.push_back(reference(p, true));
    without.push_back(reference(p, false));
  }
  std::mt19937_64 gen(3);
  std::mutex gen_mutex;
  auto random_clock = [&, t = 0.0]() mutable {
    std::lock_guard lk(gen_mutex);
    t += std::uniform_real_distribution<double>(1e-4, 1e-2)(gen);
    return t;
  };
  Engine sched(on_cpu(m.target, &m.drafter), {.max_running = 3,
                                              .max_queue = 8,
                                              .explore_min = 2,
                                              .explore_max = 4,
                                              .clock = random_clock});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto got = wait_all(*reqs[i]);
    // Greedy and seeded: the same tokens whatever mode each round ran in, equal to generate()
    // with and without the drafter.
    EXPECT_EQ(got, with[i].ids) << "request " << i;
    EXPECT_EQ(got, without[i].ids) << "request " << i;
  }
  const auto st = sched.stats();
  EXPECT_GT(spec_rounds(st), 5u);
  EXPECT_GT(plain_rounds(st), 5u);
}

// Requests that run to the last position of the target's context, with speculation forced:
// every round near the end verifies a shorter block, and each finishes with "length" as
// generate() does (before, the verify pass ran past max_position_embeddings and failed).
TEST(Engine, GenerationToTheEndOfTheContext) {
  const auto pair = flashmap::testing::write_random_pair("sched-ctx40", 64, 32, 2, 6, 17, 40);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer drafter(model, 1);
  std::vector<RequestParams> params;
  for (int i = 0; i < 6; ++i) {
    RequestParams p;
    for (int j = 0; j < 1 + 7 * i; ++j) p.prompt.push_back(int32_t((j * 13 + i) % 64));
    p.max_tokens = 40 - int(p.prompt.size());
    if (i % 2) {
      p.sampling.temperature = 1.0f;
      p.seed = 100 + uint64_t(i);
      p.seeded = true;
    }
    params.push_back(p);
  }
  std::vector<std::vector<int32_t>> wants;
  for (const auto& p : params) {
    GenerateOptions o;
    o.max_new_tokens = p.max_tokens;
    o.sampling = p.sampling;
    o.seed = p.seed;
    o.seeded = p.seeded;
    wants.push_back(generate(target, nullptr, p.prompt, o).ids);
  }
  Engine sched(on_cpu(target, &drafter), {.max_running = 4, .spec_policy = SpecPolicyKind::Always});
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::string reason;
    EXPECT_EQ(wait_all(*reqs[i], &reason), wants[i]) << "request " << i;
    EXPECT_EQ(reason, "length");
  }
  EXPECT_GT(sched.stats().speculative_rounds, 0u);
}

// Prefix caching: a second turn that extends the first (its prompt + output + a new message),
// requests sharing a system prompt, non-drafting and seeded requests: the same tokens and, for
// drafting requests, the same acceptance path as without the cache (the cached drafter context
// is the one a fresh prefill builds), with the cached positions reported.
TEST(PrefixCache, CachedPrefixesDecodeAsFreshOnes) {
  auto& m = models();
  Engine sched(on_cpu(m.target, &m.drafter),
               {.max_running = 4, .spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 64});
  auto run = [&](const RequestParams& p) {
    const auto want = reference(p, p.speculative);
    auto r = sched.submit(p);
    const auto got = wait_all(*r);
    EXPECT_EQ(got, want.ids);
    if (p.speculative) {
      EXPECT_EQ(r->acceptance_lengths(), want.acceptance_lengths);
    }
    return std::make_pair(got, r->cached_tokens());
  };
  RequestParams turn1;
  turn1.prompt = prompt_of(40, 1);
  turn1.max_tokens = 30;
  const auto [out1, cached1] = run(turn1);
  EXPECT_EQ(cached1, 0);
  RequestParams turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), out1.begin(), out1.end());
  const auto more = prompt_of(9, 2);
  turn2.prompt.insert(turn2.prompt.end(), more.begin(), more.end());
  const auto [out2, cached2] = run(turn2);
  EXPECT_GE(cached2, 40);  // the first prompt at least (its output's last round may lag)
  EXPECT_LT(cached2, int64_t(turn2.prompt.size()));
  // The same prompt again: everything but its last token comes from the cache.
  EXPECT_EQ(run(turn2).second, int64_t(turn2.prompt.size()) - 1);
  // A request that does not draft reuses a drafting entry; a seeded one decodes as without.
  RequestParams plain = turn2;
  plain.speculative = false;
  EXPECT_GE(run(plain).second, 40);
  RequestParams seeded = turn2;
  seeded.sampling = {0.9f, 0, 1.0f, 0.0f};
  seeded.seed = 7;
  seeded.seeded = true;
  EXPECT_GE(run(seeded).second, 40);
  // Shared system prompt, decoded together.
  const auto system = prompt_of(33, 3);
  std::vector<RequestParams> batch;
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.prompt = system;
    const auto user = prompt_of(5 + i, 20 + i);
    p.prompt.insert(p.prompt.end(), user.begin(), user.end());
    p.max_tokens = 12;
    batch.push_back(p);
  }
  run(batch[0]);
  // References first: the models' thread pool takes one caller at a time.
  std::vector<std::vector<int32_t>> wants;
  for (size_t i = 1; i < batch.size(); ++i) wants.push_back(reference(batch[i], true).ids);
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 1; i < batch.size(); ++i) reqs.push_back(sched.submit(batch[i]));
  for (size_t i = 1; i < batch.size(); ++i) {
    EXPECT_EQ(wait_all(*reqs[i - 1]), wants[i - 1]) << i;
    EXPECT_GE(reqs[i - 1]->cached_tokens(), 33);
  }
  const auto st = sched.stats().prefix_cache;
  EXPECT_GE(st.hits, 7u);
  EXPECT_GT(st.hit_tokens, 300u);
  EXPECT_LE(st.bytes, st.budget);
}

// What a paged device needs of the engine: a sequence copied from a cached prefix is opened for
// all it may grow to (its prompt, max_tokens and one more), and an entry the cache keeps is
// settled, so it promises only the positions it holds, not its finished request's growth.
TEST(PrefixCache, CopiesPromiseTheirGrowthAndEntriesOnlyWhatTheyHold) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  test::FaultyBackend* b = backend.get();
  b->budget = 1000;
  Engine engine(std::move(backend),
                {.max_running = 2, .spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 64});
  RequestParams turn1;
  turn1.prompt = prompt_of(40, 1);
  turn1.max_tokens = 30;
  const auto want1 = reference(turn1, true).ids;
  const auto out1 = wait_all(*engine.submit(turn1));
  engine.drain();
  EXPECT_EQ(out1, want1);
  // The finished request is the cache's entry now: it holds its 40 + 30 − 1 positions at most
  // (the last token's KV is never written), not the 71 it was opened for.
  EXPECT_GT(b->promised(), 40);
  EXPECT_LE(b->promised(), 69);
  EXPECT_TRUE(b->fork_opens.empty());
  RequestParams turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), out1.begin(), out1.end());
  turn2.prompt.push_back(7);
  turn2.max_tokens = 12;
  const auto want2 = reference(turn2, true).ids;
  auto r = engine.submit(turn2);
  EXPECT_EQ(wait_all(*r), want2);
  engine.drain();
  EXPECT_GE(r->cached_tokens(), 40);
  ASSERT_EQ(b->fork_opens.size(), 1u);
  EXPECT_EQ(b->fork_opens[0].first, r->cached_tokens());
  EXPECT_EQ(b->fork_opens[0].second, int64_t(turn2.prompt.size()) + turn2.max_tokens + 1);
}

// Cached prefixes hold memory a paged device could give a queued request: when the backend
// cannot admit the queue's head, entries are dropped (least recently used first) until it can,
// rather than the request failing for memory that only the cache holds.
TEST(PrefixCache, GivesItsMemoryToTheQueue) {
  auto& m = models();
  auto backend = std::make_unique<test::FaultyBackend>(m.target, &m.drafter);
  test::FaultyBackend* b = backend.get();
  b->budget = 200;
  Engine engine(std::move(backend),
                {.max_running = 2, .spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 64});
  for (int i = 0; i < 2; ++i) {
    RequestParams p;
    p.prompt = prompt_of(40, 1 + i);
    p.max_tokens = 30;
    const auto want = reference(p, true).ids;
    EXPECT_EQ(wait_all(*engine.submit(p)), want) << i;
    engine.drain();
  }
  // Two entries of about 69 positions each: 62 of the 200 are left.
  EXPECT_GT(b->promised(), 130);
  EXPECT_EQ(engine.stats().prefix_cache.entries, 2u);
  RequestParams big;
  big.prompt = prompt_of(100, 9);
  big.max_tokens = 60;
  const auto want = reference(big, true).ids;
  auto r = engine.submit(big);
  std::string reason;
  const auto got = wait_all(*r, &reason);
  engine.drain();
  EXPECT_EQ(reason, "length");
  EXPECT_EQ(got, want);
  const auto st = engine.stats().prefix_cache;
  EXPECT_GE(st.evictions, 1u);
  EXPECT_LE(b->most_held, 200);
}

// Under a small budget entries are evicted least recently used first and the memory held stays
// within it; outputs are unchanged.
TEST(PrefixCache, EvictsWithinTheBudget) {
  auto& m = models();
  Engine sched(on_cpu(m.target, &m.drafter),
               {.max_running = 2, .spec_policy = SpecPolicyKind::Always, .prefix_cache_mb = 1});
  for (int i = 0; i < 12; ++i) {
    RequestParams p;
    p.prompt = prompt_of(200, 40 + i);
    p.max_tokens = 8;
    const auto want = reference(p, true).ids;  // before submitting: one pool caller at a time
    auto r = sched.submit(p);
    EXPECT_EQ(wait_all(*r), want) << i;
  }
  const auto st = sched.stats().prefix_cache;
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.entries, 0u);
  EXPECT_LE(st.bytes, size_t(1) << 20);
  // The most recent prompt is still there.
  RequestParams again;
  again.prompt = prompt_of(200, 40 + 11);
  again.prompt.push_back(3);
  again.max_tokens = 4;
  auto r = sched.submit(again);
  wait_all(*r);
  EXPECT_GE(r->cached_tokens(), 200);
}

// The n choices of a request share one prefill: sequences admitted together with the same prompt
// start from the first one's KV cache and drafter context and decode exactly as alone.
TEST(PrefixCache, SamePromptInOneAdmissionIsPrefilledOnce) {
  auto& m = models();
  CpuBackend backend(m.target, &m.drafter);
  RoundLoop loop(backend, {.kind = SpecPolicyKind::Always}, 0);
  std::vector<RequestParams> params;
  for (int i = 0; i < 4; ++i) {
    RequestParams p;
    p.prompt = prompt_of(30, 9);
    p.max_tokens = 20;
    if (i > 0) {
      p.sampling = {0.9f, 0, 1.0f, 0.0f};
      p.seed = uint64_t(i);
      p.seeded = true;
    }
    p.speculative = i != 3;
    params.push_back(p);
  }
  std::vector<GenerateResult> wants;
  for (const auto& p : params) wants.push_back(reference(p, p.speculative));
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::vector<int32_t>> got(params.size());
  std::vector<Sequence*> ptrs;
  for (size_t i = 0; i < params.size(); ++i) {
    seqs.push_back(std::make_unique<Sequence>(params[i]));
    seqs.back()->sink = [&got, i](std::span<const int32_t> t, int, std::span<const TokenLogprob>) {
      got[i].insert(got[i].end(), t.begin(), t.end());
    };
    ptrs.push_back(seqs.back().get());
  }
  loop.admit(ptrs);
  EXPECT_EQ(seqs[0]->cached_tokens, 0);
  EXPECT_EQ(seqs[1]->cached_tokens, 29);  // all but the last prompt token
  EXPECT_EQ(seqs[2]->cached_tokens, 29);
  EXPECT_EQ(seqs[3]->cached_tokens, 0);  // does not draft: no drafting leader to copy
  for (int r = 0; r < 100; ++r) loop.round(ptrs);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(seqs[i]->done) << i;
    EXPECT_EQ(got[i], wants[i].ids) << i;
    if (params[i].speculative) {
      EXPECT_EQ(seqs[i]->acceptance_lengths, wants[i].acceptance_lengths) << i;
    }
  }
}
