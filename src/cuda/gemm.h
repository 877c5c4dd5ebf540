// y = x · Wᵀ (+ bias) through cuBLASLt: ops::linear on the device.
#pragma once

#include <cstdint>

#include "cuda/device.h"
#include "cuda/kernels.h"

namespace flashmap::cuda {

// RAII for the cuBLASLt descriptors of one matmul call (gemm.cpp, the drafter's state·E).
// Caching them (and the chosen algorithm) per shape is future work.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// x [M, K] (row stride ldx, default K) in x_type; W [N, K] bf16 (nn.Linear layout, row-major);
// y [M, N] (row stride ldy, default N) in y_type; bias [N] fp32 or nullptr (fp32 y only).
// Products are bf16 × bf16 accumulated in fp32 (CUBLAS_COMPUTE_32F): fp32 activations are first
// rounded to bf16 in the context's scratch, as a bf16 engine stores them anyway; the parity
// harness bounds the effect (NMSE ≈ 1e-6 against the CPU's fp32 x). Any M ≥ 1.
void linear(Context& ctx, const void* x, Elem x_type, int64_t M, int64_t K, const uint16_t* W,
            int64_t N, const float* bias, void* y, Elem y_type, int64_t ldx = -1, int64_t ldy = -1);

}  // namespace flashmap::cuda
