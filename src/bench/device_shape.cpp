#include "bench/device_shape.h"

#include <flashmap/engine.h>

#include "core/check.h"
#ifdef FLASHMAP_WITH_CUDA
#include "bench/cuda_shape.h"
#endif

namespace flashmap::bench {

void bench_device_shape(const DeviceShapeBench& spec) {
  // The engine's check first: the same error as any other command for a device this build or
  // machine does not have.
  check_device(spec.device);
  FLASHMAP_CHECK(spec.device != "cpu", "bench_device_shape: a GPU device, not cpu");
#ifdef FLASHMAP_WITH_CUDA
  run_cuda_shape(spec);
#endif
}

}  // namespace flashmap::bench
