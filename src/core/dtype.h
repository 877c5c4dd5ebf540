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

inline float f16_to_f32(uint16_t h) {
  return float(std::bit_cast<_Float16>(h));
}
inline uint16_t f32_to_f16(float f) {
  return std::bit_cast<uint16_t>(_Float16(f));
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
