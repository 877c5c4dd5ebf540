// fp16 conversions (core/dtype.h) against two independent references: the CPU's F16C
// instructions (vcvtph2ps / vcvtps2ph, round to nearest even) where the CPU has them, and the
// compiler's _Float16 where it has one. Every half is widened; every 4099th fp32 pattern and the
// edges (the largest half, the overflow point, subnormals, ties, NaN, infinity) are narrowed.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define FLASHMAP_TEST_F16C 1
#endif

namespace flashmap {
namespace {

#ifdef FLASHMAP_TEST_F16C
__attribute__((target("f16c"))) float f16c_widen(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
__attribute__((target("f16c"))) uint16_t f16c_narrow(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
bool have_f16c() {  // CPUID leaf 1, ECX bit 29
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

// The fp32 patterns narrowed: a stride through all 2³² and the edges.
std::vector<uint32_t> narrow_cases() {
  std::vector<uint32_t> u;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 4099) u.push_back(uint32_t(x));
  const float edges[] = {0.0f,
                         65504.0f,
                         65519.99f,
                         65520.0f,
                         65536.0f,
                         0x1p-14f,
                         0x1p-24f,
                         0x1p-25f,
                         0x1.8p-25f,
                         0x1.8p-24f,
                         0x1.ffcp-15f,
                         0x1.ffep-15f,
                         1.0f + 0x1p-11f,
                         1.0f + 0x1.8p-11f,
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::signaling_NaN(),
                         std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::max()};
  for (float e : edges) {
    u.push_back(bits(e));
    u.push_back(bits(-e));
    u.push_back(bits(e) + 1);
    u.push_back(bits(e) - 1);
  }
  return u;
}

TEST(Fp16, WideningMatchesF16cForEveryHalf) {
#ifdef FLASHMAP_TEST_F16C
  if (!have_f16c()) GTEST_SKIP() << "this CPU has no F16C";
  for (uint32_t h = 0; h <= 0xffff; ++h)
    ASSERT_EQ(bits(f16_to_f32(uint16_t(h))), bits(f16c_widen(uint16_t(h))))
        << "half 0x" << std::hex << h;
#else
  GTEST_SKIP() << "not an x86 CPU";
#endif
}

TEST(Fp16, NarrowingMatchesF16c) {
#ifdef FLASHMAP_TEST_F16C
  if (!have_f16c()) GTEST_SKIP() << "this CPU has no F16C";
  for (uint32_t u : narrow_cases()) {
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(f32_to_f16(f), f16c_narrow(f)) << "fp32 0x" << std::hex << u;
  }
#else
  GTEST_SKIP() << "not an x86 CPU";
#endif
}

TEST(Fp16, MatchesTheCompilersFloat16) {
#ifdef __FLT16_MANT_DIG__
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float want = float(std::bit_cast<_Float16>(uint16_t(h)));
    if (want != want) continue;  // NaN payloads: F16C's rule is the one checked above
    ASSERT_EQ(bits(f16_to_f32(uint16_t(h))), bits(want)) << "half 0x" << std::hex << h;
  }
  for (uint32_t u : narrow_cases()) {
    const float f = std::bit_cast<float>(u);
    if (f != f) continue;
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(_Float16(f))) << "fp32 0x" << std::hex << u;
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16 on this target";
#endif
}

TEST(Fp16, KnownValues) {
  // Values fixed by IEEE binary16 itself.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);    // the tie past the largest half goes to infinity
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);    // the smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);    // half of it: a tie, to even (zero)
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 steps: a tie, to even (2)
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << "half 0x" << std::hex << h;
  }
}

}  // namespace
}  // namespace flashmap
