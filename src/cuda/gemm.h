// Matrix products on the device, all through one cuBLASLt call (lt_matmul): bf16 operands, fp32
// accumulation, an optional bias added by the epilogue. Each shape's descriptors and the
// algorithm cuBLASLt's heuristic picks are made once and cached, so a decoding step (and a CUDA
// graph capture) makes no host-side planning calls after the first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "cuda/device.h"
#include "cuda/kernels.h"

namespace flashmap::cuda {

// Column-major C [m, n] = op(A) [m, k] · B [k, n] (+ bias [m] on every column), A and B bf16,
// C fp32 or bf16, fp32 compute. op(A) = Aᵀ when trans_a (A stored [k, m], ld lda), else A
// ([m, k], ld lda). bias (fp32, or nullptr) needs an fp32 C.
//
// invariant: one algorithm per weight shape (the shape without n), whatever n is: the first of
// cuBLASLt's heuristic candidates at n = kInvariantN that runs at every n of kInvariantCheckN with
// no split-K reduction and no workspace, and runs at the n asked for too (else an error naming the
// shape, never a silent fallback). Each column of C (a token row of a linear layer) is then the
// same sequence of operations for every n, so a row's result does not depend on how many rows
// share the product (the batched step's batch invariance). No workspace because an algorithm that
// uses one may split or schedule the reduction by the grid, and so by n (vLLM's batch-invariant
// mode sets it to zero for the same reason); the invariant products get a null workspace of 0
// bytes. Otherwise the heuristic picks per shape, with the context's workspace.
struct LtShape {
  bool trans_a = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  Elem c_type = Elem::F32;
  bool bias = false;
  bool invariant = false;
  auto operator<=>(const LtShape&) const = default;
};
constexpr int64_t kInvariantN = 64;
// Where a row-invariant candidate must run before it is picked: one row (a decode step), the
// heuristic's n and a wide batch (a step of 4096 rows). A fixed set, not the n first asked for, so
// that a weight shape gets the same algorithm whichever n comes first; any other n is checked when
// it is asked for.
inline constexpr int64_t kInvariantCheckN[] = {1, kInvariantN, 4096};
// The most heuristic candidates considered per shape.
constexpr int kLtCandidates = 16;
void lt_matmul(Context& ctx, const LtShape& shape, const uint16_t* A, const uint16_t* B, void* C,
               const float* bias = nullptr);

// The choice among `candidates` heuristic results, in the heuristic's order: the first that runs at
// every n of `check_n` (runs(candidate, n): the workspace bytes it needs there, or nullopt when
// cuBLASLt refuses it) within `budget` bytes of workspace; -1 when none does. It depends on its
// arguments only, so the row-invariant pick (check_n = kInvariantCheckN, budget 0) of a weight
// shape is the same for every n asked of it.
int pick_candidate(int candidates, std::span<const int64_t> check_n, size_t budget,
                   const std::function<std::optional<size_t>(int candidate, int64_t n)>& runs);

// The workspace a shape's products are given: none for a row-invariant one, else the context's.
inline size_t lt_workspace_budget(const LtShape& shape, size_t context_bytes) {
  return shape.invariant ? 0 : context_bytes;
}

// What lt_matmul runs for a shape (its cached plan, made now if need be): the workspace bytes it
// passes to cublasLtMatmul (lt_workspace_budget; with 0 the pointer is null) and the algorithm's
// opaque bytes (the same for every n of a row-invariant weight shape).
struct LtPlanInfo {
  size_t workspace_bytes = 0;
  std::array<uint64_t, 8> algo{};
};
LtPlanInfo lt_plan_info(Context& ctx, const LtShape& shape);

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
