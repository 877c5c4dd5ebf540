// model.safetensors.index.json: a sharded checkpoint's weight map, in a folder that also holds
// two small shards (a.safetensors, b.safetensors) and the input as the index.
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "io/safetensors.h"

using namespace flashmap;

namespace {

const std::filesystem::path& folder() {
  static const std::filesystem::path dir = [] {
    const auto d = fuzz::scratch_dir() / "checkpoint";
    std::filesystem::create_directories(d);
    write_safetensors((d / "a.safetensors").string(),
                      {make_tensor("x", {2, 2}, {1, 2, 3, 4}), make_tensor("y", {3}, {5, 6, 7})});
    write_safetensors((d / "b.safetensors").string(),
                      {make_tensor("z", {1}, {8}, DType::BF16), make_tensor("x", {1}, {9})});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const auto& dir = folder();
  fuzz::write_file(dir / "model.safetensors.index.json",
                   std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean("Checkpoint", [&] {
    Checkpoint c(dir.string());
    for (const auto& name : c.names()) {
      const TensorView& t = c.get(name);
      fuzz::expect_clean("to_f32", [&] { (void)t.to_f32(); });
      fuzz::expect_clean("get with shape", [&] { (void)c.get(name, {2, 2}); });
    }
  });
  return 0;
}
