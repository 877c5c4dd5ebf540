// ops::attention (src/ops/attention.cpp): values against the float64 reference at odd shapes, and
// batch invariance bit for bit: a query's output must not depend on nq, on the other queries of
// the call or on the thread count (the engine's greedy speculative output equals the target's own
// only because of it).
//
// Shapes: head_dim 16, 64, 128 (vector code only) and 24 (plus the trailing-column code), 48 and
// 80 (column blocks of 3 and 1 vectors), GQA groups 1, 2, 4, 7 (7: query blocks of 4 straddle
// rows), 1, 3, 17, 33 rows (blocks of 4 with 1-3 left over; 33 > a tile's worth of causal rows),
// key counts 1, 5, 63 and 600 (under one 4-key group, inside one tile, across tiles), all rows
// over the same keys, causal (row i sees n + i keys) and ragged (counts in no order), and pools
// of 1, 2 and 3 threads (1: one job over every KV head; 2: a job per KV head; 3 over 2 or 3 KV
// heads: the rows split into chunks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/ops.h"
#include "reference_ops.h"

namespace flashmap {
namespace {

namespace ref = reference;
using ref::Vec;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

struct Problem {
  int64_t nq = 0;
  int heads = 0, kv_heads = 0, hd = 0;
  std::vector<int64_t> counts;
  std::vector<float> q, k, v;
  float scale = 0;
};

enum class Keys { kSame, kCausal, kRagged };

// nq rows of `heads` query heads over `kv_heads` KV heads; the first row sees n keys (kSame: every
// row does; kCausal: row i sees n + i; kRagged: each row between 1 and n + nq − 1, in no order).
Problem make_problem(int64_t nq, int heads, int kv_heads, int hd, int64_t n, Keys keys,
                     uint64_t seed, float q_sd = 1.0f) {
  Problem p{nq,
            heads,
            kv_heads,
            hd,
            std::vector<int64_t>(size_t(nq)),
            {},
            {},
            {},
            1.0f / std::sqrt(float(hd))};
  Rng rng(seed);
  for (int64_t i = 0; i < nq; ++i) {
    int64_t c = n;
    if (keys == Keys::kCausal) c = n + i;
    if (keys == Keys::kRagged) c = i == 0 ? n : 1 + int64_t(rng.uniform() * double(n + nq - 1));
    p.counts[size_t(i)] = c;
  }
  const int64_t n_keys = *std::max_element(p.counts.begin(), p.counts.end());
  p.q.resize(size_t(nq * heads * hd));
  p.k.resize(size_t(n_keys * kv_heads * hd));
  p.v.resize(p.k.size());
  for (auto& x : p.q) x = q_sd * rng.normal();
  for (auto* t : {&p.k, &p.v})
    for (auto& x : *t) x = rng.normal();
  return p;
}

// Rows [r0, r1) of p in one call.
std::vector<float> run(const Problem& p, ThreadPool& pool, int64_t r0, int64_t r1) {
  const int64_t row = int64_t(p.heads) * p.hd;
  std::vector<float> out(size_t((r1 - r0) * row), std::numeric_limits<float>::quiet_NaN());
  ops::attention(p.q.data() + r0 * row, r1 - r0, p.heads, p.kv_heads, p.hd, p.k.data(), p.v.data(),
                 p.counts.data() + r0, p.scale, out.data(), pool);
  return out;
}
std::vector<float> run(const Problem& p, ThreadPool& pool) {
  return run(p, pool, 0, p.nq);
}

std::string describe(const Problem& p) {
  return "hd " + std::to_string(p.hd) + " heads " + std::to_string(p.heads) + "/" +
         std::to_string(p.kv_heads) + " nq " + std::to_string(p.nq) + " first count " +
         std::to_string(p.counts[0]);
}

// The bound of test_ops_vs_reference.cpp (attention_case, where it is derived): per (query,
// head), with A = max_j Σ_c |q_c k_jc| and Vc = max_j |v_jc| over its n keys,
// |error| ≤ (2ε + (2n + 6)·u)·Vc with ε = (2hd + 6)·u·scale·A + 4u. It holds for any order of the
// sums, so for the trailing-column code too.
Vec bound_of(const Problem& p) {
  Vec bound(p.q.size());
  const int group = p.heads / p.kv_heads;
  for (int64_t i = 0; i < p.nq; ++i)
    for (int h = 0; h < p.heads; ++h) {
      const int64_t n = p.counts[size_t(i)];
      const int kv = h / group;
      double A = 0;
      std::vector<double> vmax(size_t(p.hd), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        double a = 0;
        for (int c = 0; c < p.hd; ++c) {
          const size_t kvi = size_t((j * p.kv_heads + kv) * p.hd + c);
          a += std::fabs(double(p.q[size_t((i * p.heads + h) * p.hd + c)]) * p.k[kvi]);
          vmax[size_t(c)] = std::max(vmax[size_t(c)], std::fabs(double(p.v[kvi])));
        }
        A = std::max(A, a);
      }
      const double eps = double(2 * p.hd + 6) * kU * p.scale * A + 4 * kU;
      for (int c = 0; c < p.hd; ++c)
        bound[size_t((i * p.heads + h) * p.hd + c)] =
            (2 * eps + double(2 * n + 6) * kU) * vmax[size_t(c)];
    }
  return bound;
}

// Fails once per problem (with the first offending element) unless every output is within its
// bound of the float64 reference; NaN never passes. Returns the largest error / bound.
double expect_near_reference(const Problem& p, const std::vector<float>& got) {
  const Vec want = ref::attention(ref::of(p.q), p.nq, p.heads, p.kv_heads, p.hd, ref::of(p.k),
                                  ref::of(p.v), p.counts, double(p.scale));
  const Vec bound = bound_of(p);
  double worst = 0;
  int64_t bad = 0, first = -1;
  for (size_t e = 0; e < want.size(); ++e) {
    const double err = std::fabs(double(got[e]) - want[e]);
    if (!(err <= bound[e])) {
      if (bad++ == 0) first = int64_t(e);
    } else if (bound[e] > 0) {
      worst = std::max(worst, err / bound[e]);
    }
  }
  if (bad > 0) {
    const size_t e = size_t(first);
    ADD_FAILURE() << describe(p) << ": " << bad << " of " << want.size()
                  << " outputs past the bound; first at " << e << ": got " << got[e] << ", want "
                  << want[e] << " ± " << bound[e];
  }
  return worst;
}

// Bit-for-bit equality (== would let −0 pass for +0 and never pass NaN).
void expect_same_bits(const float* got, const float* want, size_t n, const std::string& what) {
  for (size_t e = 0; e < n; ++e)
    if (std::memcmp(&got[e], &want[e], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << e << " is " << got[e] << ", want " << want[e]
                    << " bit for bit";
      return;
    }
}

TEST(Attention, MatchesFloat64ReferenceAtOddShapes) {
  ThreadPool pool(2);
  double worst = 0;
  int cases = 0;
  for (const int hd : {16, 24, 64, 128})
    for (const int group : {1, 2, 4, 7})
      for (const int64_t nq : {1, 3, 17, 33})
        for (const int64_t n : {1, 5, 63, 600})
          for (const Keys keys : {Keys::kSame, Keys::kCausal}) {
            const int kv_heads = 3;
            const Problem p = make_problem(nq, kv_heads * group, kv_heads, hd, n, keys,
                                           uint64_t(cases) * 7919 + 1);
            worst = std::max(worst, expect_near_reference(p, run(p, pool)));
            ++cases;
          }
  std::cout << "[ info ] attention: worst error " << worst * 100 << "% of its bound over " << cases
            << " cases\n";
}

TEST(Attention, MatchesFloat64ReferenceWithRaggedCountsAndLargeScores) {
  // Counts in no order (query blocks whose first and last counts differ by hundreds), and scores
  // in the hundreds, where exp(score − max) underflows for most keys and would overflow unshifted.
  ThreadPool pool(2);
  int cases = 0;
  for (const int hd : {24, 48, 80, 128})
    for (const float q_sd : {1.0f, 40.0f})
      for (const int64_t nq : {5, 17}) {
        const Problem p =
            make_problem(nq, 8, 2, hd, 300, Keys::kRagged, uint64_t(hd) * 31 + uint64_t(nq), q_sd);
        expect_near_reference(p, run(p, pool));
        ++cases;
      }
  EXPECT_EQ(cases, 16);
}

TEST(Attention, RowsOfABatchEqualEachRowAloneBitForBit) {
  // Every row of an nq-row call, with 1, 2 or 3 threads, is bit-identical to that row called alone
  // on one thread, and to rows [1, nq) called together (other neighbours in every block).
  ThreadPool one(1), two(2), three(3);
  int cases = 0;
  for (const int hd : {16, 24, 48, 64, 80, 128})
    for (const int group : {1, 2, 4, 7})
      for (const int64_t nq : {3, 17, 33})
        for (const int64_t n : {1, 63, 600})
          for (const Keys keys : {Keys::kSame, Keys::kCausal, Keys::kRagged}) {
            if (keys == Keys::kSame && n == 1) continue;
            const int kv_heads = 2;
            const Problem p = make_problem(nq, kv_heads * group, kv_heads, hd, n, keys,
                                           uint64_t(cases) * 104729 + 3);
            const std::string what = describe(p);
            const int64_t row = int64_t(p.heads) * hd;
            std::vector<float> alone(size_t(nq * row));
            for (int64_t i = 0; i < nq; ++i) {
              const auto r = run(p, one, i, i + 1);
              std::copy(r.begin(), r.end(), alone.begin() + i * row);
            }
            for (ThreadPool* pool : {&one, &two, &three})
              expect_same_bits(run(p, *pool).data(), alone.data(), alone.size(),
                               what + " threads " + std::to_string(pool->size()));
            expect_same_bits(run(p, two, 1, nq).data(), alone.data() + row,
                             alone.size() - size_t(row), what + " rows 1..");
            ++cases;
          }
  EXPECT_EQ(cases, 576);
}

TEST(Attention, KeysPastARowsCountAreNotRead) {
  // Keys and values that only later rows attend to hold inf and NaN: the earlier rows must give
  // the same bits as with finite ones (a query block that let a row add 0·v for a key past its
  // count would get NaN from 0·inf). Groups 1 and 3 put rows 5 and 6 in one block of 4 queries.
  ThreadPool pool(2);
  for (const int hd : {24, 128})
    for (const int group : {1, 3}) {
      Problem p = make_problem(17, 2 * group, 2, hd, 40, Keys::kCausal, uint64_t(hd + group));
      const auto clean = run(p, pool);
      const int64_t kv_row = int64_t(p.kv_heads) * hd, q_row = int64_t(p.heads) * hd;
      for (int64_t j = 45; j < 56; ++j)  // rows 0-5 see keys [0, 45) and never these
        for (int64_t c = 0; c < kv_row; ++c) {
          p.k[size_t(j * kv_row + c)] = j % 2 ? INFINITY : NAN;
          p.v[size_t(j * kv_row + c)] = j % 2 ? -INFINITY : NAN;
        }
      const auto poisoned = run(p, pool);
      expect_same_bits(poisoned.data(), clean.data(), size_t(6 * q_row),
                       "hd " + std::to_string(hd) + " group " + std::to_string(group));
    }
}

TEST(Attention, RowWithoutKeysGetsZeros) {
  ThreadPool pool(2);
  Problem p = make_problem(3, 4, 2, 64, 10, Keys::kCausal, 5);
  p.counts[1] = 0;
  const auto out = run(p, pool);
  const int64_t row = int64_t(p.heads) * p.hd;
  for (int64_t c = 0; c < row; ++c) ASSERT_EQ(out[size_t(row + c)], 0.0f) << c;
  expect_same_bits(out.data(), run(p, pool, 0, 1).data(), size_t(row), "row 0");
  expect_same_bits(out.data() + 2 * row, run(p, pool, 2, 3).data(), size_t(row), "row 2");
}

// Draft trees (ops::KeyMask): node i of a random tree over n nodes after P cached keys sees the P
// keys and its ancestors (itself included) only. Against the float64 reference restricted to
// those keys, at trees of 1 to 129 nodes (one mask word, several, a partial last one), with
// 0 to 600 cached keys and 1-3 threads; and a row's output does not depend on the other rows of
// the call. The bound is bound_of's over all P + i + 1 keys: looser than over the visible ones.
TEST(Attention, DraftTreeMaskMatchesFloat64Reference) {
  double worst = 0;
  int cases = 0;
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const int64_t prefix : {0, 5, 63, 600})
      for (const int64_t nodes : {1, 9, 33, 65, 129})
        for (const int hd : {24, 64}) {
          const int kv_heads = 2, heads = 4;
          Problem p = make_problem(nodes, heads, kv_heads, hd, prefix + 1, Keys::kCausal,
                                   uint64_t(cases) * 131 + 7);
          Rng rng(uint64_t(cases) + 99);
          std::vector<int64_t> parent(static_cast<size_t>(nodes));
          for (int64_t i = 0; i < nodes; ++i)
            parent[size_t(i)] = i == 0 ? -1 : int64_t(rng.uniform() * double(i + 1)) - 1;
          const int64_t words = (nodes + 63) / 64;
          std::vector<uint64_t> bits(size_t(nodes * words), 0);
          for (int64_t i = 0; i < nodes; ++i)
            for (int64_t a = i; a >= 0; a = parent[size_t(a)])
              bits[size_t(i * words + a / 64)] |= uint64_t(1) << (a % 64);
          const ops::KeyMask mask{prefix, words, bits.data()};
          const int64_t row = int64_t(heads) * hd;
          std::vector<float> out(size_t(nodes * row));
          ops::attention(p.q.data(), nodes, heads, kv_heads, hd, p.k.data(), p.v.data(),
                         p.counts.data(), p.scale, out.data(), pool, &mask);
          const Vec want = ref::attention(
              ref::of(p.q), nodes, heads, kv_heads, hd, ref::of(p.k), ref::of(p.v), p.counts,
              double(p.scale), [&](int64_t i, int64_t j) {
                return j < prefix ||
                       ((bits[size_t(i * words + (j - prefix) / 64)] >> ((j - prefix) % 64)) & 1);
              });
          const Vec bound = bound_of(p);
          for (size_t e = 0; e < want.size(); ++e) {
            const double err = std::fabs(double(out[e]) - want[e]);
            ASSERT_LE(err, bound[e]) << "prefix " << prefix << " nodes " << nodes << " hd " << hd
                                     << " threads " << threads << " element " << e;
            if (bound[e] > 0) worst = std::max(worst, err / bound[e]);
          }
          // The last row alone (its mask words at its own offset) gives the same bits.
          const int64_t last = nodes - 1;
          const ops::KeyMask one{prefix, words, bits.data() + last * words};
          std::vector<float> alone(static_cast<size_t>(row));
          ops::attention(p.q.data() + last * row, 1, heads, kv_heads, hd, p.k.data(), p.v.data(),
                         p.counts.data() + last, p.scale, alone.data(), pool, &one);
          expect_same_bits(alone.data(), out.data() + last * row, size_t(row), "last tree row");
          ++cases;
        }
  }
  std::cout << "[ info ] tree attention: worst error " << worst * 100 << "% of its bound over "
            << cases << " cases\n";
}

}  // namespace
}  // namespace flashmap
