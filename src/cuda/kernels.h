// CUDA kernels: one launcher per CPU op in src/ops/cpu_ops.cpp (the reference), with the same
// argument order and layout so a device forward reads like the CPU one. All pointers are device
// pointers; every launcher enqueues on `stream` and returns without synchronizing. Activations are
// fp32 here (as on the CPU); weights and the KV cache may be bf16 (passed as uint16_t bits, so this
// header needs no cuda_bf16.h), always accumulated in fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashmap::cuda {

// Storage type of a tensor read by a kernel (bf16 bits or fp32).
enum class Elem : uint8_t { F32, BF16 };

// flashmap::Qwen3Model's embed_.row_f32 per token: out[i, :] = widen(table[tokens[i], :]). Tokens
// must be in [0, vocab) (validated on the host, or produced by argmax on the device).
void embedding(const void* table, Elem table_type, int64_t dim, const int32_t* tokens, int64_t n,
               float* out, cudaStream_t stream);

// ops::rms_norm (Qwen3RMSNorm): y = w * (x * rsqrt(mean(x²) + eps)). Per-head q/k norm is the
// same call with rows = tokens * heads, dim = head_dim. y may equal x.
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y,
              cudaStream_t stream);
// ops::rms_norm_scale_first (FlashMapRMSNorm): y = x * (w * rsqrt(mean(x²) + eps)).
void rms_norm_scale_first(const float* x, const float* w, float eps, int64_t rows, int64_t dim,
                          float* y, cudaStream_t stream);
// ops::layer_norm followed by the drafter's AdaLN modulation: y = ln(x) * (1 + scale) + shift,
// scale/shift per column ([dim] each). With scale = shift = nullptr it is plain ops::layer_norm.
void layer_norm_modulate(const float* x, float eps, int64_t rows, int64_t dim, const float* scale,
                         const float* shift, float* y, cudaStream_t stream);

// ops::rope_half / ops::rope_interleaved, in place on [rows, heads, head_dim]; positions[rows].
void rope_half(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
               double theta, cudaStream_t stream);
void rope_interleaved(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
                      double theta, cudaStream_t stream);

// Qwen3 MLP: out[i] = silu(gate[i]) * up[i] (ops::silu). out may equal gate.
void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
// Drafter MLP: y[i] = gelu(x[i]) (ops::gelu, exact erf). y may equal x.
void gelu(const float* x, int64_t n, float* y, cudaStream_t stream);
// Residual connections: x[i] += y[i] (target), x[r, c] += gate[c] * y[r, c] (drafter's gated add).
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
void gated_add(float* x, const float* gate, const float* y, int64_t rows, int64_t dim,
               cudaStream_t stream);

// ops::softmax_rows, in place.
void softmax_rows(float* x, int64_t rows, int64_t dim, cudaStream_t stream);
// flashmap::argmax per row (std::max_element: the lowest index among equal maxima).
void argmax_rows(const float* x, int64_t rows, int64_t dim, int32_t* out, cudaStream_t stream);

// ops::attention: q [nq, n_heads, head_dim] fp32; k, v [n_keys, n_kv_heads, head_dim] in `kv_type`
// (row stride n_kv_heads * head_dim); query i attends to keys [0, key_count[i]). Causal decode and
// verify pass key_count[i] = past + i + 1; the drafter's bidirectional self-attention passes K for
// every query and its cross-attention the context length + 1. head_dim <= 256, even.
// group_rows > 0: query i reads the keys of its own group of rows instead, k and v starting at row
// (i / group_rows) · group_rows (the batched drafter's self-attention: each sequence's block sees
// its own K slots only).
void attention(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim, const void* k,
               const void* v, Elem kv_type, const int64_t* key_count, float scale, float* out,
               cudaStream_t stream, int64_t group_rows = 0);

// flashmap::verify_greedy on the device: logits [K + 1, vocab]; draft [K]. Writes result[0] = the
// number of accepted draft tokens (longest prefix with draft[i] == argmax(logits[i])) and
// result[1] = the bonus token argmax(logits[accepted]). argmax_scratch holds K + 1 ints. The round
// then needs one 8-byte device→host copy.
void verify_greedy(const float* logits, int64_t vocab, const int32_t* draft, int K,
                   int32_t* argmax_scratch, int32_t* result, cudaStream_t stream);

// x[r, from:cols) = value for every row: the padding ids' logits set to −inf
// (flashmap::Qwen3Model::mask_padding).
void fill_columns(float* x, int64_t rows, int64_t cols, int64_t from, float value,
                  cudaStream_t stream);

// fp32 to bf16, rounded to nearest even (cuda::linear's activations).
void f32_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);

}  // namespace flashmap::cuda
