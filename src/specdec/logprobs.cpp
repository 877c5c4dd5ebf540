#include "specdec/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace flashmap {

TokenLogprob token_logprob(const float* row, int64_t V, int32_t token, int top) {
  const float mx = *std::max_element(row, row + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - double(mx));
  const double lse = double(mx) + std::log(sum);
  auto lp = [&](int32_t id) { return float(double(row[id]) - lse); };
  TokenLogprob r;
  r.token = token;
  r.logprob = lp(token);
  for (int64_t i = 0; i < V; ++i) r.rank += row[i] > row[token];
  if (top > 0) {
    const int64_t n = std::min<int64_t>(top, V);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int64_t i = 0; i < n; ++i) r.top.emplace_back(ids[size_t(i)], lp(ids[size_t(i)]));
  }
  return r;
}

}  // namespace flashmap
