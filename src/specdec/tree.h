// Draft trees: several candidate blocks after one anchor, merged into a token trie
// that the target verifies in one forward (Qwen3Model::SeqInput::parents) and walks by
// sample-and-match (verify.h verify_tree). Candidates: N noise draws of the flow map, each decoded
// as a single draft is (pick_block), and DDTree-style best-first top-k expansion of the first
// draw's per-slot distributions. bench/TREES.md has the offline τ of each shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flashmap {

// log softmax of one row of logits [V] (a slot's log-probabilities for top-k expansion).
std::vector<float> log_softmax_row(const float* logits, int64_t V);

// Which tree a round drafts. off: paths = budget = 0.
struct TreeShape {
  int paths = 0;   // noise draws (each one candidate block)
  int budget = 0;  // trie nodes that top-k expansion of the first draw may fill (0: none)
  bool active() const { return paths > 0 || budget > 0; }
  std::string name() const;
  // "off", "paths:N" (1 <= N <= 64), "topk:B" (1 <= B <= 256) or "paths:N+topk:B"; throws a
  // one-line error naming `what` (the option or field) otherwise.
  static TreeShape parse(const std::string& spec, const std::string& what = "--draft-tree");
};
inline constexpr int kMaxTreePaths = 64;
inline constexpr int kMaxTreeNodes = 256;

// A token trie below the anchor. Nodes are numbered in insertion order, so a node's parent always
// has a smaller number (−1: the anchor): the order the target's tree forward needs.
class DraftTrie {
 public:
  std::vector<int32_t> tokens, parents;  // per node
  // Per node: the drafter's probability of its token given its parent (the first candidate's
  // that made it): what a round weighs to verify fewer nodes (engine/draft_cut.h).
  std::vector<float> confidence;
  int nodes() const { return int(tokens.size()); }
  // The child of `parent` (−1: the anchor) holding `token`, made if new (with `conf`).
  int insert(int parent, int32_t token, float conf = 1.0f);
  // A candidate block's first `depth` tokens as a path from the anchor (each new node with its
  // slot's confidence, when given); stops early (returning false) when the trie would pass
  // `max_nodes`.
  bool insert_path(std::span<const int32_t> block, int depth, int max_nodes,
                   std::span<const float> conf = {});
  // Best-first top-k expansion (DDTree): candidates are prefixes scored by their summed
  // log-probability under the per-slot distributions `log_probs` [depth][V] (slots independent
  // given the noise), added in order of score until the trie holds `max_nodes` nodes.
  void expand_topk(const std::vector<std::vector<float>>& log_probs, int max_nodes);
  // The same from each slot's most likely tokens only: ranked[k] holds slot k's first
  // topk_keep(V, max_nodes) (token, log-probability) pairs in expand_topk's order (log-probability
  // descending, the lower id first among equals), all that the expansion can reach (a device
  // computes them without sending the rows).
  void expand_ranked(const std::vector<std::vector<std::pair<int32_t, float>>>& ranked,
                     int max_nodes);
  // How many of a slot's tokens top-k expansion up to max_nodes nodes can use.
  static int64_t topk_keep(int64_t V, int max_nodes) { return std::min<int64_t>(V, max_nodes + 1); }
  // The child of `parent` holding `token`, or −1.
  int child(int parent, int32_t token) const;

 private:
  std::vector<std::map<int32_t, int>> children_{1};  // [0]: the anchor's, [n + 1]: node n's
};

}  // namespace flashmap
