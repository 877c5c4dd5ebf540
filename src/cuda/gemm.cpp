#include "cuda/gemm.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace flashmap::cuda {
namespace {

cudaDataType_t lt_type(Elem e) {
  return e == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// One shape's cuBLASLt descriptors and chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

std::unique_ptr<Plan> make_plan(Context& ctx, const LtShape& s) {
  auto p = std::make_unique<Plan>();
  check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "set TRANSA");
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "set TRANSB");
  if (s.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
          "set EPILOGUE");
    const cudaDataType_t bt = CUDA_R_32F;
    check(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)),
        "set BIAS_DATA_TYPE");
  }
  // A as stored: [k, m] when transposed, else [m, k].
  const uint64_t a_rows = uint64_t(s.trans_a ? s.k : s.m), a_cols = uint64_t(s.trans_a ? s.m : s.k);
  check(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, a_rows, a_cols, s.lda), "layout A");
  check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.ldb),
        "layout B");
  check(cublasLtMatrixLayoutCreate(&p->c, lt_type(s.c_type), uint64_t(s.m), uint64_t(s.n), s.ldc),
        "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = ctx.workspace_bytes();
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // A split-K algorithm sums partial products in an order that depends on the grid, and so on n.
  const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (st == CUBLAS_STATUS_SUCCESS && s.invariant)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &no_split, sizeof(no_split));
  // The invariant algorithm is chosen once per weight shape, at n = kInvariantN.
  cublasLtMatrixLayout_t b_pick = p->b, c_pick = p->c, b_tmp = nullptr, c_tmp = nullptr;
  if (st == CUBLAS_STATUS_SUCCESS && s.invariant && s.n != kInvariantN) {
    check(cublasLtMatrixLayoutCreate(&b_tmp, CUDA_R_16BF, uint64_t(s.k), uint64_t(kInvariantN),
                                     s.ldb),
          "layout B (invariant pick)");
    check(cublasLtMatrixLayoutCreate(&c_tmp, lt_type(s.c_type), uint64_t(s.m),
                                     uint64_t(kInvariantN), s.ldc),
          "layout C (invariant pick)");
    b_pick = b_tmp;
    c_pick = c_tmp;
  }
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(ctx.lt(), p->op, p->a, b_pick, c_pick, c_pick, pref, 1,
                                        &heur, &found);
  if (b_tmp) cublasLtMatrixLayoutDestroy(b_tmp);
  if (c_tmp) cublasLtMatrixLayoutDestroy(c_tmp);
  cublasLtMatmulPreferenceDestroy(pref);
  check(st, "AlgoGetHeuristic");
  FLASHMAP_CHECK(found > 0,
                 "cuBLASLt: no algorithm for the bf16 GEMM m={} n={} k={} (lda {}, ldb {}, ldc {}, "
                 "transposed A {}, bias {}, invariant {})",
                 s.m, s.n, s.k, s.lda, s.ldb, s.ldc, s.trans_a, s.bias, s.invariant);
  p->algo = heur.algo;
  if (s.invariant && s.n != kInvariantN) {
    // The algorithm must run at this n too, unchanged; a silent fallback would lose the
    // invariance, so a refusal is an error naming the shape.
    cublasLtMatmulHeuristicResult_t checked{};
    const cublasStatus_t ok =
        cublasLtMatmulAlgoCheck(ctx.lt(), p->op, p->a, p->b, p->c, p->c, &p->algo, &checked);
    FLASHMAP_CHECK(ok == CUBLAS_STATUS_SUCCESS && checked.workspaceSize <= ws,
                   "cuBLASLt: the row-invariant algorithm chosen at n={} does not run at n={} "
                   "(m={} k={}): {}",
                   kInvariantN, s.n, s.m, s.k, int(ok));
  }
  return p;
}

}  // namespace

void lt_matmul(Context& ctx, const LtShape& shape, const uint16_t* A, const uint16_t* B, void* C,
               const float* bias) {
  FLASHMAP_ASSERT((bias != nullptr) == shape.bias && (!shape.bias || shape.c_type == Elem::F32));
  // Plans per context and shape; made under the lock, used on the context's one stream.
  static std::mutex mutex;
  static std::map<std::pair<const Context*, LtShape>, std::unique_ptr<Plan>> plans;
  Plan* p;
  {
    std::lock_guard lk(mutex);
    auto& slot = plans[{&ctx, shape}];
    if (!slot) slot = make_plan(ctx, shape);
    p = slot.get();
  }
  if (bias)
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "set BIAS_POINTER");
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(ctx.lt(), p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &p->algo,
                       ctx.workspace(), ctx.workspace_bytes(), ctx.stream()),
        "Matmul");
}

void linear(Context& ctx, const void* x, Elem x_type, int64_t M, int64_t K, const uint16_t* W,
            int64_t N, const float* bias, void* y, Elem y_type, int64_t ldx, int64_t ldy,
            bool invariant) {
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
  lt_matmul(ctx,
            {.trans_a = true,
             .m = N,
             .n = M,
             .k = K,
             .lda = K,
             .ldb = ldx,
             .ldc = ldy,
             .c_type = y_type,
             .bias = bias != nullptr,
             .invariant = invariant},
            W, static_cast<const uint16_t*>(xb), y, bias);
}

void matmul_rows_bf16(Context& ctx, const uint16_t* x, int64_t M, int64_t V, const uint16_t* E,
                      int64_t H, float* y) {
  if (M <= 0) return;
  // In column-major terms yᵀ [H, M] = E' [H, V] · x' [V, M] with E' = E viewed column-major
  // (ld H) and x' = x (ld V): no transposes.
  lt_matmul(ctx, {.trans_a = false, .m = H, .n = M, .k = V, .lda = H, .ldb = V, .ldc = H}, E, x, y);
}

}  // namespace flashmap::cuda
