// SplitMix64 (Steele, Lea and Flood 2014) as a stateless hash, for random numbers that are a
// function of a key rather than of a generator's history: the same number for the same key on
// any thread, in any batch, on the host and on the device.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FLASHMAP_HD __host__ __device__
#else
#define FLASHMAP_HD
#endif

namespace flashmap {

// SplitMix64's output function.
FLASHMAP_HD inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Seeded sampling's key for one draw: token `position` of a sequence sampled with `seed`.
FLASHMAP_HD inline uint64_t position_key(uint64_t seed, int64_t position) {
  return splitmix64(splitmix64(seed) + uint64_t(position + 1) * 0x9e3779b97f4a7c15ull);
}

// A uniform number in (0, 1), never 0 (its logarithm is finite), for vocabulary entry `id` under
// a position key: 53 random bits, centred in their interval.
FLASHMAP_HD inline double keyed_uniform(uint64_t key, int64_t id) {
  const uint64_t x = splitmix64(key ^ (uint64_t(id) * 0xd1b54a32d192ed03ull));
  return (double(x >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace flashmap
