#include "io/mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "core/check.h"

namespace flashmap {

namespace {

// The handler's table of guarded mappings. A fixed array of atomics, since a signal handler may
// neither lock nor allocate; a checkpoint maps one file per shard, so 1024 is plenty (a mapping
// made while it is full works unguarded).
constexpr int kSlots = 1024;
constexpr size_t kPathBytes = 240;  // the path as the handler prints it (cut if longer)

struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 live
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<bool> faulted{false};
  char path[kPathBytes] = {};
  size_t path_len = 0;
};
std::array<Slot, kSlots> g_slots;

struct sigaction g_previous {};
// Every MappedFile alive, for changed_mapped_file (outside the handler, so a mutex will do).
// Never destroyed: a mapping held by a static object may outlive any static of this file.
struct Live {
  std::mutex mutex;
  std::set<const MappedFile*> files;
};
Live& live() {
  static auto* l = new Live;
  return *l;
}
std::once_flag g_installed;
uintptr_t g_page = 4096;

// Only async-signal-safe calls: raw system calls (not the sanitizers' interceptors of mmap and
// write, which may allocate).
void say(const char* s, size_t n) {
  while (n > 0) {
    const long w = ::syscall(SYS_write, 2, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  // SI_USER and friends (si_code <= 0): sent by kill(), not a read; not ours.
  if (info->si_code > 0) {
    for (auto& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != 2) continue;
      const uintptr_t base = s.base.load(std::memory_order_relaxed);
      if (addr - base >= s.size.load(std::memory_order_relaxed)) continue;
      const uintptr_t page = addr & ~(g_page - 1);
      const long r = ::syscall(SYS_mmap, page, g_page, PROT_READ,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (r == -1) break;  // cannot repair it: die as before
      if (!s.faulted.exchange(true)) {
        static constexpr char kHead[] = "flashmap: error: ";
        static constexpr char kTail[] =
            ": the file shrank while it was mapped (truncated or rewritten in place); what "
            "lay past its new end reads as zeros from here on\n";
        say(kHead, sizeof(kHead) - 1);
        say(s.path, s.path_len);
        say(kTail, sizeof(kTail) - 1);
      }
      errno = saved_errno;
      return;
    }
  }
  // Not a read of a guarded mapping: whoever handled SIGBUS before, else the default action.
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    // Returning re-executes the faulting read; with the default action back it kills.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGBUS, &dfl, nullptr);
    if (info->si_code <= 0) ::raise(sig);
  }
  errno = saved_errno;
}

void install_handler() {
  g_page = uintptr_t(::sysconf(_SC_PAGESIZE));
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

int64_t mtime_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

MappedFile::MappedFile(int fd, size_t size, const std::string& path)
    : fd_(fd), size_(size), path_(path) {
  try {
    struct stat st {};
    FLASHMAP_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat ({})", path, std::strerror(errno));
    FLASHMAP_CHECK(size_t(st.st_size) >= size,
                   "{}: {} bytes, shorter than the {} to map (it changed while being opened)", path,
                   st.st_size, size);
    mtime_ns_ = mtime_ns(st);
    std::call_once(g_installed, install_handler);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    FLASHMAP_CHECK(p != MAP_FAILED, "{}: mmap failed ({})", path, std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  } catch (...) {
    ::close(fd);
    throw;
  }
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_slots[size_t(i)].state.compare_exchange_strong(expected, 1)) continue;
    Slot& s = g_slots[size_t(i)];
    s.base.store(reinterpret_cast<uintptr_t>(data_), std::memory_order_relaxed);
    s.size.store(size_, std::memory_order_relaxed);
    s.faulted.store(false, std::memory_order_relaxed);
    s.path_len = std::min(path.size(), kPathBytes);
    std::memcpy(s.path, path.data(), s.path_len);
    s.state.store(2, std::memory_order_release);
    slot_ = i;
    break;
  }
  std::lock_guard lk(live().mutex);
  live().files.insert(this);
}

MappedFile::~MappedFile() {
  {
    std::lock_guard lk(live().mutex);
    live().files.erase(this);
  }
  if (slot_ >= 0) {
    Slot& s = g_slots[size_t(slot_)];
    s.state.store(1, std::memory_order_release);
    s.base.store(0, std::memory_order_relaxed);
    s.size.store(0, std::memory_order_relaxed);
    s.state.store(0, std::memory_order_release);
  }
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

bool MappedFile::contains(const void* p, size_t n) const {
  const auto* q = static_cast<const uint8_t*>(p);
  return q >= data_ && q <= data_ + size_ && n <= size_t(data_ + size_ - q);
}

bool MappedFile::drop_pages(const void* p, size_t n) const {
  if (!contains(p, n)) return false;
  // Whole pages inside the range only: its neighbours may still be in use.
  const auto* q = static_cast<const uint8_t*>(p);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (uintptr_t(q) + page - 1) / page * page, hi = uintptr_t(q + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  return true;
}

std::string MappedFile::change() const {
  const bool faulted = slot_ >= 0 && g_slots[size_t(slot_)].faulted.load();
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    return fmt::format("{}: cannot stat the mapped file ({})", path_, std::strerror(errno));
  if (faulted || size_t(st.st_size) < size_)
    return fmt::format(
        "{}: the file shrank while it was in use ({} bytes when it was opened, {} now): "
        "truncated or rewritten in place",
        path_, size_, st.st_size);
  if (mtime_ns(st) != mtime_ns_)
    return fmt::format("{}: the file was modified while it was in use (rewritten in place)", path_);
  return {};
}

void MappedFile::check_unchanged() const {
  if (auto why = change(); !why.empty()) throw Error(why);
}

std::string changed_mapped_file() {
  std::lock_guard lk(live().mutex);
  for (const MappedFile* m : live().files)
    if (auto why = m->change(); !why.empty()) return why;
  return {};
}

}  // namespace flashmap
