#include "bench/timing.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "core/check.h"

namespace flashmap::bench {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_of(const std::function<void()>& f, int reps) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];  // median
}

json run_decode(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_new,
                int reps, float temperature) {
  double tokens = 0, rounds = 0, total = 0, draft = 0, verify = 0, accept = 0, prefill = 0;
  std::vector<int> lengths;
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestParams p;
      p.prompt = prompts[i];
      p.max_tokens = max_new;
      p.seed = uint64_t(i);
      p.sampling.temperature = temperature;  // unseeded: rejection sampling / sample-and-match
      const auto res = engine.generate(p);
      tokens += double(res.ids.size());
      rounds += res.rounds;
      total += res.times.total_ms;
      draft += res.times.draft_ms;
      verify += res.times.verify_ms;
      accept += res.times.accept_ms;
      prefill += res.times.prefill_ms;
      lengths.insert(lengths.end(), res.acceptance_lengths.begin(), res.acceptance_lengths.end());
    }
  double tau = 0;
  for (int a : lengths) tau += a;
  tau /= std::max<size_t>(lengths.size(), 1);
  const double loop = total - draft - verify - prefill;
  return {{"tokens_per_s", 1000.0 * tokens / total},
          {"tau", tau},
          {"round_ms", (total - prefill) / std::max(rounds, 1.0)},
          {"draft_ms_per_round", draft / std::max(rounds, 1.0)},
          {"verify_ms_per_round", verify / std::max(rounds, 1.0)},
          {"accept_ms_per_round", accept / std::max(rounds, 1.0)},
          {"loop_overhead_pct", 100.0 * loop / std::max(total - prefill, 1e-9)},
          {"tokens", tokens},
          {"rounds", rounds}};
}

void write_json(const json& out, const std::string& path) {
  if (path.empty()) return;
  std::ofstream f(path);
  FLASHMAP_CHECK(f.good(), "--json: cannot write {}", path);
  f << out.dump(2) << "\n";
}

}  // namespace flashmap::bench
