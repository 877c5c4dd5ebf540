// The memory this process can still take, for the checks made before a large allocation.
#pragma once

#include <cstdint>

namespace flashmap {

// Bytes of memory available to this process: the kernel's MemAvailable (/proc/meminfo), capped
// by what its memory cgroup's limit leaves (v2: memory.max − memory.current; v1:
// memory.limit_in_bytes − memory.usage_in_bytes); −1 when neither can be read.
int64_t available_memory_bytes();

}  // namespace flashmap
