// The target's forward over a token tree (draft trees): every node's logits and taps
// equal those of a plain forward over its path alone, a tree batched with other sequences is
// bit for bit the tree alone, KVCache::keep_rows leaves the cache a plain forward over the kept
// path would have, and malformed trees are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"
#include "models/qwen3.h"

using namespace flashmap;
using ::testing::HasSubstr;

namespace {
const std::string kTarget = "tests/fixtures/tiny-a/target";
const std::vector<int32_t> kPrompt = {5, 17, 300, 2, 999, 41, 7, 88, 3};
const std::vector<int> kTaps = {0, 2};

struct Tree {
  std::vector<int32_t> tokens, parents;
};

// Row 0 is the anchor (parent −1); row r > 0 hangs below a random earlier row, with a token that
// repeats its siblings' now and then (the engine's tries never do; the forward must not care).
Tree random_tree(int n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Tree t;
  for (int r = 0; r < n; ++r) {
    t.parents.push_back(r == 0 ? -1 : int32_t(rng.next() % uint64_t(r)));
    t.tokens.push_back(int32_t(rng.next() % uint64_t(vocab)));
  }
  return t;
}

std::vector<int64_t> path_to(const Tree& t, int r) {
  std::vector<int64_t> rows;
  for (int a = r; a >= 0; a = t.parents[size_t(a)]) rows.push_back(a);
  std::reverse(rows.begin(), rows.end());
  return rows;
}

Qwen3Model::Output forward(const Qwen3Model& m, KVCache& c, std::span<const int32_t> tokens,
                           std::span<const int32_t> parents = {}) {
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, tokens, parents};
  m.forward({&s, 1}, Qwen3Model::Logits::All, kTaps, out);
  return out;
}

// max |a − b| / max(1, max |b|) over the rows.
double rel_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0, scale = 1;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return d / scale;
}
}  // namespace

TEST(TreeForward, EveryNodeEqualsAPlainForwardOverItsPath) {
  Qwen3Model m(kTarget);
  const int64_t V = m.config().vocab_size, H = m.config().hidden_size;
  const int64_t F = int64_t(kTaps.size()) * H;
  for (const int n : {1, 2, 9, 40, 70}) {  // 70: two mask words
    SCOPED_TRACE(n);
    const Tree t = random_tree(n, V, uint64_t(n) * 17 + 3);
    KVCache c = m.new_cache();
    forward(m, c, kPrompt);
    const auto tree = forward(m, c, t.tokens, t.parents);
    ASSERT_EQ(c.length, int64_t(kPrompt.size()) + n);
    double worst = 0;
    for (int r = 0; r < n; ++r) {
      const auto rows = path_to(t, r);
      std::vector<int32_t> path;
      for (int64_t a : rows) path.push_back(t.tokens[size_t(a)]);
      KVCache alone = m.new_cache();
      forward(m, alone, kPrompt);
      const auto plain = forward(m, alone, path);
      const int64_t last = int64_t(path.size()) - 1;
      // fp32 sums in another order (the kept keys sit at other cache rows): 1e-5 relative.
      const double dl = rel_diff({tree.logits.data() + r * V, size_t(V)},
                                 {plain.logits.data() + last * V, size_t(V)});
      const double df = rel_diff({tree.features.data() + r * F, size_t(F)},
                                 {plain.features.data() + last * F, size_t(F)});
      EXPECT_LE(dl, 1e-5) << "row " << r << " logits";
      EXPECT_LE(df, 1e-5) << "row " << r << " features";
      worst = std::max({worst, dl, df});
    }
    std::cout << "[ info ] tree of " << n << " nodes: worst relative difference " << worst << "\n";
  }
}

TEST(TreeForward, BatchedWithOtherSequencesIsBitIdenticalToAlone) {
  Qwen3Model m(kTarget);
  const int64_t V = m.config().vocab_size;
  const Tree t = random_tree(17, V, 5);
  KVCache a = m.new_cache();
  forward(m, a, kPrompt);
  const auto alone = forward(m, a, t.tokens, t.parents);

  KVCache b = m.new_cache(), c = m.new_cache();
  forward(m, b, kPrompt);
  forward(m, c, std::vector<int32_t>{1, 2, 3});
  const std::vector<int32_t> chain = {4, 5, 6, 7};
  Qwen3Model::SeqInput in[2] = {{&c, chain}, {&b, t.tokens, t.parents}};
  Qwen3Model::Output both;
  m.forward(in, Qwen3Model::Logits::All, kTaps, both);
  const size_t off = chain.size() * size_t(V);
  ASSERT_EQ(both.logits.size(), off + alone.logits.size());
  EXPECT_TRUE(std::equal(alone.logits.begin(), alone.logits.end(), both.logits.begin() + off));
}

TEST(TreeForward, KeepRowsLeavesTheCacheOfThePath) {
  Qwen3Model m(kTarget);
  const int64_t V = m.config().vocab_size;
  const int64_t kv_dim = int64_t(m.config().num_key_value_heads) * m.config().head_dim;
  const Tree t = random_tree(24, V, 11);
  // The deepest node's path, and a shallow one (rows that need no move at the start).
  for (const int target_row : {23, 1}) {
    SCOPED_TRACE(target_row);
    const auto rows = path_to(t, target_row);
    KVCache c = m.new_cache();
    forward(m, c, kPrompt);
    const int64_t p0 = c.length;
    forward(m, c, t.tokens, t.parents);
    c.keep_rows(p0, rows, kv_dim);
    ASSERT_EQ(c.length, p0 + int64_t(rows.size()));

    std::vector<int32_t> path;
    for (int64_t a : rows) path.push_back(t.tokens[size_t(a)]);
    KVCache plain = m.new_cache();
    forward(m, plain, kPrompt);
    forward(m, plain, path);
    const std::vector<int32_t> next = {77, 78};
    const auto got = forward(m, c, next);
    const auto want = forward(m, plain, next);
    EXPECT_LE(rel_diff(got.logits, want.logits), 1e-5);
  }
}

TEST(TreeForward, MalformedTreesAreRefused) {
  Qwen3Model m(kTarget);
  KVCache c = m.new_cache();
  forward(m, c, kPrompt);
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> short_parents = {-1, 0};
  const std::vector<int32_t> forward_parent = {-1, 2, 0};
  const std::vector<int32_t> below = {-1, -2, 0};
  EXPECT_THAT([&] { forward(m, c, tokens, short_parents); },
              ::testing::ThrowsMessage<Error>(HasSubstr("2 parents for 3 tokens")));
  EXPECT_THAT([&] { forward(m, c, tokens, forward_parent); },
              ::testing::ThrowsMessage<Error>(HasSubstr("row 1 has parent 2")));
  EXPECT_THAT([&] { forward(m, c, tokens, below); },
              ::testing::ThrowsMessage<Error>(HasSubstr("row 1 has parent -2")));
}
