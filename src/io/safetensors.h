// safetensors files: an 8-byte little-endian header length N, N bytes of JSON describing each
// tensor (dtype, shape, data_offsets relative to the end of the header), then the data.
// The header is read and checked against the file's size; the data is memory-mapped, and tensors
// are views into the mapping, never copies. A file that shrinks or is rewritten while mapped does
// not kill the process (io/mapped_file.h): reads past its new end see zeros, and the next
// Checkpoint::get, TensorView::to_f32 / to_i64 or Checkpoint::drop_pages throws an Error naming
// the file, so that a load fails instead.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace flashmap {

class GgufFile;
struct GgufTensor;
class MappedFile;
class SafetensorsFile;

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string file;                         // where it came from, for error messages
  const SafetensorsFile* source = nullptr;  // the mapped file holding `data`, if any

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  // fp32 copy of a float tensor (widened from bf16/f16).
  std::vector<float> to_f32() const;
  // int64 copy of an integer tensor.
  std::vector<int64_t> to_i64() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`: header length and JSON, known dtypes, offsets inside the data,
  // no overlap, end - begin == numel * dtype size. Throws flashmap::Error naming the file and
  // the tensor at fault.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;
  // Hands the mapped pages of [p, p + n) back to the kernel (they are re-read from the file if
  // touched again): once a weight is packed into its own memory, its file pages need not stay
  // resident. False when the range is not in this file.
  bool drop_pages(const void* p, size_t n) const;
  // Throws flashmap::Error naming the file when it shrank or was modified since it was opened
  // (MappedFile::check_unchanged).
  void check_unchanged() const;

  // The header's JSON, checked for depth and syntax (errors name `path`).
  static nlohmann::json parse_header(std::string_view text, const std::string& path);

 private:
  void index_header(const nlohmann::json& header, const uint8_t* data, uint64_t data_len);

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: name, dtype, shape and raw little-endian bytes.
struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
TensorData make_tensor(const std::string& name, const std::vector<int64_t>& shape,
                       const std::vector<float>& values, DType dtype = DType::F32);

// Writes a valid safetensors file (tensors in name order, header padded to 8 bytes).
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same from views (of a mapped checkpoint): the bytes are written as they are, so a copy is
// exact in every dtype.
void write_safetensors(const std::string& path, const std::vector<const TensorView*>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A Hugging Face checkpoint folder: model.safetensors, or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}), or model.gguf: a Qwen3
// GGUF (io/gguf.h; a folder io/gguf_convert.h makes for a GGUF target), its tensors under their
// transformers names. A GGUF's F32, F16 and BF16 tensors are views into its mapping; a quantized
// one (Q8_0, Q4_K, Q6_K, ...) is dequantized to F32 as ggml does when it is first looked up, and
// held until drop_pages. So are the quantized weights of Qwen's releases: FP8 (an F8_E4M3
// `X.weight` times its `X.weight_scale_inv` per 128 × 128 block) and AWQ (4-bit `X.qweight`,
// `X.qzeros` and `X.scales` per group of input rows, GEMM packing), under `X.weight` as F32.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint();
  // A checkpoint held in memory (benchmarks generate random weights at real shapes this way).
  static std::unique_ptr<Checkpoint> from_tensors(std::vector<TensorData> tensors,
                                                  const std::string& label);
  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor `name`; throws naming the folder and the tensor when it is missing.
  const TensorView& get(const std::string& name) const;
  // The tensor `name`, which must have `shape`; throws naming file, tensor and both shapes.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  // The tensor `name` as get() would give it, read from the headers alone (its data null for a
  // quantized tensor not yet dequantized): its dtype and shape, for sizes. Null when absent.
  const TensorView* header(const std::string& name) const;
  // Whether the tensor `name`'s bytes are held in this process's memory already (random weights,
  // a converted copy), not mapped from a file nor made when first read; from the index alone.
  bool in_memory(const std::string& name) const;
  // The bytes of every tensor as get() gives it (a quantized GGUF tensor as F32), from the
  // shapes alone: nothing is read or dequantized.
  int64_t bytes() const;
  // The bytes the files hold the tensors in (a GGUF tensor's blocks as stored).
  int64_t stored_bytes() const;
  // "fp8" or "awq" when the safetensors hold such a release's tensors (read as F32 weights),
  // else "": what a config's quantization_config must say.
  const std::string& quantization() const { return quantization_; }
  // Of a GGUF checkpoint, the file's tensor that `name` is read from (null for another checkpoint
  // or name): its blocks as stored, for a packing that keeps them (a Q4_K matrix as q4k). The
  // file is checked unchanged first, as get() does.
  const GgufTensor* gguf_tensor(const std::string& name) const;
  // Once a gguf_tensor's blocks have been read into a copy of their own: its file pages released
  // (read again if touched) and the file checked unchanged, so that what was read is the file's.
  void release_gguf_tensor(const GgufTensor& g) const;
  // Once a tensor's packed copy exists: SafetensorsFile::drop_pages for a mapped tensor (its
  // pages are read again from the file if touched), and for one held in memory its bytes are
  // freed and its view's data becomes null (a random Qwen3-8B would otherwise be held twice).
  void drop_pages(const TensorView& t);

 private:
  std::string dir_;
  Checkpoint();
  void open_gguf(const std::string& path);
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<TensorData> owned_;
  std::vector<TensorView> owned_views_;
  std::map<std::string, const TensorView*> index_;
  // The float tensors of a GGUF (views of its mapping).
  std::unique_ptr<GgufFile> gguf_;
  std::deque<TensorView> gguf_views_;
  std::map<std::string, const GgufTensor*> gguf_tensors_;
  // Tensors stored quantized (a GGUF's, FP8, AWQ): an F32 view whose data `fill` makes when it is
  // first looked up, held until drop_pages.
  struct Dequantized {
    mutable TensorView view;
    std::function<void(float*)> fill;
    mutable std::vector<float> values;
  };
  std::string quantization_;
  std::deque<Dequantized> dequantized_;
  std::unordered_map<const TensorView*, Dequantized*> dequantized_of_;  // by its view
  mutable std::mutex dequantize_mutex_;
  void add_dequantized(TensorView view, std::function<void(float*)> fill);
  // The FP8 (weight + weight_scale_inv) and AWQ (qweight, qzeros, scales) tensors of the
  // safetensors files, as their F32 weights.
  void index_quantized_releases();
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace flashmap
