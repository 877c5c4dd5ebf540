// Weights on their way to the device: every matrix is stored in bf16 there.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace flashmap::cuda {

// A weight matrix as bf16 bits: bf16 copied, f32 and f16 rounded to nearest even (what torch's
// .to(torch.bfloat16) gives). Throws flashmap::Error for a dtype that is not a float, or when the
// matrix has no host bytes (a CPU model's in-memory weight gave them up for its packed copy).
std::vector<uint16_t> to_bf16(const Weight& w);

}  // namespace flashmap::cuda
