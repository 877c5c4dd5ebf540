// The one-step noise factor's arithmetic on the CPU: the Gram matrix EᵀE of an embedding,
// accumulated chunk by chunk, and its Cholesky factor, both on the project's own kernels (one per
// instruction set, picked as ops::linear picks its GEMM kernel: ops/gemm.h, active_isa()).
//
// Neither uses the engine's ThreadPool: the factor is formed on a background thread while the
// engine decodes on the pool, which runs one parallel loop at a time. Each call starts its own
// `threads` std::threads (the calling thread is one of them) and joins them before returning.
#pragma once

#include <cstdint>

namespace flashmap {

struct Weight;

namespace ops {

// G[i, j] += Σ_{r0 ≤ r < r0 + n} E[r, i] · E[r, j] for i ≤ j < H (H = E.cols): the upper
// triangle of G, row-major [H, H] float64; the strict lower triangle is left as it is. E is read
// as fp32 (bf16, f16 or f32 rows, exactly as Weight::row_f32 widens them). The products are fp32
// multiply-adds summed in fp32 over runs of at most a few hundred rows, each run's sums then
// added to G in float64 (why: gram.cpp).
void gram_accumulate(const Weight& E, int64_t r0, int64_t n, double* G, int threads = 1);

// In place, lower Cholesky factor of the symmetric positive definite A [n, n] (row-major,
// float64): reads the lower triangle (i ≥ j), overwrites it with L (L Lᵀ = A); the strict upper
// triangle is not touched. Returns -1 on success, else the first column j whose pivot
// A[j, j] − Σ_{l<j} L[j, l]² is not positive (or not a number): A is not positive definite
// (numerically), and columns from j on are left partly updated.
int64_t cholesky_lower(double* A, int64_t n, int threads = 1);

}  // namespace ops
}  // namespace flashmap
