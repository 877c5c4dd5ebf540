// Prometheus text exposition of the server's counters, latency histograms and the scheduler's
// gauges (GET /metrics).
#pragma once

#include <flashmap/engine.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace flashmap::server {

struct FrontStats;  // http_front.h

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v, uint64_t times = 1);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_done(const std::string& endpoint, int status);
  // One finished generation: token counts and its emission times (see Request::emissions).
  void generation_done(const Request& req, size_t completion_tokens);
  std::string render(const EngineStats& s) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
};

// The HTTP front's connection gauges and refusal counters.
std::string render_front_metrics(const FrontStats& f);

}  // namespace flashmap::server
