// Logit controls and logprobs on the device, against the host functions they mirror:
// apply_program (src/specdec/controls.cpp, itself ControlState::apply bit for bit) and
// token_logprob (src/specdec/logprobs.cpp). The controls are the same float operations in the
// same order per id, written with the _rn intrinsics so that nvcc contracts none of them into an
// FMA the host does not form; the logprobs' double sums are the host's up to their order.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "cuda/control_kernels.h"

namespace flashmap::cuda {
namespace {

constexpr int kThreads = 256;    // the pointwise kernels
constexpr int kLpThreads = 512;  // the logprobs kernel: one block per row, a multiple of 32
constexpr unsigned kMaxBlocks = 4096;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < int64_t(kMaxBlocks) ? (b > 0 ? b : 1) : kMaxBlocks);
}

__device__ __forceinline__ float neg_inf() {
  return __int_as_float(int(0xff800000u));
}

__global__ void control_masks_kernel(float* logits, int64_t V, const uint32_t* masks, int64_t W) {
  float* row = logits + int64_t(blockIdx.y) * V;
  const uint32_t* m = masks + int64_t(blockIdx.y) * W;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < V;
       v += int64_t(gridDim.x) * blockDim.x)
    if (!(m[v >> 5] >> (v & 31) & 1u)) row[v] = neg_inf();
}

// apply_program's penalize(): the repetition penalty, then −(frequency·n + presence).
__device__ __forceinline__ float penalize(float x, int n, const ControlScalars& s) {
  if (s.repetition != 1.0f) x = x > 0.0f ? __fdiv_rn(x, s.repetition) : __fmul_rn(x, s.repetition);
  if (n > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn(s.frequency, __int2float_rn(n)), s.presence));
  return x;
}

__device__ bool has_edit(const ControlEdit* edits, int n, int32_t id) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (edits[mid].id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && edits[lo].id == id;
}

// Threads [0, n_edits · rows): edit e on row k (consecutive threads, consecutive edits of a row);
// then, with penalties, threads over (row k, draft j) pairs for j < k: the drafts no edit names,
// each id once per row (at its first occurrence). The two sets touch disjoint (row, id) pairs.
__global__ void control_edits_kernel(float* logits, int64_t V, int rows, const int32_t* drafts,
                                     const ControlEdit* edits, int n_edits, const float* biases,
                                     ControlScalars s, int64_t total) {
  const int64_t edit_threads = int64_t(n_edits) * rows;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    if (t < edit_threads) {
      const int k = int(t / n_edits);
      const ControlEdit e = edits[t % n_edits];
      int occurs = 0;
      for (int j = 0; j < k; ++j) occurs += drafts[j] == e.id;
      float* px = logits + int64_t(k) * V + e.id;
      float x = *px;
      for (int b = 0; b < e.biases; ++b) x = __fadd_rn(x, biases[e.bias_at + b]);
      if ((e.flags & ControlEdit::kStop) && s.generated + k < s.min_tokens) x = neg_inf();
      if (s.penalties && ((e.flags & ControlEdit::kSeen) || occurs > 0))
        x = penalize(x, e.count + occurs, s);
      *px = x;
    } else {
      const int64_t u = t - edit_threads;
      const int k = int(u / (rows - 1)), j = int(u % (rows - 1));
      if (j >= k) continue;
      const int32_t d = drafts[j];
      bool first = true;
      for (int i = 0; i < j; ++i) first = first && drafts[i] != d;
      if (!first || has_edit(edits, n_edits, d)) continue;
      int occurs = 0;
      for (int i = 0; i < k; ++i) occurs += drafts[i] == d;
      float* px = logits + int64_t(k) * V + d;
      *px = penalize(*px, occurs, s);
    }
  }
}

// Block-wide reductions over kLpThreads threads; every thread gets the result. Every thread of
// the block must call them (they synchronize).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kLpThreads / 32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T t = part[0];
    for (int w = 1; w < kLpThreads / 32; ++w) t = op(t, part[w]);
    total = t;
  }
  __syncthreads();
  const T r = total;
  __syncthreads();  // part/total may be reused by the next call
  return r;
}
struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// token_logprob's order of the alternatives: the larger logit first, the lower id on ties.
__device__ __forceinline__ bool better(float a, int32_t ia, float b, int32_t ib) {
  return a > b || (a == b && ia < ib);
}

// The best (value, id) pair of the block by better(); every thread gets it.
__device__ void block_best(float& v, int32_t& id) {
  __shared__ float pv[kLpThreads / 32];
  __shared__ int32_t pid[kLpThreads / 32];
  __shared__ float bv;
  __shared__ int32_t bid;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, id, o);
    if (better(ov, oid, v, id)) {
      v = ov;
      id = oid;
    }
  }
  if (lane == 0) {
    pv[warp] = v;
    pid[warp] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float tv = pv[0];
    int32_t tid = pid[0];
    for (int w = 1; w < kLpThreads / 32; ++w)
      if (better(pv[w], pid[w], tv, tid)) {
        tv = pv[w];
        tid = pid[w];
      }
    bv = tv;
    bid = tid;
  }
  __syncthreads();
  v = bv;
  id = bid;
  __syncthreads();
}

// One block per row. The top alternatives: each thread keeps the best `top` of its ids in order,
// then `top` rounds of block_best over the threads' next candidates pick them in order.
__global__ void __launch_bounds__(kLpThreads)
    token_logprobs_kernel(const float* logits, int64_t V, const int32_t* accepted,
                          const int32_t* tokens, const int32_t* last, int top, DeviceLogprob* out) {
  const int r = int(blockIdx.x);
  const int a = accepted ? *accepted : 0;
  if (r > a) return;  // the whole block: every thread read the same count
  const int32_t token = r < a ? tokens[r] : *last;
  const float* row = logits + int64_t(r) * V;
  float mx = neg_inf();
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = block_reduce(mx, Max{});
  double sum = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += exp(double(row[i]) - double(mx));
  sum = block_reduce(sum, Sum{});
  const double lse = double(mx) + log(sum);
  const float xt = row[token];
  long long above = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) above += row[i] > xt;
  above = block_reduce(above, Sum{});
  DeviceLogprob& o = out[r];
  if (threadIdx.x == 0) {
    o.token = token;
    o.logprob = float(double(xt) - lse);
    o.rank = 1 + above;
  }
  const int n = int(top < V ? top : V);
  if (n <= 0) return;
  float vals[kLogprobTop];
  int32_t ids[kLogprobTop];
  int count = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float x = row[i];
    const int32_t id = int32_t(i);
    if (count == n && !better(x, id, vals[n - 1], ids[n - 1])) continue;
    int p = count < n ? count++ : n - 1;
    while (p > 0 && better(x, id, vals[p - 1], ids[p - 1])) {
      vals[p] = vals[p - 1];
      ids[p] = ids[p - 1];
      --p;
    }
    vals[p] = x;
    ids[p] = id;
  }
  int head = 0;
  for (int j = 0; j < n; ++j) {
    // No candidate left: a pair every real one beats (equal −inf values: the lower id wins).
    float v = head < count ? vals[head] : neg_inf();
    int32_t id = head < count ? ids[head] : INT_MAX;
    block_best(v, id);
    if (head < count && ids[head] == id) ++head;
    if (threadIdx.x == 0) {
      o.top_ids[j] = id;
      o.top_logprobs[j] = float(double(v) - lse);
    }
  }
}

}  // namespace

cudaError_t launch_control_masks(float* logits, int64_t vocab, int rows, const uint32_t* masks,
                                 cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  const int64_t per_row = (vocab + kThreads - 1) / kThreads;
  const dim3 grid(unsigned(per_row < 1024 ? per_row : 1024), unsigned(rows));
  control_masks_kernel<<<grid, kThreads, 0, stream>>>(logits, vocab, masks, (vocab + 31) / 32);
  return cudaGetLastError();
}

cudaError_t launch_control_edits(float* logits, int64_t vocab, int rows, const int32_t* drafts,
                                 const ControlEdit* edits, int n_edits, const float* biases,
                                 ControlScalars s, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int64_t total =
      int64_t(n_edits) * rows + (s.penalties && rows > 1 ? int64_t(rows) * (rows - 1) : 0);
  if (total == 0) return cudaSuccess;
  control_edits_kernel<<<blocks_for(total), kThreads, 0, stream>>>(
      logits, vocab, rows, drafts, edits, n_edits, biases, s, total);
  return cudaGetLastError();
}

cudaError_t launch_token_logprobs(const float* logits, int64_t vocab, int rows,
                                  const int32_t* accepted, const int32_t* tokens,
                                  const int32_t* last, int top, DeviceLogprob* out,
                                  cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (top < 0 || top > kLogprobTop) return cudaErrorInvalidValue;
  token_logprobs_kernel<<<unsigned(rows), kLpThreads, 0, stream>>>(logits, vocab, accepted, tokens,
                                                                   last, top, out);
  return cudaGetLastError();
}

}  // namespace flashmap::cuda
