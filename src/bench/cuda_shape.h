// The CUDA backend's shape bench (cuda_shape.cpp, compiled only into CUDA builds); reached
// through bench_device_shape (device_shape.h), which checks the device first.
#pragma once

#include "bench/device_shape.h"

namespace flashmap::bench {

// Prints the figures as markdown tables (and writes them as JSON to json_out when set): HBM read
// bandwidth, decode and verify times of the target with and without CUDA graphs, draft times of a
// random FlashMap drafter at the default shape. Throws flashmap::Error on a bad shape or device.
void run_cuda_shape(const DeviceShapeBench& spec);

}  // namespace flashmap::bench
