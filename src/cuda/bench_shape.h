// Device micro-benchmarks at a real model shape (src/cuda/bench_shape.cpp).
#pragma once

#include "engine/device_bench.h"

namespace flashmap::cuda {

using ShapeBench = ::flashmap::DeviceShapeBench;

// Prints the figures as markdown tables (and writes them as JSON to json_out when set): HBM read
// bandwidth, decode and verify times of the target with and without CUDA graphs, draft times of a
// random FlashMap drafter at the default shape. Throws flashmap::Error on a bad shape or device.
void run_shape_bench(const ShapeBench& spec);

}  // namespace flashmap::cuda
