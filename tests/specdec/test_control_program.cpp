// ControlState::program (specdec/controls.h), the form of the logit controls a device runs where
// the rows are: applied on the host by apply_program it gives ControlState::apply's rows bit for
// bit, and both equal an fp64 rule written here from vLLM's documentation and the constraint's
// contract (a fresh Matcher advanced through the output and the drafts), over random controls
// (bias with repeated ids, min_tokens, the three penalties, a small grammar), prompts, outputs
// and draft blocks whose drafts the grammar sometimes refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "constrain/constrain.h"
#include "constrain/token_constraint.h"
#include "letters.h"
#include "specdec/controls.h"

using namespace flashmap;

namespace {

std::shared_ptr<const constrain::Vocabulary> letters(int64_t V) {
  return ::flashmap::test::letters(V, 3);  // 1 to 3 letters a token
}

struct Case {
  int64_t V = 0;
  LogitControls c;
  std::vector<int32_t> prompt, output, drafts, stops;
  std::shared_ptr<const constrain::Grammar> grammar;
  std::shared_ptr<const constrain::Vocabulary> vocab;
};

// Row k of a block (after output and drafts[0..k)) in double precision: the constraint's mask
// when every draft before it was allowed (stop ids only where the text may end, or where
// nothing else may follow), then each bias, the stop ids at −inf while fewer than min_tokens
// tokens precede, the repetition penalty over prompt ∪ generated, and −frequency·count −
// presence over the generated ids.
std::vector<double> reference_row(const Case& t, const float* logits, int k) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x(logits, logits + t.V);
  std::vector<int32_t> generated = t.output;
  generated.insert(generated.end(), t.drafts.begin(), t.drafts.begin() + k);
  auto is_stop = [&](int64_t v) {
    return std::find(t.stops.begin(), t.stops.end(), int32_t(v)) != t.stops.end();
  };
  if (t.grammar) {
    constrain::Matcher m(t.grammar, t.vocab);
    for (int32_t o : t.output) EXPECT_TRUE(m.advance(o));
    bool alive = true;
    for (int j = 0; j < k && alive; ++j) alive = m.advance(t.drafts[size_t(j)]);
    if (alive) {
      bool any = false;
      for (int64_t v = 0; v < t.V; ++v) any = any || (!is_stop(v) && m.is_allowed(int32_t(v)));
      const bool end = m.can_end() || !any;
      for (int64_t v = 0; v < t.V; ++v)
        if (is_stop(v) ? !end : !m.is_allowed(int32_t(v))) x[size_t(v)] = -inf;
    }
  }
  for (const auto& [id, b] : t.c.logit_bias) x[size_t(id)] += b;
  if (int64_t(generated.size()) < t.c.min_tokens)
    for (int32_t s : t.stops) x[size_t(s)] = -inf;
  std::set<int32_t> seen(t.prompt.begin(), t.prompt.end());
  seen.insert(generated.begin(), generated.end());
  std::map<int32_t, int> count;
  for (int32_t g : generated) ++count[g];
  for (int32_t id : seen) {
    double& v = x[size_t(id)];
    v = v > 0 ? v / t.c.repetition_penalty : v * t.c.repetition_penalty;
    if (count.count(id)) v -= t.c.frequency_penalty * count[id] + t.c.presence_penalty;
  }
  return x;
}

// Random controls, with some of each kind neutral now and then; a grammar in a third of the
// cases, with an output it accepts and drafts that leave it after a few allowed ones.
Case random_case(std::mt19937& gen, int trial) {
  Case t;
  const int64_t sizes[] = {37, 50, 64, 97};
  t.V = sizes[trial % 4];
  std::uniform_int_distribution<int32_t> id(0, int32_t(t.V) - 2);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  auto coin = [&](float p) { return unit(gen) < p; };
  if (coin(0.7f)) t.c.presence_penalty = 4.0f * unit(gen) - 2.0f;
  if (coin(0.7f)) t.c.frequency_penalty = 4.0f * unit(gen) - 2.0f;
  if (coin(0.7f)) t.c.repetition_penalty = 0.3f + 3.0f * unit(gen);
  const int biases = int(gen() % 5);
  for (int b = 0; b < biases; ++b)
    t.c.logit_bias.push_back({id(gen) % 12, 200.0f * unit(gen) - 100.0f});
  if (biases > 1 && coin(0.5f))  // a repeated id: its biases add in turn
    t.c.logit_bias.push_back({t.c.logit_bias[0].first, 7.5f * unit(gen)});
  if (coin(0.6f)) t.c.min_tokens = int(gen() % 9);
  t.stops = {int32_t(t.V - 1)};
  if (coin(0.5f)) t.stops.push_back(id(gen) % 12);
  for (size_t i = 0, n = 1 + gen() % 8; i < n; ++i) t.prompt.push_back(id(gen) % 16);
  const size_t n_out = gen() % 9, n_drafts = gen() % 8;
  if (trial % 3 == 0) {
    t.vocab = letters(t.V);
    t.grammar = constrain::compile_regex("(ab|c)+d?[abc]{0,6}(dd|cb)?");
    t.c.constraint = constrain::constraint_factory(t.grammar, t.vocab);
    t.stops = {int32_t(t.V - 1)};  // an id with bytes would be a token the grammar may take
    constrain::Matcher m(t.grammar, t.vocab);
    auto allowed = [&] {
      std::vector<int32_t> ok;
      for (int32_t v = 0; v + 1 < t.V; ++v)
        if (m.is_allowed(v)) ok.push_back(v);
      return ok;
    };
    for (size_t i = 0; i < n_out; ++i) {
      const auto ok = allowed();
      if (ok.empty()) break;
      t.output.push_back(ok[gen() % ok.size()]);
      m.advance(t.output.back());
    }
    for (size_t i = 0; i < n_drafts; ++i) {
      const auto ok = allowed();
      const bool refuse = ok.empty() || coin(0.25f);
      t.drafts.push_back(refuse ? id(gen) : ok[gen() % ok.size()]);
      if (!refuse) m.advance(t.drafts.back());
    }
  } else {
    for (size_t i = 0; i < n_out; ++i) t.output.push_back(id(gen) % 12);
    for (size_t i = 0; i < n_drafts; ++i) t.drafts.push_back(id(gen) % 12);  // repeats
  }
  return t;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

}  // namespace

TEST(ControlProgram, EqualsApplyBitForBitAndTheReference) {
  std::mt19937 gen(2024);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  int constrained = 0, refused = 0, masked_stop = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Case t = random_case(gen, trial);
    ControlState st(t.c, t.prompt, t.stops, t.V);
    st.commit(t.output);
    const int rows = int(t.drafts.size()) + 1;
    std::vector<float> raw(size_t(rows * t.V));
    for (auto& x : raw) x = normal(gen);
    for (int pass = 0; pass < 2; ++pass) {  // program() and apply() leave the state as it was
      const ControlProgram p = st.program(rows, t.drafts);
      ASSERT_EQ(p.rows, rows);
      for (size_t i = 1; i < p.edits.size(); ++i) ASSERT_LT(p.edits[i - 1].id, p.edits[i].id);
      auto want = raw, got = raw;
      st.apply(want.data(), t.drafts);
      apply_program(p, got.data(), t.drafts);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(same_bits(got[i], want[i]))
            << "trial " << trial << " row " << int64_t(i) / t.V << " id " << int64_t(i) % t.V
            << ": program " << got[i] << ", apply " << want[i];
      for (int k = 0; k < rows; ++k) {
        const auto ref = reference_row(t, raw.data() + k * t.V, k);
        for (int64_t v = 0; v < t.V; ++v) {
          const float g = got[size_t(k * t.V + v)];
          const double r = ref[size_t(v)];
          if (std::isinf(r)) {
            ASSERT_TRUE(std::isinf(g) && g < 0) << "trial " << trial << " row " << k << " id " << v;
          } else {
            ASSERT_NEAR(g, r, 1e-4 * std::max(1.0, std::abs(r)))
                << "trial " << trial << " row " << k << " id " << v;
          }
        }
      }
      if (pass == 0 && t.grammar) {
        ++constrained;
        refused += p.masked_rows < rows;
        masked_stop += !(p.masks[size_t(t.V - 1) >> 5] >> ((t.V - 1) & 31) & 1u);
      }
    }
  }
  // The cases covered what they are for: grammars that refuse a draft, and rows where the stop
  // id is masked.
  EXPECT_GT(refused, 10);
  EXPECT_GT(masked_stop, 10);
  EXPECT_GT(constrained, 100);
}

// Without a constraint the program does not read the drafts (a device need not download them):
// the same program from no drafts, and a neutral one from inactive controls.
TEST(ControlProgram, UnconstrainedNeedsNoDrafts) {
  LogitControls c;
  c.frequency_penalty = 0.5f;
  c.logit_bias = {{3, 1.0f}};
  c.min_tokens = 2;
  const std::vector<int32_t> prompt = {1, 2, 3}, stops = {9}, drafts = {4, 4, 5};
  ControlState st(c, prompt, stops, 20);
  const ControlProgram a = st.program(4, drafts), b = st.program(4, {});
  ASSERT_EQ(a.edits.size(), b.edits.size());
  for (size_t i = 0; i < a.edits.size(); ++i) {
    EXPECT_EQ(a.edits[i].id, b.edits[i].id);
    EXPECT_EQ(a.edits[i].flags, b.edits[i].flags);
  }
  EXPECT_EQ(a.masked_rows, 0);
  EXPECT_TRUE(a.masks.empty());
  // Ids 1, 2, 3 (seen: the penalties), 3 (biased) and 9 (a stop id before min_tokens).
  std::vector<int32_t> ids;
  for (const auto& e : a.edits) ids.push_back(e.id);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 9}));
  ControlState off(LogitControls{}, prompt, stops, 20);
  const ControlProgram n = off.program(4, drafts);
  EXPECT_TRUE(n.edits.empty());
  std::vector<float> rows(80, 1.5f), copy = rows;
  apply_program(n, rows.data(), drafts);
  EXPECT_EQ(rows, copy);
}
