// The engine's counters (Engine::stats(), the server's /metrics): rounds, the speculation
// policy's estimates, acceptance, the prefix cache and draft trees.
#pragma once

#include <flashmap/request.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flashmap {

// The adaptive speculation policy's moving averages for one mode (speculative or plain rounds)
// of one batch-size bucket (src/engine/spec_policy.h).
struct SpecPolicyEstimate {
  uint64_t samples = 0;
  double seconds = 0, tokens = 0;  // EWMA per round
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
};

// One batch-size bucket of the adaptive policy: batch 1, 2, 3-4, 5-8, ... (powers of two).
struct SpecPolicyBucket {
  SpecPolicyEstimate spec, plain;
  int since_explore = 0;
  int interval = 0;
  bool has_choice() const { return spec.samples > 0 && plain.samples > 0; }
  bool prefers_spec() const { return spec.tokens_per_second() > plain.tokens_per_second(); }
};

// The batch sizes of bucket `bucket`: "1", "2", "3-4", ...
std::string spec_bucket_label(int bucket);

struct PrefixCacheStats {
  uint64_t queries = 0, hits = 0;
  uint64_t query_tokens = 0, hit_tokens = 0;  // prompt tokens asked for, and served from cache
  uint64_t inserts = 0, evictions = 0;
  size_t entries = 0, bytes = 0, budget = 0;
};

// Counters for /metrics, read without stopping the engine.
struct EngineStats {
  int running = 0, queued = 0;
  uint64_t rounds = 0, speculative_rounds = 0;
  // Rounds with a policy decision (some sequence could draft), by [speculated][explored].
  uint64_t policy_rounds[2][2] = {{0, 0}, {0, 0}};
  SpecPolicyKind policy = SpecPolicyKind::Adaptive;
  int spec_max_batch = 0;
  std::vector<SpecPolicyBucket> buckets;  // the adaptive policy's estimates, by bucket index
  // acceptance_hist[n]: verify rounds that committed n tokens (n in 1..K+1).
  std::vector<uint64_t> acceptance_hist;
  PrefixCacheStats prefix_cache;
  // Draft trees: the option, and per tree shape drafted ("off": single blocks) its speculative
  // rounds, the drafting sequences' rounds in them, the tokens those committed (τ = committed /
  // sequence_rounds) and the draft tokens verified (nodes per sequence round = nodes /
  // sequence_rounds).
  std::string draft_tree;
  struct TreeCounts {
    uint64_t rounds = 0, sequence_rounds = 0, committed = 0, nodes = 0;
  };
  std::map<std::string, TreeCounts> trees;
  // Drafting sequences' rounds and the tokens they committed, by what drafted: [0] the drafter
  // model, [1] prompt lookup (--draft ngram, and hybrid rounds whose last tokens matched).
  struct ProposerCounts {
    uint64_t sequence_rounds = 0, committed = 0;
  };
  ProposerCounts proposers[2];
  // Hybrid rounds under the adaptive policy: speculative rounds that let prompt lookup draft
  // where it matched ([0]) and that ran the drafter alone ([1]), as measured tokens/s chose them;
  // empty without that choice.
  std::vector<uint64_t> lookup_policy_rounds;
  // Positions the running sequences hold in their KV caches, and what the slots may hold
  // (max_running x the context limit): their ratio is the KV-cache utilisation routers read.
  int64_t kv_tokens = 0, kv_capacity_tokens = 0;
  // False after a device fault (flashmap::DeviceFault): every request held then failed and no
  // more are taken; `fault` says what happened. The process must restart to serve again.
  bool healthy = true;
  std::string fault;
  int max_running = 0;  // sequences decoded together (--max-running, at most what the device holds)
};

}  // namespace flashmap
