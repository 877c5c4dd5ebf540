// ops::attention against a float64 reference: causal key counts (a verify pass), GQA, and the
// head sizes of the register-resident path (32, 64, 128) as well as the generic one (24, 48).
// The tolerance is fp32 rounding of a softmax-weighted sum over up to ~300 keys (~1e-6 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace flashmap {
namespace {

TEST(Attention, MatchesFloat64ReferenceForEveryHeadSize) {
  ThreadPool pool(2);
  for (const int hd : {24, 32, 48, 64, 128}) {
    for (const int kv_heads : {1, 2}) {
      const int heads = 4, nq = 9, context = 300;
      Rng rng(uint64_t(hd * 10 + kv_heads));
      std::vector<float> q(size_t(nq * heads * hd)), k(size_t((context + nq) * kv_heads * hd)),
          v(k.size()), out(q.size());
      for (auto* t : {&q, &k, &v})
        for (auto& x : *t) x = float(rng.normal());
      std::vector<int64_t> counts(nq);
      for (int i = 0; i < nq; ++i) counts[size_t(i)] = context + i + 1;  // causal over the cache
      const float scale = 1.0f / std::sqrt(float(hd));
      ops::attention(q.data(), nq, heads, kv_heads, hd, k.data(), v.data(), counts.data(), scale,
                     out.data(), pool);
      const int group = heads / kv_heads;
      double worst = 0;
      for (int i = 0; i < nq; ++i)
        for (int h = 0; h < heads; ++h) {
          const float* qi = &q[size_t((i * heads + h) * hd)];
          const int kh = h / group;
          std::vector<double> s(size_t(counts[size_t(i)]));
          double mx = -1e300, sum = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            double d = 0;
            for (int c = 0; c < hd; ++c) d += double(qi[c]) * k[(j * kv_heads + kh) * hd + c];
            s[j] = d * scale;
            mx = std::max(mx, s[j]);
          }
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (int c = 0; c < hd; ++c) {
            double o = 0;
            for (size_t j = 0; j < s.size(); ++j) o += s[j] * v[(j * kv_heads + kh) * hd + c];
            o /= sum;
            worst = std::max(worst, std::abs(o - out[size_t((i * heads + h) * hd + c)]));
          }
        }
      EXPECT_LT(worst, 2e-6) << "head_dim " << hd << " kv_heads " << kv_heads;
    }
  }
}

TEST(Attention, OneQueryEqualsItsRowInABatch) {
  // Batch invariance: query i of a 9-query pass equals the same query alone, bit for bit.
  ThreadPool pool(2);
  for (const int hd : {32, 48, 64}) {
    const int heads = 2, nq = 9, context = 70;
    Rng rng(static_cast<uint64_t>(hd));
    std::vector<float> q(size_t(nq * heads * hd)), k(size_t((context + nq) * heads * hd)),
        v(k.size()), out(q.size()), one(size_t(heads * hd));
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = float(rng.normal());
    std::vector<int64_t> counts(nq);
    for (int i = 0; i < nq; ++i) counts[size_t(i)] = context + i + 1;
    ops::attention(q.data(), nq, heads, heads, hd, k.data(), v.data(), counts.data(), 0.125f,
                   out.data(), pool);
    for (int i = 0; i < nq; ++i) {
      ops::attention(&q[size_t(i * heads * hd)], 1, heads, heads, hd, k.data(), v.data(),
                     &counts[size_t(i)], 0.125f, one.data(), pool);
      for (int c = 0; c < heads * hd; ++c)
        ASSERT_EQ(one[size_t(c)], out[size_t(i * heads * hd + c)]) << "hd " << hd << " query " << i;
    }
  }
}

}  // namespace
}  // namespace flashmap
