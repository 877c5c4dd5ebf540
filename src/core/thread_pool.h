// A fixed pool of worker threads for data-parallel loops. Work is split into contiguous ranges
// so that every element is computed by the same code whatever the thread count: results do not
// depend on how many threads run (the CPU path stays deterministic and batch-invariant).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashmap {

class ThreadPool {
 public:
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), each a multiple of `grain` long
  // (but the last), on the calling thread and the workers; returns when all are done, then
  // rethrows the first exception any of them threw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool, made on first use with FLASHMAP_THREADS threads, else one per core.
  static ThreadPool& global();
  // Makes the process-wide pool with `threads` threads (in [1, 1024]) when it does not exist
  // yet; throws flashmap::Error when it already runs with another size (it is never resized:
  // the workers of a running pool belong to every model computing on it). Returns its size.
  static int configure_global(int threads);

 private:
  void worker_loop(int index);
  void keep_error(std::exception_ptr e);

  std::vector<std::thread> workers_;
  // A forward pass calls parallel_for a few hundred times, back to back, for tens of
  // microseconds each; a futex wake-up per call costs about as much. So workers and the caller
  // spin on the atomics below for up to ~200 µs before sleeping on the condition
  // variables, which only an idle pool reaches.
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::exception_ptr error_;  // the first exception of the running parallel_for
};

}  // namespace flashmap
