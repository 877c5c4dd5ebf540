// Timing helpers shared by the benches of `flashmap bench`: the folder-pair bench (pair.cpp) and
// the CPU bench at a released shape (cpu_shape.cpp).
#pragma once

#include <flashmap/engine.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace flashmap::bench {

// Median of `reps` timed calls of f after one warm-up call, in ms.
double ms_of(const std::function<void()>& f, int reps);

// Per-round phase times and tokens/s of one decoding configuration over the prompts, through an
// engine (a batch of one per prompt).
nlohmann::json run_decode(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          int max_new, int reps, float temperature = 0.0f);

// The figures as JSON to `path` (`--json`); nothing when it is empty.
void write_json(const nlohmann::json& out, const std::string& path);

}  // namespace flashmap::bench
