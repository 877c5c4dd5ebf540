// Shared by the tests/cuda binaries: one CUDA context per test binary, or none (with the reason)
// on a machine without a usable GPU, where every device test skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
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

// A test that needs the GPU (skipped without one), with copies to and from it on the context's
// stream.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Gpu::get().ctx) GTEST_SKIP() << "no usable CUDA GPU: " << Gpu::get().why;
    ctx = Gpu::get().ctx.get();
  }
  template <typename T>
  DeviceBuffer<T> up(const std::vector<T>& v) {
    return DeviceBuffer<T>(*ctx, v);
  }
  template <typename T>
  std::vector<T> down(const DeviceBuffer<T>& b) {
    ctx->sync();
    return b.download(*ctx);
  }
  // n floats at a device pointer.
  std::vector<float> down(const float* p, int64_t n) {
    ctx->sync();
    std::vector<float> h(static_cast<size_t>(n));
    check(cudaMemcpyAsync(h.data(), p, size_t(n) * 4, cudaMemcpyDeviceToHost, ctx->stream()),
          "D2H");
    ctx->sync();
    return h;
  }
  Context* ctx = nullptr;
};

// Normalized mean squared error Σ(got − want)² / Σwant², the parity measure of every test here
// (as ggml's test-backend-ops); the sizes must match.
inline double nmse(std::span<const float> got, std::span<const float> want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    err += d * d;
    ref += double(want[i]) * double(want[i]);
  }
  return ref > 0 ? err / ref : err;
}
// The same against a float64 reference (tests/ops/reference_ops.h).
inline double nmse(std::span<const float> got, std::span<const double> want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    err += d * d;
    ref += want[i] * want[i];
  }
  return ref > 0 ? err / ref : err;
}

inline std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.0f, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = ::flashmap::f32_to_bf16(v[i]);
  return b;
}

inline std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = ::flashmap::bf16_to_f32(b[i]);
  return v;
}

}  // namespace flashmap::cuda::test
