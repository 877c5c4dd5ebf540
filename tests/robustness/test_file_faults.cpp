// Files that change or fail under the engine: weights truncated or rewritten after they were
// mapped (a SIGBUS killed the process before), a model folder removed while its weights are in
// use, and writes (the noise-factor cache, `flashmap convert`'s output, any safetensors file)
// into a full disk or a read-only folder. Each ends in an error naming the file, or a warning
// for the cache, and never leaves part of a file under the final name.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/check.h"
#include "error_of.h"
#include "io/convert.h"
#include "io/files.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "models/noise_cache.h"

namespace {

using namespace flashmap;
using flashmap::testing::error_of;
using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace fs = std::filesystem;

fs::path temp_dir() {
  auto d = fs::temp_directory_path() /
           ("flashmap-file-faults-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  fs::permissions(d, fs::perms::all);  // a child running as another user works in it too
  return d;
}

// Two float32 tensors of 64 KiB each, "a" then "b" in the data.
std::string write_weights(const fs::path& path) {
  std::vector<float> a(16384, 1.5f), b(16384, 2.5f);
  write_safetensors(path.string(), {make_tensor("a", {128, 128}, a), make_tensor("b", {128, 128}, b)});
  return path.string();
}

// What a packer does with a tensor: read every byte of it.
float sum_bytes(const TensorView& t) {
  const auto* p = static_cast<const volatile float*>(t.data);
  float s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += p[i];
  return s;
}

TEST(FileFaults, ATruncatedWeightsFileFailsTheLoadNotTheProcess) {
  const auto d = temp_dir();
  const std::string path = write_weights(d / "model.safetensors");
  const uintmax_t full = fs::file_size(path);
  Checkpoint c(d.string());
  const TensorView& b = c.get("b");
  // Cut the file in the middle of b, after b was looked up: reading b's pages past the new end
  // was a SIGBUS; now they read as zeros and the next look at the file fails the load.
  const uintmax_t cut = full - 32768;
  fs::resize_file(path, cut);
  EXPECT_EQ(sum_bytes(b), 2.5f * 8192) << "the half still in the file reads as it was";
  const std::string expected = path + ": the file shrank while it was in use (" +
                               std::to_string(full) + " bytes when it was opened, " +
                               std::to_string(cut) + " now): truncated or rewritten in place";
  EXPECT_EQ(error_of([&] { c.drop_pages(b); }), expected);  // after packing it
  EXPECT_EQ(error_of([&] { (void)b.to_f32(); }), expected);
  EXPECT_EQ(error_of([&] { (void)c.get("a"); }), expected);  // the next tensor of the load
  EXPECT_EQ(changed_mapped_file(), expected);
}

TEST(FileFaults, AFileTruncatedBeforeItIsReadIsRefusedWhenLookedUp) {
  const auto d = temp_dir();
  const std::string path = write_weights(d / "model.safetensors");
  Checkpoint c(d.string());
  fs::resize_file(path, 100);
  EXPECT_THAT(error_of([&] { (void)c.get("a"); }),
              HasSubstr(path + ": the file shrank while it was in use"));
  EXPECT_THAT(error_of([&] { (void)c.get("b", {128, 128}); }), HasSubstr("now): truncated"));
}

TEST(FileFaults, AFileRewrittenInPlaceIsRefused) {
  const auto d = temp_dir();
  const std::string path = write_weights(d / "model.safetensors");
  Checkpoint c(d.string());
  {
    // Same size, other bytes (as `cp` of another checkpoint of this shape does), and a new
    // modification time.
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const float x = 7.0f;
    ASSERT_EQ(::pwrite(fd, &x, 4, off_t(fs::file_size(path) - 4)), 4);
    const timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
    ASSERT_EQ(::futimens(fd, times), 0);
    ::close(fd);
  }
  EXPECT_EQ(error_of([&] { (void)c.get("a"); }),
            path + ": the file was modified while it was in use (rewritten in place)");
}

TEST(FileFaults, AFolderRemovedWhileMappedKeepsItsWeights) {
  const auto d = temp_dir();
  write_weights(d / "model.safetensors");
  Checkpoint c(d.string());
  const std::string before = changed_mapped_file();
  fs::remove_all(d);  // the mapping keeps the file's data alive
  EXPECT_EQ(sum_bytes(c.get("a")), 1.5f * 16384);
  EXPECT_EQ(sum_bytes(c.get("b")), 2.5f * 16384);
  EXPECT_EQ(c.get("b").to_f32()[0], 2.5f);
  EXPECT_EQ(changed_mapped_file(), before);
}

TEST(FileFaults, ASigbusOutsideTheMappingsStillKills) {
  // The handler takes only reads of a guarded mapping; any other SIGBUS keeps its meaning.
  const auto d = temp_dir();
  write_weights(d / "model.safetensors");
  Checkpoint c(d.string());
  EXPECT_DEATH(::raise(SIGBUS), "");  // by the signal, or by a sanitizer's report of it
}

// Runs `fn` in a child process with `setup` applied there first (limits, another user), and
// returns what it wrote to stderr and whether it exited 0.
struct ChildResult {
  bool ok = false;
  std::string err;
};
ChildResult in_child(const std::function<void()>& setup, const std::function<void()>& fn) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    setup();
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s", e.what());
      std::fflush(stderr);
      ::_exit(1);
    }
    std::fflush(stderr);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  ChildResult r;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) r.err.append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}

// A disk that fills up after `bytes`: writes past the file size limit fail with EFBIG (the
// signal it would also send is ignored), as they fail with ENOSPC on a full disk.
std::function<void()> disk_full_after(rlim_t bytes) {
  return [bytes] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{bytes, bytes};
    ::setrlimit(RLIMIT_FSIZE, &r);
  };
}

// A folder this process may not write in: its mode is 0555, and a child running as root becomes
// nobody first (root writes anywhere).
std::function<void()> read_only(const fs::path& dir) {
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                           fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
  return [] {
    if (::geteuid() == 0) {
      ::setgroups(0, nullptr);
      if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)
        ::_exit(3);
    }
  };
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FileFaults, WritesIntoAFullDiskLeaveNothingUnderTheName) {
  const auto d = temp_dir();
  const std::string path = (d / "w.safetensors").string();
  const auto r = in_child(disk_full_after(10000), [&] { write_weights(path); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.err, path + ": cannot write (File too large)");
  EXPECT_THAT(listing(d), ::testing::IsEmpty());
  // An existing file stays as it was.
  write_weights(path);
  const auto size = fs::file_size(path);
  EXPECT_FALSE(in_child(disk_full_after(10000), [&] {
                 write_safetensors(path, {make_tensor("c", {20000}, std::vector<float>(20000))});
               }).ok);
  EXPECT_EQ(fs::file_size(path), size);
  EXPECT_EQ(listing(d), std::vector<std::string>{"w.safetensors"});
}

TEST(FileFaults, WritesIntoAReadOnlyFolderFailNamingIt) {
  const auto d = temp_dir();
  const auto ro = d / "ro";
  fs::create_directories(ro);
  const std::string path = (ro / "w.safetensors").string();
  const auto r = in_child(read_only(ro), [&] { write_weights(path); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.err, path + ": cannot write (Permission denied)");
  EXPECT_THAT(listing(ro), ::testing::IsEmpty());
}

TEST(FileFaults, TheNoiseCacheWarnsAndLeavesNoFileWhenItCannotWrite) {
  const auto d = temp_dir();
  const std::vector<float> factor(64 * 64, 0.25f);
  const std::string file = noise_cache::path(d.string(), 42, 64);
  // Full: the cache's 16 KiB file does not fit in 4 KiB.
  auto r = in_child(disk_full_after(4096), [&] { noise_cache::store(d.string(), 42, 64, 100, factor); });
  EXPECT_TRUE(r.ok) << "a cache that cannot be written is not an error";
  EXPECT_EQ(r.err, "flashmap: warning: could not write the noise-factor cache: " + file +
                       ": cannot write (File too large)\n");
  EXPECT_THAT(listing(d), ::testing::IsEmpty());
  // Read-only.
  r = in_child(read_only(d), [&] { noise_cache::store(d.string(), 42, 64, 100, factor); });
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.err, "flashmap: warning: could not write the noise-factor cache: " + file +
                       ": cannot write (Permission denied)\n");
  fs::permissions(d, fs::perms::all);
  EXPECT_THAT(listing(d), ::testing::IsEmpty());
  // And it is written whole when it can be, and read back.
  noise_cache::store(d.string(), 42, 64, 100, factor);
  EXPECT_EQ(noise_cache::load(d.string(), 42, 64, 100), factor);
  EXPECT_EQ(listing(d), std::vector<std::string>{fs::path(file).filename().string()});
}

TEST(FileFaults, ConvertIntoAFullDiskLeavesOutAsItWas) {
  const auto d = temp_dir();
  const std::string in = "tests/fixtures/convert/flashmap-speculators";
  ConvertOptions o;
  o.in = in;
  o.out = (d / "out").string();
  // The fixture's weights are ~450 KB: the config fits in 64 KiB, they do not.
  auto r = in_child(disk_full_after(65536), [&] { convert_checkpoint(o); });
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.err, StartsWith(o.out + ": nothing was written: " + o.out + ".tmp-"));
  EXPECT_THAT(r.err, HasSubstr("/model.safetensors: cannot write (File too large)"));
  EXPECT_THAT(listing(d), ::testing::IsEmpty());
  // A read-only parent: nothing to create the folder in.
  const auto ro = d / "ro";
  fs::create_directories(ro);
  o.out = (ro / "out").string();
  r = in_child(read_only(ro), [&] { convert_checkpoint(o); });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.err, o.out + ": cannot create a folder beside it (Permission denied)");
  EXPECT_THAT(listing(ro), ::testing::IsEmpty());
}

}  // namespace
