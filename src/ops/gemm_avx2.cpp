// The GEMM kernel with AVX2 + FMA registers (8 fp32 lanes, 16 registers), for x86-64-v3 CPUs
// without AVX-512. Compiled with -mavx2 -mfma -mf16c; nothing here may be an inline function
// shared with other files (see gemm_kernel.h).
#include "ops/gemm_kernel.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace flashmap::ops::kernel {
namespace {

struct V {
  using R = __m256;
  static constexpr int W = 8;
  // 5 rows × 2 vectors = 10 accumulators, 2 weight vectors and a broadcast. Six rows (15 of 16
  // registers) left GCC short of registers for the addresses and prefetch: a 17-row product ran
  // at 57 GFLOP/s cache-hot against 104 with five (bench_ops BM_LinearRows, AMD Zen 3).
  static constexpr int kRowsMax = 5, kNvMany = 2;
  // nv_for(a), a accumulators per vector column: one: 8 vectors (2 panels), 8 independent FMA
  // chains; two: 4 vectors (8 chains).
  static constexpr int kNv1 = 8, kNv2 = 4;
  static constexpr int nv_for(int a) { return a == 1 ? kNv1 : a == 2 ? kNv2 : kNvMany; }

  static R zero() { return _mm256_setzero_ps(); }
  static R bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static R bf16(const uint8_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static R f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  using I = __m256i;
  static constexpr int kRowsMaxQ8 = 3;  // 3 × 2 × (dot + acc) = 12 registers
  static I load_i32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static R q8_byte(I raw, int j) {
    const I b = _mm256_and_si256(_mm256_srli_epi32(raw, 8 * j), _mm256_set1_epi32(0xff));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(b, _mm256_set1_epi32(128)));
  }
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, R v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
};

}  // namespace

#define FLASHMAP_GEMM_ENTRY gemm_avx2
#include "ops/gemm_kernel.inc"
#define FLASHMAP_GRAM_ENTRY(f) f##_avx2
#define FLASHMAP_GRAM_ISA 2
#include "ops/gram_kernel.inc"

}  // namespace flashmap::ops::kernel

#else
namespace flashmap::ops::kernel {
void gemm_avx2(const Args& a, int64_t p0, int64_t p1) {
  gemm_generic(a, p0, p1);
}
#define FLASHMAP_GRAM_ENTRY(f) f##_avx2
#define FLASHMAP_GRAM_FORWARD
#include "ops/gram_kernel.inc"
}  // namespace flashmap::ops::kernel
#endif
