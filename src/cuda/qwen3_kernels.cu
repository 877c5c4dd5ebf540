// Kernels of the Qwen3 device forward (see qwen3_kernels.h). Each mirrors a step of
// flashmap::Qwen3Model::forward (src/models/qwen3.cpp) and the ops it calls (src/ops/cpu_ops.cpp),
// with the same fp32 formulas in the same order; what differs from the CPU is only where a bf16
// engine rounds (GEMM inputs, the KV cache) and the summation order of reductions.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/splitmix.h"
#include "cuda/qk_norm_rope.cuh"
#include "cuda/qwen3_kernels.h"

namespace flashmap::cuda {
namespace {

inline unsigned grid_for(int64_t n, int threads, unsigned cap = 132u * 32u) {
  const int64_t b = (n + threads - 1) / threads;
  return b < 1 ? 1u : (b > int64_t(cap) ? cap : unsigned(b));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block whose size is a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nw ? part[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

__global__ void fill_positions_kernel(int64_t length, int64_t n, int64_t* positions,
                                      int64_t* key_count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    positions[i] = length + i;
    key_count[i] = length + i + 1;
  }
}

// flashmap::Qwen3Model::forward's `x += tmp` followed by ops::rms_norm (w * (x * inv), that order),
// the result rounded to nearest-even bf16 (the GEMM input cuda::linear would round it to anyway).
__global__ void add_rms_norm_bf16_kernel(float* x, const float* delta, const float* w, float eps,
                                         int64_t dim, __nv_bfloat16* y) {
  float* xr = x + blockIdx.x * dim;
  const float* dr = delta ? delta + blockIdx.x * dim : nullptr;
  __nv_bfloat16* yr = y + blockIdx.x * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (dr) {
      v += dr[i];
      xr[i] = v;  // each thread re-reads only the elements it wrote
    }
    ss = fmaf(v, v, ss);
  }
  const float var = block_sum(ss) / float(dim);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = __float2bfloat16_rn(w[i] * (xr[i] * inv));
}

// Split-KV attention, pass 1. Block (query·head, split) of kWarps warps; the split takes keys [j0,
// j1) of [0, key_count[i]) in contiguous shares. Each warp keeps an online softmax over every
// kWarps-th key of the share (lane owns dims lane, lane + 32, ...), as kernels.cu's attention does;
// the warps are merged into one unnormalized state (m, l, acc) per block.
constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

__global__ void attn_partial_kernel(const float* q, int nh, int nkv, int hd, const __nv_bfloat16* k,
                                    const __nv_bfloat16* v, const int64_t* key_count, float scale,
                                    float* pm, float* pl, float* pacc) {
  const int64_t qh = blockIdx.x;
  const int64_t i = qh / nh;
  const int h = int(qh % nh), kh = h / (nh / nkv);
  const int S = int(gridDim.y), split = int(blockIdx.y);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv_stride = int64_t(nkv) * hd;
  const int64_t n = key_count[i];
  const int64_t chunk = (n + S - 1) / S;
  const int64_t j0 = split * chunk;
  const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
  const float* qi = q + qh * hd;

  float qr[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? qi[d] : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = j0 + warp; j < j1; j += kWarps) {
    const __nv_bfloat16* kj = k + j * kv_stride + int64_t(kh) * hd;
    float s = 0;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) s = fmaf(qr[e], __bfloat162float(kj[d]), s);
    }
    s = warp_sum(s) * scale;  // ops::attention: dot(q, k) * scale
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    const __nv_bfloat16* vj = v + j * kv_stride + int64_t(kh) * hd;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) acc[e] = fmaf(p, __bfloat162float(vj[d]), acc[e] * corr);
    }
    m = m_new;
  }

  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][32 * kMaxPerLane];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) sacc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float wgt[kWarps], L = 0;
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);  // a warp that saw no key adds nothing
    L += sl[w] * wgt[w];
  }
  const int64_t slot = qh * S + split;
  if (threadIdx.x == 0) {
    pm[slot] = M;  // -inf (and L = 0) when the share is empty
    pl[slot] = L;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float s = 0;
    for (int w = 0; w < kWarps; ++w) s += sacc[w][d] * wgt[w];
    pacc[slot * hd + d] = s;
  }
}

// Pass 2: O = Σ_s acc_s e^{m_s − M} / Σ_s l_s e^{m_s − M}, one block per (query, head).
template <typename Out>
__global__ void attn_combine_kernel(const float* pm, const float* pl, const float* pacc, int S,
                                    int hd, Out* out) {
  const int64_t qh = blockIdx.x;
  const float* m = pm + qh * S;
  const float* l = pl + qh * S;
  float M = -INFINITY;
  for (int s = 0; s < S; ++s) M = fmaxf(M, m[s]);
  float L = 0;
  for (int s = 0; s < S; ++s)
    if (m[s] != -INFINITY) L += l[s] * expf(m[s] - M);
  // A query without keys (every share empty: M = −inf, L = 0) gets zeros, as ops::attention
  // gives it, not 0 · ∞ = NaN.
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0;
    for (int s = 0; s < S; ++s)
      if (m[s] != -INFINITY) o += pacc[(qh * S + s) * hd + d] * expf(m[s] - M);
    if constexpr (sizeof(Out) == 2)
      out[qh * hd + d] = __float2bfloat16_rn(o * inv);
    else
      out[qh * hd + d] = o * inv;
  }
}

__global__ void swiglu_bf16_kernel(const float* gu, int64_t rows, int64_t inter, __nv_bfloat16* y) {
  const int64_t n = rows * inter;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / inter, c = t % inter;
    const float g = gu[r * 2 * inter + c], u = gu[r * 2 * inter + inter + c];
    y[t] = __float2bfloat16_rn((g / (1.0f + expf(-g))) * u);  // ops::silu(g) * up
  }
}

__global__ void uniform_bf16_kernel(__nv_bfloat16* w, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // Element i of the SplitMix64 stream started at `seed`, independent of the launch shape.
    const uint64_t h = splitmix64(seed + uint64_t(i + 1) * 0x9E3779B97F4A7C15ull);
    // The CPU bench's mapping: a signed 32-bit draw to [−√3, √3).
    const float u = float(int32_t(uint32_t(h >> 32))) * (1.7320508f / 2147483648.0f);
    w[i] = __float2bfloat16_rn(u * scale);
  }
}

__global__ void fill_f32_kernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// Four independent 16-byte loads in flight per thread per iteration.
__global__ void read_probe_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;  // never true for the zeroed probe buffer
}

void check_head_dim(int head_dim, const char* op) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256)
    throw std::invalid_argument(std::string("flashmap::cuda::") + op +
                                ": head_dim must be even and <= 256, got " +
                                std::to_string(head_dim));
}

}  // namespace

void fill_positions(int64_t length, int64_t n, int64_t* positions, int64_t* key_count,
                    cudaStream_t stream) {
  if (n > 0)
    fill_positions_kernel<<<grid_for(n, 256), 256, 0, stream>>>(length, n, positions, key_count);
}

void add_rms_norm_bf16(float* x, const float* delta, const float* w, float eps, int64_t rows,
                       int64_t dim, uint16_t* y, cudaStream_t stream) {
  if (rows <= 0) return;
  const int threads = dim >= 2048 ? 512 : (dim >= 512 ? 256 : 128);
  add_rms_norm_bf16_kernel<<<unsigned(rows), threads, 0, stream>>>(
      x, delta, w, eps, dim, reinterpret_cast<__nv_bfloat16*>(y));
}

void qk_norm_rope_append(const float* qkv, int64_t n, int64_t ld, int n_heads, int n_kv_heads,
                         int head_dim, const float* q_norm, const float* k_norm, float eps,
                         const int64_t* positions, double theta, float* q_out, uint16_t* k_cache,
                         uint16_t* v_cache, cudaStream_t stream) {
  qk::launch_qk_norm_rope(qkv, n, ld, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, positions,
                          nullptr, theta, q_out, reinterpret_cast<__nv_bfloat16*>(k_cache),
                          reinterpret_cast<__nv_bfloat16*>(v_cache), stream, "qk_norm_rope_append");
}

int attention_splits(int64_t nq, int n_heads) {
  // About 4096 blocks in all (the H200 has 132 SMs), at most 32 splits: decode (nq = 1, 32 heads)
  // gets 32 splits, a 17-token verify 8, a long prefill 1.
  const int64_t qh = nq * n_heads;
  if (qh <= 0) return 1;
  const int64_t s = (4096 + qh - 1) / qh;
  return int(s < 1 ? 1 : (s > 32 ? 32 : s));
}

int64_t attention_partial_floats(int64_t nq, int n_heads, int head_dim, int splits) {
  return nq * n_heads * int64_t(splits) * (int64_t(head_dim) + 2);
}

void attention_split_kv(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim,
                        const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* key_count,
                        float scale, int splits, float* partial, void* out, Elem out_type,
                        cudaStream_t stream) {
  if (nq <= 0) return;
  check_head_dim(head_dim, "attention_split_kv");
  if (splits < 1 || splits > 65535 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument("flashmap::cuda::attention_split_kv: bad splits or head counts");
  const int64_t slots = nq * n_heads * splits;
  float* pm = partial;
  float* pl = partial + slots;
  float* pacc = partial + 2 * slots;
  const dim3 grid(unsigned(nq * n_heads), unsigned(splits));
  attn_partial_kernel<<<grid, 32 * kWarps, 0, stream>>>(
      q, n_heads, n_kv_heads, head_dim, reinterpret_cast<const __nv_bfloat16*>(k_cache),
      reinterpret_cast<const __nv_bfloat16*>(v_cache), key_count, scale, pm, pl, pacc);
  const int threads = head_dim <= 128 ? 128 : 256;
  if (out_type == Elem::BF16)
    attn_combine_kernel<<<unsigned(nq * n_heads), threads, 0, stream>>>(
        pm, pl, pacc, splits, head_dim, static_cast<__nv_bfloat16*>(out));
  else
    attn_combine_kernel<<<unsigned(nq * n_heads), threads, 0, stream>>>(
        pm, pl, pacc, splits, head_dim, static_cast<float*>(out));
}

void swiglu_bf16(const float* gu, int64_t rows, int64_t inter, uint16_t* y, cudaStream_t stream) {
  const int64_t n = rows * inter;
  if (n > 0)
    swiglu_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(gu, rows, inter,
                                                             reinterpret_cast<__nv_bfloat16*>(y));
}

void uniform_bf16(uint16_t* w, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n > 0)
    uniform_bf16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(w),
                                                              n, scale, seed);
}

void fill_f32(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n > 0) fill_f32_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, value);
}

void read_probe(const void* p, int64_t bytes, uint32_t* sink, int sm_count, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  if (n <= 0) return;
  // 8 blocks of 256 threads per SM: full occupancy (2048 threads) on Hopper.
  const unsigned blocks = unsigned(sm_count > 0 ? sm_count * 8 : 1024);
  read_probe_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(p), n, sink);
}

}  // namespace flashmap::cuda
