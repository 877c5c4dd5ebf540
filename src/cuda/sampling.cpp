#include "cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "core/check.h"
#include "cuda/kernels.h"

namespace flashmap::cuda {

Sampler::Sampler(Context& ctx, int64_t vocab, int max_rows)
    : ctx_(ctx), vocab_(vocab), max_rows_(0), state_(2), pick_probs_(size_t(vocab)) {
  FLASHMAP_CHECK(vocab > 0 && max_rows > 0, "cuda::Sampler: vocab {} and max_rows {} must be > 0",
                 vocab, max_rows);
  reserve(max_rows);
  seed(0);
}

void Sampler::reserve(int max_rows) {
  if (max_rows <= max_rows_) return;
  const int64_t vocab = vocab_;
  // CUB's segmented sort counts items in int; the key's low word holds the id.
  FLASHMAP_CHECK(vocab * int64_t(max_rows) <= INT_MAX && vocab <= UINT32_MAX,
                 "cuda::Sampler: {} rows of vocabulary {} exceed the sort's int range", max_rows,
                 vocab);
  ctx_.sync();  // queued sorts may still use the old buffers
  keys_ = DeviceBuffer<uint64_t>(size_t(vocab) * size_t(max_rows));
  sorted_ = DeviceBuffer<uint64_t>(size_t(vocab) * size_t(max_rows));
  offsets_ = DeviceBuffer<int>(size_t(max_rows) + 1);
  argmax_ = DeviceBuffer<int32_t>(size_t(max_rows));
  std::vector<int> off(size_t(max_rows) + 1);
  for (int r = 0; r <= max_rows; ++r) off[size_t(r)] = int(int64_t(r) * vocab);
  offsets_.upload(ctx_, off.data(), off.size());
  // Size CUB's storage once for the largest sort, so that later calls (and graph captures) never
  // allocate.
  size_t bytes = 0;
  check(sort_keys_descending(nullptr, bytes, keys_.data(), sorted_.data(), max_rows, vocab,
                             offsets_.data(), ctx_.stream()),
        "cub::DeviceSegmentedRadixSort (size query)");
  sort_temp_ =
      DeviceBuffer<uint8_t>(std::max<size_t>(bytes, 16));  // never null: null is a size query
  max_rows_ = max_rows;
}

FilterRow Sampler::filter_row(int32_t src, int32_t dst, const SamplingParams& p, int64_t vocab) {
  p.validate();
  FLASHMAP_CHECK(!p.greedy(), "cuda::Sampler::filter_row needs temperature > 0, got {}",
                 p.temperature);
  FilterRow r;
  r.src = src;
  r.dst = dst;
  r.inv_t = 1.0f / p.temperature;  // the CPU's float reciprocal
  r.top_k = p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  return r;
}

bool Sampler::cuts(const FilterRow& r, int64_t vocab) {
  return (r.top_k > 0 && r.top_k < vocab) || r.top_p < 1.0f || r.min_p > 0.0f;
}

void Sampler::filtered_probs_rows(const float* logits, const FilterRow* d_rows, int n, int cuts,
                                  float* probs) {
  FLASHMAP_CHECK(n >= 0 && cuts >= 0 && cuts <= n,
                 "cuda::Sampler::filtered_probs_rows: {} rows, {} of them cut", n, cuts);
  if (n == 0) return;
  const int64_t V = vocab_;
  cudaStream_t s = ctx_.stream();
  check(launch_softmax_temperature_rows(logits, d_rows, n, V, probs, s),
        "softmax_temperature_rows");
  // As the CPU: no cut, no renormalization. The rows that cut are sorted max_rows() at a time.
  for (int at = 0; at < cuts; at += max_rows_) {
    const int m = std::min(max_rows_, cuts - at);
    check(launch_sort_keys_rows(probs, d_rows + at, m, V, keys_.data(), s), "sort_keys_rows");
    size_t bytes = sort_temp_.size();
    check(sort_keys_descending(sort_temp_.data(), bytes, keys_.data(), sorted_.data(), m, V,
                               offsets_.data(), s),
          "cub::DeviceSegmentedRadixSort::SortKeysDescending");
    check(launch_cut_rows(sorted_.data(), d_rows + at, m, V, probs, s), "cut_rows");
  }
}

void Sampler::verify_items(const float* p, const VerifyItem* d_items, int n) {
  check(launch_verify_items(p, d_items, n, vocab_, ctx_.stream()), "verify_items");
}

void Sampler::sample_items(const float* p, const SampleItem* d_items, int n, int max_rows) {
  check(launch_sample_items(p, d_items, n, max_rows, vocab_, ctx_.stream()), "sample_items");
}

void Sampler::ranked_logprobs(const float* logits, const int32_t* d_src_rows, int n, int keep,
                              int32_t* ids, float* lps) {
  FLASHMAP_CHECK(n >= 0 && keep >= 1 && keep <= vocab_,
                 "cuda::Sampler::ranked_logprobs: {} rows of {} of a vocabulary of {}", n, keep,
                 vocab_);
  cudaStream_t s = ctx_.stream();
  for (int at = 0; at < n; at += max_rows_) {  // max_rows() rows per sort
    const int m = std::min(max_rows_, n - at);
    check(launch_logprob_keys_rows(logits, d_src_rows + at, m, vocab_, keys_.data(), s),
          "logprob_keys_rows");
    size_t bytes = sort_temp_.size();
    check(sort_keys_descending(sort_temp_.data(), bytes, keys_.data(), sorted_.data(), m, vocab_,
                               offsets_.data(), s),
          "cub::DeviceSegmentedRadixSort::SortKeysDescending");
    const int64_t out = int64_t(at) * keep;
    check(launch_ranked_rows(sorted_.data(), m, vocab_, keep, ids + out, lps + out, s),
          "ranked_rows");
  }
}

void Sampler::verify_trees(const TreeItem* d_items, int n) {
  check(launch_verify_trees(d_items, n, vocab_, ctx_.stream()), "verify_trees");
}

void Sampler::seed(uint64_t seed) {
  const uint64_t s[2] = {seed, 0};
  state_.upload(ctx_, s, 2);
  table_ = nullptr;
  table_size_ = 0;
}

void Sampler::use_table(const double* table, uint64_t n) {
  const uint64_t s[2] = {0, 0};
  state_.upload(ctx_, s, 2);
  table_ = table;
  table_size_ = table ? n : 0;
}

void Sampler::init_state(uint64_t* d_state, uint64_t seed) {
  const uint64_t s[2] = {seed, 0};
  // Pageable source: the copy is staged before the call returns.
  check(cudaMemcpyAsync(d_state, s, sizeof(s), cudaMemcpyHostToDevice, ctx_.stream()),
        "cudaMemcpyAsync H2D (generator state)");
}

uint64_t Sampler::counter() const {
  return state_.download(ctx_)[1];
}

void Sampler::check_rows(int rows, const char* what) const {
  FLASHMAP_CHECK(rows >= 1 && rows <= max_rows_, "cuda::Sampler::{}: {} rows, the sampler holds {}",
                 what, rows, max_rows_);
}

void Sampler::filtered_probs(const float* logits, int rows, const SamplingParams& p, float* probs) {
  check_rows(rows, "filtered_probs");
  p.validate();
  FLASHMAP_CHECK(!p.greedy(), "cuda::Sampler::filtered_probs needs temperature > 0, got {}",
                 p.temperature);
  const int64_t V = vocab_;
  cudaStream_t s = ctx_.stream();
  const float inv_t = 1.0f / p.temperature;  // the CPU's float reciprocal
  check(launch_softmax_temperature(logits, rows, V, inv_t, probs, s), "softmax_temperature");
  const bool top_k = p.top_k > 0 && p.top_k < V;
  if (!top_k && p.top_p >= 1.0f && p.min_p <= 0.0f) return;  // as the CPU: no cut, no renorm
  check(launch_sort_keys(probs, rows, V, keys_.data(), s), "sort_keys");
  size_t bytes = sort_temp_.size();
  check(sort_keys_descending(sort_temp_.data(), bytes, keys_.data(), sorted_.data(), rows, V,
                             offsets_.data(), s),
        "cub::DeviceSegmentedRadixSort::SortKeysDescending");
  check(launch_cut(sorted_.data(), rows, V, p.top_k, p.top_p, p.min_p, probs, s), "cut");
}

void Sampler::sample(const float* probs, int rows, int32_t* ids) {
  check_rows(rows, "sample");
  check(launch_sample_rows(probs, rows, vocab_, source(), ids, ctx_.stream()), "sample_rows");
}

void Sampler::pick(const float* logits, const SamplingParams& params, int32_t* id) {
  if (params.greedy()) {
    argmax_rows(logits, 1, vocab_, id, ctx_.stream());
    check(cudaGetLastError(), "argmax_rows");
    return;
  }
  filtered_probs(logits, 1, params, pick_probs_.data());
  sample(pick_probs_.data(), 1, id);
}

void Sampler::sample_keyed(const float* probs, int rows, uint64_t seed, int64_t first_position,
                           int32_t* ids) {
  check(launch_sample_keyed_rows(probs, rows, vocab_, seed, first_position, ids, ctx_.stream()),
        "sample_keyed");
}

void Sampler::pick_keyed(const float* logits, const SamplingParams& params, uint64_t seed,
                         int64_t position, int32_t* id) {
  if (params.greedy()) return pick(logits, params, id);
  filtered_probs(logits, 1, params, pick_probs_.data());
  sample_keyed(pick_probs_.data(), 1, seed, position, id);
}

void Sampler::verify_keyed(const float* p, const int32_t* draft, int K, uint64_t seed,
                           int64_t first_position, RoundResult* result) {
  FLASHMAP_CHECK(K >= 0, "cuda::Sampler::verify_keyed: K = {}", K);
  check(launch_verify_keyed(p, draft, K, vocab_, seed, first_position,
                            reinterpret_cast<int32_t*>(result), ctx_.stream()),
        "verify_keyed");
}

void Sampler::verify_greedy(const float* logits, const int32_t* draft, int K, RoundResult* result) {
  check_rows(K + 1, "verify_greedy");
  ::flashmap::cuda::verify_greedy(logits, vocab_, draft, K, argmax_.data(),
                                  reinterpret_cast<int32_t*>(result), ctx_.stream());
  check(cudaGetLastError(), "verify_greedy");
}

void Sampler::verify_sampled(const float* p, const float* q, const int32_t* draft, int K,
                             RoundResult* result) {
  FLASHMAP_CHECK(K >= 0, "cuda::Sampler::verify_sampled: K = {}", K);
  check(launch_verify_sampled(p, q, draft, K, vocab_, source(), reinterpret_cast<int32_t*>(result),
                              ctx_.stream()),
        "verify_sampled");
}

void Sampler::draw_uniforms(int64_t n, double* out) {
  check(launch_draw_uniforms(source(), n, out, ctx_.stream()), "draw_uniforms");
}

}  // namespace flashmap::cuda
