// Chi-square goodness of fit for the statistical exactness tests.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace flashmap::testing {

struct ChiSquare {
  double statistic = 0;
  int df = 0;
  double critical = 0;     // at the test's false-alarm rate
  std::string impossible;  // a cell observed where the expected probability is 0
  bool pass() const { return impossible.empty() && statistic <= critical; }
};

// Observed counts against expected probabilities. Cells with E < 5 are pooled (the usual rule);
// a count in a cell of probability 0 fails outright. The critical value is the chi-square
// quantile at 1 - 1e-6 (Wilson–Hilferty), so fixed-seed runs of a correct sampler pass and a
// biased one fails.
inline ChiSquare chi_square(const std::vector<double>& counts, const std::vector<double>& probs) {
  ChiSquare r;
  double n = 0;
  for (double c : counts) n += c;
  double pooled_o = 0, pooled_e = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    if (probs[i] == 0.0) {
      if (counts[i] > 0) r.impossible = "cell " + std::to_string(i);
      continue;
    }
    if (e < 5) {
      pooled_o += counts[i];
      pooled_e += e;
      continue;
    }
    r.statistic += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    r.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  r.df = std::max(cells - 1, 1);
  const double z = 4.75;  // one-sided normal quantile of 1e-6
  const double a = 2.0 / (9.0 * r.df);
  r.critical = r.df * std::pow(1 - a + z * std::sqrt(a), 3);
  return r;
}

}  // namespace flashmap::testing
