#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/check.h"
#include "error_of.h"
#include "io/safetensors.h"

using namespace flashmap;
using flashmap::testing::error_of;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  auto d = fs::temp_directory_path() /
           ("flashmap-io-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A file with a hand-written header, to lie about offsets.
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypes) {
  auto d = temp_dir();
  std::vector<float> vals = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 65504.0f};
  write_safetensors((d / "a.safetensors").string(),
                    {make_tensor("f32", {2, 3}, vals), make_tensor("bf16", {6}, vals, DType::BF16),
                     make_tensor("f16", {3, 2}, vals, DType::F16)},
                    {{"format", "pt"}});
  SafetensorsFile f((d / "a.safetensors").string());
  EXPECT_EQ(f.get("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.get("f32").to_f32(), vals);
  // These values are exact in bf16/f16 except 1e-3, which rounds.
  auto bf = f.get("bf16").to_f32();
  EXPECT_EQ(bf[0], 1.5f);
  EXPECT_EQ(bf[1], -2.25f);
  EXPECT_NEAR(bf[4], 1e-3f, 1e-5f);
  EXPECT_EQ(f.get("f16").to_f32()[5], 65504.0f);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

// Views of a mapped file written again: the same file, byte for byte (the converter's copy).
TEST(Safetensors, ViewsAreWrittenByteForByte) {
  auto d = temp_dir();
  std::vector<float> vals = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 65504.0f};
  TensorData ids{"ids", DType::I64, {2}, std::vector<uint8_t>(16, 0xab)};
  TensorData mask{"mask", DType::Bool, {3}, {1, 0, 1}};
  write_safetensors(
      (d / "a.safetensors").string(),
      {make_tensor("f32", {2, 3}, vals), make_tensor("bf16", {6}, vals, DType::BF16), ids, mask},
      {{"format", "pt"}});
  {
    SafetensorsFile a((d / "a.safetensors").string());
    std::vector<const TensorView*> views;
    for (auto& [_, t] : a.tensors()) views.push_back(&t);
    std::reverse(views.begin(), views.end());  // written in name order whatever the order given
    write_safetensors((d / "b.safetensors").string(), views, a.metadata());
  }
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(bytes(d / "a.safetensors"), bytes(d / "b.safetensors"));
}

TEST(Safetensors, TruncatedFile) {
  auto d = temp_dir();
  write_safetensors((d / "a.safetensors").string(),
                    {make_tensor("w", {4, 4}, std::vector<float>(16, 1.0f))});
  fs::resize_file(d / "a.safetensors", fs::file_size(d / "a.safetensors") - 10);
  auto msg = error_of([&] { SafetensorsFile f((d / "a.safetensors").string()); });
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
  EXPECT_THAT(msg, HasSubstr("'w'"));
  EXPECT_THAT(msg, HasSubstr("outside the data"));
}

TEST(Safetensors, TooShortAndHeaderPastEnd) {
  auto d = temp_dir();
  { std::ofstream(d / "short.safetensors") << "abc"; }
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "short.safetensors").string()); }),
              HasSubstr("shorter than the 8-byte header length"));
  {
    std::ofstream out(d / "lie.safetensors", std::ios::binary);
    uint64_t n = 1 << 20;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "lie.safetensors").string()); }),
              HasSubstr("runs past the end of the file"));
}

TEST(Safetensors, BadJsonHeader) {
  auto d = temp_dir();
  write_raw(d / "a.safetensors", "{not json", 0);
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "a.safetensors").string()); }),
              HasSubstr("header is not valid JSON"));
}

TEST(Safetensors, OffsetsLie) {
  auto d = temp_dir();
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,64]}})",
            16);
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "a.safetensors").string()); }),
              HasSubstr("lie outside the data"));
  write_raw(d / "b.safetensors", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
            16);
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "b.safetensors").string()); }),
              HasSubstr("12 bytes for shape [2, 2] of F32 (expected 16)"));
  write_raw(d / "c.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            16);
  EXPECT_THAT(error_of([&] { SafetensorsFile f((d / "c.safetensors").string()); }),
              HasSubstr("overlap"));
}

TEST(Safetensors, UnknownDtype) {
  auto d = temp_dir();
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})",
            4);
  auto msg = error_of([&] { SafetensorsFile f((d / "a.safetensors").string()); });
  EXPECT_THAT(msg, HasSubstr("'w'"));
  EXPECT_THAT(msg, HasSubstr("unsupported dtype 'F8_E5M2'"));
}

TEST(Checkpoint, MissingTensorAndWrongShape) {
  auto d = temp_dir();
  write_safetensors((d / "model.safetensors").string(),
                    {make_tensor("w", {2, 3}, std::vector<float>(6))});
  Checkpoint c(d.string());
  EXPECT_THAT(error_of([&] { c.get("nope"); }), HasSubstr("missing tensor 'nope'"));
  auto msg = error_of([&] { c.get("w", {3, 2}); });
  EXPECT_THAT(msg, HasSubstr("model.safetensors"));
  EXPECT_THAT(msg, HasSubstr("has shape [2, 3], expected [3, 2]"));
}

TEST(Checkpoint, ShardedIndex) {
  auto d = temp_dir();
  write_safetensors((d / "s1.safetensors").string(), {make_tensor("a", {2}, {1, 2})});
  write_safetensors((d / "s2.safetensors").string(), {make_tensor("b", {1}, {3})});
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":12},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  Checkpoint c(d.string());
  EXPECT_EQ(c.get("a").to_f32(), (std::vector<float>{1, 2}));
  EXPECT_EQ(c.get("b").to_f32(), (std::vector<float>{3}));
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})";
  EXPECT_THAT(error_of([&] { Checkpoint c2(d.string()); }),
              HasSubstr("lists tensor 'b' in s1.safetensors, which does not hold it"));
}

TEST(Checkpoint, EmptyFolder) {
  auto d = temp_dir();
  EXPECT_THAT(error_of([&] { Checkpoint c(d.string()); }),
              HasSubstr("no model.safetensors, model.safetensors.index.json or model.gguf"));
}
