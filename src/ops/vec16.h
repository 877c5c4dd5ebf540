// 16-lane fp32 vectors for the CPU ops that are not GEMM kernels (attention, norms, dots): GCC
// lowers them to one AVX-512 register, two AVX2 ones, or scalar code, whatever the build targets.
// Internal linkage, so that files compiled for different instruction sets never share a copy.
#pragma once

#include <cstdint>

namespace flashmap::ops {
namespace {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));  // comparisons of v16f give these
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
constexpr int kLanes = 16;

// The sum of v's lanes by a fixed pairwise tree (lane i + lane i+8, then +4, +2, +1), so every
// reduction adds its lanes in the same order whatever the call; shuffles keep it in registers.
inline float hsum(v16f v) {
  const v8f s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f s4 =
      __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const float a = s4[0] + s4[2], b = s4[1] + s4[3];
  return a + b;
}

}  // namespace
}  // namespace flashmap::ops
