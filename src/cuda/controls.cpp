#include "cuda/controls.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace flashmap::cuda {

static_assert(kLogprobTop == kMaxTopLogprobs,
              "a device logprob holds as many alternatives as a "
              "request may ask for");

// --- DeviceControls

DeviceControls::DeviceControls(Context& ctx) : ctx_(ctx) {
  check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate (controls)");
}

DeviceControls::~DeviceControls() {
  if (copied_) cudaEventDestroy(copied_);
}

void DeviceControls::clear() {
  entries_.clear();
  packed_.clear();
}

template <typename T>
size_t DeviceControls::append(const std::vector<T>& v) {
  // 16-byte alignment for every array (ControlEdit is 4-byte aligned; cudaMalloc's base is 256).
  const size_t at = (packed_.size() + 15) & ~size_t(15);
  packed_.resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(packed_.data() + at, v.data(), v.size() * sizeof(T));
  return at;
}

int DeviceControls::add(const ControlProgram& p) {
  FLASHMAP_ASSERT(p.rows >= 1 && p.masked_rows <= p.rows &&
                  p.masks.size() == size_t(p.masked_rows) * size_t(p.mask_words()));
  Entry e;
  e.edits = append(p.edits);
  e.biases = append(p.biases);
  e.masks = append(p.masks);
  e.n_edits = int(p.edits.size());
  e.rows = p.rows;
  e.masked_rows = p.masked_rows;
  e.vocab = p.vocab;
  e.scalars = {p.generated, p.min_tokens, p.repetition, p.frequency, p.presence, p.penalties};
  entries_.push_back(e);
  return int(entries_.size()) - 1;
}

void DeviceControls::upload() {
  if (packed_.empty()) return;
  // The previous batch's copy reads the staging memory until it is done.
  if (in_flight_) check(cudaEventSynchronize(copied_), "cudaEventSynchronize (controls upload)");
  in_flight_ = false;
  const size_t n = packed_.size();
  if (staging_.size() < n) staging_ = HostBuffer<uint8_t>(std::max(n, staging_.size() * 2));
  if (device_.size() < n) {
    ctx_.sync();  // kernels of earlier batches may still read the old buffer
    device_ = DeviceBuffer<uint8_t>(std::max(n, device_.size() * 2));
  }
  std::memcpy(staging_.data(), packed_.data(), n);
  check(cudaMemcpyAsync(device_.data(), staging_.data(), n, cudaMemcpyHostToDevice, ctx_.stream()),
        "cudaMemcpyAsync H2D (control programs)");
  check(cudaEventRecord(copied_, ctx_.stream()), "cudaEventRecord (controls upload)");
  in_flight_ = true;
}

void DeviceControls::apply(int i, float* d_logits, const int32_t* d_drafts) {
  const Entry& e = entries_.at(size_t(i));
  const uint8_t* base = device_.data();
  const cudaStream_t s = ctx_.stream();
  if (e.masked_rows > 0)
    check(launch_control_masks(d_logits, e.vocab, e.masked_rows,
                               reinterpret_cast<const uint32_t*>(base + e.masks), s),
          "control_masks");
  check(launch_control_edits(d_logits, e.vocab, e.rows, d_drafts,
                             reinterpret_cast<const ControlEdit*>(base + e.edits), e.n_edits,
                             reinterpret_cast<const float*>(base + e.biases), e.scalars, s),
        "control_edits");
}

// --- DeviceLogprobs

DeviceLogprobs::DeviceLogprobs(Context& ctx, int64_t vocab, int max_rows)
    : ctx_(ctx), vocab_(vocab), max_rows_(max_rows) {
  FLASHMAP_CHECK(vocab > 0 && max_rows > 0, "DeviceLogprobs: vocab {} and max_rows {} must be > 0",
                 vocab, max_rows);
}

void DeviceLogprobs::reserve(size_t seqs) {
  if (seqs <= seqs_) return;
  ctx_.sync();  // earlier results may still be in flight to the old buffers
  const size_t n = std::max(seqs, seqs_ * 2);
  device_ = DeviceBuffer<DeviceLogprob>(n * size_t(max_rows_));
  host_ = HostBuffer<DeviceLogprob>(n * size_t(max_rows_));
  seqs_ = n;
}

void DeviceLogprobs::enqueue(size_t i, const float* d_logits, int rows, const int32_t* d_accepted,
                             const int32_t* d_tokens, const int32_t* d_last, int top) {
  FLASHMAP_ASSERT(i < seqs_ && rows >= 1 && rows <= max_rows_);
  FLASHMAP_CHECK(top >= 0 && top <= kLogprobTop, "logprobs: {} alternatives, at most {}", top,
                 kLogprobTop);
  DeviceLogprob* d = device_.data() + i * size_t(max_rows_);
  check(launch_token_logprobs(d_logits, vocab_, rows, d_accepted, d_tokens, d_last, top, d,
                              ctx_.stream()),
        "token_logprobs");
  check(
      cudaMemcpyAsync(host_.data() + i * size_t(max_rows_), d, size_t(rows) * sizeof(DeviceLogprob),
                      cudaMemcpyDeviceToHost, ctx_.stream()),
      "cudaMemcpyAsync D2H (logprobs)");
}

std::vector<TokenLogprob> DeviceLogprobs::results(size_t i, int n, int top) const {
  FLASHMAP_ASSERT(i < seqs_ && n >= 0 && n <= max_rows_);
  const int shown = int(std::min<int64_t>(top, vocab_));
  std::vector<TokenLogprob> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const DeviceLogprob& d = host_.data()[i * size_t(max_rows_) + size_t(r)];
    TokenLogprob& t = out[size_t(r)];
    t.token = d.token;
    t.logprob = d.logprob;
    t.rank = d.rank;
    for (int j = 0; j < shown; ++j) t.top.emplace_back(d.top_ids[j], d.top_logprobs[j]);
  }
  return out;
}

}  // namespace flashmap::cuda
