// GGUF files: the header, the typed metadata (nested arrays included), the tensor table (names,
// dimensions, types, offsets, alignment, overlap), then every tensor's rows dequantized as a
// loader reads them, the typed metadata reads a loader makes, and the Qwen3 tensor names a GGUF
// target is read under.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "io/gguf.h"
#include "io/gguf_convert.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string path =
      fuzz::input_file(std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean("GgufFile", [&] {
    GgufFile f(path);
    for (const auto& entry : f.metadata()) {
      const std::string& key = entry.first;  // (clang before 16 cannot capture a binding)
      // A value of another type than asked for is an Error naming the key, never a crash.
      fuzz::expect_clean("string", [&] { (void)f.string(key); });
      fuzz::expect_clean("integer", [&] { (void)f.integer(key); });
      fuzz::expect_clean("number", [&] { (void)f.number(key); });
      fuzz::expect_clean("array", [&] { (void)f.array(key); });
    }
    std::vector<float> row;
    for (const auto& entry : f.tensors()) {
      const GgufTensor& t = entry.second;
      FUZZ_REQUIRE(f.contains(entry.first), "tensor '{}' listed but not contained", entry.first);
      const int64_t rows = t.rows(), n = t.dims.empty() ? 0 : t.dims[0];
      FUZZ_REQUIRE(rows == 0 || uint64_t(rows) *
                                        (uint64_t(n) / uint64_t(ggml_block_elems(t.type))) *
                                        uint64_t(ggml_block_bytes(t.type)) ==
                                    t.bytes,
                   "tensor '{}': {} bytes for {} rows of {}", entry.first, t.bytes, rows, n);
      if (n > (1 << 16)) continue;  // a row this long is fine, just slow to dequantize here
      row.resize(size_t(n));
      const uint64_t row_bytes = rows ? t.bytes / uint64_t(rows) : 0;
      for (int64_t r = 0; r < rows && r < 64; ++r)
        dequantize_row(t.type, t.data + uint64_t(r) * row_bytes, row.data(), n);
    }
    fuzz::expect_clean("qwen3_gguf_tensors", [&] {
      for (const auto& [name, t] : qwen3_gguf_tensors(f))
        FUZZ_REQUIRE(!name.empty() && f.contains(t->name), "tensor '{}' named '{}'", t->name, name);
    });
    f.check_unchanged();
  });
  return 0;
}
