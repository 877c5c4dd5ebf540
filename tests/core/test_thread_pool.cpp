// ThreadPool: every index is visited exactly once, whatever the pool size, n and grain; and the
// spin-then-sleep hand-off neither loses a wake-up nor returns before the workers are done, both
// for calls back to back (the spinning path) and after idle gaps (the sleeping path).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"

namespace flashmap {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (const int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (const int64_t n : {0, 1, 2, 7, 16, 17, 1000}) {
      for (const int64_t grain : {1, 3, 16, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_LE(0, b);
          EXPECT_LE(b, e);
          EXPECT_LE(e, n);
          EXPECT_EQ(b % grain, 0);  // ranges start on grain boundaries
          for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
    }
  }
}

TEST(ThreadPool, BackToBackCallsSeeAllWork) {
  ThreadPool pool(2);
  std::vector<int64_t> out(64);
  for (int round = 0; round < 20000; ++round) {
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = round;
    });
    // parallel_for returned: every worker's writes of this round are visible.
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(out[size_t(i)], round) << "round " << round;
  }
}

// Runs body on its own thread and fails unless it returns within `limit`. A lost wake-up hangs
// parallel_for or the pool's destructor forever; this turns that into a failure that names the
// test (the stuck thread cannot be cancelled, so the binary then aborts) instead of a hang that
// only ctest's timeout would end.
template <typename Body>
void finishes_within(std::chrono::seconds limit, Body body) {
  std::promise<void> done;
  std::future<void> returned = done.get_future();
  std::thread runner([&] {
    body();  // an ASSERT_* in body returns from body, not from here
    done.set_value();
  });
  if (returned.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "did not return within " << limit.count() << " s: a lost wake-up";
    std::cerr << ::testing::UnitTest::GetInstance()->current_test_info()->name()
              << ": did not return within " << limit.count() << " s (a lost wake-up)" << std::endl;
    std::abort();
  }
  runner.join();
}

TEST(ThreadPool, WakesAfterIdleGaps) {
  // Gaps longer than the spin window (~200 µs) put the workers (and the caller's wait) to sleep;
  // a slow worker makes the caller wait for it. Every call must return, and only once every index
  // of its range has been visited exactly once.
  finishes_within(std::chrono::seconds(60), [] {
    ThreadPool pool(3);
    const int64_t n = 300;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    for (int round = 0; round < 20; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(round % 2 ? 2 : 0));
      for (auto& h : hits) h.store(0);
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        if (b > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow worker
        for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[size_t(i)].load(), 1) << "round " << round << " index " << i;
    }
  });
}

TEST(ThreadPool, DestroysWhileWorkersSpinOrSleep) {
  // The destructor must wake workers that spin (right after a call) or sleep (after a gap) and
  // join them; a call made just before it must have done all its work.
  finishes_within(std::chrono::seconds(60), [] {
    // Many pools: some are destroyed before their workers have even started.
    for (int i = 0; i < 400; ++i) {
      ThreadPool pool(2 + i % 3);
      if (i % 2) {
        std::atomic<int64_t> visited{0};
        pool.parallel_for(8, 1, [&](int64_t b, int64_t e) { visited.fetch_add(e - b); });
        ASSERT_EQ(visited.load(), 8) << "pool " << i;
      }
      if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  });
}

// Parts go to whoever runs: while one thread is held up in a part (here asleep; on a shared core,
// kept off it by another process), the others take every remaining part instead of waiting for a
// share fixed in advance.
TEST(ThreadPool, AHeldUpThreadHoldsBackOnlyItsPart) {
  ThreadPool pool(3);
  std::mutex m;
  std::map<int64_t, std::thread::id> ran;
  pool.parallel_for(12, 1, [&](int64_t b, int64_t e) {
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::lock_guard lk(m);
    for (int64_t i = b; i < e; ++i) ran[i] = std::this_thread::get_id();
  });
  ASSERT_EQ(ran.size(), 12u);
  for (int64_t i = 1; i < 12; ++i) EXPECT_NE(ran[i], ran[0]) << "part " << i;
}

// One loop at a time: callers on two threads take turns, each loop whole.
TEST(ThreadPool, CallersFromTwoThreadsTakeTurns) {
  ThreadPool pool(3);
  auto caller = [&](int salt) {
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> hits(97);
      pool.parallel_for(97, 2, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1 + salt);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1 + salt);
    }
  };
  finishes_within(std::chrono::seconds(60), [&] {
    std::thread other(caller, 1);
    caller(0);
    other.join();
  });
}

// An exception in any part (a worker's or the caller's) reaches the caller once every part has
// finished, and the pool keeps working: before, a worker's exception ended the process.
TEST(ThreadPool, RethrowsTheFirstExceptionAfterEveryPartFinished) {
  ThreadPool pool(3);
  for (const int64_t thrower : {0, 1, 2}) {
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.parallel_for(3, 1,
                                   [&](int64_t b, int64_t) {
                                     if (b == thrower) throw std::runtime_error("bad weight");
                                     std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                     ++finished;
                                   }),
                 std::runtime_error)
        << "part " << thrower;
    EXPECT_EQ(finished.load(), 2) << "returned before the other parts finished";
  }
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// The process-wide pool, in a process of its own (the child re-runs this binary, so no earlier
// test made it): an explicit size wins over FLASHMAP_THREADS without touching the variable, the
// same size is accepted again and another one refused, naming the size the pool has.
TEST(ThreadPool, ConfigureGlobalSizesThePoolOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("FLASHMAP_THREADS", "5", 1);
        const int made = ThreadPool::configure_global(3);
        const int again = ThreadPool::configure_global(3);
        std::string refused;
        try {
          ThreadPool::configure_global(4);
        } catch (const Error& e) {
          refused = e.what();
        }
        std::cerr << "made " << made << " again " << again << " size "
                  << ThreadPool::global().size() << " env " << std::getenv("FLASHMAP_THREADS")
                  << " refused: " << refused << "\n";
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0),
      "made 3 again 3 size 3 env 5 refused: threads=4: this process's CPU thread pool already "
      "runs 3 threads");
  // Without a size the variable decides, and a later explicit size must agree with it.
  EXPECT_EXIT(
      {
        setenv("FLASHMAP_THREADS", "2", 1);
        const int size = ThreadPool::global().size();
        std::cerr << "size " << size << " then " << ThreadPool::configure_global(2) << "\n";
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "size 2 then 2");
}

TEST(ThreadPool, ConfigureGlobalChecksTheRange) {
  for (int bad : {0, -1, 1025}) {
    try {
      ThreadPool::configure_global(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "threads must be in [1, 1024], got " + std::to_string(bad));
    }
  }
}

}  // namespace
}  // namespace flashmap
