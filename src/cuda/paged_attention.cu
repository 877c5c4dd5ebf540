// The batched step's kernels over a paged KV cache (see paged_attention.h). The attention follows
// FlashAttention-2's shape: a block holds one sequence's queries of one KV head (all its rows ×
// the GQA group, 128 at a time) and walks the keys in tiles of 64 loaded once into shared memory,
// S = Q·Kᵀ and O += P·V on tensor cores with an online softmax per row in registers; split slots
// of the keys are merged by a second kernel, as flash-decoding does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/paged_attention.h"
#include "cuda/qk_norm_rope.cuh"
#include "paged/step_plan.h"

namespace flashmap::cuda {
namespace {

using bf16 = __nv_bfloat16;

// --- tensor-core attention ------------------------------------------------------------------

constexpr int kWarps = 8;
constexpr int kPassRows = 16 * kWarps;  // query rows (token row × head) per pass

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8×8 bf16 matrices; lanes 8i … 8i + 7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// D += A (16×16, row-major fragments a) · B (16×8, column fragments b0, b1), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
  return *reinterpret_cast<uint32_t*>(&v);
}

// Whether the row at step row `row` (of sequence with cache base `base` and key end `key_end`)
// sees key `key`: every cached key, then the block rows its mask names.
__device__ __forceinline__ bool sees(const StepView& sv, int64_t row, int64_t key, int64_t base,
                                     int64_t key_end) {
  if (key >= key_end) return false;
  if (key < base) return true;
  const int64_t j = key - base;
  return (sv.row_mask[row * sv.mask_words + (j >> 5)] >> (j & 31)) & 1u;
}

// One block per (sequence b, KV head, split slot g); the slot takes key chunks g, g + kSplits, …
// Writes, per query row of the sequence and head of the group, the unnormalized softmax state of
// its keys (m in log2 units, l, acc) at partial slot ((b·nkv + kh)·kSplits + g)·QRmax + qi.
template <int HDP>
__global__ void __launch_bounds__(kWarps * 32)
    paged_attn_kernel(const bf16* __restrict__ q, StepView sv, int nh, int nkv, int hd,
                      const bf16* __restrict__ kpool, const bf16* __restrict__ vpool,
                      float scale_log2, float* __restrict__ pm, float* __restrict__ pl,
                      float* __restrict__ pacc) {
  constexpr int LD = HDP + 8;  // 16 bytes of padding: ldmatrix's 8 row reads hit 8 bank groups
  constexpr int kChunks = HDP / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kPassRows][LD]
  bf16* sK = sQ + kPassRows * LD;                // [kTileKeys][LD]
  bf16* sV = sK + kTileKeys * LD;                // [kTileKeys][LD]

  const int b = blockIdx.x, kh = blockIdx.y, g = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rows = sv.seq_rows[b];
  if (rows == 0) return;  // a padding sequence: the combine writes its rows' zeros
  const int gsz = nh / nkv, QR = rows * gsz, QRmax = sv.R * gsz;
  const int64_t pbase = ((int64_t(b) * nkv + kh) * kSplits + g) * QRmax;
  const int64_t base = sv.seq_base[b], key_end = base + (sv.block_keys ? rows : 0);
  const int32_t* table = sv.tables + int64_t(b) * sv.header[paged::StepPlan::kTableStride];
  const int bt = sv.block_tokens;
  const int64_t kv_dim = int64_t(nkv) * hd;
  const int64_t n_chunks = (key_end + kChunkKeys - 1) / kChunkKeys;
  const int64_t row0 = int64_t(b) * sv.R;
  const int gq = lane >> 2, tq = lane & 3;

  for (int pass0 = 0; pass0 < QR; pass0 += kPassRows) {
    // Q: query row qi is token row qi / gsz, head kh·gsz + qi % gsz; dims past hd are zeros.
    for (int c = tid; c < kPassRows * kChunks; c += blockDim.x) {
      const int i = c / kChunks, d8 = (c % kChunks) * 8, qi = pass0 + i;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (qi < QR && d8 < hd) {
        const int64_t h = int64_t(kh) * gsz + qi % gsz;
        val = *reinterpret_cast<const uint4*>(q + ((row0 + qi / gsz) * nh + h) * hd + d8);
      }
      *reinterpret_cast<uint4*>(sQ + i * LD + d8) = val;
    }
    // This thread's two rows of its warp's 16: gq and gq + 8.
    const int qi_lo = pass0 + warp * 16 + gq, qi_hi = qi_lo + 8;
    const bool warp_live = pass0 + warp * 16 < QR;
    const bool live_lo = qi_lo < QR, live_hi = qi_hi < QR;
    const int64_t row_lo = row0 + (live_lo ? qi_lo / gsz : 0);
    const int64_t row_hi = row0 + (live_hi ? qi_hi / gsz : 0);
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    float o[HDP / 8][4];
#pragma unroll
    for (int nt = 0; nt < HDP / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    __syncthreads();

    for (int64_t c = g; c < n_chunks; c += kSplits) {
      for (int t = 0; t < kChunkKeys / kTileKeys; ++t) {
        const int64_t key0 = c * kChunkKeys + int64_t(t) * kTileKeys;
        if (key0 >= key_end) break;  // the same for every thread of the block
        for (int cc = tid; cc < kTileKeys * kChunks; cc += blockDim.x) {
          const int j = cc / kChunks, d8 = (cc % kChunks) * 8;
          const int64_t key = key0 + j;
          uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
          if (key < key_end && d8 < hd) {
            const int64_t slot = int64_t(table[key / bt]) * bt + key % bt;
            const int64_t off = slot * kv_dim + int64_t(kh) * hd + d8;
            kv = *reinterpret_cast<const uint4*>(kpool + off);
            vv = *reinterpret_cast<const uint4*>(vpool + off);
          }
          *reinterpret_cast<uint4*>(sK + j * LD + d8) = kv;
          *reinterpret_cast<uint4*>(sV + j * LD + d8) = vv;
        }
        __syncthreads();
        if (warp_live) {
          // S = Q·Kᵀ for the warp's 16 rows and the tile's 64 keys (8 column tiles of 8 keys).
          float s[kTileKeys / 8][4];
#pragma unroll
          for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
          for (int ks = 0; ks < HDP / 16; ++ks) {
            uint32_t a[4];
            ldmatrix_x4(a, sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 +
                               (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < kTileKeys / 16; ++np) {
              uint32_t bk[4];
              ldmatrix_x4(bk, sK + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 +
                                  ((lane >> 3) & 1) * 8);
              mma_bf16(s[2 * np], a, bk[0], bk[1]);
              mma_bf16(s[2 * np + 1], a, bk[2], bk[3]);
            }
          }
          // Scale and mask; element e of column tile j is (row lo for e < 2, else hi; key
          // key0 + 8j + 2·tq + e % 2).
          float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
          for (int j = 0; j < kTileKeys / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const bool hi = e >= 2;
              const int64_t key = key0 + 8 * j + 2 * tq + (e & 1);
              const bool vis =
                  (hi ? live_hi : live_lo) && sees(sv, hi ? row_hi : row_lo, key, base, key_end);
              s[j][e] = vis ? s[j][e] * scale_log2 : -INFINITY;
              if (hi)
                mx_hi = fmaxf(mx_hi, s[j][e]);
              else
                mx_lo = fmaxf(mx_lo, s[j][e]);
            }
          mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
          mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
          mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
          mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
          // A row that has seen no key yet keeps m = −inf: its rescale is 1 and its p are 0.
          const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
          const float sub_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
          const float sub_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
          const float al_lo = mn_lo == -INFINITY ? 1.0f : exp2f(m_lo - mn_lo);
          const float al_hi = mn_hi == -INFINITY ? 1.0f : exp2f(m_hi - mn_hi);
          float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
          for (int j = 0; j < kTileKeys / 8; ++j) {
            s[j][0] = exp2f(s[j][0] - sub_lo);
            s[j][1] = exp2f(s[j][1] - sub_lo);
            s[j][2] = exp2f(s[j][2] - sub_hi);
            s[j][3] = exp2f(s[j][3] - sub_hi);
            sum_lo += s[j][0] + s[j][1];
            sum_hi += s[j][2] + s[j][3];
          }
          l_lo = l_lo * al_lo + sum_lo;
          l_hi = l_hi * al_hi + sum_hi;
          m_lo = mn_lo;
          m_hi = mn_hi;
#pragma unroll
          for (int nt = 0; nt < HDP / 8; ++nt) {
            o[nt][0] *= al_lo;
            o[nt][1] *= al_lo;
            o[nt][2] *= al_hi;
            o[nt][3] *= al_hi;
          }
          // O += P·V: P's accumulators are already in the A operand's layout (two column tiles of
          // 8 keys make one k-step of 16).
#pragma unroll
          for (int kk = 0; kk < kTileKeys / 16; ++kk) {
            const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                                   pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < HDP / 16; ++dp) {
              uint32_t bv[4];
              ldmatrix_x4_trans(bv, sV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                        dp * 16 + (lane >> 4) * 8);
              mma_bf16(o[2 * dp], a, bv[0], bv[1]);
              mma_bf16(o[2 * dp + 1], a, bv[2], bv[3]);
            }
          }
        }
        __syncthreads();  // the tile is read; the next one may overwrite it
      }
    }
    // The row sums' four quarters (each thread summed its own columns), in a fixed order.
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    if (warp_live) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const bool live = half ? live_hi : live_lo;
        if (!live) continue;
        const int64_t at = pbase + (half ? qi_hi : qi_lo);
        if (tq == 0) {
          pm[at] = half ? m_hi : m_lo;
          pl[at] = half ? l_hi : l_lo;
        }
#pragma unroll
        for (int nt = 0; nt < HDP / 8; ++nt) {
          const int d = nt * 8 + 2 * tq;
          if (d < hd) pacc[at * hd + d] = o[nt][half * 2];
          if (d + 1 < hd) pacc[at * hd + d + 1] = o[nt][half * 2 + 1];
        }
      }
    }
    __syncthreads();  // before the next pass overwrites Q
  }
}

// O = Σ_g acc_g·2^(m_g − M) / Σ_g l_g·2^(m_g − M) over the split slots in order; one block per
// (step row, head). Padding rows get zeros.
__global__ void paged_combine_kernel(const float* pm, const float* pl, const float* pacc,
                                     StepView sv, int nh, int nkv, int hd, bf16* out) {
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const int b = int(row / sv.R), tr = int(row % sv.R);
  bf16* o = out + (row * nh + h) * hd;
  if (tr >= sv.seq_rows[b]) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int gsz = nh / nkv, kh = h / gsz, QRmax = sv.R * gsz, qi = tr * gsz + h % gsz;
  const int64_t first = (int64_t(b) * nkv + kh) * kSplits * QRmax + qi;
  float M = -INFINITY;
  for (int g = 0; g < kSplits; ++g) M = fmaxf(M, pm[first + int64_t(g) * QRmax]);
  float L = 0;
  for (int g = 0; g < kSplits; ++g) {
    const float m = pm[first + int64_t(g) * QRmax];
    if (m != -INFINITY) L += pl[first + int64_t(g) * QRmax] * exp2f(m - M);
  }
  // A row that sees no key (every slot's m = −inf, L = 0) gets zeros, as ops::attention gives a
  // query without keys, not 0 · ∞ = NaN.
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0;
    for (int g = 0; g < kSplits; ++g) {
      const int64_t at = first + int64_t(g) * QRmax;
      if (pm[at] != -INFINITY) acc += pacc[at * hd + d] * exp2f(pm[at] - M);
    }
    o[d] = __float2bfloat16_rn(acc * inv);
  }
}

// --- block copies ----------------------------------------------------------------

__global__ void copy_kv_blocks_kernel(uint16_t* pools, int64_t pool_stride, int64_t row_elems,
                                      int bt, const int32_t* copies) {
  const int i = blockIdx.x;
  uint16_t* pool = pools + int64_t(blockIdx.y) * pool_stride;
  const int64_t src = int64_t(copies[3 * i]) * bt * row_elems;
  const int64_t dst = int64_t(copies[3 * i + 1]) * bt * row_elems;
  const int64_t n = int64_t(copies[3 * i + 2]) * row_elems / 8;  // 16-byte units
  const uint4* s = reinterpret_cast<const uint4*>(pool + src);
  uint4* d = reinterpret_cast<uint4*>(pool + dst);
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) d[e] = s[e];
}

// One thread per (pool, element of a row): the pairs in order, so each element sees the copies
// before it; elements are independent of one another.
__global__ void copy_kv_rows_kernel(uint16_t* pools, int64_t pool_stride, int64_t row_elems,
                                    const int32_t* pairs, int n) {
  uint16_t* pool = pools + int64_t(blockIdx.y) * pool_stride;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < row_elems;
       e += int64_t(gridDim.x) * blockDim.x)
    for (int i = 0; i < n; ++i)
      pool[int64_t(pairs[2 * i + 1]) * row_elems + e] = pool[int64_t(pairs[2 * i]) * row_elems + e];
}

template <int HDP>
void launch_attention(dim3 grid, const bf16* q, const StepView& sv, int nh, int nkv, int hd,
                      const bf16* k, const bf16* v, float scale_log2, float* pm, float* pl,
                      float* pacc, cudaStream_t stream) {
  constexpr size_t smem = size_t(kPassRows + 2 * kTileKeys) * (HDP + 8) * sizeof(bf16);
  // Over 48 KiB of shared memory needs the opt-in, once per kernel and device (a host-side
  // attribute, not a stream operation: allowed while a graph is being captured).
  static std::atomic<uint64_t> opted{0};
  int dev = 0;
  cudaGetDevice(&dev);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(opted.load() & bit)) {
    const cudaError_t e = cudaFuncSetAttribute(
        paged_attn_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("paged_attention: cannot opt in to ") +
                               std::to_string(smem) +
                               " bytes of shared memory: " + cudaGetErrorString(e));
    opted.fetch_or(bit);
  }
  paged_attn_kernel<HDP>
      <<<grid, kWarps * 32, smem, stream>>>(q, sv, nh, nkv, hd, k, v, scale_log2, pm, pl, pacc);
}

}  // namespace

StepView step_view(const int32_t* image, int bucket, int R, int block_tokens) {
  paged::StepPlan shape;
  shape.bucket = bucket;
  shape.R = R;
  shape.mask_words = (R + 31) / 32;
  const auto o = shape.offsets();
  StepView v;
  v.header = image;
  v.row_pos = image + o.row_pos;
  v.row_slot = image + o.row_slot;
  v.seq_base = image + o.seq_base;
  v.seq_rows = image + o.seq_rows;
  v.row_mask = reinterpret_cast<const uint32_t*>(image + o.row_mask);
  v.tables = image + o.tables;
  v.bucket = bucket;
  v.R = R;
  v.mask_words = shape.mask_words;
  v.block_tokens = block_tokens;
  return v;
}

void qk_norm_rope_paged(const float* qkv, int64_t rows, int64_t ld, int n_heads, int n_kv_heads,
                        int head_dim, const float* q_norm, const float* k_norm, float eps,
                        const StepView& step, double theta, uint16_t* q_out, uint16_t* k_pool,
                        uint16_t* v_pool, cudaStream_t stream) {
  qk::launch_qk_norm_rope(qkv, rows, ld, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps,
                          step.row_pos, step.row_slot, theta, reinterpret_cast<bf16*>(q_out),
                          reinterpret_cast<bf16*>(k_pool), reinterpret_cast<bf16*>(v_pool), stream,
                          "qk_norm_rope_paged");
}

int64_t paged_attention_partial_floats(int bucket, int R, int n_heads, int n_kv_heads,
                                       int head_dim) {
  const int64_t qr = int64_t(R) * (n_heads / n_kv_heads);
  return int64_t(bucket) * n_kv_heads * kSplits * qr * (int64_t(head_dim) + 2);
}

void paged_attention(const uint16_t* q, const StepView& step, int n_heads, int n_kv_heads,
                     int head_dim, const uint16_t* k_pool, const uint16_t* v_pool, float scale,
                     float* partial, uint16_t* out, cudaStream_t stream) {
  if (step.bucket <= 0 || step.R <= 0) return;
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 128)
    throw std::invalid_argument(
        "paged_attention: head_dim must be a multiple of 8 and at most 128, got " +
        std::to_string(head_dim));
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument("paged_attention: query heads not a multiple of the KV heads");
  const int64_t slots =
      paged_attention_partial_floats(step.bucket, step.R, n_heads, n_kv_heads, head_dim) /
      (int64_t(head_dim) + 2);
  float* pm = partial;
  float* pl = partial + slots;
  float* pacc = partial + 2 * slots;
  const dim3 grid(unsigned(step.bucket), unsigned(n_kv_heads), unsigned(kSplits));
  // Scores in log2 units: exp2f(s·scale·log2 e − m) is expf(s·scale − m·ln 2).
  const float scale_log2 = scale * 1.4426950408889634f;
  const auto* qb = reinterpret_cast<const bf16*>(q);
  const auto* kb = reinterpret_cast<const bf16*>(k_pool);
  const auto* vb = reinterpret_cast<const bf16*>(v_pool);
  if (head_dim <= 32)
    launch_attention<32>(grid, qb, step, n_heads, n_kv_heads, head_dim, kb, vb, scale_log2, pm, pl,
                         pacc, stream);
  else if (head_dim <= 64)
    launch_attention<64>(grid, qb, step, n_heads, n_kv_heads, head_dim, kb, vb, scale_log2, pm, pl,
                         pacc, stream);
  else
    launch_attention<128>(grid, qb, step, n_heads, n_kv_heads, head_dim, kb, vb, scale_log2, pm, pl,
                          pacc, stream);
  const dim3 cgrid(unsigned(int64_t(step.bucket) * step.R), unsigned(n_heads));
  paged_combine_kernel<<<cgrid, head_dim <= 64 ? 64 : 128, 0, stream>>>(
      pm, pl, pacc, step, n_heads, n_kv_heads, head_dim, reinterpret_cast<bf16*>(out));
}

void copy_kv_blocks(uint16_t* pools, int pools_count, int64_t pool_stride, int64_t row_elems,
                    int block_tokens, const int32_t* copies, int n_copies, cudaStream_t stream) {
  if (n_copies <= 0 || pools_count <= 0) return;
  if (row_elems % 8 != 0)
    throw std::invalid_argument("copy_kv_blocks: rows must be whole 16-byte units");
  copy_kv_blocks_kernel<<<dim3(unsigned(n_copies), unsigned(pools_count)), 256, 0, stream>>>(
      pools, pool_stride, row_elems, block_tokens, copies);
}

void copy_kv_rows(uint16_t* pools, int pools_count, int64_t pool_stride, int64_t row_elems,
                  const int32_t* pairs, int n_pairs, cudaStream_t stream) {
  if (n_pairs <= 0 || pools_count <= 0 || row_elems <= 0) return;
  const unsigned x = unsigned(std::min<int64_t>((row_elems + 255) / 256, 64));
  copy_kv_rows_kernel<<<dim3(x, unsigned(pools_count)), 256, 0, stream>>>(
      pools, pool_stride, row_elems, pairs, n_pairs);
}

}  // namespace flashmap::cuda
