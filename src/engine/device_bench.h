// What `flashmap bench --device cuda --shape S` asks of a device backend: its kernels at a real
// model shape with random weights (src/cuda/bench_shape.cpp). A plain struct, shared by the
// engine's factory and the backend so that neither copies it into the other's type.
#pragma once

#include <string>

namespace flashmap {

struct DeviceShapeBench {
  std::string device, shape, json_out;
  int context = 512, block = 16, reps = 3, max_new_tokens = 128;
};

}  // namespace flashmap
