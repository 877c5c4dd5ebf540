#include "server/metrics.h"

#include <fmt/format.h>

namespace flashmap::server {

void Histogram::observe(double v, uint64_t times) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i] += times;
  sum_ += v * double(times);
  count_ += times;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     sum_, name, count_);
}

namespace {
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
double seconds(runtime::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

Metrics::Metrics() : ttft_(latency_buckets()), itl_(latency_buckets()), e2e_(latency_buckets()) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard lk(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation_done(const runtime::Request& req, size_t completion_tokens) {
  const auto em = req.emissions();
  std::lock_guard lk(mutex_);
  prompt_tokens_ += req.params.prompt.size();
  generation_tokens_ += completion_tokens;
  if (em.empty()) return;
  ttft_.observe(seconds(em.front().first - req.submitted));
  // A verify round delivers several tokens at once; each of them waited gap / count on average.
  for (size_t i = 1; i < em.size(); ++i)
    itl_.observe(seconds(em[i].first - em[i - 1].first) / em[i].second, uint64_t(em[i].second));
  e2e_.observe(seconds(em.back().first - req.submitted));
}

std::string Metrics::render(const runtime::SchedulerStats& s, int spec_max_batch) const {
  std::lock_guard lk(mutex_);
  std::string out;
  out +=
      "# HELP flashmap_requests_total HTTP requests by endpoint and status.\n"
      "# TYPE flashmap_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("flashmap_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  out += fmt::format(
      "# HELP flashmap_prompt_tokens_total Prompt tokens of finished generations.\n"
      "# TYPE flashmap_prompt_tokens_total counter\nflashmap_prompt_tokens_total {}\n"
      "# HELP flashmap_generation_tokens_total Tokens generated.\n"
      "# TYPE flashmap_generation_tokens_total counter\nflashmap_generation_tokens_total {}\n",
      prompt_tokens_, generation_tokens_);
  ttft_.render(out, "flashmap_time_to_first_token_seconds", "Time to first token.");
  itl_.render(out, "flashmap_inter_token_latency_seconds",
              "Time between consecutive output tokens.");
  e2e_.render(out, "flashmap_request_latency_seconds", "Submission to last token.");
  out += fmt::format(
      "# HELP flashmap_queue_depth Requests waiting for a slot.\n"
      "# TYPE flashmap_queue_depth gauge\nflashmap_queue_depth {}\n"
      "# HELP flashmap_running_sequences Sequences being decoded.\n"
      "# TYPE flashmap_running_sequences gauge\nflashmap_running_sequences {}\n"
      "# HELP flashmap_rounds_total Engine rounds (one batched verify forward each).\n"
      "# TYPE flashmap_rounds_total counter\nflashmap_rounds_total {}\n"
      "# HELP flashmap_speculative_rounds_total Rounds in which sequences drafted.\n"
      "# TYPE flashmap_speculative_rounds_total counter\nflashmap_speculative_rounds_total {}\n"
      "# HELP flashmap_spec_max_batch Speculation runs while running sequences <= this (0: "
      "always).\n# TYPE flashmap_spec_max_batch gauge\nflashmap_spec_max_batch {}\n",
      s.queued, s.running, s.rounds, s.speculative_rounds, spec_max_batch);
  // Tokens committed per speculative verify of one sequence (1 .. block size + 1).
  out +=
      "# HELP flashmap_acceptance_length Tokens committed per speculative verify.\n"
      "# TYPE flashmap_acceptance_length histogram\n";
  uint64_t cum = 0, sum = 0;
  for (size_t n = 1; n < s.acceptance_hist.size(); ++n) {
    cum += s.acceptance_hist[n];
    sum += n * s.acceptance_hist[n];
    out += fmt::format("flashmap_acceptance_length_bucket{{le=\"{}\"}} {}\n", n, cum);
  }
  out += fmt::format(
      "flashmap_acceptance_length_bucket{{le=\"+Inf\"}} {}\nflashmap_acceptance_length_sum {}\n"
      "flashmap_acceptance_length_count {}\n",
      cum, sum, cum);
  return out;
}

}  // namespace flashmap::server
