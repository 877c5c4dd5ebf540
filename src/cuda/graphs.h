// CUDA graphs for the fixed-shape launches of a decoding loop (the target's verify and decode
// steps, the drafter's drafts): one capture routine and one cache type, used by both models.
// A graph bakes in the pointers its body used, so a key must name every buffer that can change.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <utility>

#include "cuda/device.h"

namespace flashmap::cuda {

// Records `body` on `stream` and instantiates it. Relaxed mode: a library call that is merely
// "potentially unsafe" (cuBLASLt's host-side queries) must not void the capture. A body that
// throws leaves the stream usable (the broken capture is ended and dropped) and rethrows.
cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what);

template <class Key>
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(GraphCache&& o) noexcept : graphs_(std::exchange(o.graphs_, {})) {}
  GraphCache& operator=(GraphCache&& o) noexcept {
    if (this != &o) {
      clear();
      graphs_ = std::exchange(o.graphs_, {});
    }
    return *this;
  }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  // An executable graph still in flight is freed when it completes (cudaGraphExecDestroy).
  ~GraphCache() { clear(); }

  // Launches the graph of `key` if there is one; false when there is none yet.
  bool replay(const Key& key, cudaStream_t stream, const char* what) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    check(cudaGraphLaunch(it->second, stream), what);
    return true;
  }
  // Captures `body` as the graph of `key` (recording only: nothing runs).
  void add(const Key& key, cudaStream_t stream, const std::function<void()>& body,
           const char* what) {
    graphs_.emplace(key, capture_graph(stream, body, what));
  }
  template <class Pred>
  void erase_if(Pred pred) {
    for (auto it = graphs_.begin(); it != graphs_.end();) {
      if (pred(it->first)) {
        cudaGraphExecDestroy(it->second);
        it = graphs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void clear() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }
  size_t size() const { return graphs_.size(); }

 private:
  std::map<Key, cudaGraphExec_t> graphs_;
};

}  // namespace flashmap::cuda
