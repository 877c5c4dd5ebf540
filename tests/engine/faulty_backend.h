// A CPU backend that fails as a device can: open() throws flashmap::Error (out of device memory
// for one more sequence) on the opens named, and forward() throws flashmap::DeviceFault (a sticky
// CUDA error: the context cannot compute again) from its fault_at-th call on; and whose open()
// a test can hold (`gate`). Everything else is the CPU reference, so the requests that do run
// decode as generate() does.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

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

  // Held by a test, open() waits for it: the engine thread stops before a sequence starts, so
  // what the test submits meanwhile finds the earlier requests still in flight.
  std::mutex gate;

  Slot open(const Open& o) override {
    { std::lock_guard wait_for_the_test(gate); }
    if (failing_opens.count(opens++))
      throw Error(
          "CUDA: cudaMalloc of 512.0 MiB failed: out of memory (cudaErrorMemoryAllocation)");
    return open_by_need(o);
  }
  // Memory by need, as a paged device backend gives it: at most `budget` positions promised to
  // open sequences at once (each its Open::max_positions); -1: no limit. admissible() says what
  // fits, open() refuses what does not; `most_held` records the peak.
  int64_t budget = -1;
  int64_t most_held = 0;
  size_t admissible(std::span<const int64_t> positions) const override {
    if (budget < 0) return positions.size();
    int64_t left = budget - held_positions();
    size_t n = 0;
    for (int64_t p : positions) {
      if (p > left) break;
      left -= p;
      ++n;
    }
    return n;
  }
  // Opens from another sequence (copies of a prefix), as asked: the length and max_positions.
  std::vector<std::pair<int64_t, int64_t>> fork_opens;
  // A settled sequence promises only what it holds (a paged device gives back its growth).
  void settle(int seq) override {
    const int64_t holds = CpuBackend::held(seq).positions;
    std::lock_guard lk(mutex_);
    promised_[seq] = holds;
  }
  int64_t promised() const { return held_positions(); }
  Slot open_by_need(const Open& o) {
    if (o.from) {
      std::lock_guard lk(mutex_);
      fork_opens.push_back({o.length, o.max_positions});
    }
    if (budget >= 0) {
      if (o.max_positions > budget - held_positions())
        throw Error("out of KV memory: " + std::to_string(o.max_positions) + " positions asked, " +
                    std::to_string(budget - held_positions()) + " free");
    }
    Slot s = CpuBackend::open(o);
    if (s) {
      std::lock_guard lk(mutex_);
      promised_[s.index()] = o.max_positions;
      most_held = std::max(most_held, sum_locked());
    }
    return s;
  }

  void forward(std::span<const SeqStep> steps) override {
    if (fault_at >= 0 && verifies++ >= fault_at)
      throw DeviceFault(
          "CUDA: cudaStreamSynchronize failed: an illegal memory access was encountered "
          "(cudaErrorIllegalAddress)");
    CpuBackend::forward(steps);
  }

 protected:
  void close(int seq) override {
    {
      std::lock_guard lk(mutex_);
      promised_.erase(seq);
    }
    CpuBackend::close(seq);
  }

 private:
  int64_t held_positions() const {
    std::lock_guard lk(mutex_);
    return sum_locked();
  }
  int64_t sum_locked() const {
    int64_t n = 0;
    for (const auto& [seq, p] : promised_) n += p;
    return n;
  }
  mutable std::mutex mutex_;
  std::map<int, int64_t> promised_;  // open sequences' Open::max_positions
};

}  // namespace flashmap::engine::test
