// `flashmap bench --device cuda --shape S`: a device backend's kernels at a real model shape with
// random weights (src/cuda/bench_shape.cpp). The spec is a plain struct, shared by the engine's
// factory and the backend so that neither copies it into the other's type; the hook is the
// factory's (engine.cpp), the one place that knows which backends this build has.
#pragma once

#include <string>

namespace flashmap {

struct DeviceShapeBench {
  std::string device, shape, json_out;
  int context = 512, block = 16, reps = 3, max_new_tokens = 128;
};

// Runs the bench on spec.device (a GPU); markdown on stdout, JSON to json_out when set. Throws
// flashmap::Error when this build or machine has no such device.
void bench_device_shape(const DeviceShapeBench& spec);

}  // namespace flashmap
