#include "cuda/weights.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace flashmap::cuda {

std::vector<uint16_t> to_bf16(const Weight& w) {
  const size_t n = size_t(w.rows * w.cols);
  // A matrix held in memory gives its bytes up once packed for the CPU (Checkpoint::drop_pages);
  // a mapped one reads them again from its file.
  FLASHMAP_CHECK(w.data || n == 0,
                 "a [{}, {}] weight has no host bytes left to upload (packed for the CPU from a "
                 "checkpoint held in memory)",
                 w.rows, w.cols);
  std::vector<uint16_t> out(n);
  switch (w.dtype) {
    case DType::BF16:
      std::memcpy(out.data(), w.data, n * 2);
      break;
    case DType::F32: {
      const auto* p = static_cast<const float*>(w.data);
      for (size_t i = 0; i < n; ++i) out[i] = ::flashmap::f32_to_bf16(p[i]);
      break;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint16_t*>(w.data);
      for (size_t i = 0; i < n; ++i) out[i] = ::flashmap::f32_to_bf16(f16_to_f32(p[i]));
      break;
    }
    default:
      throw Error(fmt::format("weight of dtype {} is not a float matrix", dtype_name(w.dtype)));
  }
  return out;
}

}  // namespace flashmap::cuda
