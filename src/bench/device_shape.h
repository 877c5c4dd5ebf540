// `flashmap bench --device cuda --shape S`: a device backend's kernels at a real model shape with
// random weights (cuda_shape.cpp). The dispatch (device_shape.cpp) is the one place in this
// library that knows which device backends the build has.
#pragma once

#include <string>

namespace flashmap::bench {

struct DeviceShapeBench {
  std::string device, shape, json_out;
  int context = 512, block = 16, reps = 3, max_new_tokens = 128;
};

// Runs the bench on spec.device (a GPU); markdown on stdout, JSON to json_out when set. Throws
// flashmap::Error when this build or machine has no such device.
void bench_device_shape(const DeviceShapeBench& spec);

}  // namespace flashmap::bench
