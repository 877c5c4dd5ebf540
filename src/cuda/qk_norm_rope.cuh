// The attention block's per-head steps after the fused q/k/v GEMM, shared by the per-sequence
// forward (qwen3_kernels.cu, qk_norm_rope_append) and the batched step (paged_attention.cu,
// qk_norm_rope_paged): per row, q and k heads get the per-head RMSNorm (q_norm / k_norm, before
// RoPE as in modeling_qwen3.py) then rotate_half RoPE; q goes to q_out, k (normed, rotated) and v
// to the row's cache slot. Include from one .cu file each (the kernel is instantiated per file).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace flashmap::cuda::qk {

// inv_freq by value, computed on the host with cpu_ops.cpp's formula in fp32, so both backends
// rotate by bit-identical frequencies (head_dim <= 256).
struct Freq {
  float f[128];
};

inline Freq rope_freq(double theta, int head_dim, const char* op) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256)
    throw std::invalid_argument(std::string("flashmap::cuda::") + op +
                                ": head_dim must be even and <= 256, got " +
                                std::to_string(head_dim));
  Freq f{};
  for (int i = 0; i < head_dim / 2; ++i)
    f.f[i] = 1.0f / std::pow(float(theta), float(2 * i) / float(head_dim));
  return f;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void put(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void put(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// One warp per (row, head) of a row's q, k and v heads (q first, then k, then v). Row r is at
// RoPE position pos[r] and writes its keys and values to cache slot slot[r] (slot == nullptr: the
// position itself; a slot < 0: no write, a padding row).
template <typename Pos, typename QOut>
__global__ void qk_norm_rope_kernel(const float* qkv, int64_t n, int64_t ld, int nh, int nkv,
                                    int hd, const float* qn, const float* kn, float eps,
                                    const Pos* pos, const int32_t* slot, Freq freq, QOut* q_out,
                                    __nv_bfloat16* kc, __nv_bfloat16* vc) {
  const int lane = threadIdx.x & 31;
  const int per_row = nh + 2 * nkv;
  const int64_t item = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= n * per_row) return;  // the whole warp shares `item`, so it leaves together
  const int64_t r = item / per_row;
  const int hh = int(item % per_row);
  const int64_t p = pos[r], at = slot ? int64_t(slot[r]) : p;
  const int64_t q_dim = int64_t(nh) * hd, kv_dim = int64_t(nkv) * hd;
  const float* row = qkv + r * ld;
  const bool is_q = hh < nh;
  if (!is_q && at < 0) return;
  if (hh >= nh + nkv) {  // v: stored as computed
    const int vh = hh - nh - nkv;
    const float* src = row + q_dim + kv_dim + int64_t(vh) * hd;
    __nv_bfloat16* dst = vc + at * kv_dim + int64_t(vh) * hd;
    for (int d = lane; d < hd; d += 32) dst[d] = __float2bfloat16_rn(src[d]);
    return;
  }
  const int h = is_q ? hh : hh - nh;
  const float* src = row + (is_q ? int64_t(h) * hd : q_dim + int64_t(h) * hd);
  const float* w = is_q ? qn : kn;
  // ops::rms_norm over head_dim.
  float ss = 0;
  for (int d = lane; d < hd; d += 32) ss = fmaf(src[d], src[d], ss);
  const float inv = 1.0f / sqrtf(warp_sum(ss) / float(hd) + eps);
  // ops::rope_half: channel i pairs with i + half, angle float(position) * inv_freq[i].
  const int half = hd / 2;
  for (int i = lane; i < half; i += 32) {
    const float a = w[i] * (src[i] * inv), b = w[i + half] * (src[i + half] * inv);
    const float ang = float(p) * freq.f[i];
    const float c = cosf(ang), s = sinf(ang);
    const float o1 = a * c - b * s, o2 = b * c + a * s;
    if (is_q) {
      QOut* dst = q_out + (r * nh + h) * hd;
      put(dst + i, o1);
      put(dst + i + half, o2);
    } else {
      __nv_bfloat16* dst = kc + at * kv_dim + int64_t(h) * hd;
      dst[i] = __float2bfloat16_rn(o1);
      dst[i + half] = __float2bfloat16_rn(o2);
    }
  }
}

// Launches the kernel over n rows: four warps a block.
template <typename Pos, typename QOut>
void launch_qk_norm_rope(const float* qkv, int64_t n, int64_t ld, int nh, int nkv, int hd,
                         const float* qn, const float* kn, float eps, const Pos* pos,
                         const int32_t* slot, double theta, QOut* q_out, __nv_bfloat16* kc,
                         __nv_bfloat16* vc, cudaStream_t stream, const char* op) {
  if (n <= 0) return;
  const Freq f = rope_freq(theta, hd, op);
  const int64_t items = n * (nh + 2 * nkv);
  constexpr int kItemsPerBlock = 4;
  qk_norm_rope_kernel<<<unsigned((items + kItemsPerBlock - 1) / kItemsPerBlock),
                        32 * kItemsPerBlock, 0, stream>>>(qkv, n, ld, nh, nkv, hd, qn, kn, eps, pos,
                                                          slot, f, q_out, kc, vc);
}

}  // namespace flashmap::cuda::qk
