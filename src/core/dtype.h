// Element types of checkpoint tensors. Weights stay in their file dtype in memory (an 8B bf16
// checkpoint must not need 32 GB); kernels widen them to fp32 as they read them.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace flashmap {

// Bool: one byte per element (speculators' t2d vocabulary mask). F8_E4M3: float8_e4m3fn, the
// weights of an FP8 checkpoint (read through their scales: io/safetensors.h Checkpoint).
enum class DType : uint8_t { F32, BF16, F16, I64, I32, Bool, F8_E4M3 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I64:
      return 8;
    case DType::I32:
      return 4;
    case DType::Bool:
    case DType::F8_E4M3:
      return 1;
  }
  return 0;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::Bool:
      return "BOOL";
    case DType::F8_E4M3:
      return "F8_E4M3";
  }
  return "?";
}

inline bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// bf16 is the upper half of an fp32: widening is exact.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch's .to(torch.bfloat16) does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IEEE binary16 to and from fp32 in integer arithmetic, for every compiler (clang before 15 has
// no _Float16 on x86 without AVX512-FP16): exact widening; narrowing rounds to nearest even,
// overflows to infinity and keeps NaN a quiet NaN, as the CPU's F16C conversions do.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man · 2⁻²⁴, exact in fp32
    const float v = float(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 0x1f)  // infinity, or NaN made quiet
    return std::bit_cast<float>(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}
inline uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((u >> 13) & 0x3ffu));  // NaN: quiet
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // from 65520 (65504 + half a step) up
  if (u < 0x38800000u) {
    // Below 2⁻¹⁴: a subnormal half, man = |f| · 2²⁴ rounded to even (1024 is 2⁻¹⁴ itself). The
    // scaling is exact; adding and taking away 2²³ rounds to an integer in fp32's own rounding.
    const float scaled = std::bit_cast<float>(u) * 0x1p24f;
    const float big = scaled + 0x1p23f;
    return uint16_t(sign | uint32_t(big - 0x1p23f));
  }
  u += 0xfffu + ((u >> 13) & 1u);  // round the 13 dropped bits to nearest even
  return uint16_t(sign | ((u - 0x38000000u) >> 13));
}

// Element i of a float tensor (is_float(t)), widened to fp32; `data` need not be aligned
// (safetensors offsets are any byte). 0 for other dtypes, which callers rule out first.
inline float float_element(const void* data, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint16_t h;
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case DType::BF16:
      std::memcpy(&h, p + i * 2, 2);
      return bf16_to_f32(h);
    case DType::F16:
      std::memcpy(&h, p + i * 2, 2);
      return f16_to_f32(h);
    default:
      return 0.0f;
  }
}

}  // namespace flashmap
