#include "cuda/graphs.h"

#include <string>

namespace flashmap::cuda {

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what) {
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed),
        (std::string("cudaStreamBeginCapture ") + what).c_str());
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  check(cudaStreamEndCapture(stream, &graph),
        (std::string("cudaStreamEndCapture ") + what).c_str());
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0ull);
  cudaGraphDestroy(graph);
  check(e, (std::string("cudaGraphInstantiate ") + what).c_str());
  return exec;
}

}  // namespace flashmap::cuda
