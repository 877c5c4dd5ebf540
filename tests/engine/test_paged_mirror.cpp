// A paged device's per-sequence bookkeeping (paged::Ledger, what the CUDA backend keeps) under
// the engine's real rounds, without a GPU: PagedMirror runs it beside the CPU reference and
// checks, after every call, that its lengths equal the CPU's and that every sequence reads back
// its own KV and drafter context through its block table in a simulated device memory. The
// workloads take every path a round has: the FlashMap and DFlash drafters (DFlash's drafts write
// a whole block past the context), verifies cut short near max_tokens, plain and speculative
// sequences in one batch, rounds that do not speculate, greedy and seeded sampling, draft trees,
// copies of a cached prefix and of a prompt admitted n times, and admission that waits for, or
// evicts, held memory.
#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/generate.h"
#include "cpu/proposers.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "paged_mirror.h"
#include "requests.h"

using namespace flashmap;
using namespace flashmap::engine;
using flashmap::engine::test::PagedMirror;
using flashmap::engine::test::prompt_of;
using flashmap::engine::test::wait_all;

namespace {

struct Models {
  Qwen3Model target{"tests/fixtures/tiny-a/target"};
  FlashMapModel flashmap{"tests/fixtures/tiny-a/draft", target};
  FlashMapProposer fm{flashmap, 1};
  DFlashModel dflash{"tests/fixtures/dflash/zlab", target};
  DFlashProposer df{dflash, target};
};
Models& models() {
  static Models m;
  return m;
}

GenerateResult reference(const BlockProposer* drafter, const RequestParams& p) {
  return test::generate_alone(models().target, p.speculative ? drafter : nullptr, p);
}

struct Drafter {
  const char* name;
  const BlockProposer* proposer;
  int extra;  // what the device's ledger reserves past the context for a draft's writes
};
std::vector<Drafter> drafters() {
  auto& m = models();
  // DFlash drafts its anchor and block_size() drafts as one block of rows after the context.
  return {{"FlashMap", &m.fm, 0}, {"DFlash", &m.df, m.df.block_size() + 1}};
}

// Requests with and without drafting, greedy and seeded, max_tokens that cut the last verify
// short, more of them than run at once.
std::vector<RequestParams> mixed() {
  std::vector<RequestParams> out;
  for (int i = 0; i < 7; ++i) {
    RequestParams p;
    p.prompt = prompt_of(5 + 9 * i, i);
    p.max_tokens = 11 + 6 * i;
    p.speculative = i % 3 != 2;
    if (i % 2 == 1) {
      p.sampling = {0.8f, 0, 1.0f, 0.0f};
      p.seed = uint64_t(100 + i);
      p.seeded = true;
    }
    out.push_back(p);
  }
  return out;
}

// The references of `params`, computed before an engine runs (one caller of the CPU's thread
// pool at a time).
std::vector<std::vector<int32_t>> references(const BlockProposer* drafter,
                                             const std::vector<RequestParams>& params) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : params) out.push_back(reference(drafter, p).ids);
  return out;
}

// Submits the requests at once; each output must equal its reference (exact) or at least have
// its max_tokens tokens (a draft tree's sampled rows draw another path of the same law).
void expect_outputs(Engine& engine, const std::vector<RequestParams>& params,
                    const std::vector<std::vector<int32_t>>& wants, const std::string& what,
                    bool exact = true) {
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : params) reqs.push_back(engine.submit(p));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto got = wait_all(*reqs[i]);
    if (exact)
      EXPECT_EQ(got, wants[i]) << what << " request " << i;
    else
      EXPECT_EQ(got.size(), size_t(params[i].max_tokens)) << what << " request " << i;
  }
}

void expect_clean(const PagedMirror& b, const std::string& what) {
  for (const std::string& e : b.errors()) ADD_FAILURE() << what << ": " << e;
}

TEST(PagedMirror, MixedBatchesKeepEveryLengthAndBlock) {
  for (const Drafter& d : drafters()) {
    for (const char* tree : {"off", "paths:2+topk:6"}) {
      const auto params = mixed();
      const auto wants = references(d.proposer, params);
      const int margin = std::string(tree) == "off" ? 0 : 64;
      auto owned =
          std::make_unique<PagedMirror>(models().target, d.proposer, d.extra, 4096, 16, 64, margin);
      PagedMirror* b = owned.get();
      {
        EngineOptions eo;
        eo.max_running = 4;
        eo.spec_policy = SpecPolicyKind::Always;
        eo.draft_tree = tree;
        Engine engine(std::move(owned), eo);
        expect_outputs(engine, params, wants, d.name, std::string(tree) == "off");
        engine.drain();
        expect_clean(*b, std::string(d.name) + ", trees " + tree);
        EXPECT_EQ(b->pool().free_blocks(), b->pool().num_blocks()) << d.name;
      }
    }
  }
}

TEST(PagedMirror, CopiesOfAPrefixReadTheirOwnBlocks) {
  for (const Drafter& d : drafters()) {
    auto owned = std::make_unique<PagedMirror>(models().target, d.proposer, d.extra);
    PagedMirror* b = owned.get();
    EngineOptions eo;
    eo.max_running = 4;
    eo.spec_policy = SpecPolicyKind::Always;
    eo.prefix_cache_mb = 64;
    Engine engine(std::move(owned), eo);
    // A chat: each turn's prompt is the last one, its answer and a new token (37 positions
    // first, so that a copy's first write falls inside a block it shares).
    RequestParams turn;
    turn.prompt = prompt_of(37, 3);
    turn.max_tokens = 21;
    for (int t = 0; t < 3; ++t) {
      const auto want = reference(d.proposer, turn).ids;  // the engine is idle: one pool caller
      auto r = engine.submit(turn);
      const auto got = wait_all(*r);
      EXPECT_EQ(got, want) << d.name << " turn " << t;
      engine.drain();
      if (t > 0) {
        EXPECT_GE(r->cached_tokens(), 37) << d.name << " turn " << t;
      }
      turn.prompt.insert(turn.prompt.end(), got.begin(), got.end());
      turn.prompt.push_back(int32_t(7 + t));
    }
    // Three choices of one prompt, admitted together: two copy the first one's prefill, and
    // the leader's own next write falls in the block they share.
    RequestParams same;
    same.prompt = prompt_of(22, 8);
    same.max_tokens = 17;
    const auto want = reference(d.proposer, same).ids;
    auto reqs = engine.submit_all({same, same, same});
    for (auto& r : reqs) EXPECT_EQ(wait_all(*r), want) << d.name;
    engine.drain();
    EXPECT_GE(b->copies_opened(), 4) << d.name;
    EXPECT_GT(b->block_copies(), 0) << d.name;
    expect_clean(*b, d.name);
  }
}

// Rounds that do not speculate for drafting sequences (the anchor alone, its features still
// committed) between rounds that do, as the adaptive and batch-size policies choose them.
TEST(PagedMirror, PlainRoundsBetweenSpeculativeOnes) {
  for (const Drafter& d : drafters()) {
    for (const SpecPolicyKind kind : {SpecPolicyKind::Adaptive, SpecPolicyKind::Batch}) {
      const auto params = mixed();
      const auto wants = references(d.proposer, params);
      auto owned = std::make_unique<PagedMirror>(models().target, d.proposer, d.extra);
      PagedMirror* b = owned.get();
      EngineOptions eo;
      eo.max_running = 4;
      eo.spec_policy = kind;
      eo.spec_max_batch = 2;
      Engine engine(std::move(owned), eo);
      expect_outputs(engine, params, wants, d.name);
      engine.drain();
      expect_clean(*b, d.name);
      const auto st = engine.stats();
      EXPECT_GT(st.rounds, st.speculative_rounds) << d.name;
    }
  }
}

// A pool that holds two sequences at a time: the queue waits for blocks, and cached prefixes
// give theirs back to the queue's head.
TEST(PagedMirror, AdmissionWaitsForBlocksAndEvictsCachedPrefixes) {
  for (const Drafter& d : drafters()) {
    // 12 blocks of 16: each request below needs up to 61 positions and the draft's extra.
    auto owned = std::make_unique<PagedMirror>(models().target, d.proposer, d.extra, 12, 16);
    PagedMirror* b = owned.get();
    EngineOptions eo;
    eo.max_running = 4;
    eo.spec_policy = SpecPolicyKind::Always;
    eo.prefix_cache_mb = 64;
    Engine engine(std::move(owned), eo);
    std::vector<RequestParams> params;
    for (int i = 0; i < 5; ++i) {
      RequestParams p;
      p.prompt = prompt_of(30, 20 + i);
      p.max_tokens = 30;
      params.push_back(p);
    }
    expect_outputs(engine, params, references(d.proposer, params), d.name);
    engine.drain();
    EXPECT_GE(engine.stats().prefix_cache.evictions, 1u) << d.name;
    expect_clean(*b, d.name);
  }
}

}  // namespace
