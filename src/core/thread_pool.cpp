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

// Polls `ready` with pause instructions for up to ~30 µs (the gap between two loops of a forward
// pass is far shorter); false when the caller should park. No sched_yield: on a core another
// process wants, a thread that yields goes to the back of the queue and may wait a time slice
// for the core, where a parked thread is woken with a fresh claim on it.
template <typename Ready>
bool spin_until(Ready ready) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 255) == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(30))
      return ready();
  }
}

// Parts per thread: enough that a thread kept off its core holds back little of a loop, few
// enough that claiming one costs nothing next to running it.
constexpr int64_t kPartsPerThread = 4;

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  FLASHMAP_CHECK(uint64_t(threads) < kJoined, "a thread pool holds at most {} threads, got {}",
                 kJoined - 1, threads);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  // A new generation wakes every worker, spinning or parked; they see stop_ and leave.
  state_.fetch_add(kGeneration, std::memory_order_seq_cst);
  { std::lock_guard lk(park_mutex_); }
  workers_cv_.notify_all();
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

void ThreadPool::run_parts() {
  for (;;) {
    const int64_t part = next_part_.fetch_add(1, std::memory_order_relaxed);
    if (part >= job_parts_) return;
    const int64_t begin = part * job_chunk_;
    try {
      (*job_)(begin, std::min(job_n_, begin + job_chunk_));
    } catch (...) {
      keep_error(std::current_exception());
    }
    if (parts_done_.fetch_add(1, std::memory_order_seq_cst) + 1 == job_parts_ &&
        caller_parked_.load(std::memory_order_seq_cst)) {
      // The caller is parked or about to be: once it holds the lock, it is waiting or sees this.
      { std::lock_guard lk(park_mutex_); }
      caller_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(units, int64_t(size()) * kPartsPerThread);
  if (workers_.empty() || parts <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard one_caller(caller_mutex_);
  // The previous job's late joiners (they found no part left) leave before it is rewritten;
  // then no worker may join until the new job is written.
  uint64_t s = state_.load(std::memory_order_acquire);
  for (int i = 1;; ++i) {
    if ((s & kJoined) != 0) {
      if (i < 4096)
        cpu_relax();
      else
        std::this_thread::yield();  // a joiner was taken off its core: give it one back
      s = state_.load(std::memory_order_acquire);
      continue;
    }
    if (state_.compare_exchange_weak(s, s & ~kOpen, std::memory_order_acq_rel)) break;
  }
  const int64_t chunk = (units + parts - 1) / parts * grain;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_parts_ = (n + chunk - 1) / chunk;
  next_part_.store(0, std::memory_order_relaxed);
  parts_done_.store(0, std::memory_order_relaxed);
  // Publish: a new generation, open for joining (the job's fields before it). Sequentially
  // consistent with the sleepers' count: a worker parking now either sees the new generation or
  // is counted here and woken.
  state_.store(((s & ~(kOpen | kJoined)) + kGeneration) | kOpen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard lk(park_mutex_); }
    workers_cv_.notify_all();
  }
  // An exception (e.g. a weight that fails a check while it is packed) must not leave the
  // workers running on `fn` after the caller returns, nor end a worker thread: each part catches
  // its own, and the first is rethrown here once every part is done.
  run_parts();
  const int64_t total = job_parts_;
  auto finished = [&] { return parts_done_.load(std::memory_order_acquire) == total; };
  if (!spin_until(finished)) {
    std::unique_lock lk(park_mutex_);
    caller_parked_.store(true, std::memory_order_seq_cst);
    caller_cv_.wait(lk, [&] { return parts_done_.load(std::memory_order_seq_cst) == total; });
    caller_parked_.store(false, std::memory_order_relaxed);
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::keep_error(std::exception_ptr e) {
  std::lock_guard lock(error_mutex_);
  if (!error_) error_ = std::move(e);
}

void ThreadPool::worker_loop(int) {
  // Generation 0 is the pool's start: a worker that starts late still sees every later one (the
  // destructor's included).
  uint64_t seen = 0;
  for (;;) {
    // The destructor's generation may have been taken for a job's (it leaves the last job open):
    // the worker that joined it sees stop_ here rather than waiting for a generation to come.
    if (stop_.load(std::memory_order_acquire)) return;
    // Wait for a generation this worker has not worked on.
    auto fresh = [&] { return state_.load(std::memory_order_acquire) / kGeneration != seen; };
    if (!spin_until(fresh)) {
      std::unique_lock lk(park_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      workers_cv_.wait(
          lk, [&] { return state_.load(std::memory_order_seq_cst) / kGeneration != seen; });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the newest generation while it is open; its job stays as written until we leave.
    uint64_t s = state_.load(std::memory_order_acquire);
    bool joined = false;
    while (s & kOpen) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    seen = s / kGeneration;
    if (!joined) continue;  // closed: being rewritten; the next generation will wake us
    run_parts();
    state_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace flashmap
