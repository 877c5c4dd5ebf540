// What every harness in tests/fuzz shares: the outcome rule, files made from the input, and the
// source tree's fixtures.
//
// The rule: hostile input may end in a flashmap::Error (the one-line errors the CLI prints and
// the server answers with 400), never in anything else. A json exception, std::out_of_range,
// std::bad_alloc, an InternalError or any other exception escaping the code under test is a bug
// (the server would answer 500 "internal error", the CLI would print "internal error"), so it
// aborts the run and libFuzzer keeps the input.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/check.h"

namespace flashmap::fuzz {

// Runs `fn`; returns true when it finished, false when it threw a flashmap::Error; aborts on
// anything else.
template <class Fn>
bool expect_clean(const char* what, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s threw %s, not a flashmap::Error: %s\n", what, typeid(e).name(),
                 e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: %s threw something that is not an exception\n", what);
    std::abort();
  }
}

// A failed check of a property the code promises (a round trip, an invariant): a bug.
#define FUZZ_REQUIRE(cond, ...)                                        \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "fuzz: %s\n", fmt::format(__VA_ARGS__).c_str()); \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

// The input as a regular file the code opens by path: one memory file per process, rewritten
// for each input (no disk traffic; /proc/self/fd/N is a regular file to stat and open).
inline std::string input_file(std::string_view bytes) {
  static const int fd = [] {
    const int f = ::memfd_create("fuzz-input", MFD_CLOEXEC);
    if (f < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return f;
  }();
  if (::ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

// A folder of this process's own for harnesses that need one (removed when the process exits).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "flashmap-fuzz-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    static const std::string keep = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    std::abort();
}

// The source tree (fixtures, the default pair's tokenizer): FLASHMAP_SOURCE_DIR, overridable
// with the environment variable of the same name for a harness binary run elsewhere.
inline std::string source_dir() {
  if (const char* d = std::getenv("FLASHMAP_SOURCE_DIR"); d && *d) return d;
  return FLASHMAP_SOURCE_DIR;
}

// A deterministic stream of small numbers from the input's bytes, for harnesses that walk an
// automaton or pick among options after the main input is consumed.
class Picker {
 public:
  explicit Picker(std::string_view bytes) : bytes_(bytes) {}
  uint32_t next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull +
             (pos_ < bytes_.size() ? uint8_t(bytes_[pos_++]) : 0);
    return uint32_t(state_ >> 33);
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace flashmap::fuzz
