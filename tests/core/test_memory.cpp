#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/memory.h"
#include "temp_dir.h"

namespace flashmap {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

// What the kernel says is available (MemAvailable, or less under a cgroup's limit): more than
// nothing and at most the machine's memory; so the weights' check (models/qwen3.cpp) compares
// against a real figure.
TEST(AvailableMemory, IsPositiveAndAtMostThePhysicalMemory) {
  const int64_t physical = int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t available = available_memory_bytes();
  EXPECT_GT(available, 0);
  EXPECT_LE(available, physical);
}

// A machine's /proc and /sys/fs/cgroup laid out in a temporary folder, as the kernel writes them.
class FakeSystem {
 public:
  FakeSystem() {
    files.proc = dir / "proc";
    files.cgroup = dir / "cgroup";
    std::filesystem::create_directories(files.proc + "/self");
    std::filesystem::create_directories(files.cgroup);
  }
  // <proc>/meminfo with MemAvailable of `bytes` (as kB, the kernel's unit).
  void meminfo(int64_t bytes) {
    write(files.proc + "/meminfo",
          "MemTotal:       32000000 kB\nMemFree:         1000000 kB\n"
          "MemAvailable:   " +
              std::to_string(bytes / 1024) + " kB\nBuffers: 0 kB\n");
  }
  void self_cgroup(const std::string& text) { write(files.proc + "/self/cgroup", text); }
  // The cgroup at `at` under the mount (v1: under its memory/) with its limit and usage:
  // v2's memory.max ("max" for none) and memory.current, or v1's pair.
  void v2(const std::string& at, const std::string& max, int64_t current) {
    write(files.cgroup + at + "/memory.max", max + "\n");
    write(files.cgroup + at + "/memory.current", std::to_string(current) + "\n");
  }
  void v1(const std::string& at, int64_t limit, int64_t usage) {
    write(files.cgroup + "/memory" + at + "/memory.limit_in_bytes", std::to_string(limit) + "\n");
    write(files.cgroup + "/memory" + at + "/memory.usage_in_bytes", std::to_string(usage) + "\n");
  }
  static void write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  }

  testing::TempDir dir{"flashmap-memory"};
  MemoryFiles files;
};

TEST(AvailableMemory, IsMemAvailableWithoutACgroupLimit) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("0::/user.slice/session-1.scope\n");
  sys.v2("/user.slice/session-1.scope", "max", 3 * kGiB);
  EXPECT_EQ(available_memory_bytes(sys.files), 12 * kGiB);
}

TEST(AvailableMemory, IsCappedByTheOwnCgroupV2Limit) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("0::/app\n");
  sys.v2("/app", std::to_string(4 * kGiB), kGiB);
  EXPECT_EQ(available_memory_bytes(sys.files), 3 * kGiB);
}

// A slice's limit binds every cgroup under it, though the process's own says "max".
TEST(AvailableMemory, IsCappedByAnAncestorsLimit) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("0::/limited.slice/job/step\n");
  sys.v2("/limited.slice", std::to_string(2 * kGiB), kGiB + kGiB / 2);
  sys.v2("/limited.slice/job", "max", kGiB);
  sys.v2("/limited.slice/job/step", std::to_string(8 * kGiB), kGiB);
  EXPECT_EQ(available_memory_bytes(sys.files), kGiB / 2);
}

// Cgroup v1: the memory controller's own line among the others, its hierarchy under memory/.
TEST(AvailableMemory, ReadsTheV1MemoryController) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("12:pids:/x\n5:cpu,cpuacct:/x\n4:blkio,memory:/jobs/7\n1:name=systemd:/x\n");
  sys.v1("", int64_t(9223372036854771712), 20 * kGiB);  // the root: no limit
  sys.v1("/jobs/7", 2 * kGiB, kGiB / 4);
  EXPECT_EQ(available_memory_bytes(sys.files), 2 * kGiB - kGiB / 4);
}

// A container that sees its host's path for its cgroup but has its own mounted at the root.
TEST(AvailableMemory, FallsBackToTheMountsOwnFilesInAContainer) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("0::/system.slice/docker-abc.scope\n");
  sys.v2("", std::to_string(kGiB), kGiB / 4);
  EXPECT_EQ(available_memory_bytes(sys.files), kGiB - kGiB / 4);
  // and one whose path lies outside its cgroup namespace
  sys.self_cgroup("0::/../../elsewhere\n");
  EXPECT_EQ(available_memory_bytes(sys.files), kGiB - kGiB / 4);
}

// Usage above the limit (the kernel reclaims later) leaves nothing, not a negative size.
TEST(AvailableMemory, IsZeroWhenUsageExceedsTheLimit) {
  FakeSystem sys;
  sys.meminfo(12 * kGiB);
  sys.self_cgroup("0::/app\n");
  sys.v2("/app", std::to_string(kGiB), 2 * kGiB);
  EXPECT_EQ(available_memory_bytes(sys.files), 0);
}

// Files that are missing or say something else are no limit, never a wrong one.
TEST(AvailableMemory, IgnoresMissingAndMalformedFiles) {
  FakeSystem sys;
  EXPECT_EQ(available_memory_bytes(sys.files), -1);  // nothing to read
  sys.self_cgroup("0::/app\nnot a cgroup line\n::\n");
  sys.v2("/app", std::to_string(kGiB), kGiB / 2);
  EXPECT_EQ(available_memory_bytes(sys.files), kGiB / 2);  // no meminfo: the cgroup's room
  for (const char* bad : {"-5\n", "12abc\n", "\n", "99999999999999999999999\n", "1 2\n"}) {
    FakeSystem::write(sys.files.cgroup + "/app/memory.max", bad);
    EXPECT_EQ(available_memory_bytes(sys.files), -1) << "memory.max: " << bad;
  }
  sys.meminfo(3 * kGiB);
  EXPECT_EQ(available_memory_bytes(sys.files), 3 * kGiB);
  FakeSystem::write(sys.files.proc + "/meminfo", "MemAvailable: 12 MB\n");
  EXPECT_EQ(available_memory_bytes(sys.files), -1);
  FakeSystem::write(sys.files.proc + "/meminfo", "MemAvailable: 99999999999999999999 kB\n");
  EXPECT_EQ(available_memory_bytes(sys.files), -1);
}

}  // namespace
}  // namespace flashmap
