// The batched round loop against the single-sequence one: the kernels are batch-invariant, so
// every sequence of a batch must decode exactly as flashmap::generate() decodes it alone,
// whatever else shares its rounds. Plus cancellation and admission control. References are
// computed while no scheduler runs: the models share one thread pool, which takes one caller at
// a time (in the server only the engine thread computes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "models/flashmap.h"
#include "models/qwen3.h"
#include "runtime/scheduler.h"
#include "spec/decoder.h"

using namespace flashmap;
using namespace flashmap::runtime;
using ::testing::HasSubstr;

namespace {
const std::string kA = "tests/fixtures/tiny-a";

struct Models {
  Qwen3Model target{kA + "/target"};
  FlashMapDrafter draft{kA + "/draft", target};
  FlashMapBlockDrafter drafter{draft, 1};
};
Models& models() {
  static Models m;
  return m;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 5) % 1024));
  return p;
}

std::vector<int32_t> wait_all(Request& r, std::string* reason = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    auto u = r.wait(0, std::chrono::milliseconds(1000));
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "request " << r.id << " did not finish in 60 s";
      r.cancel();
      return u.tokens;
    }
    if (u.finished) {
      if (reason) *reason = u.finish_reason;
      EXPECT_TRUE(u.error.empty()) << u.error;
      return u.tokens;
    }
  }
}

GenerateResult reference(const RequestParams& p, bool with_drafter) {
  GenerateOptions o;
  o.max_new_tokens = p.max_tokens;
  o.sampling = p.sampling;
  o.seed = p.seed;
  o.stop_ids = p.stop_ids;
  return generate(models().target, with_drafter ? &models().drafter : nullptr, p.prompt, o);
}
}  // namespace

TEST(Scheduler, BatchedGreedyEqualsGenerate) {
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
  Scheduler sched(m.target, &m.drafter, {.max_running = 8, .max_queue = 8});
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

TEST(Scheduler, SeededSamplingEqualsGenerate) {
  auto& m = models();
  std::vector<RequestParams> params;
  for (int i = 0; i < 3; ++i) {
    RequestParams p;
    p.prompt = prompt_of(4 + 3 * i, 10 + i);
    p.max_tokens = 24;
    p.sampling = {0.8f, 50, 0.95f, 0.0f};
    p.seed = 1000 + uint64_t(i);
    params.push_back(p);
  }
  std::vector<std::vector<int32_t>> wants;
  for (auto& p : params) wants.push_back(reference(p, true).ids);
  Scheduler sched(m.target, &m.drafter, {.max_running = 4});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(wait_all(*reqs[i]), wants[i]) << "request " << i;
}

TEST(Scheduler, StopIdsAndLateJoinersMatchGenerate) {
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
  Scheduler sched(m.target, &m.drafter, {.max_running = 2, .max_queue = 8});
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

TEST(Scheduler, SpeculationOffAboveSpecMaxBatch) {
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
  Scheduler sched(m.target, &m.drafter, {.max_running = 8, .spec_max_batch = 1});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(wait_all(*reqs[i]), wants[i]);  // lossless
  // The longest request ran alone at the end, so it speculated there: both kinds of round.
  const auto st = sched.stats();
  EXPECT_GT(st.speculative_rounds, 0u);
  EXPECT_LT(st.speculative_rounds, st.rounds);
}

TEST(Scheduler, CancelFreesTheSequence) {
  auto& m = models();
  Scheduler sched(m.target, &m.drafter, {.max_running = 2});
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

TEST(Scheduler, AdmissionLimits) {
  auto& m = models();
  Scheduler sched(m.target, &m.drafter,
                  {.max_running = 1, .max_queue = 1, .max_context = 64, .spec_max_batch = 0});
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

TEST(Scheduler, TargetAloneEqualsGenerate) {
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
  Scheduler sched(m.target, nullptr, {.max_running = 4});
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : params) reqs.push_back(sched.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(wait_all(*reqs[i]), wants[i]);
}
