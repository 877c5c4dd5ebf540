// The memory this process can still take, for the checks made before a large allocation.
#pragma once

#include <cstdint>
#include <string>

namespace flashmap {

// Where the kernel's figures are read: the system's own, or a tree a test lays out.
struct MemoryFiles {
  std::string proc = "/proc";             // meminfo, self/cgroup
  std::string cgroup = "/sys/fs/cgroup";  // the cgroup mounts
};

// Bytes of memory available to this process: the kernel's MemAvailable (/proc/meminfo), capped
// by what each memory cgroup on its path, its own and every ancestor's, leaves under its limit
// (v2: memory.max − memory.current; v1: memory.limit_in_bytes − memory.usage_in_bytes); −1 when
// none of these can be read.
int64_t available_memory_bytes(const MemoryFiles& files = {});

}  // namespace flashmap
