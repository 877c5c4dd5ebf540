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
  // Claims and runs parts of the current job until none is left.
  void run_parts();
  void keep_error(std::exception_ptr e);

  std::vector<std::thread> workers_;
  // A forward pass calls parallel_for a few hundred times, back to back, for tens of
  // microseconds each, so waiting threads first spin on the atomics below (pause instructions
  // only: a thread that yields its core to another process may not get it back for a time
  // slice), then park (a condition variable), which wakes a thread with a fresh claim on it.
  //
  // A job is cut into parts (a few per thread) that whoever runs claims in order, so a thread
  // that another process keeps off its core delays only the part it holds, not a share fixed in
  // advance. `state_` is the job's generation (high bits), whether workers may join it, and how
  // many have joined: the caller writes the next job only once every joined worker has left, so
  // a worker that joined reads a stable job.
  static constexpr uint64_t kOpen = uint64_t(1) << 15, kJoined = kOpen - 1, kGeneration = 1 << 16;
  std::atomic<uint64_t> state_{0};
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0, job_parts_ = 0;
  std::atomic<int64_t> next_part_{0}, parts_done_{0};
  std::atomic<int> sleepers_{0};            // workers parked for the next generation
  std::atomic<bool> caller_parked_{false};  // the caller parked for the last part
  std::mutex park_mutex_;
  std::condition_variable workers_cv_, caller_cv_;
  std::atomic<bool> stop_{false};
  std::mutex caller_mutex_;  // one parallel_for at a time
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception of the running parallel_for
};

}  // namespace flashmap
