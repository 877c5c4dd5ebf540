// A CPU backend that fails as a device can: open() throws flashmap::Error (out of device memory
// for one more sequence) on the opens named, and forward() throws flashmap::DeviceFault (a sticky
// CUDA error: the context cannot compute again) from its fault_at-th call on. Everything else
// is the CPU reference, so the requests that do run decode as generate() does.
#pragma once

#include <atomic>
#include <set>

#include "cpu/backend.h"

namespace flashmap::engine::test {

class FaultyBackend : public cpu::CpuBackend {
 public:
  FaultyBackend(const Qwen3Model& target, const BlockProposer* proposer)
      : CpuBackend(target, proposer) {}
  std::set<int> failing_opens;    // 0-based indices of open() calls that throw
  std::atomic<int> fault_at{-1};  // forward() calls from this one on throw (-1: never)
  std::atomic<int> opens{0}, verifies{0};

  // Sequences it says it holds (BackendInfo::max_sequences), before an engine is made over it.
  void set_lanes(int n) { info_.max_sequences = n; }
  // What it says it can do beyond the round (as a device backend without these would).
  void set_caps(Capabilities c) { info_.caps = c; }

  Slot open(const Open& o) override {
    if (failing_opens.count(opens++))
      throw Error(
          "CUDA: cudaMalloc of 512.0 MiB failed: out of memory (cudaErrorMemoryAllocation)");
    return CpuBackend::open(o);
  }
  void forward(std::span<const SeqStep> steps) override {
    if (fault_at >= 0 && verifies++ >= fault_at)
      throw DeviceFault(
          "CUDA: cudaStreamSynchronize failed: an illegal memory access was encountered "
          "(cudaErrorIllegalAddress)");
    CpuBackend::forward(steps);
  }
};

}  // namespace flashmap::engine::test
