// Logit controls and logprobs on the device (cuda/controls.h) against the host functions they
// mirror: a batch of ControlPrograms run on device rows gives apply_program's rows (and so
// ControlState::apply's) bit for bit (the host built without FMA contraction, as the GPU bundle
// is: -DFLASHMAP_NATIVE=OFF), over random controls (bias with repeated ids, min_tokens,
// the three penalties, a grammar that refuses some drafts) at odd vocabularies and block sizes;
// the device logprobs of the emitted tokens equal token_logprob's (the fp64 rule) on rows with
// ties and −inf entries, for every accepted count and for pick()'s one row. Without a usable
// GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../specdec/letters.h"
#include "constrain/constrain.h"
#include "constrain/token_constraint.h"
#include "cuda/controls.h"
#include "cuda/device.h"
#include "gpu_test.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"

namespace flashmap::cuda {
namespace {

using test::Gpu;

class CudaControls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Gpu::get().ctx) GTEST_SKIP() << "no usable CUDA GPU: " << Gpu::get().why;
    ctx = Gpu::get().ctx.get();
  }
  Context* ctx = nullptr;
};

std::shared_ptr<const constrain::Vocabulary> letters(int64_t V) {
  return ::flashmap::test::letters(V, 6);  // 1 to 6 letters a token
}

// One sequence of a batch: its state, committed output and the block's drafts.
struct Seq {
  std::unique_ptr<ControlState> state;
  std::vector<int32_t> drafts;
  int rows = 0;
};

Seq random_seq(std::mt19937& gen, int64_t V, int K, int trial,
               const std::shared_ptr<const constrain::Grammar>& grammar,
               const std::shared_ptr<const constrain::Vocabulary>& vocab) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> id(0, int32_t(V) - 2);
  auto coin = [&](float p) { return unit(gen) < p; };
  LogitControls c;
  if (coin(0.7f)) c.presence_penalty = 4.0f * unit(gen) - 2.0f;
  if (coin(0.7f)) c.frequency_penalty = 4.0f * unit(gen) - 2.0f;
  if (coin(0.7f)) c.repetition_penalty = 0.3f + 3.0f * unit(gen);
  for (int b = 0, n = int(gen() % 6); b < n; ++b)
    c.logit_bias.push_back({id(gen) % 40, 200.0f * unit(gen) - 100.0f});
  if (c.logit_bias.size() > 1) c.logit_bias.push_back({c.logit_bias[0].first, 3.25f});
  if (coin(0.6f)) c.min_tokens = int(gen() % 9);
  std::vector<int32_t> stops = {int32_t(V - 1)};
  const bool constrained = trial % 3 == 0;
  if (constrained) {
    c.constraint = constrain::constraint_factory(grammar, vocab);
  } else if (coin(0.5f)) {
    stops.push_back(id(gen) % 40);
  }
  std::vector<int32_t> prompt;
  for (size_t i = 0, n = 1 + gen() % 30; i < n; ++i) prompt.push_back(id(gen) % 60);
  Seq s;
  s.state = std::make_unique<ControlState>(c, prompt, stops, V);
  s.rows = 1 + int(gen() % uint32_t(K + 1));
  constrain::Matcher m(grammar, vocab);
  auto allowed = [&] {
    std::vector<int32_t> ok;
    for (int32_t v = 0; v + 1 < V; ++v)
      if (m.is_allowed(v)) ok.push_back(v);
    return ok;
  };
  std::vector<int32_t> output;
  for (size_t i = 0, n = gen() % 12; i < n; ++i) {
    if (constrained) {
      const auto ok = allowed();
      if (ok.empty()) break;
      output.push_back(ok[gen() % ok.size()]);
      m.advance(output.back());
    } else {
      output.push_back(id(gen) % 40);
    }
  }
  s.state->commit(output);
  for (int k = 0; k + 1 < s.rows; ++k) {
    if (constrained) {
      const auto ok = allowed();
      const bool refuse = ok.empty() || coin(0.2f);
      s.drafts.push_back(refuse ? id(gen) : ok[gen() % ok.size()]);
      if (!refuse) m.advance(s.drafts.back());
    } else {
      s.drafts.push_back(id(gen) % 40);  // repeats among drafts, output and prompt
    }
  }
  return s;
}

TEST_F(CudaControls, RowsEqualTheHostProgramBitForBit) {
  std::mt19937 gen(99);
  DeviceControls dc(*ctx);
  int trial = 0, masked = 0, refused = 0;
  for (const int64_t V : {37, 1000, 1537, 4099}) {
    const auto vocab = letters(V);
    const auto grammar = constrain::compile_regex("(ab|c)+d?[abc]{0,9}(dd|cb)?");
    for (const int K : {1, 4, 15}) {
      for (int batch_no = 0; batch_no < 6; ++batch_no) {
        // A batch of sequences: one upload, then each program on its own rows.
        const int n = 1 + int(gen() % 4);
        std::vector<Seq> seqs;
        std::vector<DeviceBuffer<float>> d_rows;
        std::vector<DeviceBuffer<int32_t>> d_drafts;
        std::vector<std::vector<float>> raw;
        std::vector<ControlProgram> programs;
        dc.clear();
        for (int i = 0; i < n; ++i, ++trial) {
          seqs.push_back(random_seq(gen, V, K, trial, grammar, vocab));
          Seq& s = seqs.back();
          raw.push_back(test::randn(size_t(s.rows * V), uint64_t(trial) + 7, 4.0f));
          // Ties and −inf entries, as padding ids and earlier masks leave.
          raw.back()[0] = raw.back()[1];
          raw.back()[size_t(V - 2)] = -std::numeric_limits<float>::infinity();
          d_rows.emplace_back(*ctx, raw.back());
          // Room for K drafts, as the backend's round buffer has.
          std::vector<int32_t> padded = s.drafts;
          padded.resize(size_t(K), 0);
          d_drafts.emplace_back(*ctx, padded);
          programs.push_back(s.state->program(s.rows, s.drafts));
          masked += programs.back().masked_rows > 0;
          refused += programs.back().masked_rows > 0 && programs.back().masked_rows < s.rows;
          EXPECT_EQ(dc.add(programs.back()), i);
        }
        dc.upload();
        for (int i = 0; i < n; ++i)
          dc.apply(i, d_rows[size_t(i)].data(), d_drafts[size_t(i)].data());
        for (int i = 0; i < n; ++i) {
          const Seq& s = seqs[size_t(i)];
          const auto got = d_rows[size_t(i)].download(*ctx);
          auto want = raw[size_t(i)], applied = raw[size_t(i)];
          apply_program(programs[size_t(i)], want.data(), s.drafts);
          s.state->apply(applied.data(), s.drafts);
          for (size_t j = 0; j < got.size(); ++j) {
            ASSERT_EQ(std::memcmp(&want[j], &applied[j], sizeof(float)), 0) << "host program";
            ASSERT_EQ(std::memcmp(&got[j], &want[j], sizeof(float)), 0)
                << "V " << V << " K " << K << " sequence " << i << " row " << int64_t(j) / V
                << " id " << int64_t(j) % V << ": device " << got[j] << ", host " << want[j];
          }
        }
      }
    }
  }
  EXPECT_GT(masked, 10);
  EXPECT_GT(refused, 2);
}

// Plain fp64 log-softmax over a row, with the rank and the top ids written from their
// definitions (a full sort), for the logprob test's second reference.
struct Plain {
  double logprob = 0;
  int64_t rank = 1;
  std::vector<int32_t> top;
};
Plain plain_logprob(const float* row, int64_t V, int32_t token, int top) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
  Plain p;
  p.logprob = double(row[token]) - (mx + std::log(sum));
  for (int64_t i = 0; i < V; ++i) p.rank += row[i] > row[token];
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) ids[size_t(i)] = int32_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  p.top.assign(ids.begin(), ids.begin() + std::min<int64_t>(top, V));
  return p;
}

TEST_F(CudaControls, LogprobsEqualTokenLogprob) {
  std::mt19937 gen(5);
  for (const int64_t V : {1, 7, 1000, 1537, 151936}) {
    for (const int rows : {1, 3, 17}) {
      DeviceLogprobs lp(*ctx, V, rows);
      const size_t seqs = 3;
      lp.reserve(seqs);
      std::vector<std::vector<float>> host;
      std::vector<DeviceBuffer<float>> d_rows;
      std::vector<DeviceBuffer<int32_t>> d_round;  // [accepted, last, tokens rows − 1]
      std::vector<std::vector<int32_t>> round;
      std::vector<int> tops;
      for (size_t i = 0; i < seqs; ++i) {
        auto x = test::randn(size_t(rows * V), gen(), 3.0f);
        // Exact ties among the largest (the lower id first), −inf entries (padding ids).
        for (int r = 0; r < rows && V > 4; ++r) {
          float* row = x.data() + int64_t(r) * V;
          const float big = *std::max_element(row, row + V) + 1.0f;
          row[V - 1] = row[2] = row[V / 2] = big;
          row[3] = -std::numeric_limits<float>::infinity();
        }
        std::vector<int32_t> rd(size_t(rows) + 1);
        rd[0] = int32_t(gen() % uint32_t(rows));  // accepted
        for (size_t j = 1; j < rd.size(); ++j) rd[j] = int32_t(gen() % uint64_t(V));
        host.push_back(x);
        d_rows.emplace_back(*ctx, x);
        round.push_back(rd);
        d_round.emplace_back(*ctx, rd);
        tops.push_back(int(gen() % 21));
      }
      // Sequence 0 as pick() asks: one row, no accepted count.
      const int32_t* r0 = d_round[0].data();
      lp.enqueue(0, d_rows[0].data(), 1, nullptr, nullptr, r0 + 1, tops[0]);
      for (size_t i = 1; i < seqs; ++i) {
        const int32_t* r = d_round[i].data();
        lp.enqueue(i, d_rows[i].data(), rows, r, r + 2, r + 1, tops[i]);
      }
      ctx->sync();
      for (size_t i = 0; i < seqs; ++i) {
        const int accepted = i == 0 ? 0 : round[i][0];
        const auto got = lp.results(i, accepted + 1, tops[i]);
        for (int r = 0; r <= accepted; ++r) {
          const float* row = host[i].data() + int64_t(r) * V;
          const int32_t token = r < accepted ? round[i][size_t(r) + 2] : round[i][1];
          const TokenLogprob want = token_logprob(row, V, token, tops[i]);
          const Plain plain = plain_logprob(row, V, token, tops[i]);
          const TokenLogprob& g = got[size_t(r)];
          const std::string what =
              "V " + std::to_string(V) + " row " + std::to_string(r) + " seq " + std::to_string(i);
          EXPECT_EQ(g.token, token) << what;
          EXPECT_EQ(g.rank, want.rank) << what;
          EXPECT_EQ(g.rank, plain.rank) << what;
          // The double sums differ from the host's in their order only: the float results
          // agree to an ulp.
          EXPECT_NEAR(g.logprob, want.logprob, 2e-7 * std::max(1.0f, std::abs(want.logprob)))
              << what;
          EXPECT_NEAR(g.logprob, plain.logprob, 1e-6 * std::max(1.0, std::abs(plain.logprob)))
              << what;
          ASSERT_EQ(g.top.size(), want.top.size()) << what;
          for (size_t j = 0; j < g.top.size(); ++j) {
            EXPECT_EQ(g.top[j].first, want.top[j].first) << what << " top " << j;
            EXPECT_EQ(g.top[j].first, plain.top[j]) << what << " top " << j;
            EXPECT_NEAR(g.top[j].second, want.top[j].second,
                        2e-7 * std::max(1.0f, std::abs(want.top[j].second)))
                << what << " top " << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashmap::cuda
