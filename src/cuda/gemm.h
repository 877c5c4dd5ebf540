// Matrix products on the device, all through one cuBLASLt call (lt_matmul): bf16 operands, fp32
// accumulation, an optional bias added by the epilogue. Each shape's descriptors and the
// algorithm cuBLASLt's heuristic picks are made once and cached, so a decoding step (and a CUDA
// graph capture) makes no host-side planning calls after the first.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels.h"

namespace flashmap::cuda {

// Column-major C [m, n] = op(A) [m, k] · B [k, n] (+ bias [m] on every column), A and B bf16,
// C fp32 or bf16, fp32 compute. op(A) = Aᵀ when trans_a (A stored [k, m], ld lda), else A
// ([m, k], ld lda). bias (fp32, or nullptr) needs an fp32 C.
//
// invariant: the algorithm is the one cuBLASLt's heuristic picks for this shape at n =
// kInvariantN, with no split-K reduction, whatever n is: each column of C (a token row of a
// linear layer) is then the same sequence of operations for every n, so a row's result does not
// depend on how many rows share the product (the batched step's batch invariance). Otherwise the
// heuristic picks per shape.
struct LtShape {
  bool trans_a = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  Elem c_type = Elem::F32;
  bool bias = false;
  bool invariant = false;
  auto operator<=>(const LtShape&) const = default;
};
constexpr int64_t kInvariantN = 64;
void lt_matmul(Context& ctx, const LtShape& shape, const uint16_t* A, const uint16_t* B, void* C,
               const float* bias = nullptr);

// y = x · Wᵀ (+ bias): ops::linear on the device. x [M, K] (row stride ldx, default K) in x_type;
// W [N, K] bf16 (nn.Linear layout, row-major); y [M, N] (row stride ldy, default N) in y_type;
// bias [N] fp32 or nullptr (fp32 y only). fp32 activations are first rounded to bf16 in the
// context's scratch, as a bf16 engine stores them anyway; the parity harness bounds the effect
// (NMSE ≈ 1e-6 against the CPU's fp32 x). Any M ≥ 1.
// invariant: LtShape::invariant (the rows' results do not depend on M).
void linear(Context& ctx, const void* x, Elem x_type, int64_t M, int64_t K, const uint16_t* W,
            int64_t N, const float* bias, void* y, Elem y_type, int64_t ldx = -1, int64_t ldy = -1,
            bool invariant = false);

// y [M, H] fp32 = x [M, V] bf16 · E [V, H] bf16, all row-major: ops::matmul_rows (a state read
// through the embedding) without a transposed copy of E.
void matmul_rows_bf16(Context& ctx, const uint16_t* x, int64_t M, int64_t V, const uint16_t* E,
                      int64_t H, float* y);

}  // namespace flashmap::cuda
