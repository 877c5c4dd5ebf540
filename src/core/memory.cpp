#include "core/memory.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace flashmap {
namespace {

// The non-negative number that is all of `path`'s first line (−1 for "max", a missing file or
// anything else).
int64_t read_number(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return -1;
  std::istringstream in(line);
  int64_t n = -1;
  if (!(in >> n) || n < 0) return -1;
  in >> std::ws;
  return in.eof() ? n : -1;
}

// MemAvailable from meminfo, in bytes (−1 when absent or not a number of kB).
int64_t mem_available(const std::string& meminfo) {
  std::ifstream f(meminfo);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    int64_t kib = -1;
    std::string unit;
    if (in >> kib >> unit && unit == "kB" && kib >= 0 &&
        kib <= std::numeric_limits<int64_t>::max() / 1024)
      return kib * 1024;
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

// The least room of the cgroup at `path` under `mount` and of its ancestors (a parent's limit
// binds its children: systemd sets them on slices); −1 where none has a limit. Where the process
// sees another hierarchy's path (a container without a cgroup namespace, its own cgroup mounted
// at the root), the directories that do not exist are skipped up to the mount itself.
int64_t least_room(const std::string& mount, std::string path, bool v2) {
  int64_t room = -1;
  for (;;) {
    const int64_t r = room_in(mount + path, v2);
    if (r >= 0) room = room < 0 ? r : std::min(room, r);
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) break;
    path.resize(slash);
  }
  return room;
}

// What this process's memory cgroups leave under their limits (−1: no limit found). The path
// comes from <proc>/self/cgroup ("0::/p" for cgroup v2, "N:memory:/p" for v1's memory
// controller); the files are under the controller's mount with that path.
int64_t cgroup_room(const MemoryFiles& files) {
  std::ifstream f(files.proc + "/self/cgroup");
  std::string line;
  int64_t room = -1;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::istringstream controllers(line.substr(a + 1, b - a - 1));
    // A path outside the process's cgroup namespace ("/../…"), or not a path, names no directory
    // under the mount: only the mount's own files apply.
    std::string path = line.substr(b + 1);
    if (path == "/" || path.empty() || path[0] != '/' || path.find("/..") != std::string::npos)
      path.clear();
    const bool v2 = b == a + 1;
    bool memory = false;
    for (std::string c; std::getline(controllers, c, ',');) memory = memory || c == "memory";
    if (!v2 && !memory) continue;
    const std::vector<std::string> mounts =
        v2 ? std::vector<std::string>{files.cgroup, files.cgroup + "/unified"}
           : std::vector<std::string>{files.cgroup + "/memory"};
    for (const std::string& mount : mounts) {
      const int64_t r = least_room(mount, path, v2);
      if (r < 0) continue;
      room = room < 0 ? r : std::min(room, r);
      break;
    }
  }
  return room;
}

}  // namespace

int64_t available_memory_bytes(const MemoryFiles& files) {
  const int64_t available = mem_available(files.proc + "/meminfo"), room = cgroup_room(files);
  if (available < 0) return room;
  return room < 0 ? available : std::min(available, room);
}

}  // namespace flashmap
