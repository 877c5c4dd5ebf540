// Offline τ of draft trees: how many tokens a verify pass would commit if it
// checked a trie of candidate blocks instead of one block, on the shipped default pair, before
// any engine change. At temperature 0 the committed sequence does not depend on the drafter, so
// the target's greedy continuation is computed once per prompt and each round's candidates are
// scored against it: a trie commits 1 + the longest candidate prefix that matches it, which is
// exactly what tree verification would commit. Candidate sets:
//   paths:N   N noise draws of the flow map, each decoded greedily (argmax per slot);
//   topk:B    the B most likely prefixes of one draw's per-slot distributions (best-first by
//             summed log-probability, as DDTree builds its trees);
//   paths:N+topk:B  the N paths, then top-k expansions of the first draw up to B nodes.
// Each configuration runs its own rounds (the commit decides where the next round starts).
//
//   build/bench/tree_tau [--target models/default/target] [--draft models/default/draft]
//                        [--corpus /usr/share/games/fortunes] [--prompts 32] [--tokens 96]
//                        [--steps 1]
//
// Prompts: the first 16 tokens of documents drawn (seeded) from the last 2% of the corpus, the
// target's validation split (tools/train/eval_engine.py's rule). Output: a markdown table, τ as
// committed tokens per round with a 95% interval over prompts, and trie nodes per round.
#include <flashmap/engine.h>
#include <flashmap/tokenizer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/generate.h"
#include "core/rng.h"
#include "cpu/proposers.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "specdec/tree.h"

using namespace flashmap;

namespace {

struct Config {
  std::string name;
  int paths = 0;   // noise draws decoded greedily
  int budget = 0;  // trie nodes allowed (0: only the paths)
};

std::vector<std::string> read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (fs::is_regular_file(path)) {
    files.push_back(path);
  } else {
    for (const auto& e : fs::directory_iterator(path)) {
      const auto p = e.path().string();
      if (e.is_regular_file() && !p.ends_with(".dat") && !p.ends_with(".u8")) files.push_back(p);
    }
    std::sort(files.begin(), files.end());
  }
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t end = text.find("\n%\n", pos);
      if (end == std::string::npos) end = text.size();
      std::string rec = text.substr(pos, end - pos);
      while (!rec.empty() && (rec.front() == '\n' || rec.front() == '%')) rec.erase(0, 1);
      while (!rec.empty() && (rec.back() == '\n' || rec.back() == '%')) rec.pop_back();
      if (rec.find_first_not_of(" \t\n") != std::string::npos) docs.push_back(rec + "\n");
      pos = end + 3;
    }
  }
  return docs;
}

// Tokens of `truth` matched from the anchor: what a trie verification commits before the bonus.
int matched_depth(const DraftTrie& trie, std::span<const int32_t> truth) {
  int node = -1, d = 0;
  for (int32_t t : truth) {
    node = trie.child(node, t);
    if (node < 0) break;
    ++d;
  }
  return d;
}

struct Result {
  std::vector<double> tau_by_prompt;
  double rounds = 0, tokens = 0, nodes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string target_dir = "models/default/target", draft_dir = "models/default/draft",
              corpus = "/usr/share/games/fortunes";
  int n_prompts = 32, n_tokens = 96, steps = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--target")
      target_dir = v;
    else if (a == "--draft")
      draft_dir = v;
    else if (a == "--corpus")
      corpus = v;
    else if (a == "--prompts")
      n_prompts = std::stoi(v);
    else if (a == "--tokens")
      n_tokens = std::stoi(v);
    else if (a == "--steps")
      steps = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  Qwen3Model target(target_dir);
  FlashMapModel model(draft_dir, target);
  const auto tok = Tokenizer::from_dir(target_dir);
  target.set_sampled_vocab(int64_t(tok.vocab_size()));
  const int64_t V = target.config().vocab_size;
  const int K = model.block_size();
  const auto taps = model.target_layer_ids();
  const int64_t F = int64_t(taps.size()) * target.config().hidden_size;

  // Held-out prompts.
  auto docs = read_corpus(corpus);
  docs.erase(docs.begin(), docs.end() - std::max<ptrdiff_t>(ptrdiff_t(docs.size()) / 50, 1));
  std::mt19937_64 gen(1);
  std::vector<std::vector<int32_t>> prompts;
  for (int tries = 0; int(prompts.size()) < n_prompts && tries < 100 * n_prompts; ++tries) {
    auto ids = tok.encode(docs[gen() % docs.size()]);
    if (ids.size() < 4) continue;
    ids.resize(std::min<size_t>(ids.size(), 16));
    prompts.push_back(ids);
  }

  std::vector<Config> configs = {
      {"paths:1", 1, 0},          {"paths:2", 2, 0},          {"paths:4", 4, 0},
      {"paths:8", 8, 0},          {"paths:16", 16, 0},        {"topk:16", 0, 16},
      {"topk:32", 0, 32},         {"topk:64", 0, 64},         {"topk:128", 0, 128},
      {"paths:4+topk:32", 4, 32}, {"paths:8+topk:64", 8, 64}, {"paths:16+topk:128", 16, 128}};
  std::vector<Result> results(configs.size());
  Result engine;

  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    // The target's greedy continuation, and its features at every position (one forward).
    GenerateOptions o;
    o.max_new_tokens = n_tokens;
    const auto cont = generate(target, nullptr, prompts[pi], o).ids;
    std::vector<int32_t> S = prompts[pi];
    S.insert(S.end(), cont.begin(), cont.end());
    KVCache cache = target.new_cache();
    Qwen3Model::Output out;
    Qwen3Model::SeqInput in{&cache, S};
    target.forward({&in, 1}, Qwen3Model::Logits::None, taps, out);
    const int64_t P = int64_t(prompts[pi].size()), L = int64_t(S.size());
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Config& cfg = configs[ci];
      FlashMapContext ctx = model.new_context();
      model.extend_context(ctx, out.features.data(), P);
      int64_t c = P;  // the anchor's position: S[c] is the target's token after the prompt
      double rounds = 0, tokens = 0, nodes = 0;
      std::vector<float> logits(size_t(K * V));
      while (c + 1 < L) {
        const auto truth = std::span<const int32_t>(S).subspan(
            size_t(c + 1), size_t(std::min<int64_t>(K, L - c - 1)));
        DraftTrie trie;
        std::vector<std::vector<float>> lp0;
        const int draws = std::max(cfg.paths, 1);
        for (int d = 0; d < draws; ++d) {
          Rng rng(uint64_t(pi) * 1000003u + uint64_t(c) * 7919u + uint64_t(d) + 1);
          FlashMapModel::Request req{
              &ctx, S[size_t(c)], {FlashMapModel::Noise::Draw, nullptr, &rng}};
          model.draft({&req, 1}, steps, logits.data());
          target.mask_padding(logits.data(), K);
          if (d == 0 && cfg.budget > 0)
            for (int k = 0; k < K; ++k)
              lp0.push_back(log_softmax_row(logits.data() + int64_t(k) * V, V));
          if (cfg.paths > 0) {
            int node = -1;
            for (int k = 0; k < K; ++k)
              node = trie.insert(node, argmax(logits.data() + int64_t(k) * V, V));
          }
        }
        if (cfg.budget > 0) trie.expand_topk(lp0, cfg.budget);
        const int depth = matched_depth(trie, truth);
        rounds += 1;
        tokens += depth + 1;
        nodes += double(trie.nodes());
        model.extend_context(ctx, out.features.data() + c * F, depth + 1);
        c += depth + 1;
      }
      results[ci].tau_by_prompt.push_back(tokens / rounds);
      results[ci].rounds += rounds;
      results[ci].tokens += tokens;
      results[ci].nodes += nodes;
    }
    // The engine itself, one draft per round (its own noise stream): the simulation's paths:1
    // must agree with it within the intervals.
    FlashMapProposer proposer(model, steps);
    GenerateOptions eo;
    eo.max_new_tokens = n_tokens;
    eo.seed = pi + 1;
    const auto r = generate(target, &proposer, prompts[pi], eo);
    if (r.ids != cont) std::fprintf(stderr, "warning: speculative output differs from greedy\n");
    double committed = 0;
    for (int a : r.acceptance_lengths) committed += a;
    engine.tau_by_prompt.push_back(r.acceptance_length());
    engine.rounds += double(r.acceptance_lengths.size());
    engine.tokens += committed;
    engine.nodes += double(K) * double(r.acceptance_lengths.size());
    std::fprintf(stderr, "prompt %zu/%zu\n", pi + 1, prompts.size());
  }

  std::printf("pair: %s + %s, %d step(s), block %d, %zu prompts x %d greedy tokens\n\n",
              target_dir.c_str(), draft_dir.c_str(), steps, K, prompts.size(), n_tokens);
  std::printf(
      "| candidates | tau (tokens / verify) | 95%% CI over prompts | trie nodes / round | tau / "
      "tau(paths:1) |\n");
  std::printf("|---|---|---|---|---|\n");
  const double base = results[0].tokens / results[0].rounds;
  configs.push_back({"engine (generate, 1 draft)", 1, 0});
  results.push_back(engine);
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const auto& r = results[ci];
    const auto& t = r.tau_by_prompt;
    double m = 0;
    for (double x : t) m += x;
    m /= double(t.size());
    double var = 0;
    for (double x : t) var += (x - m) * (x - m);
    const double half = 1.96 * std::sqrt(var / std::max<double>(double(t.size()) - 1, 1)) /
                        std::sqrt(double(t.size()));
    const double tau = r.tokens / r.rounds;
    std::printf("| %s | %.3f | %.3f ± %.3f | %.1f | %.3f |\n", configs[ci].name.c_str(), tau, m,
                half, r.nodes / r.rounds, tau / base);
  }
  return 0;
}
