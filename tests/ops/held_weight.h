// A matrix of a test, held in one storage dtype (fp32, or bf16/f16 bits), seen as a Weight.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/ops.h"

namespace flashmap::test {

struct HeldWeight {
  DType dtype;
  int64_t rows, cols;
  std::vector<float> f32;      // the values (fp32 storage)
  std::vector<uint16_t> half;  // their bf16/f16 bits otherwise
  Weight view() const {
    return Weight{dtype, dtype == DType::F32 ? static_cast<const void*>(f32.data()) : half.data(),
                  rows, cols};
  }
};

}  // namespace flashmap::test
