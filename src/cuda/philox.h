// Counter-based standard normals for drafting on the device: Philox4x32-10 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator of cuRAND's and torch's CUDA
// streams) followed by Box-Muller. Host and device share this code, so the CPU tests can check the
// bits (known-answer vectors of Random123) and the device stream element by element.
//
// Element i of the stream (seed, counter) comes from block g = i / 4 of Philox with key = seed and
// counter words {g_lo, g_hi, counter_lo, counter_hi}: any element is computed independently of the
// others, and a draft that draws K·V normals with a fresh counter never reuses a block of another.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHMAP_HD __host__ __device__ __forceinline__
#else
#define FLASHMAP_HD inline
#endif

namespace flashmap::cuda::philox {

struct U4 {
  uint32_t x, y, z, w;
};

FLASHMAP_HD uint32_t mulhi(uint32_t a, uint32_t b) {
  return uint32_t((uint64_t(a) * uint64_t(b)) >> 32);
}

// Philox4x32 with 10 rounds; the key is bumped by the Weyl constants between rounds.
FLASHMAP_HD U4 philox4x32_10(U4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += W0;
      k1 += W1;
    }
    const uint32_t hi0 = mulhi(M0, c.x), lo0 = M0 * c.x;
    const uint32_t hi1 = mulhi(M1, c.z), lo1 = M1 * c.z;
    c = U4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
  }
  return c;
}

// The four uint32 of block g of the stream (seed, counter).
FLASHMAP_HD U4 block(uint64_t seed, uint64_t counter, uint64_t g) {
  return philox4x32_10(
      U4{uint32_t(g), uint32_t(g >> 32), uint32_t(counter), uint32_t(counter >> 32)},
      uint32_t(seed), uint32_t(seed >> 32));
}

// Box-Muller on two uint32: u1 in (0, 1) from the top 24 bits plus half an ulp (never 0, so the
// log is finite; the largest |z| is sqrt(-2 ln 2⁻²⁵) ≈ 5.9), u2 in [0, 1). Only IEEE-exact float
// operations and logf/sqrtf/sincos, so host and device agree to a few ulps.
FLASHMAP_HD void box_muller(uint32_t a, uint32_t b, float& z0, float& z1) {
  const float u1 = (float(a >> 8) + 0.5f) * 0x1.0p-24f;
  const float u2 = float(b >> 8) * 0x1.0p-24f;
  const float r = sqrtf(-2.0f * logf(u1));
  const float theta = 6.28318530717958647692f * u2;
  z0 = r * cosf(theta);
  z1 = r * sinf(theta);
}

// Element i of the standard-normal stream (seed, counter).
FLASHMAP_HD float normal(uint64_t seed, uint64_t counter, uint64_t i) {
  const U4 u = block(seed, counter, i / 4);
  float z0, z1;
  if ((i & 3) < 2)
    box_muller(u.x, u.y, z0, z1);
  else
    box_muller(u.z, u.w, z0, z1);
  return (i & 1) ? z1 : z0;
}

}  // namespace flashmap::cuda::philox
