#include "spec/decoder.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace flashmap {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

double GenerateResult::acceptance_length() const {
  if (acceptance_lengths.empty()) return 0.0;
  double s = 0;
  for (int a : acceptance_lengths) s += a;
  return s / double(acceptance_lengths.size());
}

void validate_request(const Qwen3Model& target, std::span<const int32_t> prompt,
                      const GenerateOptions& options) {
  const int64_t V = target.config().vocab_size;
  FLASHMAP_CHECK(!prompt.empty(), "the prompt is empty: give at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    FLASHMAP_CHECK(prompt[i] >= 0 && prompt[i] < V,
                   "prompt token {} (at index {}) is outside the vocabulary [0, {})", prompt[i], i,
                   V);
  FLASHMAP_CHECK(options.max_new_tokens > 0, "max_new_tokens must be > 0, got {}",
                 options.max_new_tokens);
  for (int32_t s : options.stop_ids)
    FLASHMAP_CHECK(s >= 0 && s < V, "stop token {} is outside the vocabulary [0, {})", s, V);
  options.sampling.validate();
  const int64_t need = int64_t(prompt.size()) + options.max_new_tokens;
  FLASHMAP_CHECK(need <= target.config().max_position_embeddings,
                 "prompt ({} tokens) + max_new_tokens ({}) exceeds the target's context of {} "
                 "positions",
                 prompt.size(), options.max_new_tokens, target.config().max_position_embeddings);
}

int verify_greedy(std::span<const int32_t> draft, const float* logits, int64_t V, int32_t& bonus) {
  int accepted = 0;
  while (accepted < int(draft.size()) &&
         argmax(logits + accepted * V, V) == draft[size_t(accepted)])
    ++accepted;
  bonus = argmax(logits + accepted * V, V);
  return accepted;
}

int verify_sampled(std::span<const int32_t> draft, const float* p, const float* q, int64_t V,
                   Rng& rng, int32_t& bonus) {
  const int K = int(draft.size());
  int accepted = 0;
  // u·q < p accepts with probability min(1, p/q), as the reference writes it; a slot whose
  // target probability is zero is never accepted.
  while (accepted < K) {
    const int32_t tok = draft[size_t(accepted)];
    const float pk = p[accepted * V + tok], qk = q[accepted * V + tok];
    if (!(rng.uniform() * qk < pk)) break;
    ++accepted;
  }
  const float* target = p + accepted * V;
  if (accepted == K) {
    bonus = sample({target, size_t(V)}, rng);
    return accepted;
  }
  std::vector<float> residual(static_cast<size_t>(V));
  const float* qk = q + accepted * V;
  double mass = 0;
  for (int64_t i = 0; i < V; ++i) {
    residual[size_t(i)] = std::max(target[i] - qk[i], 0.0f);
    mass += residual[size_t(i)];
  }
  bonus = mass > 0 ? sample(residual, rng) : sample({target, size_t(V)}, rng);
  return accepted;
}

int verify_keyed(std::span<const int32_t> draft, const float* logits, int64_t V,
                 const SamplingParams& sp, uint64_t seed, int64_t first_position,
                 std::vector<float>& probs, int32_t& bonus) {
  probs.resize(size_t(V));
  for (int k = 0;; ++k) {
    filtered_probs(logits + k * V, V, sp, probs.data());
    const int32_t t = sample_keyed(probs, seed, first_position + k);
    if (k == int(draft.size()) || draft[size_t(k)] != t) {
      bonus = t;
      return k;
    }
  }
}

int verify_block(SeqSampler& s, std::span<const int32_t> draft, const float* logits, const float* q,
                 int64_t V, int64_t first_position, int32_t& bonus) {
  if (s.params.greedy()) return verify_greedy(draft, logits, V, bonus);
  if (s.keyed())
    return verify_keyed(draft, logits, V, s.params, s.seed, first_position, s.scratch, bonus);
  const size_t n = draft.size();
  s.scratch.resize((n + 1) * size_t(V));
  for (size_t k = 0; k <= n; ++k)
    filtered_probs(logits + int64_t(k) * V, V, s.params, s.scratch.data() + int64_t(k) * V);
  return verify_sampled(draft, s.scratch.data(), q, V, s.rng, bonus);
}

int block_room(int K, int64_t cache_length, int64_t max_positions, int64_t remaining) {
  const int64_t by_context = max_positions - cache_length - 1;
  return int(std::max<int64_t>(0, std::min({int64_t(K), by_context, remaining - 1})));
}

GenerateResult generate(const Qwen3Model& target, const Drafter* drafter,
                        std::span<const int32_t> prompt, const GenerateOptions& opt) {
  validate_request(target, prompt, opt);
  const auto t_start = Clock::now();
  const int64_t V = target.config().vocab_size;
  const int64_t max_positions = target.config().max_position_embeddings;
  SeqSampler sampler(opt.sampling, opt.seed, opt.seeded);
  GenerateResult res;
  auto is_stop = [&](int32_t t) {
    return std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end();
  };
  // Emits new tokens, cut at a stop token and at max_new_tokens; returns false when done.
  auto emit = [&](std::vector<int32_t> fresh) {
    bool stopped = false;
    for (size_t i = 0; i < fresh.size(); ++i)
      if (is_stop(fresh[i])) {
        fresh.resize(i + 1);
        stopped = true;
        break;
      }
    const size_t room = size_t(opt.max_new_tokens) - res.ids.size();
    std::vector<int32_t> shown(fresh.begin(), fresh.begin() + std::min(room, fresh.size()));
    res.ids.insert(res.ids.end(), shown.begin(), shown.end());
    if (opt.on_tokens && !shown.empty()) opt.on_tokens(shown);
    if (stopped && fresh.size() <= room) {
      res.finish_reason = "stop";
      return false;
    }
    if (res.ids.size() >= size_t(opt.max_new_tokens)) {
      res.finish_reason = "length";
      return false;
    }
    return true;
  };

  // Prefill: the prompt's last logits and the drafter's features of every prompt position.
  KVCache cache = target.new_cache();
  Qwen3Model::Output out;
  const std::span<const int> taps = drafter ? drafter->target_layer_ids() : std::span<const int>{};
  {
    auto t0 = Clock::now();
    Qwen3Model::SeqInput seq{&cache, prompt};
    target.forward({&seq, 1}, Qwen3Model::Logits::Last, taps, out);
    res.times.prefill_ms = ms_since(t0);
  }
  int32_t first = sampler.pick(out.logits.data(), V, int64_t(prompt.size()));
  std::unique_ptr<DraftState> state;
  if (drafter) {
    state = drafter->begin();
    drafter->commit(*state, out.features.data(), int64_t(prompt.size()), prompt);
  }
  bool going = emit({first});
  int32_t anchor = first;
  const int K = drafter ? drafter->block_size() : 0;
  if (drafter) res.accepted_at.assign(size_t(K), 0);
  Proposal proposal;
  std::vector<int32_t> block;

  while (going) {
    ++res.rounds;
    const int64_t anchor_pos = cache.length;
    const int room = block_room(K, anchor_pos, max_positions,
                                int64_t(opt.max_new_tokens) - int64_t(res.ids.size()));
    auto t0 = Clock::now();
    if (room > 0) {
      Drafter::Seq ds{state.get(), anchor, anchor_pos + 1, &sampler, &proposal};
      drafter->propose({&ds, 1});
      res.times.draft_ms += ms_since(t0);
      t0 = Clock::now();
    }
    block.assign(1, anchor);
    block.insert(block.end(), proposal.tokens.begin(), proposal.tokens.begin() + room);
    Qwen3Model::SeqInput seq{&cache, block};
    // A round without drafts still feeds the drafter's taps, so that it can draft next round.
    target.forward({&seq, 1}, room > 0 ? Qwen3Model::Logits::All : Qwen3Model::Logits::Last, taps,
                   out);
    res.times.verify_ms += ms_since(t0);

    t0 = Clock::now();
    int32_t bonus = 0;
    const std::span<const int32_t> draft = std::span<const int32_t>(block).subspan(1);
    const int accepted = verify_block(sampler, draft, out.logits.data(),
                                      proposal.probs.empty() ? nullptr : proposal.probs.data(), V,
                                      anchor_pos + 1, bonus);
    for (int k = 0; k < accepted; ++k) ++res.accepted_at[size_t(k)];
    std::vector<int32_t> fresh(draft.begin(), draft.begin() + accepted);
    fresh.push_back(bonus);
    size_t committed = fresh.size();
    for (size_t i = 0; i < fresh.size(); ++i)
      if (is_stop(fresh[i])) {
        committed = i + 1;
        break;
      }
    res.acceptance_lengths.push_back(int(committed));
    going = emit(fresh);
    // Keep the anchor and the accepted drafts; the bonus token is the next anchor.
    cache.truncate(anchor_pos + accepted + 1);
    if (going && drafter) {
      drafter->commit(*state, out.features.data(), accepted + 1,
                      std::span<const int32_t>(block).first(size_t(accepted) + 1));
    }
    anchor = bonus;
    res.times.accept_ms += ms_since(t0);
  }
  res.times.total_ms = ms_since(t_start);
  return res;
}

}  // namespace flashmap
