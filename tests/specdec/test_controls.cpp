// Logit controls (penalties, logit_bias, min_tokens) and logprobs in the round loop: checked
// against an independent fp64 implementation of vLLM's rules driven by the target model alone
// (no round loop, no drafter), for greedy equality, the exact joint distribution at T > 0 and
// the target's own log-softmax at every emitted token.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "bench/generate.h"
#include "constrain/constrain.h"
#include "constrain/token_constraint.h"
#include "core/check.h"
#include "cpu/proposers.h"
#include "joint.h"
#include "letters.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "random_models.h"
#include "stats.h"

using namespace flashmap;
using flashmap::testing::exact_three;
using flashmap::testing::next_logits;
using ::testing::HasSubstr;

namespace {
const std::string kA = "tests/fixtures/tiny-a";
const std::vector<int32_t> kPrompt = {3, 141, 59, 265, 358, 979};

// vLLM's logits processing in double precision, written from its documentation rather than
// from ControlState: logit_bias added, stop ids at -inf before min_tokens tokens, then the
// repetition penalty over prompt ∪ output, then −frequency·count − presence·[count > 0] over
// the output.
std::vector<double> reference_controls(const float* logits, int64_t V, const LogitControls& c,
                                       const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& output,
                                       const std::vector<int32_t>& stop_ids) {
  std::vector<double> x(logits, logits + V);
  for (const auto& [id, b] : c.logit_bias) x[size_t(id)] += b;
  if (int64_t(output.size()) < c.min_tokens)
    for (int32_t s : stop_ids) x[size_t(s)] = -std::numeric_limits<double>::infinity();
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  std::map<int32_t, int> count;
  for (int32_t t : output) ++count[t];
  for (int32_t id : seen) {
    double& v = x[size_t(id)];
    v = v > 0 ? v / c.repetition_penalty : v * c.repetition_penalty;
    if (count.count(id)) v -= c.frequency_penalty * count[id] + c.presence_penalty;
  }
  return x;
}

LogitControls some_controls() {
  LogitControls c;
  c.repetition_penalty = 1.4f;
  c.frequency_penalty = 0.6f;
  c.presence_penalty = 0.3f;
  c.logit_bias = {{17, 2.5f}, {500, -3.0f}, {901, 1.5f}};
  c.min_tokens = 12;
  return c;
}
std::vector<double> softmax(const std::vector<double>& x) {
  std::vector<double> p(x.size());
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += p[i] = std::exp(x[i] - mx);
  for (auto& v : p) v /= sum;
  return p;
}

// n runs of four tokens at T = 1 (the round after the first verifies drafts for the second and
// third) with rejection sampling and with keyed draws, against `exact` (exact_three): the chi-
// square test, and first drafts accepted often enough that the third token's row (whose prefix
// holds a draft) is exercised.
void expect_joint_three(const Qwen3Model& target, const BlockProposer& d,
                        const std::vector<int32_t>& prompt, const LogitControls& c, int32_t stop,
                        const std::vector<double>& exact, int n) {
  const int64_t V = target.config().vocab_size;
  for (bool seeded : {false, true}) {
    std::vector<double> counts(exact.size(), 0.0);
    GenerateOptions o;
    o.max_new_tokens = 4;
    o.sampling = {1.0f, 0, 1.0f, 0.0f};
    o.seeded = seeded;
    o.controls = c;
    o.stop_ids = {stop};
    double first_accepted = 0;
    for (int i = 0; i < n; ++i) {
      o.seed = uint64_t(i) * 7919 + 1;
      const auto r = generate(target, &d, prompt, o);
      ASSERT_GE(r.ids.size(), 2u);
      const int32_t t3 = r.ids.size() > 2 ? r.ids[2] : int32_t(V);
      counts[size_t((r.ids[0] * V + r.ids[1]) * (V + 1) + t3)] += 1;
      first_accepted += r.accepted_at[0] > 0;
    }
    const auto chi = flashmap::testing::chi_square(counts, exact);
    EXPECT_TRUE(chi.pass()) << "seeded=" << seeded << " chi2 " << chi.statistic << " > "
                            << chi.critical << " " << chi.impossible;
    EXPECT_GT(first_accepted, n * 0.05) << "seeded=" << seeded;
  }
}
}  // namespace

// ControlState against the reference on random rows, prompts and draft prefixes; applying a
// block leaves the committed state as it was.
TEST(Controls, RowsEqualTheReference) {
  const int64_t V = 50;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> id(0, int32_t(V) - 1);
  LogitControls c;
  c.repetition_penalty = 1.7f;
  c.frequency_penalty = -0.4f;
  c.presence_penalty = 1.1f;
  c.logit_bias = {{3, 5.0f}, {4, -100.0f}};
  c.min_tokens = 5;
  const std::vector<int32_t> stop = {0, 9};
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> prompt(size_t(1 + trial % 7)), output, drafts(size_t(trial % 6));
    for (auto& t : prompt) t = id(gen);
    for (auto& t : drafts) t = id(gen) % 12;  // repeats among drafts and with the output
    ControlState st(c, prompt, stop, V);
    for (int g = 0; g < trial % 9; ++g) output.push_back(id(gen) % 12);
    st.commit(output);
    std::vector<float> rows(size_t(V) * (drafts.size() + 1));
    for (auto& x : rows) x = normal(gen);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass sees the same committed state
      auto got = rows;
      st.apply(got.data(), drafts);
      for (size_t k = 0; k <= drafts.size(); ++k) {
        auto out_k = output;
        out_k.insert(out_k.end(), drafts.begin(), drafts.begin() + int64_t(k));
        const auto want =
            reference_controls(rows.data() + int64_t(k) * V, V, c, prompt, out_k, stop);
        for (int64_t v = 0; v < V; ++v) {
          const float g = got[size_t(int64_t(k) * V + v)];
          if (std::isinf(want[size_t(v)]))
            ASSERT_TRUE(std::isinf(g) && g < 0) << trial << " row " << k << " id " << v;
          else
            ASSERT_NEAR(g, want[size_t(v)], 1e-4) << trial << " row " << k << " id " << v;
        }
      }
    }
  }
}

// Greedy decoding with controls: the reference loop (target alone, fp64 controls, argmax) and
// the round loop with drafters of every acceptance pattern give the same tokens.
TEST(Controls, GreedyEqualsTargetAloneWithControls) {
  Qwen3Model target(kA + "/target");
  FlashMapModel model(kA + "/draft", target);
  const int64_t V = target.config().vocab_size;
  const int n = 40;
  const auto c = some_controls();
  // A stop id the model would produce early without min_tokens.
  GenerateOptions six;
  six.max_new_tokens = 6;
  const auto plain = generate(target, nullptr, kPrompt, six).ids;
  const std::vector<int32_t> stop = {plain[2]};
  std::vector<int32_t> want;
  for (int i = 0; i < n; ++i) {
    auto prefix = kPrompt;
    prefix.insert(prefix.end(), want.begin(), want.end());
    const auto row =
        reference_controls(next_logits(target, prefix).data(), V, c, kPrompt, want, stop);
    const auto t = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    want.push_back(t);
    if (t == stop[0]) break;
  }
  ASSERT_GT(want.size(), size_t(c.min_tokens));  // the stop id was held back
  GenerateOptions o;
  o.max_new_tokens = n;
  o.controls = c;
  o.stop_ids = stop;
  FlashMapProposer one(model, 1), two(model, 2);
  ScriptedProposer right(8, V, want, 8), half(8, V, want, 4);
  EXPECT_EQ(generate(target, nullptr, kPrompt, o).ids, want);
  for (const BlockProposer* d :
       {static_cast<const BlockProposer*>(&one), static_cast<const BlockProposer*>(&two),
        static_cast<const BlockProposer*>(&right), static_cast<const BlockProposer*>(&half)})
    EXPECT_EQ(generate(target, d, kPrompt, o).ids, want);
  // The scripted drafter that knows the answer is accepted through the controls.
  EXPECT_GE(generate(target, &right, kPrompt, o).acceptance_length(), 4.0);
}

// T > 0: the joint distribution of the first three tokens under controls equals the target's
// (exact enumeration over an 8-token vocabulary), for rejection sampling and keyed draws. The
// third token comes from the second row of a verify pass, whose prefix holds a draft: the row
// only a correct draft-prefix count gets right. 8 × 8 × 9 cells (the third "token" of a run
// that stopped at its second is a cell of its own); 60000 runs.
TEST(Controls, SpeculativeSamplingWithControlsMatchesTarget) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-controls", 8, 8, 2, 4, 77);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer d(model, 1);
  const int64_t V = 8;
  const std::vector<int32_t> prompt = {1, 5, 2};
  LogitControls c;
  c.repetition_penalty = 1.8f;
  c.frequency_penalty = 0.9f;
  c.presence_penalty = 0.5f;
  c.logit_bias = {{3, 1.0f}, {6, -0.7f}};
  c.min_tokens = 1;
  const int32_t stop = 4;
  auto next = [&](const std::vector<int32_t>& output) {
    auto prefix = prompt;
    prefix.insert(prefix.end(), output.begin(), output.end());
    return softmax(
        reference_controls(next_logits(target, prefix).data(), V, c, prompt, output, {stop}));
  };
  EXPECT_EQ(next({})[size_t(stop)], 0.0);  // min_tokens
  expect_joint_three(target, d, prompt, c, stop, exact_three(V, stop, next), 60000);
}

// Logprobs are the target's own log-softmax at every emitted token (not the drafter's, not after
// temperature or controls), with the top alternatives in order, for greedy and sampled requests
// with speculation on: a drafter scripted with the seeded target-alone output (accepted in
// blocks, so rows past the first of a verify pass are read) and the FlashMap drafter.
TEST(Controls, LogprobsAreTheTargetsLogSoftmax) {
  Qwen3Model target(kA + "/target");
  FlashMapModel model(kA + "/draft", target);
  FlashMapProposer flow(model, 1);
  const int64_t V = target.config().vocab_size;
  for (float T : {0.0f, 0.9f})
    for (bool controls : {false, true})
      for (bool scripted : {true, false}) {
        GenerateOptions o;
        o.max_new_tokens = 25;
        o.sampling.temperature = T;
        o.seed = 4;
        o.seeded = true;
        o.logprobs = 5;
        if (controls) o.controls = some_controls();
        const auto alone = generate(target, nullptr, kPrompt, o);
        ScriptedProposer script(8, V, alone.ids, 8);
        const auto r = generate(
            target, scripted ? static_cast<const BlockProposer*>(&script) : &flow, kPrompt, o);
        ASSERT_EQ(r.ids, alone.ids);
        ASSERT_EQ(r.logprobs.size(), r.ids.size());
        if (scripted) {
          EXPECT_GT(r.acceptance_length(), 4.0);
        }
        auto prefix = kPrompt;
        for (size_t k = 0; k < r.ids.size(); ++k) {
          const auto row = next_logits(target, prefix);
          double mx = -1e300, sum = 0;
          for (float x : row) mx = std::max(mx, double(x));
          for (float x : row) sum += std::exp(double(x) - mx);
          auto lsm = [&](int32_t id) { return double(row[size_t(id)]) - mx - std::log(sum); };
          const TokenLogprob& lp = r.logprobs[k];
          EXPECT_EQ(lp.token, r.ids[k]);
          // 1e-4: the verify pass and this full forward order the attention sums differently.
          EXPECT_NEAR(lp.logprob, lsm(r.ids[k]), 1e-4) << "T=" << T << " token " << k;
          ASSERT_EQ(lp.top.size(), 5u);
          std::vector<int32_t> order(static_cast<size_t>(V));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
          for (size_t j = 0; j < 5; ++j) {
            EXPECT_EQ(lp.top[j].first, order[j]) << "token " << k << " rank " << j;
            EXPECT_NEAR(lp.top[j].second, lsm(order[j]), 1e-4);
          }
          prefix.push_back(r.ids[k]);
        }
      }
}

TEST(Controls, OutOfRangeValuesNameTheField) {
  Qwen3Model target(kA + "/target");
  auto err = [&](GenerateOptions o) -> std::string {
    o.max_new_tokens = 3;
    try {
      generate(target, nullptr, kPrompt, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  };
  GenerateOptions o;
  o.controls.presence_penalty = 2.5f;
  EXPECT_THAT(err(o), HasSubstr("presence_penalty must be in [-2, 2]"));
  o = {};
  o.controls.frequency_penalty = -3.0f;
  EXPECT_THAT(err(o), HasSubstr("frequency_penalty"));
  o = {};
  o.controls.repetition_penalty = 0.0f;
  EXPECT_THAT(err(o), HasSubstr("repetition_penalty must be in (0, 10]"));
  o = {};
  o.controls.repetition_penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(err(o), HasSubstr("repetition_penalty"));
  o = {};
  o.controls.logit_bias = {{int32_t(target.config().vocab_size), 1.0f}};
  EXPECT_THAT(err(o), HasSubstr("logit_bias: token"));
  o = {};
  o.controls.logit_bias = {{5, 101.0f}};
  EXPECT_THAT(err(o), HasSubstr("[-100, 100]"));
  o = {};
  o.controls.min_tokens = -1;
  EXPECT_THAT(err(o), HasSubstr("min_tokens"));
  o = {};
  o.logprobs = 21;
  EXPECT_THAT(err(o), HasSubstr("top_logprobs must be in [0, 20]"));
}

// ---- Structured output: a grammar's mask in the round loop ----

namespace {
std::shared_ptr<const constrain::Vocabulary> letters(int64_t V) {
  return ::flashmap::test::letters(V, 5);  // 1 to 5 letters a token
}

// The masked row a constrained target-alone decoder uses after `output`: a fresh Matcher
// advanced through the output (not the loop's checkpoint and rollback), −inf where it refuses,
// the stop id only where it can end.
std::vector<double> masked(const float* logits, int64_t V,
                           const std::shared_ptr<const constrain::Grammar>& g,
                           const std::shared_ptr<const constrain::Vocabulary>& vocab,
                           const std::vector<int32_t>& output, int32_t stop) {
  constrain::Matcher m(g, vocab);
  for (int32_t t : output) EXPECT_TRUE(m.advance(t));
  std::vector<double> x(logits, logits + V);
  for (int64_t v = 0; v < V; ++v)
    if (v == stop ? !m.can_end() : !m.is_allowed(int32_t(v)))
      x[size_t(v)] = -std::numeric_limits<double>::infinity();
  return x;
}
}  // namespace

// Greedy: the constrained round loop with drafters of every acceptance pattern gives the
// constrained target-alone tokens, and the text is in the regex's language.
TEST(Constrained, GreedyEqualsConstrainedTargetAlone) {
  Qwen3Model target(kA + "/target");
  FlashMapModel model(kA + "/draft", target);
  const int64_t V = target.config().vocab_size;
  const auto vocab = letters(V);
  const std::string pattern = "(ab|c)+d[abc]{3,12}(dd|cb)";
  const auto g = constrain::compile_regex(pattern);
  const int32_t stop = int32_t(V - 1);
  std::vector<int32_t> want;
  while (want.size() < 40) {
    auto prefix = kPrompt;
    prefix.insert(prefix.end(), want.begin(), want.end());
    const auto row = masked(next_logits(target, prefix).data(), V, g, vocab, want, stop);
    const auto t = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    want.push_back(t);
    if (t == stop) break;
  }
  std::string text;
  for (int32_t t : want)
    if (t != stop) text += vocab->bytes(t);
  ASSERT_EQ(want.back(), stop) << "the regex's text ends within 40 tokens";
  EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << text;
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.stop_ids = {stop};
  o.controls.constraint = constrain::constraint_factory(g, vocab);
  FlashMapProposer one(model, 1), two(model, 2);
  ScriptedProposer right(8, V, want, 8), half(8, V, want, 3);
  EXPECT_EQ(generate(target, nullptr, kPrompt, o).ids, want);
  for (const BlockProposer* d :
       {static_cast<const BlockProposer*>(&one), static_cast<const BlockProposer*>(&two),
        static_cast<const BlockProposer*>(&right), static_cast<const BlockProposer*>(&half)})
    EXPECT_EQ(generate(target, d, kPrompt, o).ids, want);
  EXPECT_GE(generate(target, &right, kPrompt, o).acceptance_length(), 4.0);
  // A request that could never end is refused.
  o.stop_ids.clear();
  EXPECT_THROW(generate(target, nullptr, kPrompt, o), Error);
}

// T > 0: the joint law of the first three tokens under a grammar (and a penalty with it) equals
// the constrained target's, for rejection sampling and keyed draws, with the drafter's rows
// masked too.
TEST(Constrained, SpeculativeSamplingMatchesConstrainedTarget) {
  const auto pair = flashmap::testing::write_random_pair("tiny-v8-grammar", 8, 8, 2, 4, 79);
  Qwen3Model target(pair.target);
  FlashMapModel model(pair.draft, target);
  FlashMapProposer d(model, 1);
  const int64_t V = 8;
  const int32_t stop = 7;
  std::vector<std::string> spell = {"a", "b", "c", "ab", "ba", "cc", "d", ""};
  const auto vocab = constrain::Vocabulary::from_bytes(spell);
  const auto g = constrain::compile_regex("(a|b)+c?(ab|d)*");
  const std::vector<int32_t> prompt = {1, 5, 2};
  LogitControls c;
  c.presence_penalty = 0.4f;
  c.constraint = constrain::constraint_factory(g, vocab);
  auto next = [&](const std::vector<int32_t>& output) {
    auto prefix = prompt;
    prefix.insert(prefix.end(), output.begin(), output.end());
    const auto lg = next_logits(target, prefix);
    auto x = masked(lg.data(), V, g, vocab, output, stop);
    std::set<int32_t> seen(output.begin(), output.end());
    for (int32_t t : seen) x[size_t(t)] -= c.presence_penalty;
    return softmax(x);
  };
  EXPECT_EQ(next({})[size_t(stop)], 0.0);  // the empty text is not in the language
  expect_joint_three(target, d, prompt, c, stop, exact_three(V, stop, next), 40000);
}

// The drafter's proposals follow the grammar too: every block is a chain the constraint accepts
// up to its first stop id, whatever the noise.
TEST(Constrained, DraftsFollowTheGrammar) {
  Qwen3Model target(kA + "/target");
  FlashMapModel model(kA + "/draft", target);
  FlashMapProposer d(model, 1);
  const int64_t V = target.config().vocab_size;
  const auto vocab = letters(V);
  const auto g = constrain::compile_regex("[ab]+(cd)*[abcd]{2,30}");
  LogitControls c;
  c.constraint = constrain::constraint_factory(g, vocab);
  const std::vector<int32_t> stops = {int32_t(V - 1)};
  ControlState controls(c, kPrompt, stops, V);
  auto state = d.begin();
  Qwen3Model::Output out;
  KVCache cache = target.new_cache();
  Qwen3Model::SeqInput seq{&cache, kPrompt};
  target.forward({&seq, 1}, Qwen3Model::Logits::Last, d.target_layer_ids(), out);
  d.commit(state, out.features.data(), int64_t(kPrompt.size()), kPrompt);
  for (float T : {0.0f, 1.5f}) {
    SeqSampler sampler({T, 0, 1.0f, 0.0f}, 11, false);
    Proposal p;
    for (int i = 0; i < 20; ++i) {
      BlockProposer::Seq s{&state, 5, int64_t(kPrompt.size()) + 1, &sampler, &p, &controls};
      d.propose({&s, 1});
      constrain::Matcher m(g, vocab);
      for (int32_t t : p.tokens) {
        if (t == V - 1) {
          EXPECT_TRUE(m.can_end());
          break;
        }
        ASSERT_TRUE(m.advance(t)) << "T=" << T << " draft " << i;
      }
    }
  }
}

// Prompt logprobs (echo + logprobs, lm-eval's loglikelihood): token i of the prompt scored given
// tokens 0..i-1, equal to the target's log-softmax of a full forward, across the 128-row chunks
// the prompt is prefilled in; the continuation is what a plain prefill gives.
TEST(Controls, PromptLogprobsAreTheTargetsLogSoftmax) {
  Qwen3Model target(kA + "/target");
  FlashMapModel model(kA + "/draft", target);
  FlashMapProposer d(model, 1);
  const int64_t V = target.config().vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(int32_t((i * 131 + 7) % (V - 1)));
  GenerateOptions o;
  o.max_new_tokens = 12;
  const auto plain = generate(target, &d, prompt, o);
  o.prompt_logprobs = 3;
  const auto scored = generate(target, &d, prompt, o);
  EXPECT_EQ(scored.ids, plain.ids);
  EXPECT_EQ(scored.acceptance_lengths, plain.acceptance_lengths);
  ASSERT_EQ(scored.prompt_logprobs.size(), prompt.size() - 1);
  KVCache c = target.new_cache();
  Qwen3Model::Output out;
  Qwen3Model::SeqInput s{&c, prompt};
  target.forward({&s, 1}, Qwen3Model::Logits::All, {}, out);
  for (size_t i = 1; i < prompt.size(); ++i) {
    const float* row = out.logits.data() + int64_t(i - 1) * V;
    double mx = -1e300, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
    const TokenLogprob& lp = scored.prompt_logprobs[i - 1];
    EXPECT_EQ(lp.token, prompt[i]);
    EXPECT_NEAR(lp.logprob, double(row[prompt[i]]) - mx - std::log(sum), 1e-4) << i;
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, argmax(row, V)) << i;
  }
  o.prompt_logprobs = 21;
  EXPECT_THROW(generate(target, &d, prompt, o), Error);
}
