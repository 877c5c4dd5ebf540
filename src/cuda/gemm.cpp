#include "cuda/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace flashmap::cuda {
namespace {

cudaDataType_t lt_type(Elem e) {
  return e == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// One shape's cuBLASLt descriptors, chosen algorithm and the workspace its calls pass.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // bytes given to cublasLtMatmul (0: a null workspace)
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

// B [k, n] and C [m, n] of a shape at n columns (its own n, or another for the invariant pick).
struct Columns {
  cublasLtMatrixLayout_t b = nullptr, c = nullptr;
  Columns(const LtShape& s, int64_t n) {
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(s.k), uint64_t(n), s.ldb),
          "layout B");
    check(cublasLtMatrixLayoutCreate(&c, lt_type(s.c_type), uint64_t(s.m), uint64_t(n), s.ldc),
          "layout C");
  }
  Columns(const Columns&) = delete;
  Columns& operator=(const Columns&) = delete;
  ~Columns() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
  }
};

std::string describe(const LtShape& s) {
  return fmt::format(
      "bf16 GEMM m={} n={} k={} (lda {}, ldb {}, ldc {}, transposed A {}, bias {}, "
      "invariant {})",
      s.m, s.n, s.k, s.lda, s.ldb, s.ldc, s.trans_a, s.bias, s.invariant);
}

// The operation's descriptor and A's layout (n plays no part in them).
void describe_op(const LtShape& s, Plan& p) {
  check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "set TRANSA");
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "set TRANSB");
  if (s.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
          "set EPILOGUE");
    const cudaDataType_t bt = CUDA_R_32F;
    check(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)),
        "set BIAS_DATA_TYPE");
  }
  // A as stored: [k, m] when transposed, else [m, k].
  const uint64_t a_rows = uint64_t(s.trans_a ? s.k : s.m), a_cols = uint64_t(s.trans_a ? s.m : s.k);
  check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, a_rows, a_cols, s.lda), "layout A");
}

// Up to kLtCandidates algorithms for B and C with layouts b and c, in the heuristic's order, each
// needing at most `budget` bytes of workspace; the invariant products' without split-K (a split-K
// algorithm sums partial products in an order that depends on the grid, and so on n).
std::vector<cublasLtMatmulAlgo_t> candidates(Context& ctx, const LtShape& s, const Plan& p,
                                             cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                             uint64_t budget) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &budget, sizeof(budget));
  const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (st == CUBLAS_STATUS_SUCCESS && s.invariant)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &no_split, sizeof(no_split));
  cublasLtMatmulHeuristicResult_t heur[kLtCandidates] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(ctx.lt(), p.op, p.a, b, c, c, pref, kLtCandidates, heur,
                                        &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check(st, "AlgoGetHeuristic");
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i)
    if (heur[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(heur[i].algo);
  return out;
}

// The workspace `algo` needs for the plan's operation with B and C laid out as b and c; nullopt
// when cuBLASLt refuses it there.
std::optional<size_t> runs(Context& ctx, const Plan& p, const cublasLtMatmulAlgo_t& algo,
                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c) {
  cublasLtMatmulHeuristicResult_t r{};
  if (cublasLtMatmulAlgoCheck(ctx.lt(), p.op, p.a, b, c, c, &algo, &r) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  return r.workspaceSize;
}

// The plans and the row-invariant picks, per context; made under the lock, used on the context's
// one stream.
struct Cache {
  std::mutex mutex;
  std::map<std::pair<const Context*, LtShape>, std::unique_ptr<Plan>> plans;
  // Keyed by the weight shape (n = 0): every n of it runs this algorithm.
  std::map<std::pair<const Context*, LtShape>, cublasLtMatmulAlgo_t> invariant;
};
Cache& cache() {
  static Cache c;
  return c;
}

// The row-invariant algorithm of s's weight shape, picked on first use (under the cache's lock):
// candidates at n = kInvariantN, each checked at every n of kInvariantCheckN, none at the n that
// happens to be asked first, so the pick is the weight shape's whatever that n is.
cublasLtMatmulAlgo_t invariant_algo(Context& ctx, const LtShape& s, const Plan& p) {
  LtShape weight = s;
  weight.n = 0;
  auto& picks = cache().invariant;
  if (auto it = picks.find({&ctx, weight}); it != picks.end()) return it->second;
  const Columns pick_cols(s, kInvariantN);
  const auto algos = candidates(ctx, s, p, pick_cols.b, pick_cols.c, 0);
  const int i = pick_candidate(int(algos.size()), kInvariantCheckN, 0, [&](int c, int64_t n) {
    const Columns at(s, n);
    return runs(ctx, p, algos[size_t(c)], at.b, at.c);
  });
  FLASHMAP_CHECK(i >= 0,
                 "cuBLASLt: none of {} row-invariant candidates for the {} runs at every n of "
                 "{{{}}} without split-K and without workspace",
                 algos.size(), describe(s), fmt::join(kInvariantCheckN, ", "));
  return picks.emplace(std::make_pair(&ctx, weight), algos[size_t(i)]).first->second;
}

std::unique_ptr<Plan> make_plan(Context& ctx, const LtShape& s) {
  auto p = std::make_unique<Plan>();
  describe_op(s, *p);
  check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.ldb),
        "layout B");
  check(cublasLtMatrixLayoutCreate(&p->c, lt_type(s.c_type), uint64_t(s.m), uint64_t(s.n), s.ldc),
        "layout C");
  p->workspace = lt_workspace_budget(s, ctx.workspace_bytes());
  if (s.invariant) {
    p->algo = invariant_algo(ctx, s, *p);
    // It must run at this n too, unchanged and without workspace; a fallback to another algorithm
    // would lose the invariance, so a refusal is an error naming the shape.
    const auto need = runs(ctx, *p, p->algo, p->b, p->c);
    FLASHMAP_CHECK(need && *need == 0,
                   "cuBLASLt: the row-invariant algorithm of the {} (checked at every n of {{{}}}) "
                   "does not run at n = {}{}",
                   describe(s), fmt::join(kInvariantCheckN, ", "), s.n,
                   need ? " without workspace" : "");
    return p;
  }
  const auto algos = candidates(ctx, s, *p, p->b, p->c, p->workspace);
  const int64_t n[] = {s.n};
  const int i = pick_candidate(int(algos.size()), n, p->workspace, [&](int c, int64_t) {
    return runs(ctx, *p, algos[size_t(c)], p->b, p->c);
  });
  FLASHMAP_CHECK(i >= 0, "cuBLASLt: no algorithm for the {} among {} candidates", describe(s),
                 algos.size());
  p->algo = algos[size_t(i)];
  return p;
}

Plan& plan_of(Context& ctx, const LtShape& shape) {
  Cache& c = cache();
  std::lock_guard lk(c.mutex);
  auto& slot = c.plans[{&ctx, shape}];
  if (!slot) slot = make_plan(ctx, shape);
  return *slot;
}

}  // namespace

int pick_candidate(int candidates, std::span<const int64_t> check_n, size_t budget,
                   const std::function<std::optional<size_t>(int candidate, int64_t n)>& runs) {
  for (int i = 0; i < candidates; ++i) {
    bool ok = true;
    for (const int64_t n : check_n) {
      const std::optional<size_t> need = runs(i, n);
      if (!need || *need > budget) {
        ok = false;
        break;
      }
    }
    if (ok) return i;
  }
  return -1;
}

LtPlanInfo lt_plan_info(Context& ctx, const LtShape& shape) {
  const Plan& p = plan_of(ctx, shape);
  LtPlanInfo info;
  info.workspace_bytes = p.workspace;
  std::copy(std::begin(p.algo.data), std::end(p.algo.data), info.algo.begin());
  return info;
}

void lt_matmul(Context& ctx, const LtShape& shape, const uint16_t* A, const uint16_t* B, void* C,
               const float* bias) {
  FLASHMAP_ASSERT((bias != nullptr) == shape.bias && (!shape.bias || shape.c_type == Elem::F32));
  Plan& p = plan_of(ctx, shape);
  if (bias)
    check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "set BIAS_POINTER");
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(ctx.lt(), p.op, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, &p.algo,
                       p.workspace ? ctx.workspace() : nullptr, p.workspace, ctx.stream()),
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
