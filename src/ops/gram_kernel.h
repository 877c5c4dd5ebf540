// The interface between the Gram/Cholesky driver (gram.cpp) and its per-instruction-set kernels
// (gram_kernel.inc, compiled into gemm_avx512.cpp, gemm_avx2.cpp and gemm_generic.cpp with their
// flags). Plain data only, for the reason gemm_kernel.h gives.
#pragma once

#include <cstdint>

namespace flashmap::ops::kernel {

// Columns per packed panel: a matrix P [K, n] is held as ceil(n / 32) panels, panel q holding
// P[k, 32q … 32q+31] for k = 0 … K−1 side by side (the columns past n zero) — the k-major panels
// of ops::pack with k the row of P.
constexpr int kGramPanel = 32;
// Rows of the output a thread takes at a time (a multiple of every kernel's tile height).
constexpr int kGramRows = 96;

struct GramArgs {
  const void* panels;  // float (gram_f32_*) or double (syrk_f64_*)
  int64_t K, n;        // P is [K, n]; the output [n, n]
  double* out;
  int64_t ld;  // row stride of out
};

// out[i, j] += Σ_k P[k, i] · P[k, j] for i in [i0, i1), i ≤ j < n (upper triangle): fp32
// multiply-adds summed in fp32 over blocks of k, each block's sums added to out in float64.
void gram_f32_generic(const GramArgs& a, int64_t i0, int64_t i1);
void gram_f32_avx2(const GramArgs& a, int64_t i0, int64_t i1);
void gram_f32_avx512(const GramArgs& a, int64_t i0, int64_t i1);

// out[i, j] −= Σ_k P[k, i] · P[k, j] for i in [i0, i1), j ≤ i (lower triangle), in float64: the
// Cholesky's trailing update.
void syrk_f64_generic(const GramArgs& a, int64_t i0, int64_t i1);
void syrk_f64_avx2(const GramArgs& a, int64_t i0, int64_t i1);
void syrk_f64_avx512(const GramArgs& a, int64_t i0, int64_t i1);

}  // namespace flashmap::ops::kernel
