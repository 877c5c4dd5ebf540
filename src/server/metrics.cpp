#include "server/metrics.h"

#include <fmt/format.h>

#include "server/http_front.h"

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
double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

Metrics::Metrics() : ttft_(latency_buckets()), itl_(latency_buckets()), e2e_(latency_buckets()) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard lk(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation_done(const Request& req, size_t completion_tokens) {
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

namespace {

// The engine's gauges and round counters.
void render_engine(std::string& out, const EngineStats& s) {
  out += fmt::format(
      "# HELP flashmap_engine_healthy 1 while the engine serves; 0 after a device fault (the "
      "process must restart).\n# TYPE flashmap_engine_healthy gauge\nflashmap_engine_healthy {}\n"
      "# HELP flashmap_max_running Sequences decoded together (at most what device memory "
      "holds).\n# TYPE flashmap_max_running gauge\nflashmap_max_running {}\n"
      "# HELP flashmap_queue_depth Requests waiting for a slot.\n"
      "# TYPE flashmap_queue_depth gauge\nflashmap_queue_depth {}\n"
      "# HELP flashmap_running_sequences Sequences being decoded.\n"
      "# TYPE flashmap_running_sequences gauge\nflashmap_running_sequences {}\n"
      "# HELP flashmap_rounds_total Engine rounds (one batched verify forward each).\n"
      "# TYPE flashmap_rounds_total counter\nflashmap_rounds_total {}\n"
      "# HELP flashmap_speculative_rounds_total Rounds in which sequences drafted.\n"
      "# TYPE flashmap_speculative_rounds_total counter\nflashmap_speculative_rounds_total {}\n"
      "# HELP flashmap_spec_max_batch --spec-policy batch: speculation runs while running "
      "sequences <= this (0: always).\n# TYPE flashmap_spec_max_batch gauge\n"
      "flashmap_spec_max_batch {}\n",
      s.healthy ? 1 : 0, s.max_running, s.queued, s.running, s.rounds, s.speculative_rounds,
      s.spec_max_batch);
}

// The speculation policy's decisions and, for the adaptive one, what it bases them on.
void render_policy(std::string& out, const EngineStats& s) {
  out += fmt::format(
      "# HELP flashmap_spec_policy The speculation policy (--spec-policy).\n"
      "# TYPE flashmap_spec_policy gauge\nflashmap_spec_policy{{policy=\"{}\"}} 1\n"
      "# HELP flashmap_spec_policy_rounds_total Rounds in which some sequence could draft, by "
      "the policy's choice (speculative or target) and whether it explored.\n"
      "# TYPE flashmap_spec_policy_rounds_total counter\n",
      spec_policy_name(s.policy));
  for (int spec = 1; spec >= 0; --spec)
    for (int explore = 0; explore < 2; ++explore)
      out += fmt::format("flashmap_spec_policy_rounds_total{{mode=\"{}\",explore=\"{}\"}} {}\n",
                         spec ? "speculative" : "target", explore ? "true" : "false",
                         s.policy_rounds[spec][explore]);
}

// Per draft tree shape: rounds, sequence rounds, committed and verified tokens.
void render_trees(std::string& out, const EngineStats& s) {
  if (!s.trees.empty()) {
    // Per tree shape (--draft-tree auto mixes them): rounds, and for τ and nodes per round the
    // drafting sequences' rounds, committed tokens and verified draft tokens.
    using Counts = EngineStats::TreeCounts;
    const struct {
      const char *name, *help;
      uint64_t Counts::*field;
    } series[] = {
        {"rounds", "Speculative rounds by the draft tree they verified", &Counts::rounds},
        {"sequence_rounds", "Drafting sequences' rounds by draft tree", &Counts::sequence_rounds},
        {"committed_tokens", "Tokens committed by drafting sequences, by draft tree",
         &Counts::committed},
        {"verified_nodes", "Draft tokens (tree nodes or block slots) verified, by draft tree",
         &Counts::nodes}};
    for (const auto& x : series) {
      out += fmt::format(
          "# HELP flashmap_draft_tree_{0}_total {1} (--draft-tree {2}; off: single blocks).\n"
          "# TYPE flashmap_draft_tree_{0}_total counter\n",
          x.name, x.help, s.draft_tree);
      for (const auto& [tree, t] : s.trees)
        out += fmt::format("flashmap_draft_tree_{}_total{{tree=\"{}\"}} {}\n", x.name, tree,
                           t.*x.field);
    }
  }
}

// The adaptive policy's estimates per batch-size bucket and mode.
void render_estimates(std::string& out, const EngineStats& s) {
  std::string tps, secs, toks, samples, choice;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const auto& bk = s.buckets[b];
    const auto label = spec_bucket_label(int(b));
    for (int spec = 1; spec >= 0; --spec) {
      const auto& e = spec ? bk.spec : bk.plain;
      if (e.samples == 0) continue;
      const auto labels =
          fmt::format("{{batch=\"{}\",mode=\"{}\"}}", label, spec ? "speculative" : "target");
      tps += fmt::format("flashmap_spec_policy_tokens_per_second{} {}\n", labels,
                         e.tokens_per_second());
      secs += fmt::format("flashmap_spec_policy_round_seconds{} {}\n", labels, e.seconds);
      toks += fmt::format("flashmap_spec_policy_round_tokens{} {}\n", labels, e.tokens);
      samples += fmt::format("flashmap_spec_policy_samples_total{} {}\n", labels, e.samples);
    }
    if (bk.has_choice())
      choice += fmt::format("flashmap_spec_policy_speculating{{batch=\"{}\"}} {}\n", label,
                            bk.prefers_spec() ? 1 : 0);
  }
  out +=
      "# HELP flashmap_spec_policy_tokens_per_second Adaptive policy: estimated committed "
      "tokens/s of a round, by batch-size bucket and mode.\n"
      "# TYPE flashmap_spec_policy_tokens_per_second gauge\n" +
      tps +
      "# HELP flashmap_spec_policy_round_seconds Adaptive policy: EWMA wall time of a round.\n"
      "# TYPE flashmap_spec_policy_round_seconds gauge\n" +
      secs +
      "# HELP flashmap_spec_policy_round_tokens Adaptive policy: EWMA tokens committed by a "
      "round (all its sequences).\n# TYPE flashmap_spec_policy_round_tokens gauge\n" +
      toks +
      "# HELP flashmap_spec_policy_samples_total Adaptive policy: rounds measured.\n"
      "# TYPE flashmap_spec_policy_samples_total counter\n" +
      samples +
      "# HELP flashmap_spec_policy_speculating Adaptive policy: 1 where the estimates favour "
      "speculation for the batch-size bucket, 0 where the target alone.\n"
      "# TYPE flashmap_spec_policy_speculating gauge\n" +
      choice;
}

// Tokens committed per speculative verify of one sequence (1 .. block size + 1).
void render_acceptance(std::string& out, const EngineStats& s) {
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
}

// The prefix cache's counters and gauges.
void render_prefix_cache(std::string& out, const EngineStats& s) {
  const auto& pc = s.prefix_cache;
  const std::pair<const char*, std::string> prefix[] = {
      {"flashmap_prefix_cache_queries_total counter Requests that looked up the prefix cache.",
       std::to_string(pc.queries)},
      {"flashmap_prefix_cache_hits_total counter Requests that started from a cached prefix.",
       std::to_string(pc.hits)},
      {"flashmap_prefix_cache_query_tokens_total counter Prompt tokens of the lookups.",
       std::to_string(pc.query_tokens)},
      {"flashmap_prefix_cache_hit_tokens_total counter Prompt tokens served from the cache.",
       std::to_string(pc.hit_tokens)},
      {"flashmap_prefix_cache_evictions_total counter Entries evicted to stay in the budget.",
       std::to_string(pc.evictions)},
      {"flashmap_prefix_cache_entries gauge Sequences held.", std::to_string(pc.entries)},
      {"flashmap_prefix_cache_bytes gauge Memory held.", std::to_string(pc.bytes)},
      {"flashmap_prefix_cache_budget_bytes gauge Memory allowed (0: off).",
       std::to_string(pc.budget)}};
  for (const auto& [spec, value] : prefix) {
    const std::string_view v(spec);
    const size_t a = v.find(' '), b = v.find(' ', a + 1);
    const auto name = v.substr(0, a), type = v.substr(a + 1, b - a - 1), help = v.substr(b + 1);
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  }
}

// Who drafted each drafting sequence's round: the drafter model or prompt lookup.
void render_proposers(std::string& out, const EngineStats& s) {
  const char* names[2] = {"drafter", "lookup"};
  out +=
      "# HELP flashmap_proposer_sequence_rounds_total Drafting sequences' rounds by what drafted "
      "(drafter: the drafter model; lookup: prompt lookup, --draft ngram or a hybrid round).\n"
      "# TYPE flashmap_proposer_sequence_rounds_total counter\n";
  for (int p = 0; p < 2; ++p)
    out += fmt::format("flashmap_proposer_sequence_rounds_total{{proposer=\"{}\"}} {}\n", names[p],
                       s.proposers[p].sequence_rounds);
  out +=
      "# HELP flashmap_proposer_committed_tokens_total Tokens those rounds committed, by what "
      "drafted.\n# TYPE flashmap_proposer_committed_tokens_total counter\n";
  for (int p = 0; p < 2; ++p)
    out += fmt::format("flashmap_proposer_committed_tokens_total{{proposer=\"{}\"}} {}\n", names[p],
                       s.proposers[p].committed);
  if (s.lookup_policy_rounds.size() == 2) {
    out +=
        "# HELP flashmap_hybrid_policy_rounds_total Hybrid speculative rounds by the adaptive "
        "policy's choice: lookup drafts where it matches, or the drafter alone.\n"
        "# TYPE flashmap_hybrid_policy_rounds_total counter\n";
    for (int c = 0; c < 2; ++c)
      out += fmt::format("flashmap_hybrid_policy_rounds_total{{choice=\"{}\"}} {}\n",
                         c == 0 ? "lookup" : "drafter", s.lookup_policy_rounds[size_t(c)]);
  }
}

// The KV cache's fill, and the series the Kubernetes Gateway API Inference Extension's endpoint
// picker scrapes from a model server (its model-server protocol: queued and running requests,
// KV-cache utilisation), under the vLLM names that its defaults read, with the prefix cache's
// token counters under vLLM's names too.
void render_router(std::string& out, const EngineStats& s) {
  const double usage =
      s.kv_capacity_tokens > 0 ? double(s.kv_tokens) / double(s.kv_capacity_tokens) : 0.0;
  const auto& pc = s.prefix_cache;
  const double hit_rate = pc.query_tokens > 0 ? double(pc.hit_tokens) / double(pc.query_tokens) : 0;
  out += fmt::format(
      "# HELP flashmap_kv_cache_tokens Positions the running sequences hold in their KV caches.\n"
      "# TYPE flashmap_kv_cache_tokens gauge\nflashmap_kv_cache_tokens {}\n"
      "# HELP flashmap_kv_cache_capacity_tokens Positions the sequence slots may hold "
      "(max_running x the context limit).\n"
      "# TYPE flashmap_kv_cache_capacity_tokens gauge\nflashmap_kv_cache_capacity_tokens {}\n"
      "# HELP flashmap_prefix_cache_hit_rate Prompt tokens served from the prefix cache over "
      "prompt tokens looked up, since start.\n"
      "# TYPE flashmap_prefix_cache_hit_rate gauge\nflashmap_prefix_cache_hit_rate {}\n"
      "# HELP vllm:num_requests_waiting Requests waiting for a slot (TotalQueuedRequests).\n"
      "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {}\n"
      "# HELP vllm:num_requests_running Requests being decoded (TotalRunningRequests).\n"
      "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {}\n"
      "# HELP vllm:kv_cache_usage_perc KV-cache utilisation from 0 to 1 "
      "(KVCacheUtilization).\n"
      "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {}\n"
      "# HELP vllm:gpu_cache_usage_perc The same utilisation under its earlier name.\n"
      "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc {}\n"
      "# HELP vllm:prefix_cache_queries_total Prompt tokens looked up in the prefix cache.\n"
      "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {}\n"
      "# HELP vllm:prefix_cache_hits_total Prompt tokens served from the prefix cache.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {}\n",
      s.kv_tokens, s.kv_capacity_tokens, hit_rate, s.queued, s.running, usage, usage,
      pc.query_tokens, pc.hit_tokens);
}

}  // namespace

std::string Metrics::render(const EngineStats& s) const {
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
  render_engine(out, s);
  render_policy(out, s);
  render_trees(out, s);
  render_estimates(out, s);
  render_acceptance(out, s);
  render_prefix_cache(out, s);
  render_proposers(out, s);
  render_router(out, s);
  return out;
}

std::string render_front_metrics(const FrontStats& f) {
  std::string out =
      "# HELP flashmap_http_connections_open Connections held by the HTTP front.\n"
      "# TYPE flashmap_http_connections_open gauge\n";
  out += fmt::format("flashmap_http_connections_open {}\n", f.open);
  out +=
      "# HELP flashmap_http_connections_total Connections accepted.\n"
      "# TYPE flashmap_http_connections_total counter\n";
  out += fmt::format("flashmap_http_connections_total {}\n", f.connections);
  out +=
      "# HELP flashmap_http_refused_total Connections the HTTP front closed or refused, by "
      "reason.\n# TYPE flashmap_http_refused_total counter\n";
  const std::pair<const char*, uint64_t> rows[] = {{"idle_timeout", f.timed_out_idle},
                                                   {"request_timeout", f.timed_out_request},
                                                   {"evicted", f.evicted},
                                                   {"connection_limit", f.refused_busy},
                                                   {"head_too_large", f.refused_head},
                                                   {"body_too_large", f.refused_body},
                                                   {"malformed", f.refused_malformed}};
  for (const auto& [reason, n] : rows)
    out += fmt::format("flashmap_http_refused_total{{reason=\"{}\"}} {}\n", reason, n);
  return out;
}

}  // namespace flashmap::server
