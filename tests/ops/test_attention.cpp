// ops::attention is batch-invariant: a query's output does not depend on the other queries of the
// pass, in the register-resident path (head_dim 32, 64) and the generic one (48). Its values are
// checked against the float64 reference in test_ops_vs_reference.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace flashmap {
namespace {

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
