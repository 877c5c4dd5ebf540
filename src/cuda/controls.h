// Logit controls, constraints and logprobs where the logits are: the CUDA backend changes a
// sequence's rows on the device before it samples or verifies them, and reads the emitted
// tokens' logprobs off the raw rows there, so that no logits row travels to the host. Only the
// small things do: the controls' programs (host → device, one copy per batch), a constrained
// sequence's drafts (device → host, for its masks) and the logprob results (device → host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda/control_kernels.h"
#include "cuda/device.h"
#include "specdec/controls.h"
#include "specdec/logprobs.h"

namespace flashmap::cuda {

// The ControlPrograms of a batch of sequences: packed on the host, staged in pinned memory,
// uploaded in one copy, then each run on its sequence's rows.
class DeviceControls {
 public:
  explicit DeviceControls(Context& ctx);
  ~DeviceControls();
  DeviceControls(const DeviceControls&) = delete;
  DeviceControls& operator=(const DeviceControls&) = delete;

  // Starts a new batch.
  void clear();
  // Adds a program to the batch; returns its index there.
  int add(const ControlProgram& p);
  // Enqueues the batch's upload (waits first until the previous upload has left the staging
  // memory; synchronizes the stream when the device buffer must grow).
  void upload();
  // Enqueues program i (uploaded) on logits [rows, vocab] (device), whose drafts d_drafts
  // [rows − 1] it reads on the device.
  void apply(int i, float* d_logits, const int32_t* d_drafts);

 private:
  struct Entry {
    size_t edits = 0, biases = 0, masks = 0;  // byte offsets in the batch
    int n_edits = 0, rows = 0, masked_rows = 0;
    int64_t vocab = 0;
    ControlScalars scalars;
  };
  template <typename T>
  size_t append(const std::vector<T>& v);

  Context& ctx_;
  std::vector<Entry> entries_;
  std::vector<uint8_t> packed_;
  HostBuffer<uint8_t> staging_;
  DeviceBuffer<uint8_t> device_;
  cudaEvent_t copied_ = nullptr;  // recorded after the last upload's copy
  bool in_flight_ = false;
};

// token_logprob of each sequence's emitted tokens, computed on its raw rows on the device;
// results for up to `max_rows` rows per sequence come back through pinned memory.
class DeviceLogprobs {
 public:
  DeviceLogprobs(Context& ctx, int64_t vocab, int max_rows);

  // Room for `seqs` sequences' results (synchronizes the stream when it grows).
  void reserve(size_t seqs);
  // Enqueues sequence i's logprobs of rows [0, rows) of d_logits (device [rows, vocab]) and
  // their download: the tokens are d_tokens[r] for r < *d_accepted, then *d_last
  // (launch_token_logprobs), with `top` alternatives each.
  void enqueue(size_t i, const float* d_logits, int rows, const int32_t* d_accepted,
               const int32_t* d_tokens, const int32_t* d_last, int top);
  // After the stream synchronized: sequence i's first n logprobs.
  std::vector<TokenLogprob> results(size_t i, int n, int top) const;

 private:
  Context& ctx_;
  int64_t vocab_;
  int max_rows_;
  size_t seqs_ = 0;
  DeviceBuffer<DeviceLogprob> device_;
  HostBuffer<DeviceLogprob> host_;
};

}  // namespace flashmap::cuda
