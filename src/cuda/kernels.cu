// CUDA kernels mirroring src/ops/cpu_ops.cpp (see kernels.h for which op each one mirrors).
// Deliberately straightforward: one block per row (norms, softmax, argmax), one thread per element
// (pointwise, RoPE), one block per (query, head) for attention. They are the correct baseline the
// parity harness (tests/cuda) checks; fusion, vectorized bf16 loads and split-KV come later.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/kernels.h"

namespace flashmap::cuda {
namespace {

// Errors from a launch surface at the next synchronizing call (Context::sync), which throws.
constexpr int kRowThreads = 256;

inline unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

__device__ __forceinline__ float load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
template <bool Max>
__device__ float block_reduce(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nw ? part[lane] : (Max ? -INFINITY : 0.0f);
    t = Max ? warp_max(t) : warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();  // part/total may be reused by a following reduction
  return r;
}

// One block per token (grid.x allows 2³¹ − 1 rows, so long prefills fit).
template <typename T>
__global__ void embedding_kernel(const T* table, int64_t dim, const int32_t* tokens, float* out) {
  const int64_t row = blockIdx.x;
  const T* src = table + int64_t(tokens[row]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[row * dim + i] = load(src, i);
}

// ScaleFirst = false: w * (x * inv) (Qwen3RMSNorm); true: x * (w * inv) (FlashMapRMSNorm). The
// multiplication order matters in fp32, so both are kept exactly as the CPU writes them.
template <bool ScaleFirst>
__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t dim, float* y) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  const float var = block_reduce<false>(ss) / float(dim);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = ScaleFirst ? xr[i] * (w[i] * inv) : w[i] * (xr[i] * inv);
}

// Two passes (mean, then centred variance) like ops::layer_norm; fp32 partial sums instead of the
// CPU's double, which changes results by ~1e-7 relative.
__global__ void layer_norm_kernel(const float* x, float eps, int64_t dim, const float* scale,
                                  const float* shift, float* y) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float s = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
  const float mu = block_reduce<false>(s) / float(dim);
  float v = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = xr[i] - mu;
    v = fmaf(d, d, v);
  }
  const float var = block_reduce<false>(v) / float(dim);
  const float inv = float(1.0 / sqrt(double(var) + double(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float h = (xr[i] - mu) * inv;
    if (scale) h = h * (1.0f + scale[i]) + shift[i];
    yr[i] = h;
  }
}

// inv_freq computed on the host with the CPU's formula and passed by value, so both backends
// rotate by bit-identical frequencies (device powf may differ from glibc's by an ulp, which at
// position ~4000 would move the angle by ~1e-4 rad).
struct InvFreq {
  float f[128];
};

template <bool Interleaved>
__global__ void rope_kernel(float* x, int64_t rows, int heads, int head_dim,
                            const int64_t* positions, InvFreq freq) {
  const int half = head_dim / 2;
  const int64_t n = rows * heads * half;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(t % half);
    const int64_t rh = t / half, r = rh / heads;
    const float a = float(positions[r]) * freq.f[i];
    const float c = cosf(a), s = sinf(a);
    float* v = x + rh * head_dim;
    const int i0 = Interleaved ? 2 * i : i, i1 = Interleaved ? 2 * i + 1 : i + half;
    const float p = v[i0], q = v[i1];
    v[i0] = p * c - q * s;
    v[i1] = q * c + p * s;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = (g / (1.0f + expf(-g))) * up[i];
  }
}

__global__ void gelu_kernel(const float* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * float(M_SQRT1_2)));
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void gated_add_kernel(float* x, const float* gate, const float* y, int64_t n,
                                 int64_t dim) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += gate[i % dim] * y[i];
}

__global__ void softmax_kernel(float* x, int64_t dim) {
  float* xr = x + blockIdx.x * dim;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_reduce<true>(mx);
  float s = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float e = expf(xr[i] - mx);
    xr[i] = e;
    s += e;
  }
  const float inv = 1.0f / block_reduce<false>(s);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) xr[i] *= inv;
}

// (value, index) pairs: a larger value wins, equal values keep the lower index, so the result is
// std::max_element's whatever the thread count.
__device__ __forceinline__ void better(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ int64_t block_argmax(const float* xr, int64_t dim) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float v = -INFINITY;
  int64_t idx = 0;
  bool any = false;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    if (!any) {
      v = xr[i];
      idx = i;
      any = true;
    } else {
      better(v, idx, xr[i], i);
    }
  }
  if (!any) idx = INT64_MAX;  // idle thread: loses every tie
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    better(v, idx, ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < nw ? sv[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : INT64_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
      better(v, idx, ov, oi);
    }
    if (lane == 0) si[0] = idx;
  }
  __syncthreads();
  const int64_t r = si[0];
  __syncthreads();
  return r;
}

__global__ void argmax_kernel(const float* x, int64_t dim, int32_t* out) {
  const int64_t r = block_argmax(x + blockIdx.x * dim, dim);
  if (threadIdx.x == 0) out[blockIdx.x] = int32_t(r);
}

__global__ void verify_greedy_kernel(const int32_t* am, const int32_t* draft, int K,
                                     int32_t* result) {
  int a = 0;
  while (a < K && am[a] == draft[a]) ++a;
  result[0] = a;
  result[1] = am[a];
}

// One block of kAttnWarps warps per (query, head). Each warp takes every kAttnWarps-th key and
// keeps an online softmax (running max m, sum l, accumulator over head_dim spread across lanes:
// lane owns dims lane, lane + 32, ...); the warps' states are merged at the end. Scores are
// dot(q, k) * scale like ops::attention; exp(s - m) with rescaling gives the same result up to
// rounding. Work is O(keys) per block with no split across the keys: decode at long context uses
// only n_heads blocks, hence split-KV as future work (src/cuda/README.md).
constexpr int kAttnWarps = 4;
constexpr int kMaxDimPerLane = 8;  // head_dim <= 256

template <typename KV>
__global__ void attention_kernel(const float* q, int n_heads, int n_kv_heads, int head_dim,
                                 const KV* k, const KV* v, const int64_t* key_count, float scale,
                                 float* out, int64_t group_rows) {
  const int64_t i = blockIdx.x / n_heads;
  const int h = int(blockIdx.x % n_heads), kh = h / (n_heads / n_kv_heads);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv_stride = int64_t(n_kv_heads) * head_dim;
  const float* qi = q + (i * n_heads + h) * head_dim;
  const int64_t n = key_count[i];
  if (group_rows > 0) {
    const int64_t first = (i / group_rows) * group_rows * kv_stride;
    k += first;
    v += first;
  }

  float qr[kMaxDimPerLane], acc[kMaxDimPerLane];
#pragma unroll
  for (int e = 0; e < kMaxDimPerLane; ++e) {
    const int d = lane + 32 * e;
    qr[e] = d < head_dim ? qi[d] : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < n; j += kAttnWarps) {
    const KV* kj = k + j * kv_stride + int64_t(kh) * head_dim;
    float s = 0;
#pragma unroll
    for (int e = 0; e < kMaxDimPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) s = fmaf(qr[e], load(kj, d), s);
    }
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    const KV* vj = v + j * kv_stride + int64_t(kh) * head_dim;
#pragma unroll
    for (int e = 0; e < kMaxDimPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) acc[e] = fmaf(p, load(vj, d), acc[e] * corr);
    }
    m = m_new;
  }

  // Merge the warps: M = max m_w, L = Σ l_w e^{m_w - M}, O = Σ acc_w e^{m_w - M} / L.
  __shared__ float sm[kAttnWarps], sl[kAttnWarps];
  __shared__ float sacc[kAttnWarps][32 * kMaxDimPerLane];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kMaxDimPerLane; ++e) sacc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0;
  float wgt[kAttnWarps];
  for (int w = 0; w < kAttnWarps; ++w) {
    wgt[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);  // a warp that saw no key adds nothing
    L += sl[w] * wgt[w];
  }
  // A query without keys gets zeros, as ops::attention gives it (L = 0 would make 0 · ∞ = NaN).
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float* o = out + (i * n_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float s = 0;
    for (int w = 0; w < kAttnWarps; ++w) s += sacc[w][d] * wgt[w];
    o[d] = s * inv;
  }
}

__global__ void fill_columns_kernel(float* x, int64_t rows, int64_t cols, int64_t from,
                                    float value) {
  const int64_t w = cols - from, n = rows * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[(i / w) * cols + from + i % w] = value;
}

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);  // round to nearest even, like flashmap::f32_to_bf16
}

// Grid for grid-stride pointwise kernels: enough blocks to fill an H200 (132 SMs) several times.
inline unsigned pointwise_grid(int64_t n) {
  const unsigned b = blocks_for(n, 256);
  return b < 1 ? 1 : (b > 132u * 32u ? 132u * 32u : b);
}

inline int row_threads(int64_t dim) {
  return dim <= 128 ? 128 : kRowThreads;
}

}  // namespace

void embedding(const void* table, Elem table_type, int64_t dim, const int32_t* tokens, int64_t n,
               float* out, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned grid = unsigned(n);
  if (table_type == Elem::BF16)
    embedding_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), dim,
                                               tokens, out);
  else
    embedding_kernel<<<grid, 256, 0, stream>>>(static_cast<const float*>(table), dim, tokens, out);
}

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y,
              cudaStream_t stream) {
  if (rows <= 0) return;
  rms_norm_kernel<false><<<unsigned(rows), row_threads(dim), 0, stream>>>(x, w, eps, dim, y);
}

void rms_norm_scale_first(const float* x, const float* w, float eps, int64_t rows, int64_t dim,
                          float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  rms_norm_kernel<true><<<unsigned(rows), row_threads(dim), 0, stream>>>(x, w, eps, dim, y);
}

void layer_norm_modulate(const float* x, float eps, int64_t rows, int64_t dim, const float* scale,
                         const float* shift, float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  layer_norm_kernel<<<unsigned(rows), row_threads(dim), 0, stream>>>(x, eps, dim, scale, shift, y);
}

// head_dim limits shared by RoPE (InvFreq holds 128 frequencies) and attention (8 dims per lane).
static void check_head_dim(int head_dim, const char* op) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256)
    throw std::invalid_argument(std::string("flashmap::cuda::") + op +
                                ": head_dim must be even and <= 256, got " +
                                std::to_string(head_dim));
}

static InvFreq make_inv_freq(int head_dim, double theta) {
  check_head_dim(head_dim, "rope");
  InvFreq f{};
  for (int i = 0; i < head_dim / 2 && i < 128; ++i)
    f.f[i] = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  return f;
}

void rope_half(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
               double theta, cudaStream_t stream) {
  const int64_t n = rows * heads * (head_dim / 2);
  if (n <= 0) return;
  rope_kernel<false><<<pointwise_grid(n), 256, 0, stream>>>(x, rows, heads, head_dim, positions,
                                                            make_inv_freq(head_dim, theta));
}

void rope_interleaved(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
                      double theta, cudaStream_t stream) {
  const int64_t n = rows * heads * (head_dim / 2);
  if (n <= 0) return;
  rope_kernel<true><<<pointwise_grid(n), 256, 0, stream>>>(x, rows, heads, head_dim, positions,
                                                           make_inv_freq(head_dim, theta));
}

void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n > 0) swiglu_kernel<<<pointwise_grid(n), 256, 0, stream>>>(gate, up, n, out);
}

void gelu(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n > 0) gelu_kernel<<<pointwise_grid(n), 256, 0, stream>>>(x, n, y);
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n > 0) add_kernel<<<pointwise_grid(n), 256, 0, stream>>>(x, y, n);
}

void gated_add(float* x, const float* gate, const float* y, int64_t rows, int64_t dim,
               cudaStream_t stream) {
  const int64_t n = rows * dim;
  if (n > 0) gated_add_kernel<<<pointwise_grid(n), 256, 0, stream>>>(x, gate, y, n, dim);
}

void softmax_rows(float* x, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows > 0) softmax_kernel<<<unsigned(rows), row_threads(dim), 0, stream>>>(x, dim);
}

void argmax_rows(const float* x, int64_t rows, int64_t dim, int32_t* out, cudaStream_t stream) {
  if (rows > 0) argmax_kernel<<<unsigned(rows), row_threads(dim), 0, stream>>>(x, dim, out);
}

void attention(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim, const void* k,
               const void* v, Elem kv_type, const int64_t* key_count, float scale, float* out,
               cudaStream_t stream, int64_t group_rows) {
  if (nq <= 0) return;
  check_head_dim(head_dim, "attention");
  const unsigned grid = unsigned(nq * n_heads);
  if (kv_type == Elem::BF16)
    attention_kernel<<<grid, 32 * kAttnWarps, 0, stream>>>(
        q, n_heads, n_kv_heads, head_dim, static_cast<const __nv_bfloat16*>(k),
        static_cast<const __nv_bfloat16*>(v), key_count, scale, out, group_rows);
  else
    attention_kernel<<<grid, 32 * kAttnWarps, 0, stream>>>(
        q, n_heads, n_kv_heads, head_dim, static_cast<const float*>(k),
        static_cast<const float*>(v), key_count, scale, out, group_rows);
}

void verify_greedy(const float* logits, int64_t vocab, const int32_t* draft, int K,
                   int32_t* argmax_scratch, int32_t* result, cudaStream_t stream) {
  argmax_rows(logits, int64_t(K) + 1, vocab, argmax_scratch, stream);
  verify_greedy_kernel<<<1, 1, 0, stream>>>(argmax_scratch, draft, K, result);
}

void fill_columns(float* x, int64_t rows, int64_t cols, int64_t from, float value,
                  cudaStream_t stream) {
  if (rows > 0 && from < cols)
    fill_columns_kernel<<<pointwise_grid(rows * (cols - from)), 256, 0, stream>>>(x, rows, cols,
                                                                                  from, value);
}

void f32_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n > 0)
    f32_to_bf16_kernel<<<pointwise_grid(n), 256, 0, stream>>>(x, n,
                                                              reinterpret_cast<__nv_bfloat16*>(y));
}

}  // namespace flashmap::cuda
