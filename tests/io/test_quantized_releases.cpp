// Qwen's quantized releases read as F32 weights (io/safetensors.h Checkpoint): tiny-a's target as
// an FP8 (e4m3, 128 × 128 block scales) and an AWQ (4-bit, zero points, GEMM packing) checkpoint,
// made by tools/make_quant_fixtures.py, whose expected.json holds the XXH3 of each weight as the
// reference dequantization (numpy with ml_dtypes' float8_e4m3fn; vLLM's AWQ unpacking) gives it.
// Malformed ones fail naming the file and the tensor or field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_of.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "temp_dir.h"

using namespace flashmap;
using flashmap::testing::error_of;
using flashmap::testing::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kDir = "tests/fixtures/quant";

json expected() {
  return json::parse(std::ifstream(kDir + "/expected.json"));
}

TensorData raw(const std::string& name, DType dtype, std::vector<int64_t> shape, size_t bytes) {
  return TensorData{name, dtype, std::move(shape), std::vector<uint8_t>(bytes, 0x11)};
}

// What opening a folder holding `tensors` throws.
std::string open_error(const std::vector<TensorData>& tensors) {
  TempDir tmp;
  write_safetensors((tmp.path / "model.safetensors").string(), tensors);
  return error_of([&] { Checkpoint c(tmp.path.string()); });
}

}  // namespace

TEST(QuantizedReleases, Fp8AndAwqWeightsDequantizeAsTheirReferences) {
  const json want = expected();
  for (const std::string format : {"fp8", "awq"}) {
    SCOPED_TRACE(format);
    EXPECT_EQ(Qwen3Config::from_file(kDir + "/" + format + "/config.json").quantization, format);
    Checkpoint got(kDir + "/" + format);
    const Checkpoint plain("tests/fixtures/tiny-a/target");
    // The folder's tensors under the names of the unquantized model, and only those.
    EXPECT_EQ(got.names(), plain.names());
    ASSERT_EQ(want[format].size(), 28u);  // 4 layers × 7 matrices
    for (const auto& [name, e] : want[format].items()) {
      SCOPED_TRACE(name);
      const TensorView& t = got.get(name, e["shape"].get<std::vector<int64_t>>());
      ASSERT_EQ(t.dtype, DType::F32);
      EXPECT_EQ(XXH3_64bits(t.data, t.nbytes()), e["xxh3_64"].get<uint64_t>());
      // Freed once packed; made again, the same, when looked up again.
      got.drop_pages(t);
      EXPECT_EQ(t.data, nullptr);
      const TensorView& again = got.get(name);
      EXPECT_EQ(XXH3_64bits(again.data, again.nbytes()), e["xxh3_64"].get<uint64_t>());
    }
    // Everything else is the plain model's, byte for byte.
    for (const auto& name : plain.names())
      if (!want[format].contains(name)) {
        const TensorView &a = got.get(name), &b = plain.get(name);
        EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>(a.data),
                                       static_cast<const uint8_t*>(a.data) + a.nbytes()),
                  std::vector<uint8_t>(static_cast<const uint8_t*>(b.data),
                                       static_cast<const uint8_t*>(b.data) + b.nbytes()))
            << name;
      }
  }
}

TEST(QuantizedReleases, MalformedTensorsAreRefusedNamingThem) {
  const std::string w = "model.layers.0.mlp.up_proj";
  // FP8 without its scales, with scales of the wrong shape, or not a matrix.
  EXPECT_THAT(
      open_error({raw(w + ".weight", DType::F8_E4M3, {160, 64}, 160 * 64)}),
      HasSubstr("tensor '" + w + ".weight' is F8_E4M3 without '" + w + ".weight_scale_inv'"));
  EXPECT_THAT(open_error({raw(w + ".weight", DType::F8_E4M3, {160, 64}, 160 * 64),
                          raw(w + ".weight_scale_inv", DType::F32, {1, 1}, 4)}),
              HasSubstr("tensor '" + w +
                        ".weight_scale_inv' is F32 [1, 1], expected a float "
                        "tensor of shape [2, 1]"));
  EXPECT_THAT(open_error({raw(w + ".weight", DType::F8_E4M3, {64}, 64),
                          raw(w + ".weight_scale_inv", DType::F32, {1}, 4)}),
              HasSubstr("tensor '" + w + ".weight' has shape [64], expected a matrix"));
  // AWQ with a part missing, of the wrong type or shape, or beside a plain weight.
  EXPECT_THAT(
      open_error({raw(w + ".qweight", DType::I32, {64, 20}, 64 * 20 * 4)}),
      HasSubstr("tensor '" + w + ".qweight' without '" + w + ".qzeros' and '" + w + ".scales'"));
  const auto awq = [&](std::vector<int64_t> q, std::vector<int64_t> z, std::vector<int64_t> s,
                       DType qt = DType::I32) {
    int64_t nq = 1, nz = 1, ns = 1;
    for (auto d : q) nq *= d;
    for (auto d : z) nz *= d;
    for (auto d : s) ns *= d;
    return open_error({raw(w + ".qweight", qt, q, size_t(nq) * 4),
                       raw(w + ".qzeros", DType::I32, z, size_t(nz) * 4),
                       raw(w + ".scales", DType::F16, s, size_t(ns) * 2)});
  };
  EXPECT_THAT(awq({64, 20}, {2, 20}, {2, 160}, DType::F32),
              HasSubstr("tensor '" + w + ".qweight' is F32 [64, 20], expected an I32 matrix"));
  EXPECT_THAT(awq({64, 20}, {2, 20}, {3, 160}),
              HasSubstr("tensor '" + w +
                        ".scales' is F16 [3, 160], expected a float matrix "
                        "[groups, 160]"));
  EXPECT_THAT(awq({64, 20}, {2, 19}, {2, 160}),
              HasSubstr("tensor '" + w + ".qzeros' is I32 [2, 19], expected I32 [2, 20]"));
  EXPECT_THAT(open_error({raw(w + ".qweight", DType::I32, {64, 20}, 64 * 20 * 4),
                          raw(w + ".qzeros", DType::I32, {2, 20}, 2 * 20 * 4),
                          raw(w + ".scales", DType::F16, {2, 160}, 2 * 160 * 2),
                          raw(w + ".weight", DType::F32, {160, 64}, 160 * 64 * 4)}),
              HasSubstr("both '" + w + ".weight' and the AWQ tensor '" + w + ".qweight'"));
}

TEST(QuantizedReleases, OtherQuantizationConfigsAreRefusedNamingThem) {
  json c = json::parse(std::ifstream(kDir + "/fp8/config.json"));
  const auto error = [&](const json& q) {
    json j = c;
    j["quantization_config"] = q;
    return error_of([&] { Qwen3Config::from_json_text(j.dump(), "config.json"); });
  };
  EXPECT_THAT(error({{"quant_method", "gptq"}, {"bits", 4}}),
              HasSubstr("config.json: quantization_config: quant_method 'gptq' is not supported"));
  EXPECT_THAT(error({{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}),
              HasSubstr("weight_block_size [64,64] is not supported"));
  EXPECT_THAT(error({{"quant_method", "fp8"}}), HasSubstr("weight_block_size absent"));
  EXPECT_THAT(error({{"quant_method", "awq"}, {"bits", 8}}), HasSubstr("bits 8 is not supported"));
  EXPECT_THAT(error({{"quant_method", "awq"}, {"version", "gemv"}}),
              HasSubstr("version 'gemv' is not supported"));
  EXPECT_THAT(error({{"quant_method", "awq"}, {"zero_point", false}}),
              HasSubstr("zero_point false is not supported"));
  EXPECT_THAT(error("fp8"), HasSubstr("field 'quantization_config' must be an object"));
}
