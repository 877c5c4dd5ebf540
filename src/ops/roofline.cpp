// The limits the CPU kernels are measured against, on the pool's threads: read bandwidth (what
// a decode step streams its weights at) and the arithmetic peak a many-row product is held to:
// fp32 FMAs, bf16 dot products, or int8 dot products for q8/q4 weights.
#include "ops/roofline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/thread_pool.h"
#include "ops/gemm.h"
#include "ops/gemm_kernel.h"

namespace flashmap::ops {
namespace {

// Median of three timed calls after a warm-up, in ms.
double median_ms(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[1];
}

// Read bandwidth of this machine with all threads (the roofline a decode step is held to): sums
// of a 1 GiB buffer with four independent vector accumulators per thread (one chain of adds
// would be held to its latency, not to memory).
#if defined(__x86_64__)
__attribute__((target("avx2"))) float sum_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float l[8];
  _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return l[0] + l[7];
}
#endif
float sum_plain(const float* p, int64_t n) {
  float a[4] = {};
  for (int64_t i = 0; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) a[j] += p[i + j];
  return a[0] + a[1] + a[2] + a[3];
}

// The fp32 multiply-add peak: 12 independent accumulators (more than latency × FMA ports on
// every x86 core in use) of the widest vector the GEMM kernel runs, on every thread. Returns the
// flops of one call per thread.
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters, float* sink) {
  __m256 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(float(j) * 1e-3f);
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], b, c);
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  *sink = _mm256_cvtss_f32(s);
  return double(iters) * 12 * 8 * 2;
}
__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters, float* sink) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(float(j) * 1e-3f);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(a[j], b, c);
  __m512 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, a[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  *sink = lanes[0] + lanes[15];
  return double(iters) * 12 * 16 * 2;
}
// The bf16 compute mode's peak: 12 chains of vdpbf16ps, each 16 lanes × 2 multiply-adds.
__attribute__((target("avx512f,avx512bf16"))) double dpbf16_loop(int64_t iters, float* sink) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(float(j) * 1e-3f);
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3f803f80),
                 c = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm512_dpbf16_ps(a[j], b, c);
  __m512 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, a[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  *sink = lanes[0] + lanes[15];
  return double(iters) * 12 * 16 * 4;
}
// The integer dot products of the q8/q4 tiles, 12 chains each: vpdpbusd (AVX512-VNNI: 16
// lanes × 4 byte products; AVX-VNNI: 8 lanes), or AVX2's vpmaddubsw + vpmaddwd + vpaddd (32
// byte products per three instructions). A multiply-add counts 2 operations.
__attribute__((target("avx512f,avx512vnni"))) double dpbusd_loop_avx512(int64_t iters,
                                                                        float* sink) {
  __m512i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_epi32(j);
  const __m512i b = _mm512_set1_epi32(0x01020304), c = _mm512_set1_epi32(0x05060708);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm512_dpbusd_epi32(a[j], b, c);
  __m512i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_epi32(s, a[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  *sink = float(lanes[0] + lanes[15]);
  return double(iters) * 12 * 64 * 2;
}
__attribute__((target("avx2,avxvnni"))) double dpbusd_loop_avx2(int64_t iters, float* sink) {
  __m256i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_epi32(j);
  const __m256i b = _mm256_set1_epi32(0x01020304), c = _mm256_set1_epi32(0x05060708);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = _mm256_dpbusd_avx_epi32(a[j], b, c);
  __m256i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_epi32(s, a[j]);
  *sink = float(_mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7));
  return double(iters) * 12 * 32 * 2;
}
__attribute__((target("avx2"))) double maddubs_loop_avx2(int64_t iters, float* sink) {
  __m256i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_epi32(j);
  // Each chain's bytes are its own sums, so that no product is hoisted out of the loop.
  const __m256i c = _mm256_set1_epi32(0x05060708), one = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j)
      a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], c), one));
  __m256i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_epi32(s, a[j]);
  *sink = float(_mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7));
  return double(iters) * 12 * 32 * 2;
}
#endif
double fma_loop_scalar(int64_t iters, float* sink) {
  float a[12];
  for (int j = 0; j < 12; ++j) a[j] = float(j) * 1e-3f;
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = std::fma(a[j], 0.999999f, 1e-7f);
  float s = 0;
  for (float x : a) s += x;
  *sink = s;
  return double(iters) * 12 * 2;
}

}  // namespace

double read_bandwidth_gbps(ThreadPool& pool) {
  const size_t n = size_t(1) << 28;  // 1 GiB of floats
  std::vector<float> buf(n, 1.0f);
  [[maybe_unused]] const bool avx2 = ops::active_isa() != ops::Isa::Generic;
  // One partial sum per 64 Ki-float chunk, written by the thread that read it (keeps the reads
  // from being optimized away without sharing a cache line between threads).
  std::vector<float> sums((n >> 16) + 1, 0.0f);
  auto run = [&] {
    pool.parallel_for(int64_t(n), 1 << 16, [&](int64_t b, int64_t e) {
#if defined(__x86_64__)
      if (avx2) {
        sums[size_t(b >> 16)] = sum_avx2(buf.data() + b, e - b);
        return;
      }
#endif
      sums[size_t(b >> 16)] = sum_plain(buf.data() + b, e - b);
    });
  };
  const double ms = median_ms(run);
  return double(n) * 4 / (ms * 1e-3) / 1e9;
}

namespace {

// The flops per second of `loop` (one call per thread: its flops) on every thread of the pool.
double peak_of(ThreadPool& pool, const std::function<double(int64_t, float*)>& loop) {
  const int threads = pool.size();
  std::vector<float> sinks(size_t(threads) * 16);
  const int64_t iters = int64_t(1) << 24;
  double flops = 0;
  auto run = [&] {
    flops = 0;
    std::vector<double> per(static_cast<size_t>(threads));
    pool.parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) per[size_t(t)] = loop(iters, &sinks[size_t(t) * 16]);
    });
    for (double f : per) flops += f;
  };
  const double ms = median_ms(run);
  return flops / (ms * 1e-3) / 1e9;
}

}  // namespace

double fma_peak_gflops(ThreadPool& pool) {
  const ops::Isa isa = ops::active_isa();
  return peak_of(pool, [&](int64_t iters, float* sink) {
#if defined(__x86_64__)
    if (isa >= ops::Isa::Avx512) return fma_loop_avx512(iters, sink);
    if (isa >= ops::Isa::Avx2) return fma_loop_avx2(iters, sink);
#endif
    return fma_loop_scalar(iters, sink);
  });
}

double int8_dot_peak_gops(ThreadPool& pool) {
#if defined(__x86_64__)
  const ops::Isa isa = ops::active_isa();
  if (isa >= ops::Isa::Avx512Vnni) return peak_of(pool, dpbusd_loop_avx512);
  if (isa == ops::Isa::Avx2Vnni) return peak_of(pool, dpbusd_loop_avx2);
  if (isa == ops::Isa::Avx2) return peak_of(pool, maddubs_loop_avx2);
#endif
  return 0;
}

double bf16_dot_peak_gflops(ThreadPool& pool) {
#if defined(__x86_64__)
  // A tile product takes some 16 times a vdpbf16ps's time: as many fewer of them.
  if (ops::active_isa() == ops::Isa::Amx)
    return peak_of(
        pool, [](int64_t iters, float* sink) { return kernel::amx_bf16_loop(iters / 16, sink); });
  if (ops::has_bf16_compute()) return peak_of(pool, dpbf16_loop);
#endif
  return 0;
}

}  // namespace flashmap::ops
