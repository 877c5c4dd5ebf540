// The interface between the GEMM driver (gemm.cpp) and its per-instruction-set kernels
// (gemm_avx512.cpp, gemm_avx2.cpp, gemm_generic.cpp, each compiled with its own flags from
// gemm_kernel.inc). Plain data only: those files must not instantiate any inline function or
// template shared with the rest of the program, or the linker could keep an AVX-512 copy of it
// for code that runs on any CPU.
#pragma once

#include <cstdint>

namespace flashmap::ops::kernel {

enum Format : int { kF32 = 0, kBF16 = 1, kF16 = 2, kQ8 = 3 };

// y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n]) for m < M and the columns of panels [p0, p1).
struct Args {
  const float* x;
  int64_t M, ldx;
  const uint8_t* panels;  // PackedWeight::data
  int64_t panel_bytes, N, K;
  Format format;
  const float* bias;  // may be null
  float* y;
  int64_t ldy;
  // kQ8: x quantized per row and block of 32 k (gemm.cpp): qx int8 [M, K], the same values as
  // fp32 in qxf, dx the blocks' fp32 scales and sx the sums of their qx [M, K/32].
  const int8_t* qx;
  const float* qxf;
  const float* dx;
  const int32_t* sx;
  bool vnni;  // AVX-512 kernel: int8 dot products (AVX512-VNNI) for kQ8
};

void gemm_generic(const Args& a, int64_t p0, int64_t p1);
void gemm_avx2(const Args& a, int64_t p0, int64_t p1);
void gemm_avx512(const Args& a, int64_t p0, int64_t p1);

// Panels each kernel wants per thread chunk (its widest one-row tile), so that chunks split on
// tile boundaries.
constexpr int kPanelsPerUnit = 4;

}  // namespace flashmap::ops::kernel

#include "ops/gram_kernel.h"  // the Gram kernels, compiled into the same files
