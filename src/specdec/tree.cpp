#include "specdec/tree.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <queue>

#include "core/check.h"

namespace flashmap {

namespace {
int parse_count(const std::string& spec, const std::string& text, int lo, int hi,
                const std::string& what) {
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  FLASHMAP_CHECK(ec == std::errc() && end == text.data() + text.size() && n >= lo && n <= hi,
                 "{}: '{}' needs a count in [{}, {}] after the colon, got '{}'", what, spec, lo, hi,
                 text);
  return n;
}
}  // namespace

std::string TreeShape::name() const {
  if (!active()) return "off";
  if (budget == 0) return fmt::format("paths:{}", paths);
  if (paths == 0) return fmt::format("topk:{}", budget);
  return fmt::format("paths:{}+topk:{}", paths, budget);
}

TreeShape TreeShape::parse(const std::string& spec, const std::string& what) {
  TreeShape t;
  if (spec == "off") return t;
  size_t start = 0;
  bool any = false;
  while (start <= spec.size()) {
    const size_t plus = std::min(spec.find('+', start), spec.size());
    const std::string part = spec.substr(start, plus - start);
    if (part.starts_with("paths:") && t.paths == 0) {
      t.paths = parse_count(spec, part.substr(6), 1, kMaxTreePaths, what);
    } else if (part.starts_with("topk:") && t.budget == 0) {
      t.budget = parse_count(spec, part.substr(5), 1, kMaxTreeNodes, what);
    } else {
      FLASHMAP_CHECK(
          false, "{}: '{}' is not a tree; expected off, auto, paths:N, topk:B or paths:N+topk:B",
          what, spec);
    }
    any = true;
    start = plus + 1;
  }
  FLASHMAP_CHECK(any, "{}: empty tree", what);
  return t;
}

std::vector<float> log_softmax_row(const float* x, int64_t V) {
  const float mx = *std::max_element(x, x + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(x[v]) - mx);
  const float lse = float(double(mx) + std::log(sum));
  std::vector<float> out(x, x + V);
  for (auto& v : out) v -= lse;
  return out;
}

int DraftTrie::insert(int parent, int32_t token, float conf) {
  auto& kids = children_[size_t(parent + 1)];
  if (auto it = kids.find(token); it != kids.end()) return it->second;
  const int id = nodes();
  kids.emplace(token, id);
  tokens.push_back(token);
  parents.push_back(parent);
  confidence.push_back(conf);
  children_.emplace_back();
  return id;
}

int DraftTrie::child(int parent, int32_t token) const {
  const auto& kids = children_[size_t(parent + 1)];
  const auto it = kids.find(token);
  return it == kids.end() ? -1 : it->second;
}

bool DraftTrie::insert_path(std::span<const int32_t> block, int depth, int max_nodes,
                            std::span<const float> conf) {
  int node = -1;
  for (int k = 0; k < depth && k < int(block.size()); ++k) {
    const int next = child(node, block[size_t(k)]);
    if (next < 0 && nodes() >= max_nodes) return false;
    node = next >= 0
               ? next
               : insert(node, block[size_t(k)], size_t(k) < conf.size() ? conf[size_t(k)] : 1);
  }
  return true;
}

void DraftTrie::expand_topk(const std::vector<std::vector<float>>& log_probs, int max_nodes) {
  const int K = int(log_probs.size());
  if (K == 0 || nodes() >= max_nodes) return;
  const int64_t V = int64_t(log_probs[0].size());
  // Per slot, the tokens in order of probability: a node's next sibling candidate is the
  // next in this order (only as many as the budget can use are sorted).
  const int64_t keep = topk_keep(V, max_nodes);
  std::vector<std::vector<std::pair<int32_t, float>>> ranked(static_cast<size_t>(K));
  std::vector<int32_t> o(static_cast<size_t>(V));
  for (int k = 0; k < K; ++k) {
    for (int64_t v = 0; v < V; ++v) o[size_t(v)] = int32_t(v);
    const auto& lp = log_probs[size_t(k)];
    std::partial_sort(o.begin(), o.begin() + keep, o.end(), [&](int32_t a, int32_t b) {
      return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
    });
    for (int64_t r = 0; r < keep; ++r)
      ranked[size_t(k)].push_back({o[size_t(r)], lp[size_t(o[size_t(r)])]});
  }
  expand_ranked(ranked, max_nodes);
}

void DraftTrie::expand_ranked(const std::vector<std::vector<std::pair<int32_t, float>>>& ranked,
                              int max_nodes) {
  const int K = int(ranked.size());
  if (K == 0 || nodes() >= max_nodes) return;
  for (const auto& r : ranked) FLASHMAP_CHECK(!r.empty(), "expand_ranked: a slot without tokens");
  struct Cand {
    double score, parent_score;
    int parent, depth;
    int64_t rank;
    bool operator<(const Cand& o) const { return score < o.score; }
  };
  std::priority_queue<Cand> heap;
  heap.push({ranked[0][0].second, 0.0, -1, 0, 0});
  while (!heap.empty() && nodes() < max_nodes) {
    const Cand c = heap.top();
    heap.pop();
    const auto& slot = ranked[size_t(c.depth)];
    const int32_t tok = slot[size_t(c.rank)].first;
    // May exist already (a path put it there, with its own confidence).
    const int node = insert(c.parent, tok, float(std::exp(double(slot[size_t(c.rank)].second))));
    if (c.rank + 1 < int64_t(slot.size()))
      heap.push({c.parent_score + slot[size_t(c.rank + 1)].second, c.parent_score, c.parent,
                 c.depth, c.rank + 1});
    if (c.depth + 1 < K)
      heap.push({c.score + ranked[size_t(c.depth + 1)][0].second, c.score, node, c.depth + 1, 0});
  }
}

}  // namespace flashmap
