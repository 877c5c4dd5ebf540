// HybridProposer (proposers.h): prompt lookup where the text repeats, the trained drafter
// elsewhere, chosen per sequence and round.
#include <algorithm>
#include <vector>

#include "core/check.h"
#include "cpu/proposers.h"

namespace flashmap {

namespace {
// The lookup drafts at most the drafter's block (so that a round's verify shape is the one the
// drafter has), from matches of min_match tokens up: a shorter match is no evidence of a
// quotation, and below it the drafter proposes better.
NgramOptions lookup_options(const BlockProposer& drafter, int min_match, int max_match) {
  FLASHMAP_CHECK(min_match >= 1 && min_match <= NgramOptions::kMaxN,
                 "--hybrid-ngram {}: must be in [1, {}]", min_match, NgramOptions::kMaxN);
  FLASHMAP_CHECK(drafter.block_size() <= NgramOptions::kMaxBlock,
                 "--hybrid-ngram: the drafter's block of {} is above the lookup's limit of {}",
                 drafter.block_size(), NgramOptions::kMaxBlock);
  return NgramOptions{min_match, std::max(min_match, max_match), drafter.block_size()};
}
const HybridContext& hybrid(const DraftState& s) {
  return std::get<HybridContext>(s);
}
}  // namespace

HybridProposer::HybridProposer(const BlockProposer& drafter, int min_match, int max_match)
    : drafter_(drafter), lookup_(lookup_options(drafter, min_match, max_match)) {}

DraftState HybridProposer::begin() const {
  return HybridContext{std::make_unique<DraftState>(drafter_.begin()),
                       std::make_unique<DraftState>(lookup_.begin())};
}

void HybridProposer::commit(DraftState& state, const float* features, int64_t n,
                            std::span<const int32_t> tokens) const {
  const HybridContext& h = hybrid(state);
  drafter_.commit(*h.drafter, features, n, tokens);
  lookup_.commit(*h.lookup, features, n, tokens);
}

void HybridProposer::propose(std::span<const Seq> batch) const {
  std::vector<Seq> drafted;
  for (const Seq& s : batch) {
    if (s.lookup) {
      Seq lookup = s;
      lookup.state = hybrid(*s.state).lookup.get();
      lookup_.propose({&lookup, 1});
      if (!s.out->tokens.empty()) continue;
    }
    // The lookup marked the (empty) proposal one-hot; the drafter's carries its q.
    s.out->one_hot = false;
    Seq d = s;
    d.state = hybrid(*s.state).drafter.get();
    drafted.push_back(d);
  }
  if (drafted.empty()) return;
  drafter_.propose(drafted);
  for (const Seq& s : drafted) s.out->source = Proposal::Source::Drafter;
}

std::optional<DraftState> HybridProposer::fork(const DraftState& from, int64_t length) const {
  auto drafter = drafter_.fork(*hybrid(from).drafter, length);
  auto lookup = lookup_.fork(*hybrid(from).lookup, length);
  if (!drafter || !lookup) return std::nullopt;
  return HybridContext{std::make_unique<DraftState>(std::move(*drafter)),
                       std::make_unique<DraftState>(std::move(*lookup))};
}

int64_t HybridProposer::context_length(const DraftState& state) const {
  // The drafter's context may hold fewer positions than the index (which holds every token).
  return drafter_.context_length(*hybrid(state).drafter);
}

size_t HybridProposer::bytes(const DraftState& state) const {
  return drafter_.bytes(*hybrid(state).drafter) + lookup_.bytes(*hybrid(state).lookup);
}

}  // namespace flashmap
