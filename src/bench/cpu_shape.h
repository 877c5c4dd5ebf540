// `flashmap bench --shape S` on the CPU (cpu_shape.cpp): a Qwen3 target of a released shape, with
// random bf16 weights made in memory or the weights of a folder of that shape, and optionally a
// FlashMap or DFlash drafter.
#pragma once

#include <string>

namespace flashmap::bench {

struct CpuShapeBench {
  std::string shape;        // qwen3_shape's name
  std::string draft_shape;  // a random drafter of flashmap_shape's or dflash_shape's name, or empty
  int draft_vocab = 0;  // a DFlash draft_shape's own lm_head over this many target ids (0: none)
  std::string target;   // a Qwen3 folder of that shape instead of random weights, or empty
  std::string draft;    // a FlashMap or DFlash drafter folder, or empty
  std::string weights = "native", compute = "fp32";  // as the engine's CPU backend loads a target
  std::string json_out;
  int steps = 0;  // refused when set: every step count of the drafter is timed
  bool no_sweep = false;
  int context = 512, block = 16, prefill = 32, reps = 3, max_new_tokens = 128;
};

// Markdown tables on stdout, JSON to json_out when set. Runs on ThreadPool::global() as it is
// configured. Throws flashmap::Error on a bad shape, folder or combination of options.
void bench_cpu_shape(const CpuShapeBench& a);

}  // namespace flashmap::bench
