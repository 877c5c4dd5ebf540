#include "cuda/gemm.h"

namespace flashmap::cuda {
namespace {

cudaDataType_t lt_type(Elem e) {
  return e == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

}  // namespace

void linear(Context& ctx, const void* x, Elem x_type, int64_t M, int64_t K, const uint16_t* W,
            int64_t N, const float* bias, void* y, Elem y_type, int64_t ldx, int64_t ldy) {
  if (ldx < 0) ldx = K;
  if (ldy < 0) ldy = N;
  if (M <= 0 || N <= 0) return;
  FLASHMAP_ASSERT(K > 0 && ldx >= K && ldy >= N);
  FLASHMAP_ASSERT(bias == nullptr || y_type == Elem::F32);

  const void* xb = x;
  if (x_type == Elem::F32) {
    // Round the activations to bf16 (dense, ld = K): cuBLASLt has no fp32 × bf16 matmul.
    auto* tmp = static_cast<uint16_t*>(ctx.scratch(size_t(M * K) * 2));
    if (ldx == K) {
      f32_to_bf16(static_cast<const float*>(x), M * K, tmp, ctx.stream());
    } else {
      for (int64_t m = 0; m < M; ++m)
        f32_to_bf16(static_cast<const float*>(x) + m * ldx, K, tmp + m * K, ctx.stream());
    }
    xb = tmp;
    ldx = K;
  }

  // Row-major y[M, N] = x[M, K] · W[N, K]ᵀ is column-major yᵀ[N, M] = W'ᵀ · x' with
  // W' = W viewed as column-major [K, N] and x' = x as column-major [K, M].
  LtDescriptors d;
  check(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "set TRANSA");
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "set TRANSB");
  check(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, uint64_t(K), uint64_t(N), K), "layout W");
  check(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, uint64_t(K), uint64_t(M), ldx), "layout x");
  check(cublasLtMatrixLayoutCreate(&d.c, lt_type(y_type), uint64_t(N), uint64_t(M), ldy),
        "layout y");
  check(cublasLtMatmulPreferenceCreate(&d.pref), "PreferenceCreate");
  const uint64_t ws = ctx.workspace_bytes();
  check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof(ws)),
        "set workspace");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  check(
      cublasLtMatmulAlgoGetHeuristic(ctx.lt(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &found),
      "AlgoGetHeuristic");
  FLASHMAP_CHECK(found > 0, "cuBLASLt: no algorithm for bf16 GEMM M={} N={} K={} (ldx {}, ldy {})",
                 M, N, K, ldx, ldy);
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(ctx.lt(), d.op, &alpha, W, d.a, xb, d.b, &beta, y, d.c, y, d.c, &heur.algo,
                       ctx.workspace(), ctx.workspace_bytes(), ctx.stream()),
        "Matmul");
  if (bias) add_bias_rows(static_cast<float*>(y), M, N, ldy, bias, ctx.stream());
}

}  // namespace flashmap::cuda
