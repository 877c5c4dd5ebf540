// The memory this process can still take, for the checks made before a large allocation.
#pragma once

#include <cstdint>

namespace flashmap {

// Bytes of memory available to this process: the kernel's MemAvailable (/proc/meminfo), capped
// by what a cgroup v2 limit leaves (memory.max − memory.current); −1 when neither can be read.
int64_t available_memory_bytes();

}  // namespace flashmap
