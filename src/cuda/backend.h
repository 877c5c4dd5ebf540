// The CUDA backend of the engine (src/backend/backend.h): the target (cuda::Qwen3Model, one KV
// cache per sequence), a block proposer on the device (proposers.h: the FlashMap or DFlash
// drafter, or a scripted one in tests) and acceptance by the device sampler (cuda::Sampler),
// all on one stream. A round's tokens stay on the device: the proposer writes each sequence's
// drafts next to its anchor, the forward reads them there, the sequence's logit controls,
// constraint and logprobs run on its rows there (controls.h), and acceptance writes [accepted,
// token, anchor, drafts] that one device→host copy per sequence brings back (one
// synchronization per round; a constrained sequence adds one to bring its drafts to the host
// for its masks). Each sequence's device resources (KV cache, drafter lane, logits and draft
// buffers, generator state) are a lane of the backend's table, Slot::index() its row; a closed
// sequence's lane is the next one's, so the CUDA graphs captured for it stay valid.
//
// Capabilities: forks (the prefix cache and n choices: copies of a prefix share its KV blocks,
// copied on write) without a drafter or with a batched one, draft trees with a batched FlashMap
// drafter, no prompt logprobs (backend.cpp's describe()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace flashmap::cuda {

class Qwen3Model;
class DeviceProposer;

// A backend over device models made elsewhere (tests, benchmarks): they must outlive it.
// proposer may be null (target alone); capacity: positions of each sequence's KV cache (at most
// max_position_embeddings); graphs: replay CUDA graphs for the full-block forward and the
// single-token step (false: the same kernels eagerly, the same results bit for bit).
// Sequences (BackendInfo::max_sequences): as many as the device memory free at start holds,
// each with its full capacity, at most max_lanes (0: no cap); the first lane is made here.
std::unique_ptr<engine::Backend> make_backend(Qwen3Model& target, DeviceProposer* proposer,
                                              int64_t capacity, bool graphs = true,
                                              int max_lanes = 0);

// The engine's factory: loads the folders on the host, uploads them to `device` ("cuda",
// "cuda:N") in bf16 and frees the host copies. capacity 0: the target's max_position_embeddings.
std::unique_ptr<engine::Backend> make_backend(const std::string& device,
                                              const std::string& target_dir,
                                              const std::string& draft_dir, int steps,
                                              int64_t sampled_vocab, int64_t capacity,
                                              int max_lanes = 0);

}  // namespace flashmap::cuda
