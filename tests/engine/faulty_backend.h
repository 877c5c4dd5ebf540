// A CPU backend that fails as a device can: open() throws flashmap::Error (out of device memory
// for one more sequence) on the opens named, and verify() throws flashmap::DeviceFault (a sticky
// CUDA error: the context cannot compute again) from its fault_at-th call on. Everything else
// is the CPU reference, so the requests that do run decode as generate() does.
#pragma once

#include <atomic>
#include <set>

#include "engine/cpu_backend.h"

namespace flashmap::engine::test {

class FaultyBackend : public CpuBackend {
 public:
  FaultyBackend(const Qwen3Model& target, const BlockProposer* proposer)
      : CpuBackend(target, proposer) {}
  std::set<int> failing_opens;    // 0-based indices of open() calls that throw
  std::atomic<int> fault_at{-1};  // verify() calls from this one on throw (-1: never)
  int lanes = 1 << 20;            // max_sequences()
  std::atomic<int> opens{0}, verifies{0};

  int max_sequences() const override { return lanes; }

  std::unique_ptr<Slot> open(bool drafting) override {
    if (failing_opens.count(opens++))
      throw Error(
          "CUDA: cudaMalloc of 512.0 MiB failed: out of memory (cudaErrorMemoryAllocation)");
    return CpuBackend::open(drafting);
  }
  void verify(std::span<const SeqStep> steps) override {
    if (fault_at >= 0 && verifies++ >= fault_at)
      throw DeviceFault(
          "CUDA: cudaStreamSynchronize failed: an illegal memory access was encountered "
          "(cudaErrorIllegalAddress)");
    CpuBackend::verify(steps);
  }
};

}  // namespace flashmap::engine::test
