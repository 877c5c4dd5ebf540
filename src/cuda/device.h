// The CUDA device context of the engine: which GPU, one stream that every kernel and copy goes
// through (so a forward is ordered without events, and can later be captured into a CUDA graph),
// one cuBLASLt handle with its workspace, and RAII device buffers.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"

namespace flashmap::cuda {

// Throws flashmap::Error naming the call and the CUDA error, after clearing the thread's last
// error; flashmap::DeviceFault when the error is sticky (the context cannot compute again).
void check(cudaError_t e, const char* what);
bool is_sticky(cudaError_t e);
void check(cublasStatus_t s, const char* what);

// The number of usable GPUs; 0 when there are none or the driver/runtime cannot be used (no
// driver, no device node), with the reason in *why when given.
int device_count(std::string* why = nullptr);

// Parses "cuda" (device 0) or "cuda:N"; anything else is a flashmap::Error. Needs no GPU.
int parse_device(std::string_view spec);

class Context {
 public:
  // Selects the device named by `spec` ("cuda" or "cuda:N"), creates the stream, the cuBLASLt
  // handle and a workspace. Throws flashmap::Error when no usable GPU exists or N is out of range.
  explicit Context(std::string_view spec = "cuda", size_t workspace_bytes = size_t(32) << 20);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  // Makes this context's GPU the calling thread's current device. The runtime keeps the current
  // device per thread: a thread that never calls it allocates and launches on GPU 0, so every
  // entry point a thread other than the constructing one may call starts with it.
  void make_current() const;
  // Device memory free now (cudaMemGetInfo), for sizing what is allocated later.
  size_t free_bytes() const;
  const std::string& name() const { return name_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Device scratch of at least `bytes` (grown, never shrunk); stream-ordered reuse only.
  void* scratch(size_t bytes);
  // Waits for the stream; surfaces asynchronous kernel errors as flashmap::Error.
  void sync() const;

 private:
  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// An owning device allocation of n elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // check() clears the failed allocation's last error, so that a later healthy call does not
  // report it.
  explicit DeviceBuffer(size_t n) {
    if (n == 0) return;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T));
    if (e != cudaSuccess) {
      p_ = nullptr;
      check(
          e,
          fmt::format("cudaMalloc of {:.1f} MiB", double(n * sizeof(T)) / double(1 << 20)).c_str());
    }
    n_ = n;
  }
  DeviceBuffer(const Context& ctx, const std::vector<T>& host) : DeviceBuffer(host.size()) {
    upload(ctx, host.data(), host.size());
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return p_; }
  size_t size() const { return n_; }

  // Stream-ordered copies on ctx's stream; download waits for the stream before returning.
  void upload(const Context& ctx, const T* host, size_t n) {
    FLASHMAP_ASSERT(n <= n_);
    check(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, ctx.stream()),
          "cudaMemcpyAsync H2D");
    ctx.sync();  // the host buffer may be freed as soon as we return
  }
  std::vector<T> download(const Context& ctx) const {
    std::vector<T> host(n_);
    check(cudaMemcpyAsync(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, ctx.stream()),
          "cudaMemcpyAsync D2H");
    ctx.sync();
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// An owning pinned (page-locked) host allocation of n elements of T: copies between it and the
// device are asynchronous, where a pageable buffer's are staged (a device→host copy into one
// waits for the stream). Stream order does not protect it: the host must know a copy finished
// (a synchronization, or an event) before it reads the buffer or writes it again.
template <typename T>
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t n) {
    if (n == 0) return;
    const cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T));
    if (e != cudaSuccess) {
      p_ = nullptr;
      check(e, fmt::format("cudaMallocHost of {:.1f} MiB", double(n * sizeof(T)) / double(1 << 20))
                   .c_str());
    }
    n_ = n;
  }
  ~HostBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  HostBuffer(HostBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFreeHost(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace flashmap::cuda
