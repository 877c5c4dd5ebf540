// Device sampling kernels: each mirrors a CPU function of src/specdec (the reference) — the
// filtered distribution of flashmap::filtered_probs, the inverse-CDF draw of flashmap::sample and
// the rejection-sampling verification of flashmap::verify_sampled — with the same arithmetic
// (fp32 probabilities, double sums and uniforms, the same comparisons) so that, given the same
// uniforms, the device takes the CPU's decisions. The one difference is the order of the double
// sums (the CPU adds sequentially, a block adds per-thread chunks), which moves a cumulative sum by
// ~1e-16 relative: a decision differs only when a uniform falls in that gap.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "cuda/sampling_kernels.h"

namespace flashmap::cuda {
namespace {

// One block per row; rows are vocabularies (1e3 … 1.5e5 entries), so a full block is used.
// Must be a multiple of 32 (the reductions and the chunk scan assume whole warps).
constexpr int kThreads = 1024;

__device__ __forceinline__ double draw(const UniformSource& u, uint64_t i) {
  if (u.table)
    return i < u.table_size ? u.table[i] : __longlong_as_double(0x7ff8000000000000ll);  // NaN
  return counter_uniform(u.state[0], i);
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

// Block-wide reduction (blockDim.x a multiple of 32); every thread gets the result. Every thread
// of the block must call it (it synchronizes).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T part[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T t = lane < nw ? part[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) t = op(t, __shfl_xor_sync(0xffffffffu, t, o));
    if (lane == 0) total = t;
  }
  __syncthreads();
  const T r = total;
  __syncthreads();  // part/total may be reused by the next call
  return r;
}

// The running sums the CPU accumulates sequentially in double (sample's `acc`, top-p's `mass`),
// in two levels: thread t owns the contiguous chunk [begin, end) of [0, n) and gets the exclusive
// sum of the chunks before it (`offset`); `total` is the sum of all. A thread then walks its chunk
// adding from `offset`, which reproduces the CPU's running sum up to the grouping of the additions.
struct Chunk {
  int64_t begin, end;
  double offset, total;
};

template <typename Val>
__device__ Chunk block_chunks(int64_t n, const Val& val) {
  __shared__ double sums[kThreads];
  __shared__ double total;
  const int64_t c = (n + blockDim.x - 1) / blockDim.x;
  Chunk ch;
  ch.begin = min(n, int64_t(threadIdx.x) * c);
  ch.end = min(n, ch.begin + c);
  double s = 0;
  for (int64_t i = ch.begin; i < ch.end; ++i) s += val(i);
  sums[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    // Warp 0 scans the chunk sums: lane l owns chunks [l·m, (l+1)·m) in order; the lanes' totals
    // are scanned with shuffles (Hillis–Steele), then each lane writes its exclusive offsets.
    const int lane = threadIdx.x, m = blockDim.x / 32;
    double run = 0;
    for (int j = 0; j < m; ++j) run += sums[lane * m + j];
    double incl = run;
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    double acc = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) acc = 0;
    for (int j = 0; j < m; ++j) {
      const double x = sums[lane * m + j];
      sums[lane * m + j] = acc;
      acc += x;
    }
    if (lane == 31) total = acc;
  }
  __syncthreads();
  ch.offset = sums[threadIdx.x];
  ch.total = total;
  __syncthreads();  // sums/total may be reused by the next call
  return ch;
}

// The first i in [0, n) whose running sum through i satisfies pred(val(i), sum), or INT64_MAX.
template <typename Val, typename Pred>
__device__ int64_t block_first(const Chunk& ch, const Val& val, const Pred& pred) {
  int64_t found = INT64_MAX;
  double acc = ch.offset;
  for (int64_t i = ch.begin; i < ch.end; ++i) {
    const float v = val(i);
    acc += v;
    if (pred(v, acc)) {
      found = i;
      break;
    }
  }
  return block_reduce(found, MinOp{}, int64_t(INT64_MAX));
}

// flashmap::sample_keyed on one block: the lowest id among those with the smallest
// −log u(key, id) / p (ids with p <= 0 skipped), 0 when none is positive. The keys are the CPU's
// up to CUDA's double log (within 1 ulp of the correctly rounded value, as glibc's): a decision
// can differ only when two ids' keys fall within an ulp of each other.
__device__ int32_t block_sample_keyed(int64_t n, const float* row, uint64_t key) {
  const double inf = __longlong_as_double(0x7ff0000000000000ll);
  double best = inf;
  int64_t idx = INT64_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float p = row[i];
    if (!(p > 0.0f)) continue;
    const double k = -log(keyed_uniform(key, i)) / double(p);
    if (k < best) {  // strict: each thread keeps its lowest id among equal keys
      best = k;
      idx = i;
    }
  }
  const double m = block_reduce(best, MinOp{}, inf);
  const int64_t mine = best == m ? idx : int64_t(INT64_MAX);
  const int64_t found = block_reduce(mine, MinOp{}, int64_t(INT64_MAX));
  return found == INT64_MAX ? 0 : int32_t(found);
}

// flashmap::sample on one block: u = uniform · Σ val; the first positive entry whose running sum
// exceeds u; past the end (rounding) the last positive entry; 0 when none is positive.
template <typename Val>
__device__ int32_t block_sample(int64_t n, const Val& val, double uniform) {
  const Chunk ch = block_chunks(n, val);
  const double u = uniform * ch.total;
  int64_t found = INT64_MAX, last = -1;
  double acc = ch.offset;
  for (int64_t i = ch.begin; i < ch.end; ++i) {
    const float v = val(i);
    if (v <= 0.0f) continue;  // the CPU's `probs[i] <= 0.0f` skip, NaN included as it is there
    acc += v;
    last = i;
    if (u < acc) {
      found = i;
      break;  // this thread's `last` no longer matters: a crossing exists
    }
  }
  found = block_reduce(found, MinOp{}, int64_t(INT64_MAX));
  last = block_reduce(last, MaxOp{}, int64_t(-1));
  if (found != INT64_MAX) return int32_t(found);
  return last >= 0 ? int32_t(last) : 0;
}

// Probabilities are ≥ 0, so their IEEE bits order like their values; the low word makes equal
// probabilities sort by ascending id in a descending sort (std::stable_sort's order on the CPU)
// whether or not the sort is stable.
__global__ void sort_keys_kernel(const float* probs, int64_t n, int64_t V, uint64_t* keys) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    keys[i] = (uint64_t(__float_as_uint(probs[i])) << 32) | uint64_t(0xffffffffu - uint32_t(i % V));
}

__device__ __forceinline__ float key_prob(uint64_t k) {
  return __uint_as_float(uint32_t(k >> 32));
}
__device__ __forceinline__ int64_t key_id(uint64_t k) {
  return int64_t(0xffffffffu - uint32_t(k));
}

// filtered_probs, second part, on the sorted row: keep = top_k; top-p keeps the shortest prefix
// whose running mass reaches top_p · (mass of the kept); min-p stops at the first probability
// below min_p · the largest (keeping at least one); the kept are renormalized, the rest zeroed.
__device__ void block_cut(const uint64_t* k, int64_t V, int top_k, float top_p, float min_p,
                          float* out) {
  const auto prob = [k](int64_t i) { return key_prob(k[i]); };
  int64_t keep = (top_k > 0 && top_k < V) ? top_k : V;
  if (top_p < 1.0f) {
    const Chunk ch = block_chunks(keep, prob);
    const double threshold = double(top_p) * ch.total;
    // CPU: `mass += probs[order[n++]]; if (mass >= top_p · kept_mass) break;`
    const int64_t i =
        block_first(ch, prob, [threshold](float, double mass) { return mass >= threshold; });
    if (i < keep) keep = i + 1;
  }
  if (min_p > 0.0f) {
    const float floor = min_p * prob(0);
    // CPU: `while (n < keep && probs[order[n]] >= floor) ++n;` from n = 1.
    int64_t found = INT64_MAX;
    for (int64_t i = 1 + threadIdx.x; i < keep; i += blockDim.x)
      if (!(prob(i) >= floor)) {
        found = i;
        break;
      }
    found = block_reduce(found, MinOp{}, int64_t(INT64_MAX));
    if (found < keep) keep = found;
  }
  double kept = 0;
  for (int64_t i = threadIdx.x; i < keep; i += blockDim.x) kept += prob(i);
  kept = block_reduce(kept, SumOp{}, 0.0);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    out[key_id(k[i])] = i < keep ? float(double(prob(i)) / kept) : 0.0f;
}

__global__ void __launch_bounds__(kThreads) cut_kernel(const uint64_t* sorted, int64_t V, int top_k,
                                                       float top_p, float min_p, float* probs) {
  block_cut(sorted + blockIdx.x * V, V, top_k, top_p, min_p, probs + blockIdx.x * V);
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* probs, int64_t V, UniformSource u, int32_t* out) {
  const float* row = probs + blockIdx.x * V;
  const double uniform = draw(u, u.state[1] + blockIdx.x);
  const int32_t tok = block_sample(
      V, [row](int64_t i) { return row[i]; }, uniform);
  if (threadIdx.x == 0) out[blockIdx.x] = tok;
}

// Runs after every block of the kernel that read the counter (stream order), so no block reads a
// counter another one has already advanced.
__global__ void advance_kernel(UniformSource u, uint64_t n) {
  u.state[1] += n;
}

__global__ void draw_uniforms_kernel(UniformSource u, int64_t n, double* out) {
  const uint64_t c = u.state[1];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = draw(u, c + uint64_t(i));
}

// flashmap::verify_sampled on one block: thread 0 runs the accept loop (at most K serial steps)
// taking uniforms in the CPU's order, then the block draws the token after the accepted ones with
// the next one.
__device__ void block_verify_sampled(const float* p, const float* q, const int32_t* draft, int K,
                                     int64_t V, UniformSource u, int32_t* result) {
  __shared__ int s_accepted;
  __shared__ uint64_t s_next;
  if (threadIdx.x == 0) {
    uint64_t c = u.state[1];
    int a = 0;
    // u·q < p accepts with probability min(1, p/q) (the CPU's and the reference's form); a slot
    // whose target probability is zero is never accepted.
    while (a < K) {
      const int32_t tok = draft[a];
      const float pk = p[int64_t(a) * V + tok], qk = q[int64_t(a) * V + tok];
      if (!(draw(u, c++) * qk < pk)) break;
      ++a;
    }
    s_accepted = a;
    s_next = c;
  }
  __syncthreads();
  const int a = s_accepted;
  const uint64_t c = s_next;
  const double uniform = draw(u, c);
  const float* target = p + int64_t(a) * V;
  const auto target_prob = [target](int64_t i) { return target[i]; };
  int32_t tok;
  if (a == K) {
    tok = block_sample(V, target_prob, uniform);  // full block: the bonus comes from p
  } else {
    const float* qa = q + int64_t(a) * V;
    // std::max(p − q, 0.0f) as the CPU writes it: (d < 0) ? 0 : d.
    const auto residual = [target, qa](int64_t i) {
      const float d = target[i] - qa[i];
      return d < 0.0f ? 0.0f : d;
    };
    const double mass = block_chunks(V, residual).total;
    tok = mass > 0 ? block_sample(V, residual, uniform) : block_sample(V, target_prob, uniform);
  }
  if (threadIdx.x == 0) {
    result[0] = a;
    result[1] = tok;
    u.state[1] = c + 1;
  }
}

__global__ void __launch_bounds__(kThreads)
    verify_sampled_kernel(const float* p, const float* q, const int32_t* draft, int K, int64_t V,
                          UniformSource u, int32_t* result) {
  block_verify_sampled(p, q, draft, K, V, u, result);
}

__global__ void __launch_bounds__(kThreads)
    sample_keyed_rows_kernel(const float* probs, int64_t V, uint64_t seed, int64_t first_position,
                             int32_t* out) {
  const int32_t tok = block_sample_keyed(V, probs + blockIdx.x * V,
                                         position_key(seed, first_position + blockIdx.x));
  if (threadIdx.x == 0) out[blockIdx.x] = tok;
}

// flashmap::verify_keyed on one block: the target's keyed draw at each slot, until one differs
// from the draft (every thread computes the same draws, so the loop is uniform across the block).
__device__ void block_verify_keyed(const float* p, const int32_t* draft, int K, int64_t V,
                                   uint64_t seed, int64_t first_position, int32_t* result) {
  int k = 0;
  int32_t t = 0;
  for (;; ++k) {
    t = block_sample_keyed(V, p + int64_t(k) * V, position_key(seed, first_position + k));
    if (k == K || draft[k] != t) break;
  }
  if (threadIdx.x == 0) {
    result[0] = k;
    result[1] = t;
  }
}

__global__ void __launch_bounds__(kThreads)
    verify_keyed_kernel(const float* p, const int32_t* draft, int K, int64_t V, uint64_t seed,
                        int64_t first_position, int32_t* result) {
  block_verify_keyed(p, draft, K, V, seed, first_position, result);
}

// --- batches -----------------------------------------------------------------------------------

// filtered_probs, first part: probs = float(exp((x − max) · inv_t) / Σ exp) with the exponentials
// rounded to float before the double sum, as the CPU stores them.
__device__ void block_softmax_temperature(const float* x, int64_t V, float inv_t, float* y) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  double s = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf((x[i] - mx) * inv_t);
    y[i] = e;
    s += e;
  }
  s = block_reduce(s, SumOp{}, 0.0);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) y[i] = float(double(y[i]) / s);
}

__global__ void __launch_bounds__(kThreads)
    softmax_temperature_kernel(const float* logits, int64_t V, float inv_t, float* probs) {
  block_softmax_temperature(logits + blockIdx.x * V, V, inv_t, probs + blockIdx.x * V);
}

__global__ void __launch_bounds__(kThreads)
    softmax_temperature_rows_kernel(const float* logits, const FilterRow* rows, int64_t V,
                                    float* probs) {
  const FilterRow r = rows[blockIdx.x];
  block_softmax_temperature(logits + int64_t(r.src) * V, V, r.inv_t, probs + int64_t(r.dst) * V);
}

__global__ void sort_keys_rows_kernel(const float* probs, const FilterRow* rows, int64_t V,
                                      uint64_t* keys) {
  const float* row = probs + int64_t(rows[blockIdx.y].dst) * V;
  uint64_t* k = keys + int64_t(blockIdx.y) * V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < V;
       i += int64_t(gridDim.x) * blockDim.x)
    k[i] = (uint64_t(__float_as_uint(row[i])) << 32) | uint64_t(0xffffffffu - uint32_t(i));
}

__global__ void __launch_bounds__(kThreads)
    cut_rows_kernel(const uint64_t* sorted, const FilterRow* rows, int64_t V, float* probs) {
  const FilterRow r = rows[blockIdx.x];
  block_cut(sorted + int64_t(blockIdx.x) * V, V, r.top_k, r.top_p, r.min_p,
            probs + int64_t(r.dst) * V);
}

__global__ void __launch_bounds__(kThreads)
    verify_items_kernel(const float* p, const VerifyItem* items, int64_t V) {
  const VerifyItem it = items[blockIdx.x];
  const float* rows = p + int64_t(it.p_row) * V;
  if (it.keyed)
    block_verify_keyed(rows, it.draft, it.room, V, it.seed, it.first_position, it.result);
  else
    block_verify_sampled(rows, it.q, it.draft, it.room, V, UniformSource{it.state, nullptr, 0},
                         it.result);
}

// Block (r, i): row r of item i. The unkeyed rows read uniforms counter + r; the counters advance
// afterwards (advance_items_kernel, stream-ordered after every read).
__global__ void __launch_bounds__(kThreads)
    sample_items_kernel(const float* p, const SampleItem* items, int64_t V) {
  const SampleItem it = items[blockIdx.y];
  const int r = int(blockIdx.x);
  if (r >= it.rows) return;  // uniform across the block
  const float* row = p + (int64_t(it.p_row) + r) * V;
  int32_t tok;
  if (it.keyed) {
    tok = block_sample_keyed(V, row, position_key(it.seed, it.first_position + r));
  } else {
    const UniformSource u{it.state, nullptr, 0};
    tok = block_sample(
        V, [row](int64_t i) { return row[i]; },
        draw(u, u.state[1] + uint64_t(it.skip) + uint64_t(r)));
  }
  if (threadIdx.x == 0) it.out[r] = tok;
}

// Items may share a generator (a tree's draws): the additions are atomic.
__global__ void advance_items_kernel(const SampleItem* items, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && !items[i].keyed)
    atomicAdd(reinterpret_cast<unsigned long long*>(items[i].state + 1),
              static_cast<unsigned long long>(items[i].rows));
}

// --- draft trees ---------------------------------------------------------------------------

// IEEE bits mapped so that unsigned order is the floats' order (negative ones included).
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_bits(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

__global__ void __launch_bounds__(kThreads)
    logprob_keys_rows_kernel(const float* logits, const int32_t* src_rows, int64_t V,
                             uint64_t* keys) {
  const float* x = logits + int64_t(src_rows[blockIdx.x]) * V;
  uint64_t* k = keys + int64_t(blockIdx.x) * V;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += exp(double(x[i]) - double(mx));
  sum = block_reduce(sum, SumOp{}, 0.0);
  const float lse = float(double(mx) + log(sum));
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    k[i] = (uint64_t(ordered_bits(x[i] - lse)) << 32) | uint64_t(0xffffffffu - uint32_t(i));
}

__global__ void ranked_rows_kernel(const uint64_t* sorted, int64_t V, int keep, int32_t* ids,
                                   float* lps) {
  const uint64_t* k = sorted + int64_t(blockIdx.x) * V;
  for (int j = threadIdx.x; j < keep; j += blockDim.x) {
    ids[int64_t(blockIdx.x) * keep + j] = int32_t(key_id(k[j]));
    lps[int64_t(blockIdx.x) * keep + j] = from_ordered_bits(uint32_t(k[j] >> 32));
  }
}

__global__ void __launch_bounds__(kThreads) verify_trees_kernel(const TreeItem* items, int64_t V) {
  const TreeItem it = items[blockIdx.x];
  __shared__ int32_t s_nodes[kMaxTreeDepth], s_tokens[kMaxTreeDepth];
  const UniformSource u{it.state, nullptr, 0};
  uint64_t c = it.mode == kTreeSampled ? it.state[1] : 0;
  int node = -1, depth = 0;
  int32_t t = 0;
  for (;;) {
    const int64_t row = node + 1;
    const float* p = it.rows ? it.rows + row * V : nullptr;
    if (it.mode == kTreeGreedy) {
      t = it.argmax[row];
    } else if (it.mode == kTreeKeyed) {
      t = block_sample_keyed(V, p, position_key(it.seed, it.first_position + depth));
    } else {
      t = block_sample(
          V, [p](int64_t i) { return p[i]; }, draw(u, c++));
    }
    // The child of `node` holding t: children come after their parent.
    int64_t found = INT64_MAX;
    for (int i = node + 1 + int(threadIdx.x); i < it.nodes; i += int(blockDim.x))
      if (it.parents[i] == node && it.tokens[i] == t) {
        found = i;
        break;
      }
    found = block_reduce(found, MinOp{}, int64_t(INT64_MAX));
    if (found == INT64_MAX || depth >= kMaxTreeDepth) break;
    if (threadIdx.x == 0) {
      s_nodes[depth] = int32_t(found);
      s_tokens[depth] = t;
    }
    node = int(found);
    ++depth;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < depth; j += blockDim.x) {
    it.path_nodes[j] = s_nodes[j];
    it.path_tokens[j] = s_tokens[j];
  }
  if (threadIdx.x == 0) {
    it.result[0] = depth;
    it.result[1] = t;
    if (it.mode == kTreeSampled) it.state[1] = c;
  }
}

unsigned pointwise_grid(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 65535 ? blocks : 65535);
}

}  // namespace

cudaError_t launch_softmax_temperature(const float* logits, int64_t rows, int64_t vocab,
                                       float inv_t, float* probs, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  softmax_temperature_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, inv_t, probs);
  return cudaGetLastError();
}

cudaError_t launch_sort_keys(const float* probs, int64_t rows, int64_t vocab, uint64_t* keys,
                             cudaStream_t stream) {
  const int64_t n = rows * vocab;
  if (n <= 0) return cudaSuccess;
  sort_keys_kernel<<<pointwise_grid(n), 256, 0, stream>>>(probs, n, vocab, keys);
  return cudaGetLastError();
}

cudaError_t sort_keys_descending(void* temp, size_t& temp_bytes, const uint64_t* keys_in,
                                 uint64_t* keys_out, int64_t rows, int64_t vocab,
                                 const int* offsets, cudaStream_t stream) {
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, temp_bytes, keys_in, keys_out,
                                                           int(rows * vocab), int(rows), offsets,
                                                           offsets + 1, 0, 64, stream);
}

cudaError_t launch_cut(const uint64_t* sorted, int64_t rows, int64_t vocab, int top_k, float top_p,
                       float min_p, float* probs, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  cut_kernel<<<unsigned(rows), kThreads, 0, stream>>>(sorted, vocab, top_k, top_p, min_p, probs);
  return cudaGetLastError();
}

cudaError_t launch_sample_rows(const float* probs, int64_t rows, int64_t vocab, UniformSource u,
                               int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  sample_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(probs, vocab, u, out);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  advance_kernel<<<1, 1, 0, stream>>>(u, uint64_t(rows));
  return cudaGetLastError();
}

cudaError_t launch_verify_sampled(const float* p, const float* q, const int32_t* draft, int K,
                                  int64_t vocab, UniformSource u, int32_t* result,
                                  cudaStream_t stream) {
  verify_sampled_kernel<<<1, kThreads, 0, stream>>>(p, q, draft, K, vocab, u, result);
  return cudaGetLastError();
}

cudaError_t launch_sample_keyed_rows(const float* probs, int64_t rows, int64_t vocab, uint64_t seed,
                                     int64_t first_position, int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  sample_keyed_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(probs, vocab, seed,
                                                                    first_position, out);
  return cudaGetLastError();
}

cudaError_t launch_verify_keyed(const float* p, const int32_t* draft, int K, int64_t vocab,
                                uint64_t seed, int64_t first_position, int32_t* result,
                                cudaStream_t stream) {
  verify_keyed_kernel<<<1, kThreads, 0, stream>>>(p, draft, K, vocab, seed, first_position, result);
  return cudaGetLastError();
}

cudaError_t launch_softmax_temperature_rows(const float* logits, const FilterRow* rows, int n,
                                            int64_t vocab, float* probs, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  softmax_temperature_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(logits, rows, vocab, probs);
  return cudaGetLastError();
}

cudaError_t launch_sort_keys_rows(const float* probs, const FilterRow* rows, int n, int64_t vocab,
                                  uint64_t* keys, cudaStream_t stream) {
  if (n <= 0 || vocab <= 0) return cudaSuccess;
  const unsigned x = unsigned(std::min<int64_t>((vocab + 255) / 256, 1024));
  sort_keys_rows_kernel<<<dim3(x, unsigned(n)), 256, 0, stream>>>(probs, rows, vocab, keys);
  return cudaGetLastError();
}

cudaError_t launch_cut_rows(const uint64_t* sorted, const FilterRow* rows, int n, int64_t vocab,
                            float* probs, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  cut_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(sorted, rows, vocab, probs);
  return cudaGetLastError();
}

cudaError_t launch_verify_items(const float* p, const VerifyItem* items, int n, int64_t vocab,
                                cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  verify_items_kernel<<<unsigned(n), kThreads, 0, stream>>>(p, items, vocab);
  return cudaGetLastError();
}

cudaError_t launch_sample_items(const float* p, const SampleItem* items, int n, int max_rows,
                                int64_t vocab, cudaStream_t stream) {
  if (n <= 0 || max_rows <= 0) return cudaSuccess;
  sample_items_kernel<<<dim3(unsigned(max_rows), unsigned(n)), kThreads, 0, stream>>>(p, items,
                                                                                      vocab);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  advance_items_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(items, n);
  return cudaGetLastError();
}

cudaError_t launch_logprob_keys_rows(const float* logits, const int32_t* src_rows, int n,
                                     int64_t vocab, uint64_t* keys, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  logprob_keys_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(logits, src_rows, vocab, keys);
  return cudaGetLastError();
}

cudaError_t launch_ranked_rows(const uint64_t* sorted, int n, int64_t vocab, int keep, int32_t* ids,
                               float* lps, cudaStream_t stream) {
  if (n <= 0 || keep <= 0) return cudaSuccess;
  ranked_rows_kernel<<<unsigned(n), 256, 0, stream>>>(sorted, vocab, keep, ids, lps);
  return cudaGetLastError();
}

cudaError_t launch_verify_trees(const TreeItem* items, int n, int64_t vocab, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  verify_trees_kernel<<<unsigned(n), kThreads, 0, stream>>>(items, vocab);
  return cudaGetLastError();
}

cudaError_t launch_draw_uniforms(UniformSource u, int64_t n, double* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  draw_uniforms_kernel<<<pointwise_grid(n), 256, 0, stream>>>(u, n, out);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  advance_kernel<<<1, 1, 0, stream>>>(u, uint64_t(n));
  return cudaGetLastError();
}

}  // namespace flashmap::cuda
