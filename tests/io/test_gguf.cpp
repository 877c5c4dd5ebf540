// GGUF files: dequantization of every type against the `gguf` package's (bit for bit, fixtures by
// tools/make_gguf_fixtures.py), the metadata read back as written, and hostile files (truncated
// anywhere, absurd counts and sizes, unknown types, overlapping or misaligned tensors, strings
// that are not what they claim): a clear error naming the file, never a crash or a huge
// allocation.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "error_of.h"
#include "io/gguf.h"
#include "io/safetensors.h"

using namespace flashmap;
using flashmap::testing::error_of;
namespace fs = std::filesystem;

namespace {

const std::string kDir = "tests/fixtures/gguf";

std::string temp_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const fs::path p = fs::temp_directory_path() / fmt::format("flashmap-gguf-{}-{}", getpid(), name);
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return p.string();
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A GGUF file written by hand, for the hostile cases.
struct Writer {
  std::vector<uint8_t> b;
  template <typename T>
  Writer& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Writer& header(uint64_t tensors, uint64_t kv) {
    return put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(tensors).put<uint64_t>(kv);
  }
  Writer& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                 uint64_t offset) {
    str(name).put<uint32_t>(uint32_t(dims.size()));
    for (auto d : dims) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Writer& align() {
    while (b.size() % 32) b.push_back(0);
    return *this;
  }
  Writer& data(size_t n, uint8_t v = 0) {
    b.insert(b.end(), n, v);
    return *this;
  }
};

std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string path = temp_file(name, bytes);
  const std::string e = error_of([&] { GgufFile f(path); });
  fs::remove(path);
  return e;
}

}  // namespace

TEST(Gguf, DequantizationEqualsTheGgufPackage) {
  GgufFile f(kDir + "/quants.gguf");
  SafetensorsFile expected(kDir + "/quants_expected.safetensors");
  int checked = 0;
  for (const auto& [name, t] : f.tensors()) {
    SCOPED_TRACE(name);
    ASSERT_EQ(t.dims.size(), 2u);
    const int64_t cols = t.dims[0], rows = t.dims[1];
    const auto want = expected.get(name).to_f32();
    ASSERT_EQ(int64_t(want.size()), rows * cols);
    const int64_t row_bytes = cols / ggml_block_elems(t.type) * ggml_block_bytes(t.type);
    std::vector<float> got(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, t.data + r * row_bytes, got.data(), cols);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(std::memcmp(&got[size_t(c)], &want[size_t(r * cols + c)], 4), 0)
            << "row " << r << " col " << c << ": " << got[size_t(c)] << " vs "
            << want[size_t(r * cols + c)];
    }
    ++checked;
  }
  EXPECT_EQ(checked, 11);
}

TEST(Gguf, MetadataReadsBackAsWritten) {
  GgufFile f(kDir + "/quants.gguf");
  EXPECT_EQ(*f.string("general.architecture"), "test");
  EXPECT_EQ(*f.integer("test.u8"), 200);
  EXPECT_EQ(*f.integer("test.i8"), -100);
  EXPECT_EQ(*f.integer("test.u16"), 60000);
  EXPECT_EQ(*f.integer("test.i16"), -30000);
  EXPECT_EQ(*f.integer("test.u32"), 4000000000);
  EXPECT_EQ(*f.integer("test.i32"), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f.metadata().at("test.u64").v), (uint64_t(1) << 63) + 5);
  EXPECT_EQ(*f.integer("test.i64"), -(int64_t(1) << 62));
  EXPECT_EQ(*f.number("test.f32"), 0.25);
  EXPECT_EQ(*f.number("test.f64"), -1.5e300);
  EXPECT_EQ(std::get<bool>(f.metadata().at("test.bool").v), true);
  EXPECT_EQ(*f.string("test.string"), "héllo, wörld");
  const auto* strings = f.array("test.strings");
  ASSERT_TRUE(strings);
  ASSERT_EQ(strings->size(), 4u);
  EXPECT_EQ(std::get<std::string>((*strings)[2].v), "ünïcode");
  const auto* nested = f.array("test.nested");
  ASSERT_TRUE(nested);
  EXPECT_EQ(std::get<std::vector<GgufValue>>((*nested)[0].v).size(), 2u);
  EXPECT_FALSE(f.string("no.such.key"));
  EXPECT_NE(error_of([&] { f.integer("test.string"); }).find("'test.string' is not an integer"),
            std::string::npos);
}

TEST(Gguf, EveryTruncationIsAClearError) {
  const auto bytes = read_all(kDir + "/quants.gguf");
  ASSERT_GT(bytes.size(), 1000u);
  // Every prefix that cuts the last tensor's data short is an error (the file may pad past it):
  // all up to the end of the tensor table, then a sample of the data's.
  uint64_t end = 0;
  const GgufFile whole(kDir + "/quants.gguf");
  for (const auto& [name, t] : whole.tensors())
    end = std::max(end, t.file_offset + t.bytes);
  ASSERT_LE(end, bytes.size());
  for (size_t n = 0; n < end; n += n < 2048 ? 1 : 97) {
    const std::string e =
        open_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + int64_t(n)), "trunc");
    ASSERT_NE(e, "<no error>") << n << " bytes";
    ASSERT_NE(e.find("flashmap-gguf-"), std::string::npos) << e;  // names the file
  }
}

TEST(Gguf, HostileHeadersAndTables) {
  struct Case {
    std::string name, expect;
    Writer w;
  };
  std::vector<Case> cases;
  cases.push_back({"magic", "no GGUF magic", Writer{}.put<uint32_t>(0x12345678).data(40)});
  cases.push_back(
      {"version", "GGUF version 7", Writer{}.put<uint32_t>(0x46554747).put<uint32_t>(7).data(40)});
  cases.push_back({"tensor count", "tensor_count", Writer{}.header(uint64_t(1) << 40, 0).data(64)});
  cases.push_back({"kv count", "metadata_kv_count", Writer{}.header(0, ~uint64_t(0)).data(64)});
  cases.push_back({"huge string", "runs past the end",
                   Writer{}.header(0, 1).put<uint64_t>(uint64_t(1) << 60).data(64)});
  cases.push_back({"huge array", "more than the rest of the file",
                   Writer{}
                       .header(0, 1)
                       .str("k")
                       .put<uint32_t>(9)
                       .put<uint32_t>(8)
                       .put<uint64_t>(uint64_t(1) << 50)
                       .data(64)});
  cases.push_back({"array depth", "nests arrays deeper", [] {
                     Writer w;
                     w.header(0, 1).str("k").put<uint32_t>(9);  // an array of arrays of ...
                     for (int i = 0; i < 6; ++i) w.put<uint32_t>(9).put<uint64_t>(1);
                     return w.data(64);
                   }()});
  cases.push_back({"value type", "unknown value type 99",
                   Writer{}.header(0, 1).str("k").put<uint32_t>(99).data(64)});
  cases.push_back({"bool", "is a bool of value 7",
                   Writer{}.header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(7).data(64)});
  cases.push_back(
      {"dims", "has 9 dimensions", Writer{}.header(1, 0).str("t").put<uint32_t>(9).data(128)});
  cases.push_back({"zero dim", "has dimension 0 = 0",
                   Writer{}.header(1, 0).tensor("t", {0}, 0, 0).align().data(64)});
  cases.push_back({"numel", "more than 2^48 elements",
                   Writer{}.header(1, 0).tensor("t", {1 << 30, 1 << 30}, 0, 0).align().data(64)});
  cases.push_back({"type", "type 99, which this engine does not read",
                   Writer{}.header(1, 0).tensor("t", {32}, 99, 0).align().data(256)});
  cases.push_back({"block", "not a multiple of its 256-element blocks",
                   Writer{}.header(1, 0).tensor("t", {100}, 12, 0).align().data(256)});
  cases.push_back({"past the end", "runs past the end of the data",
                   Writer{}.header(1, 0).tensor("t", {64}, 0, 0).align().data(100)});
  cases.push_back({"misaligned", "is not aligned to 32",
                   Writer{}.header(1, 0).tensor("t", {8}, 0, 4).align().data(64)});
  cases.push_back(
      {"overlap", "overlaps",
       Writer{}.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).align().data(256)});
  cases.push_back(
      {"duplicate", "appears twice",
       Writer{}.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 64).align().data(256)});
  cases.push_back(
      {"alignment", "general.alignment must be a power of two",
       Writer{}.header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(3).data(64)});
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string e = open_error(c.w.b, c.name.substr(0, 4));
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
  }
  // A well-formed hand-written file opens.
  const std::string path = temp_file("ok", Writer{}
                                               .header(1, 1)
                                               .str("general.name")
                                               .put<uint32_t>(8)
                                               .str("x")
                                               .tensor("t", {8}, 0, 0)
                                               .align()
                                               .data(32)
                                               .b);
  GgufFile ok(path);
  EXPECT_EQ(ok.tensor("t").numel(), 8);
  EXPECT_EQ(*ok.string("general.name"), "x");
  fs::remove(path);
}
