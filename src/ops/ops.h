// CPU fp32 kernels: the reference every other backend is checked against.
// Each row of an op's output is computed by the same code in the same order whatever the number
// of rows or threads, so a 17-token verify pass gives bit-identical logits to 17 single-token
// steps (docs/ARCHITECTURE.md, "batch-invariant").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"

namespace flashmap {

struct TensorView;
enum class GgmlType : uint32_t;
namespace ops {
struct PackedWeight;
}

// Rows stored in a block-quantized encoding (a GGUF's Q4_K embedding: 4.5 bits a weight where
// fp32 takes 32), widened to fp32 a row or a run of its blocks at a time: `decode(row, c0, n,
// out)` writes values [c0, c0 + n) of the row whose row_bytes bytes start at `row`, c0 and n
// multiples of `block` (the values a block holds; n may end at the row's end). `tag` names the
// encoding (cache keys tell encodings apart).
struct BlockRows {
  std::vector<uint8_t> bytes;  // rows × row_bytes
  int64_t row_bytes = 0;
  int64_t block = 1;
  uint64_t tag = 0;
  std::function<void(const uint8_t* row, int64_t c0, int64_t n, float* out)> decode;

  // Rows of `cols` values in a GGUF type (Q8_0, Q4_K, ...: io/gguf.h), decoded as ggml does;
  // `bytes` holds whole rows.
  static std::shared_ptr<BlockRows> of_ggml(GgmlType type, int64_t cols,
                                            std::vector<uint8_t> bytes);
};

// A row-major [rows, cols] matrix of weights in their file dtype (nn.Linear stores [out, in]).
struct Weight {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  // The same matrix packed for the GEMM kernel (ops/gemm.h), set at load for linear layers;
  // linear() packs an unpacked weight per call (tests, one-off products).
  std::shared_ptr<const ops::PackedWeight> packed = nullptr;
  // Set instead of data for a table held in blocks (dtype F32: what its rows decode to). Rows
  // and products (row_f32, matmul_rows, the Gram matrix) give the values the decoded fp32
  // matrix gives, bit for bit.
  std::shared_ptr<const BlockRows> blocks = nullptr;

  static Weight of(const TensorView& t);  // a 2-D float tensor
  float at(int64_t r, int64_t c) const;   // of a block-held table: decodes row r
  void row_f32(int64_t r, float* out) const;
};

namespace ops {

// y[M, N] = x[M, K] · Wᵀ (+ bias[N]); W is [N, K] (nn.Linear). ldx/ldy: row strides.
// Each output is one fused multiply-add per k in order, then the bias (ops/gemm.h).
void linear(const float* x, int64_t M, const Weight& W, const float* bias, float* y,
            ThreadPool& pool, int64_t ldx = -1, int64_t ldy = -1);

// y[M, H] = x[M, V] · E with E [V, H] (a state read through an embedding table): each output is
// one fused multiply-add per row of E in order, from zero — linear's kernel over E's rows, packed
// a slice at a time. Defined in gemm.cpp.
void matmul_rows(const float* x, int64_t M, const Weight& E, float* y, ThreadPool& pool);
// For a block-held E (Weight::blocks): fn(v_lo, n, rows) for chunks of n ≤ kDecodedRows rows
// from v_lo on, in order, each decoded to fp32 on the pool (rows [n, H], 16 MB at H = 4096).
constexpr int64_t kDecodedRows = 1024;  // even: a chunk keeps pairs of rows whole
void for_decoded_rows(const Weight& E, ThreadPool& pool,
                      const std::function<void(int64_t, int64_t, const float*)>& fn);
// The same in the bf16 compute mode (ops/gemm.h, WeightFormat::Bf16): x and E rounded to bf16,
// AVX512-BF16 dot products over pairs of the vocabulary, fp32 sums in order. Defined in gemm.cpp.
void matmul_rows_bf16(const float* x, int64_t M, const Weight& E, float* y, ThreadPool& pool);

// Fixed-order dot product of two fp32 vectors.
float dot(const float* a, const float* b, int64_t n);

// transformers' Qwen3RMSNorm: w * (x * rsqrt(mean(x²) + eps)).
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y);
// FlashMapRMSNorm: x * (w * rsqrt(mean(x²) + eps)) — the scale is formed first.
void rms_norm_scale_first(const float* x, const float* w, float eps, int64_t rows, int64_t dim,
                          float* y);
// F.layer_norm without affine parameters (biased variance).
void layer_norm(const float* x, float eps, int64_t rows, int64_t dim, float* y);

// Rotary embedding on rows of [heads, head_dim] at one position each.
// Half-split (rotate_half: i pairs with i + d/2), transformers' Qwen3.
void rope_half(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
               double theta);
// Interleaved pairs (x[2i], x[2i+1]), FlashMap's apply_rope.
void rope_interleaved(float* x, int64_t rows, int heads, int head_dim, const int64_t* positions,
                      double theta);

// Which keys a query of a draft tree sees (each node: the committed context and its ancestors):
// keys below `first` always; key j >= first only where bit (j − first) of the query's `words`
// 64-bit words (query i's at bits + i * words) is set.
struct KeyMask {
  int64_t first = 0;
  int64_t words = 0;
  const uint64_t* bits = nullptr;
};

// Multi-head attention with grouped KV heads. q: [nq, n_heads, hd]; k, v: [n_keys, n_kv, hd]
// (row stride n_kv * hd); query i attends to keys [0, key_count[i]) (none: zeros), of them only
// those `mask` shows when given. out: [nq, n_heads, hd]. Defined in attention.cpp.
void attention(const float* q, int64_t nq, int n_heads, int n_kv_heads, int head_dim,
               const float* k, const float* v, const int64_t* key_count, float scale, float* out,
               ThreadPool& pool, const KeyMask* mask = nullptr);

// In-place softmax of each row (max-subtracted, fp32).
void softmax_rows(float* x, int64_t rows, int64_t dim);

// SiLU, x / (1 + e^-x), with e^x by a polynomial within 1.3 units in the last place, 16 lanes
// at a time (y may equal x); swiglu: y[i] = silu(gate[i]) · up[i].
void silu(const float* x, int64_t n, float* y);
void swiglu(const float* gate, const float* up, int64_t n, float* y);
float silu(float x);
// Exact (erf) GELU, F.gelu's default: y[i] = x[i]/2 · (1 + erf(x[i]/√2)), erf by polynomials
// within 1.5e-7 of it, 16 lanes at a time (y may equal x).
void gelu(const float* x, int64_t n, float* y);
float gelu(float x);

// n standard normals from rng into y, 32 at a time: Box-Muller in float32 on 16 of rng's 64-bit
// draws (u1 = (bits 41–63 + 1/2) / 2^23, exact and never 0 or 1, so 0 < r ≤ sqrt(2 ln 2^24) ≈
// 5.8; u2 = bits 16–39 / 2^24), the first 16 values r·cos 2πu2, the next 16 r·sin 2πu2; ln and
// sin/cos by their series, within 1e-6 of the float64 values of the same draws. A tail draws a
// whole group and keeps its first values, so the values of a call are a prefix of a longer call's.
void normals(Rng& rng, int64_t n, float* y);

}  // namespace ops
}  // namespace flashmap
