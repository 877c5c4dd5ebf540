#include "core/memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace flashmap {
namespace {

// The number at the start of `path` (−1 for "max", a missing file or anything else).
int64_t read_number(const std::string& path) {
  std::ifstream f(path);
  int64_t n = -1;
  if (!(f >> n)) return -1;
  return n;
}

// MemAvailable from /proc/meminfo, in bytes (−1 when absent).
int64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    int64_t kib = -1;
    std::string unit;
    if (in >> kib >> unit && unit == "kB" && kib >= 0) return kib * 1024;
    return -1;
  }
  return -1;
}

// What a cgroup directory's limit leaves (−1 where its files cannot be read, or say "max").
int64_t room_in(const std::string& dir, bool v2) {
  const int64_t limit = read_number(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  const int64_t used = read_number(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
  return limit < 0 || used < 0 ? -1 : std::max<int64_t>(0, limit - used);
}

// What this process's memory cgroup leaves under its limit (−1: no limit found). Its path comes
// from /proc/self/cgroup ("0::/p" for cgroup v2, "N:memory:/p" for v1's memory controller); the
// files are under the controller's mount with that path, or at the mount's root where the
// process sees its own cgroup there (a container).
int64_t cgroup_room() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  int64_t room = -1;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::istringstream controllers(line.substr(a + 1, b - a - 1));
    const std::string path = line.substr(b + 1);
    const bool v2 = b == a + 1;
    bool memory = false;
    for (std::string c; std::getline(controllers, c, ',');) memory = memory || c == "memory";
    if (!v2 && !memory) continue;
    const std::vector<std::string> mounts =
        v2 ? std::vector<std::string>{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}
           : std::vector<std::string>{"/sys/fs/cgroup/memory"};
    for (const std::string& mount : mounts) {
      int64_t r = room_in(mount + path, v2);
      if (r < 0) r = room_in(mount, v2);
      if (r < 0) continue;
      room = room < 0 ? r : std::min(room, r);
      break;
    }
  }
  return room;
}

}  // namespace

int64_t available_memory_bytes() {
  const int64_t available = mem_available(), room = cgroup_room();
  if (available < 0) return room;
  return room < 0 ? available : std::min(available, room);
}

}  // namespace flashmap
