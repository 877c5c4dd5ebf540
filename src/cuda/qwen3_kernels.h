// Kernels of the Qwen3 forward on the device (Qwen3Model, qwen3_cuda.cpp) that kernels.h does not
// have: fused steps of flashmap::Qwen3Model::forward (src/models/qwen3.cpp, the reference) that
// write the bf16 GEMM inputs and the bf16 KV cache directly, a split-KV causal attention whose grid
// does not depend on the context length (so one CUDA graph replays at any position), random bf16
// weights made on the device, and the HBM read probe of `flashmap bench --device cuda`. Same
// conventions as kernels.h: device pointers, bf16 passed as uint16_t bits, enqueued on `stream`, no
// sync; launch errors surface through cudaGetLastError (the callers check after each layer).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace flashmap::cuda {

// positions[i] = length + i and key_count[i] = length + i + 1 for i < n (causal, as the CPU forward
// sets them). Launched outside the captured graph with `length` by value: the graph itself only
// reads these two buffers, so it replays at any cache length.
void fill_positions(int64_t length, int64_t n, int64_t* positions, int64_t* key_count,
                    cudaStream_t stream);

// One block per row: if delta != nullptr, x += delta first (the residual add of the CPU forward,
// written back to x); then y = bf16(w * (x * rsqrt(mean(x²) + eps))), ops::rms_norm rounded to bf16
// as the next GEMM's input.
void add_rms_norm_bf16(float* x, const float* delta, const float* w, float eps, int64_t rows,
                       int64_t dim, uint16_t* y, cudaStream_t stream);

// The attention block's per-head steps after the fused q/k/v GEMM. qkv [n, ld] fp32 holds per row q
// (n_heads·head_dim), then k, then v (n_kv_heads·head_dim each). Per row r at position
// positions[r]: q and k heads get the per-head RMSNorm (q_norm / k_norm, ops::rms_norm over
// head_dim) then rotate_half RoPE (ops::rope_half, inv_freq computed on the host like cpu_ops.cpp's
// inv_freq); q goes to q_out [n, n_heads, head_dim] fp32, k and v (unnormalized) to row
// positions[r] of the bf16 caches [*, n_kv_heads·head_dim]. head_dim even, <= 256.
void qk_norm_rope_append(const float* qkv, int64_t n, int64_t ld, int n_heads, int n_kv_heads,
                         int head_dim, const float* q_norm, const float* k_norm, float eps,
                         const int64_t* positions, double theta, float* q_out, uint16_t* k_cache,
                         uint16_t* v_cache, cudaStream_t stream);

// ops::attention over a bf16 KV cache, split across the keys (flash-decoding): query i attends to
// keys [0, key_count[i]); each of `splits` blocks per (query, head) takes a contiguous share of
// those keys (the share is computed on the device from key_count, so the grid is fixed for a
// captured graph) and writes a partial softmax state to `partial`; a second kernel merges them and
// writes out [nq, n_heads, head_dim] in out_type (bf16 when it feeds the o GEMM). partial holds
// attention_partial_floats(nq, n_heads, head_dim, splits) floats.
int attention_splits(int64_t nq,
                     int n_heads);  // the split count used for nq queries
int64_t attention_partial_floats(int64_t nq, int n_heads, int head_dim, int splits);
void attention_split_kv(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim,
                        const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* key_count,
                        float scale, int splits, float* partial, void* out, Elem out_type,
                        cudaStream_t stream);

// The Qwen3 MLP activation on the fused gate/up GEMM output gu [rows, 2·inter] (gate columns
// first): y[r, c] = bf16(silu(gate) * up), ops::silu's x / (1 + exp(−x)).
void swiglu_bf16(const float* gu, int64_t rows, int64_t inter, uint16_t* y, cudaStream_t stream);

// w[i] = bf16(u_i · scale), u_i uniform in [−√3, √3) (unit variance) from a counter-based hash of
// (seed, i): the same values for the same seed whatever the launch shape. Mirrors the CPU bench's
// random_target (src/cli/cmd_bench.cpp), not its exact values.
void uniform_bf16(uint16_t* w, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
void fill_f32(float* x, int64_t n, float value, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) from p with 16-byte loads on every SM; sink[0] is written only
// if an impossible value turns up, which keeps the loads alive. The HBM read probe of the bench.
void read_probe(const void* p, int64_t bytes, uint32_t* sink, int sm_count, cudaStream_t stream);

}  // namespace flashmap::cuda
