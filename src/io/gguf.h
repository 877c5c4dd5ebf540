// GGUF files (llama.cpp's model format): a little-endian header ("GGUF", version 2 or 3, tensor
// and metadata counts), typed metadata key/values, a tensor table (name, dimensions, ggml type,
// offset), then the tensors' data, aligned. Every count, length, dimension and offset is checked
// against the file's size before anything is mapped or allocated (errors name the file and the
// field); the data is mapped (io/mapped_file.h) and tensors are views into it. A model split in
// several files (NAME-00001-of-0000N.gguf) opens as one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace flashmap {

class MappedFile;

// ggml's tensor types (the ones this engine reads; the others are refused by name).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};
// "Q4_K", ...; "type 17" for a type this engine does not know.
std::string ggml_type_name(uint32_t type);
// Whether `type` is one of the above.
bool ggml_type_known(uint32_t type);
// Elements per block and bytes per block of a known type (1 and the element size for floats).
int64_t ggml_block_elems(GgmlType type);
int64_t ggml_block_bytes(GgmlType type);
// The dtype of a float type (F32, F16, BF16); none for a block-quantized one.
std::optional<DType> ggml_float_dtype(GgmlType type);

// One row of `n` elements of `type` (n a multiple of the block) to fp32, as ggml's dequantize
// does it: the same fp32 operations in the same order (the `gguf` package's dequantize gives the
// same bits).
void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n);
// One Q4_K block (144 bytes: fp16 d and dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles)
// unpacked: d and dmin as their fp16 bits, sub-block j's scale sc[j] and min m[j], the 256 codes
// q (0…15) in order of k; weight k is d · sc[k / 32] · q[k] − dmin · m[k / 32].
void unpack_q4_k(const uint8_t* block, uint16_t& d, uint16_t& dmin, uint8_t (&sc)[8],
                 uint8_t (&m)[8], uint8_t (&q)[256]);
// One Q5_K block (176 bytes: Q4_K's fields with the 32 bytes of fifth bits before the nibbles)
// unpacked as unpack_q4_k does, q 0…31.
void unpack_q5_k(const uint8_t* block, uint16_t& d, uint16_t& dmin, uint8_t (&sc)[8],
                 uint8_t (&m)[8], uint8_t (&q)[256]);
// One Q6_K block (210 bytes: 128 of low nibbles, 64 of high bit pairs, 16 int8 scales, fp16 d)
// unpacked: d as its fp16 bits, the scale sc[j] of each 16 codes, the 256 codes q (0…63) in order
// of k; weight k is d · sc[k / 16] · (q[k] − 32).
void unpack_q6_k(const uint8_t* block, uint16_t& d, int8_t (&sc)[16], uint8_t (&q)[256]);

// A metadata value: an integer (any width, signed or not), a float, a bool, a string, or an
// array of values.
struct GgufValue {
  std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<GgufValue>> v;
  uint32_t type = 0;  // the file's type code (GGUF_TYPE_*)
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (a row's length)
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint64_t file_offset = 0;  // where its data starts in `file`
  std::string file;
  int64_t numel() const;
  int64_t rows() const { return dims.empty() || dims[0] == 0 ? 0 : numel() / dims[0]; }
};

class GgufFile {
 public:
  // Opens `path` (and, for the first file of a split model, the others: split.count files named
  // as it is). Throws flashmap::Error naming the file and the field at fault.
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const GgufTensor& tensor(const std::string& name) const;

  // Typed metadata reads: nullopt when absent; a value of another type is an Error naming the key.
  std::optional<std::string> string(const std::string& key) const;
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;  // a float or an integer
  const std::vector<GgufValue>* array(const std::string& key) const;

  // Throws when a mapped file shrank or changed since it was opened.
  void check_unchanged() const;
  // MappedFile::drop_pages on the file holding [p, p + n); false when none does.
  bool drop_pages(const void* p, size_t n) const;

  // Limits on what a file may declare (beyond what its size allows).
  static constexpr uint64_t kMaxTensors = 1 << 20;
  static constexpr uint64_t kMaxMetadata = 1 << 20;
  static constexpr int kMaxDims = 4;
  static constexpr int kMaxArrayDepth = 4;
  static constexpr uint32_t kMaxSplits = 512;

 private:
  void read_one(const std::string& path, bool first);

  std::string path_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
};

}  // namespace flashmap
