// safetensors files: the 8-byte header length, the JSON header (dtypes, shapes, offsets, overlap),
// then every tensor read as a loader reads it (to_f32 / to_i64), and the file as a checkpoint
// folder's model.safetensors: every tensor looked up, Qwen's FP8 and AWQ weights dequantized.
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "io/safetensors.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string path =
      fuzz::input_file(std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean("SafetensorsFile", [&] {
    SafetensorsFile f(path);
    for (const auto& entry : f.tensors()) {
      const auto& name = entry.first;
      const TensorView& t = entry.second;  // (clang before 16 cannot capture a binding)
      FUZZ_REQUIRE(f.contains(name), "tensor '{}' listed but not contained", name);
      // Every view lies inside the mapping: drop_pages says whether a range is in the file.
      FUZZ_REQUIRE(f.drop_pages(t.data, t.nbytes()), "tensor '{}' lies outside its file", name);
      fuzz::expect_clean("to_f32", [&] { (void)t.to_f32(); });
      fuzz::expect_clean("to_i64", [&] { (void)t.to_i64(); });
    }
  });
  static const std::filesystem::path dir = [] {
    const auto d = fuzz::scratch_dir() / "checkpoint";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::write_file(dir / "model.safetensors",
                   std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean("Checkpoint", [&] {
    Checkpoint c(dir.string());
    for (const auto& name : c.names()) {
      const TensorView& t = c.get(name);
      FUZZ_REQUIRE(t.data || t.numel() == 0, "tensor '{}' has no data", name);
      fuzz::expect_clean("to_f32", [&] { (void)t.to_f32(); });
    }
  });
  return 0;
}
