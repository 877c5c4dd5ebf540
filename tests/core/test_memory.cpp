#include <gtest/gtest.h>
#include <unistd.h>

#include "core/memory.h"

namespace flashmap {
namespace {

// What the kernel says is available (MemAvailable, or less under a cgroup's limit): more than
// nothing and at most the machine's memory; so the weights' check (models/qwen3.cpp) compares
// against a real figure.
TEST(AvailableMemory, IsPositiveAndAtMostThePhysicalMemory) {
  const int64_t physical = int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t available = available_memory_bytes();
  EXPECT_GT(available, 0);
  EXPECT_LE(available, physical);
}

}  // namespace
}  // namespace flashmap
