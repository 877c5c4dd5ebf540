#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace flashmap {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` for up to ~200 µs: a few pause-instruction polls, then sched_yield() so that a
// thread of another process sharing this core still runs. False when the caller should sleep.
template <typename Ready>
bool spin_until(Ready ready) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (i < 64) {
      cpu_relax();
      continue;
    }
    std::this_thread::yield();
    if ((i & 15) == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      return ready();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);  // spinning workers look at this
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {

std::mutex global_mutex;
std::unique_ptr<ThreadPool> global_owner;  // joins the workers at exit
std::atomic<ThreadPool*> global_pool{nullptr};

// The process-wide pool, made with `threads` threads (0: FLASHMAP_THREADS, else one per core)
// when it does not exist yet.
ThreadPool& global_pool_of(int threads) {
  std::lock_guard lk(global_mutex);
  if (ThreadPool* p = global_pool.load(std::memory_order_relaxed)) return *p;
  if (threads <= 0) {
    const char* env = std::getenv("FLASHMAP_THREADS");
    threads = env ? std::atoi(env) : 0;
  }
  global_owner = std::make_unique<ThreadPool>(threads);
  global_pool.store(global_owner.get(), std::memory_order_release);
  return *global_owner;
}

}  // namespace

ThreadPool& ThreadPool::global() {
  // parallel_for asks for the pool hundreds of times per forward: no lock once it exists.
  if (ThreadPool* p = global_pool.load(std::memory_order_acquire)) return *p;
  return global_pool_of(0);
}

int ThreadPool::configure_global(int threads) {
  FLASHMAP_CHECK(threads >= 1 && threads <= 1024, "threads must be in [1, 1024], got {}", threads);
  const int size = global_pool_of(threads).size();
  FLASHMAP_CHECK(size == threads,
                 "threads={}: this process's CPU thread pool already runs {} threads (it is made "
                 "once, by the first engine)",
                 threads, size);
  return size;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = int(std::min<int64_t>(units, size()));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (units + parts - 1) / parts * grain;
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();  // no system call when no worker sleeps
  // An exception (e.g. a weight that fails a check while it is packed) must not leave the
  // workers running on `fn` after the caller returns, nor end a worker thread: each part catches
  // its own, and the first is rethrown here once every part is done.
  try {
    fn(0, std::min(n, chunk));
  } catch (...) {
    keep_error(std::current_exception());
  }
  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::keep_error(std::exception_ptr e) {
  std::lock_guard lock(mutex_);
  if (!error_) error_ = std::move(e);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
    }
    const int64_t begin = chunk * index;
    if (begin < n) {
      try {
        (*job)(begin, std::min(n, begin + chunk));
      } catch (...) {
        keep_error(std::current_exception());
      }
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);  // the caller may be between its check and its wait
      done_cv_.notify_one();
    }
  }
}

}  // namespace flashmap
