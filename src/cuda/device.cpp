#include "cuda/device.h"

#include <charconv>

namespace flashmap::cuda {

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  // Out of memory and bad arguments also set the thread's last error; left there, it would fail
  // the next healthy call that checks cudaGetLastError (a later round of another request).
  cudaGetLastError();
  const std::string msg =
      fmt::format("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
  // A sticky error stays in the context (the reset above cannot clear it): every later call
  // would fail, so it is a fault of the device, not of this request.
  if (is_sticky(e))
    throw DeviceFault(msg + "; the device cannot be used until the process restarts");
  throw Error(msg);
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("cuBLASLt: {} failed: status {}", what, int(s)));
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    // No driver or no device node: the runtime reports an error rather than 0 devices.
    if (why) *why = fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "0 devices";
  return n;
}

int parse_device(std::string_view spec) {
  if (spec == "cuda") return 0;
  constexpr std::string_view prefix = "cuda:";
  int n = -1;
  if (spec.starts_with(prefix)) {
    const auto digits = spec.substr(prefix.size());
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || digits.empty()) n = -1;
  }
  FLASHMAP_CHECK(n >= 0, "--device: expected 'cuda' or 'cuda:N' (N a GPU index), got '{}'", spec);
  return n;
}

Context::Context(std::string_view spec, size_t workspace_bytes) {
  device_ = parse_device(spec);
  std::string why;
  const int n = device_count(&why);
  FLASHMAP_CHECK(n > 0, "--device {}: no usable CUDA GPU on this machine ({})", spec, why);
  FLASHMAP_CHECK(device_ < n, "--device {}: GPU index {} out of range, this machine has {} GPU(s)",
                 spec, device_, n);
  check(cudaSetDevice(device_), "cudaSetDevice");
  // The primary context now, so that free_bytes() below and later allocations see its memory.
  check(cudaFree(nullptr), "cudaFree (context start)");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  name_ = fmt::format("{} (sm_{}{}, {} MiB)", prop.name, prop.major, prop.minor,
                      prop.totalGlobalMem >> 20);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasLtCreate(&lt_), "cublasLtCreate");
  workspace_bytes_ = workspace_bytes;
  check(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc (cuBLASLt workspace)");
}

void Context::make_current() const {
  int now = -1;
  if (cudaGetDevice(&now) != cudaSuccess || now != device_)
    check(cudaSetDevice(device_), "cudaSetDevice");
}

size_t Context::free_bytes() const {
  make_current();
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

Context::~Context() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (scratch_) cudaFree(scratch_);
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* Context::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    // The old scratch may still be read by queued kernels: wait before freeing it.
    sync();
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    check(cudaMalloc(&scratch_, bytes), "cudaMalloc (scratch)");
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

void Context::sync() const {
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  check(cudaGetLastError(), "kernel launch");
}

}  // namespace flashmap::cuda
