// Shared by the tests/cuda binaries: one CUDA context per test binary, or none (with the reason)
// on a machine without a usable GPU, where every device test skips.
#pragma once

#include <memory>
#include <string>

#include "cuda/device.h"

namespace flashmap::cuda::test {

struct Gpu {
  std::unique_ptr<Context> ctx;
  std::string why;
  static Gpu& get() {
    static Gpu g = [] {
      Gpu r;
      if (device_count(&r.why) > 0) r.ctx = std::make_unique<Context>("cuda");
      return r;
    }();
    return g;
  }
};

}  // namespace flashmap::cuda::test
