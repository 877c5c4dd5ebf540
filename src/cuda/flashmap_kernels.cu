// Kernels of the FlashMap drafter on the device (see flashmap_kernels.h for what each mirrors).
// Grid-stride pointwise kernels like kernels.cu; the few single-thread ones write one value.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/flashmap_kernels.h"
#include "cuda/philox.h"
#include "paged/step_plan.h"

namespace flashmap::cuda::drafter {
namespace {

// Enough blocks to fill an H200 (132 SMs) several times, at least one.
inline unsigned grid_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return b < 1 ? 1u : (b > 132 * 32 ? 132u * 32u : unsigned(b));
}

#define FLASHMAP_GRID_STRIDE(i, n)                                          \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// One Philox block (four normals) per iteration, written as philox::normal numbers them.
__global__ void philox_normal_kernel(float* out, int64_t n, const uint64_t* seed_counter,
                                     uint64_t seed, uint64_t counter) {
  if (seed_counter) {
    seed = seed_counter[0];
    counter = seed_counter[1];
  }
  const int64_t groups = (n + 3) / 4;
  FLASHMAP_GRID_STRIDE(g, groups) {
    const philox::U4 u = philox::block(seed, counter, uint64_t(g));
    float z[4];
    philox::box_muller(u.x, u.y, z[0], z[1]);
    philox::box_muller(u.z, u.w, z[2], z[3]);
    const int64_t i0 = 4 * g;
    for (int e = 0; e < 4 && i0 + e < n; ++e) out[i0 + e] = z[e];
  }
}

// Sequence blockIdx.y's draws, numbered as philox_normal_kernel numbers them.
__global__ void philox_normal_seqs_kernel(float* out, int64_t per_seq,
                                          const uint64_t* seed_counter) {
  const int b = blockIdx.y;
  const uint64_t seed = seed_counter[2 * b], counter = seed_counter[2 * b + 1];
  float* o = out + int64_t(b) * per_seq;
  const int64_t groups = (per_seq + 3) / 4;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    const philox::U4 u = philox::block(seed, counter, uint64_t(g));
    float z[4];
    philox::box_muller(u.x, u.y, z[0], z[1]);
    philox::box_muller(u.z, u.w, z[2], z[3]);
    const int64_t i0 = 4 * g;
    for (int e = 0; e < 4 && i0 + e < per_seq; ++e) o[i0 + e] = z[e];
  }
}

__global__ void widen_kernel(const int32_t* in, int64_t n, int64_t offset, int64_t* out) {
  FLASHMAP_GRID_STRIDE(i, n) out[i] = int64_t(in[i]) + offset;
}

__global__ void gather_rows_kernel(const float* src, const int32_t* rows, int64_t n, int64_t dim,
                                   float* out) {
  FLASHMAP_GRID_STRIDE(t, n * dim) {
    const int64_t i = t / dim, j = t % dim;
    out[t] = src[int64_t(rows[i]) * dim + j];
  }
}

__global__ void scatter_rows_bf16_kernel(const float* src, int64_t n, int64_t dim,
                                         const int32_t* slots, __nv_bfloat16* pool) {
  FLASHMAP_GRID_STRIDE(t, n * dim) {
    const int64_t i = t / dim, j = t % dim;
    const int32_t slot = slots[i];
    if (slot >= 0) pool[int64_t(slot) * dim + j] = __float2bfloat16_rn(src[t]);
  }
}

// The anchor slot of sequence b of the view, −1 for a padding sequence.
__device__ int32_t anchor_slot_of(const StepView& sv, int b) {
  if (sv.seq_rows[b] == 0) return -1;
  const int64_t p = int64_t(sv.seq_base[b]) - 1;
  const int32_t* table = sv.tables + int64_t(b) * sv.header[paged::StepPlan::kTableStride];
  const int bt = sv.block_tokens;
  return int32_t(int64_t(table[p / bt]) * bt + p % bt);
}

__global__ void anchor_slots_kernel(StepView sv, int32_t* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= sv.bucket) return;
  const int32_t slot = anchor_slot_of(sv, b);
  // The first sequence naming a slot writes it; a later one (another draw of the same tree)
  // reads what that one wrote. At most bucket lookups per sequence.
  bool first = slot >= 0;
  for (int e = 0; first && e < b; ++e) first = anchor_slot_of(sv, e) != slot;
  out[b] = first ? slot : -1;
}

__global__ void first_writers_kernel(const int32_t* slots, int64_t n, int32_t* out) {
  FLASHMAP_GRID_STRIDE(i, n) {
    const int32_t slot = slots[i];
    bool first = slot >= 0;
    for (int64_t j = 0; first && j < i; ++j) first = slots[j] != slot;
    out[i] = first ? slot : -1;
  }
}

__global__ void block_ids_kernel(const int32_t* anchors, int64_t n, int B, int32_t mask_id,
                                 int32_t* out) {
  FLASHMAP_GRID_STRIDE(i, n) out[i] = i % B == 0 ? anchors[i / B] : mask_id;
}

__global__ void philox_normal_bf16_kernel(__nv_bfloat16* out, int64_t n, float scale,
                                          uint64_t seed) {
  const int64_t groups = (n + 3) / 4;
  FLASHMAP_GRID_STRIDE(g, groups) {
    const philox::U4 u = philox::block(seed, 0, uint64_t(g));
    float z[4];
    philox::box_muller(u.x, u.y, z[0], z[1]);
    philox::box_muller(u.z, u.w, z[2], z[3]);
    const int64_t i0 = 4 * g;
    for (int e = 0; e < 4 && i0 + e < n; ++e) out[i0 + e] = __float2bfloat16_rn(scale * z[e]);
  }
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
  FLASHMAP_GRID_STRIDE(i, n) out[i] = value;
}

__global__ void unit_lower_kernel(__nv_bfloat16* L, int64_t n) {
  FLASHMAP_GRID_STRIDE(t, n * n) {
    const int64_t r = t / n, c = t % n;
    if (c > r) L[t] = __float2bfloat16_rn(0.0f);
    if (c == r) L[t] = __float2bfloat16_rn(1.0f);
  }
}

// ops::silu: x / (1 + exp(-x)).
__device__ __forceinline__ float silu_f(float x) {
  return x / (1.0f + expf(-x));
}

__global__ void silu_kernel(float* x, int64_t n) {
  FLASHMAP_GRID_STRIDE(i, n) x[i] = silu_f(x[i]);
}

__global__ void add_silu_kernel(const float* a, const float* b, int64_t n, float* out) {
  FLASHMAP_GRID_STRIDE(i, n) out[i] = silu_f(a[i] + b[i]);
}

__global__ void mix_state_kernel(const float* posterior, int64_t posterior_stride,
                                 const float* noise, float gate, int64_t rows, int64_t dim,
                                 float* out) {
  FLASHMAP_GRID_STRIDE(t, rows * dim) {
    const int64_t r = t / dim, i = t % dim;
    out[t] = posterior[r * posterior_stride + i] + gate * noise[t];
  }
}

__global__ void scale_kernel(const float* x, float s, int64_t n, float* y) {
  FLASHMAP_GRID_STRIDE(i, n) y[i] = x[i] * s;
}

__global__ void jump_update_kernel(float* state, const float* probs, float a, float w, float d,
                                   int64_t n) {
  FLASHMAP_GRID_STRIDE(i, n) state[i] = (state[i] * a + probs[i] * w) / d;
}

__global__ void draft_positions_kernel(const int64_t* length, int K, int64_t* block_positions,
                                       int64_t* anchor_position, int64_t* cross_counts) {
  const int64_t L = *length;
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    block_positions[i] = L + 1 + i;
    cross_counts[i] = L + 1;
  }
  if (threadIdx.x == 0) anchor_position[0] = L;
}

__global__ void iota_kernel(int64_t* out, int64_t start, int64_t n) {
  FLASHMAP_GRID_STRIDE(i, n) out[i] = start + i;
}

template <typename T>
__global__ void set_value_kernel(T* p, T v) {
  *p = v;
}

__global__ void set_pair_kernel(uint64_t* p, uint64_t a, uint64_t b) {
  p[0] = a;
  p[1] = b;
}

__global__ void write_row_kernel(float* base, const int64_t* row, const float* src, int64_t dim) {
  float* dst = base + (*row) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void philox_normal(float* out, int64_t n, const uint64_t* seed_counter, uint64_t seed,
                   uint64_t counter, cudaStream_t stream) {
  if (n > 0)
    philox_normal_kernel<<<grid_for((n + 3) / 4), 256, 0, stream>>>(out, n, seed_counter, seed,
                                                                    counter);
}

void philox_normal_seqs(float* out, int64_t per_seq, int seqs, const uint64_t* seed_counter,
                        cudaStream_t stream) {
  if (per_seq <= 0 || seqs <= 0) return;
  const int64_t groups = (per_seq + 3) / 4;
  const unsigned x = unsigned(std::min<int64_t>((groups + 255) / 256, 256));
  philox_normal_seqs_kernel<<<dim3(x, unsigned(seqs)), 256, 0, stream>>>(out, per_seq,
                                                                         seed_counter);
}

void widen(const int32_t* in, int64_t n, int64_t offset, int64_t* out, cudaStream_t stream) {
  if (n > 0) widen_kernel<<<grid_for(n), 256, 0, stream>>>(in, n, offset, out);
}

void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t dim, float* out,
                 cudaStream_t stream) {
  if (n * dim > 0)
    gather_rows_kernel<<<grid_for(n * dim), 256, 0, stream>>>(src, rows, n, dim, out);
}

void scatter_rows_bf16(const float* src, int64_t n, int64_t dim, const int32_t* slots,
                       uint16_t* pool, cudaStream_t stream) {
  if (n * dim > 0)
    scatter_rows_bf16_kernel<<<grid_for(n * dim), 256, 0, stream>>>(
        src, n, dim, slots, reinterpret_cast<__nv_bfloat16*>(pool));
}

void anchor_slots(const StepView& view, int32_t* out, cudaStream_t stream) {
  if (view.bucket > 0)
    anchor_slots_kernel<<<unsigned((view.bucket + 127) / 128), 128, 0, stream>>>(view, out);
}

void first_writers(const int32_t* slots, int64_t n, int32_t* out, cudaStream_t stream) {
  if (n > 0) first_writers_kernel<<<grid_for(n), 256, 0, stream>>>(slots, n, out);
}

void block_ids(const int32_t* anchors, int bucket, int B, int32_t mask_id, int32_t* out,
               cudaStream_t stream) {
  const int64_t n = int64_t(bucket) * B;
  if (n > 0) block_ids_kernel<<<grid_for(n), 256, 0, stream>>>(anchors, n, B, mask_id, out);
}

void philox_normal_bf16(uint16_t* out, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n > 0)
    philox_normal_bf16_kernel<<<grid_for((n + 3) / 4), 256, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out), n, scale, seed);
}

void fill(float* out, int64_t n, float value, cudaStream_t stream) {
  if (n > 0) fill_kernel<<<grid_for(n), 256, 0, stream>>>(out, n, value);
}

void make_unit_lower(uint16_t* L, int64_t n, cudaStream_t stream) {
  if (n > 0)
    unit_lower_kernel<<<grid_for(n * n), 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(L), n);
}

void silu(float* x, int64_t n, cudaStream_t stream) {
  if (n > 0) silu_kernel<<<grid_for(n), 256, 0, stream>>>(x, n);
}

void add_silu(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n > 0) add_silu_kernel<<<grid_for(n), 256, 0, stream>>>(a, b, n, out);
}

void mix_state(const float* posterior, int64_t posterior_stride, const float* noise, float gate,
               int64_t rows, int64_t dim, float* out, cudaStream_t stream) {
  if (rows * dim > 0)
    mix_state_kernel<<<grid_for(rows * dim), 256, 0, stream>>>(posterior, posterior_stride, noise,
                                                               gate, rows, dim, out);
}

void scale(const float* x, float s, int64_t n, float* y, cudaStream_t stream) {
  if (n > 0) scale_kernel<<<grid_for(n), 256, 0, stream>>>(x, s, n, y);
}

void jump_update(float* state, const float* probs, float a, float w, float d, int64_t n,
                 cudaStream_t stream) {
  if (n > 0) jump_update_kernel<<<grid_for(n), 256, 0, stream>>>(state, probs, a, w, d, n);
}

void draft_positions(const int64_t* length, int K, int64_t* block_positions,
                     int64_t* anchor_position, int64_t* cross_counts, cudaStream_t stream) {
  draft_positions_kernel<<<1, 128, 0, stream>>>(length, K, block_positions, anchor_position,
                                                cross_counts);
}

void iota(int64_t* out, int64_t start, int64_t n, cudaStream_t stream) {
  if (n > 0) iota_kernel<<<grid_for(n), 256, 0, stream>>>(out, start, n);
}

void set_value(int64_t* p, int64_t v, cudaStream_t stream) {
  set_value_kernel<int64_t><<<1, 1, 0, stream>>>(p, v);
}

void set_value(int32_t* p, int32_t v, cudaStream_t stream) {
  set_value_kernel<int32_t><<<1, 1, 0, stream>>>(p, v);
}

void set_pair(uint64_t* p, uint64_t a, uint64_t b, cudaStream_t stream) {
  set_pair_kernel<<<1, 1, 0, stream>>>(p, a, b);
}

void write_row(float* base, const int64_t* row, const float* src, int64_t dim,
               cudaStream_t stream) {
  if (dim > 0) write_row_kernel<<<1, 256, 0, stream>>>(base, row, src, dim);
}

}  // namespace flashmap::cuda::drafter
