// The round's batch kernels (round_kernels.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/round_kernels.h"

namespace flashmap::cuda {
namespace {

__global__ void gather_step_ids_kernel(const int32_t* rounds, int64_t stride, const int32_t* lanes,
                                       StepView sv, int32_t* ids) {
  const int64_t n = int64_t(sv.bucket) * sv.R;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int b = int(i / sv.R), r = int(i % sv.R);
    ids[i] = r < sv.seq_rows[b] ? rounds[int64_t(lanes[b]) * stride + kRoundAnchor + r] : 0;
  }
}

__global__ void accept_greedy_kernel(const int32_t* argmax, const int32_t* items, int n,
                                     int32_t* rounds, int64_t stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t lane = items[3 * i], first = items[3 * i + 1], room = items[3 * i + 2];
  int32_t* row = rounds + int64_t(lane) * stride;
  const int32_t* am = argmax + first;
  int a = 0;
  while (a < room && am[a] == row[kRoundDrafts + a]) ++a;
  row[kRoundAccepted] = a;
  row[kRoundToken] = am[a];
}

__global__ void next_anchors_kernel(const int32_t* lanes, int n, int32_t* rounds, int64_t stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int32_t* row = rounds + int64_t(lanes[i]) * stride;
  row[kRoundAnchor] = row[kRoundToken];
}

__global__ void gather_anchors_kernel(const int32_t* rounds, int64_t stride, const int32_t* lanes,
                                      int n, int32_t* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < n) out[b] = rounds[int64_t(lanes[b]) * stride + kRoundAnchor];
}

__global__ void scatter_drafts_kernel(const int32_t* drafts, const int32_t* lanes, int n, int K,
                                      int32_t* rounds, int64_t stride) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < int64_t(n) * K;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int b = int(t / K), i = int(t % K);
    rounds[int64_t(lanes[b]) * stride + kRoundDrafts + i] = drafts[t];
  }
}

unsigned blocks_of(int64_t n, int threads) {
  return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, 4096));
}

}  // namespace

void gather_step_ids(const int32_t* rounds, int64_t stride, const int32_t* lanes,
                     const StepView& step, int32_t* ids, cudaStream_t stream) {
  const int64_t n = int64_t(step.bucket) * step.R;
  if (n > 0)
    gather_step_ids_kernel<<<blocks_of(n, 256), 256, 0, stream>>>(rounds, stride, lanes, step, ids);
}

void accept_greedy(const int32_t* argmax, const int32_t* items, int n, int32_t* rounds,
                   int64_t stride, cudaStream_t stream) {
  if (n > 0)
    accept_greedy_kernel<<<blocks_of(n, 128), 128, 0, stream>>>(argmax, items, n, rounds, stride);
}

void next_anchors(const int32_t* lanes, int n, int32_t* rounds, int64_t stride,
                  cudaStream_t stream) {
  if (n > 0) next_anchors_kernel<<<blocks_of(n, 128), 128, 0, stream>>>(lanes, n, rounds, stride);
}

void gather_anchors(const int32_t* rounds, int64_t stride, const int32_t* lanes, int n,
                    int32_t* out, cudaStream_t stream) {
  if (n > 0)
    gather_anchors_kernel<<<blocks_of(n, 128), 128, 0, stream>>>(rounds, stride, lanes, n, out);
}

void scatter_drafts(const int32_t* drafts, const int32_t* lanes, int n, int K, int32_t* rounds,
                    int64_t stride, cudaStream_t stream) {
  const int64_t t = int64_t(n) * K;
  if (t > 0)
    scatter_drafts_kernel<<<blocks_of(t, 256), 256, 0, stream>>>(drafts, lanes, n, K, rounds,
                                                                 stride);
}

}  // namespace flashmap::cuda
