#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "core/thread_pool.h"
#include "io/files.h"
#include "io/gguf.h"
#include "io/gguf_convert.h"
#include "io/mapped_file.h"

namespace flashmap {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  FLASHMAP_CHECK(is_float(dtype), "{}: tensor '{}' has dtype {}, expected a float dtype", file,
                 name, dtype_name(dtype));
  std::vector<float> out(static_cast<size_t>(numel()));
  const auto* p16 = static_cast<const uint16_t*>(data);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&out[i], static_cast<const char*>(data) + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p16 + i, 2);
      out[i] = dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  if (source) source->check_unchanged();  // what was read came from the file as it was mapped
  return out;
}

std::vector<int64_t> TensorView::to_i64() const {
  FLASHMAP_CHECK(dtype == DType::I64 || dtype == DType::I32,
                 "{}: tensor '{}' has dtype {}, expected I64 or I32", file, name,
                 dtype_name(dtype));
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::I64) {
      std::memcpy(&out[i], static_cast<const char*>(data) + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, static_cast<const char*>(data) + 4 * i, 4);
      out[i] = v;
    }
  }
  if (source) source->check_unchanged();
  return out;
}

static DType parse_dtype(const std::string& s, const std::string& file, const std::string& name) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I64") return DType::I64;
  if (s == "I32") return DType::I32;
  if (s == "BOOL") return DType::Bool;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  throw Error(
      fmt::format("{}: tensor '{}' has unsupported dtype '{}' (supported: F32, BF16, F16, "
                  "I64, I32, BOOL, F8_E4M3)",
                  file, name, s));
}

// The safetensors format's own bound on the header (MAX_HEADER_SIZE of the reference crate): a
// header is a few hundred bytes per tensor, and parsing one builds a JSON tree several times its
// size.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

namespace {

// Reads exactly n bytes at `offset`; false when the file ends first.
bool pread_all(int fd, void* out, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    FLASHMAP_CHECK(r >= 0, "{}: read failed ({})", path, std::strerror(errno));
    if (r == 0) return false;
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = open_regular_file(path);  // a FIFO or device here would block or never end
  // The header is read into memory and checked against the file's size before anything is
  // mapped; only the tensors' bytes are read through the mapping (MappedFile guards them).
  json header;
  uint64_t header_len = 0, size = 0;
  try {
    struct stat st {};
    FLASHMAP_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat ({})", path, std::strerror(errno));
    size = uint64_t(st.st_size);
    FLASHMAP_CHECK(size >= 8,
                   "{}: not a safetensors file ({} bytes, shorter than the 8-byte header length)",
                   path, size);
    uint8_t len[8];
    FLASHMAP_CHECK(pread_all(fd, len, 8, 0, path), "{}: the file shrank while it was read", path);
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len[i];
    FLASHMAP_CHECK(header_len <= size - 8,
                   "{}: header length {} runs past the end of the file ({} bytes): truncated or "
                   "not a safetensors file",
                   path, header_len, size);
    FLASHMAP_CHECK(header_len <= kMaxHeaderBytes,
                   "{}: header length {} is over the safetensors limit of {} bytes", path,
                   header_len, kMaxHeaderBytes);
    std::string text(size_t(header_len), '\0');
    FLASHMAP_CHECK(pread_all(fd, text.data(), text.size(), 8, path),
                   "{}: the file shrank while it was read", path);
    header = parse_header(text, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  map_ = std::make_unique<MappedFile>(fd, size_t(size), path);  // owns fd, even when it throws
  index_header(header, map_->data() + 8 + header_len, size - 8 - header_len);
}

json SafetensorsFile::parse_header(std::string_view text, const std::string& path) {
  check_json_depth(text, path + ": header");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: header is not valid JSON ({})", path, e.what()));
  }
  FLASHMAP_CHECK(header.is_object(), "{}: header is not a JSON object", path);
  return header;
}

void SafetensorsFile::index_header(const json& header, const uint8_t* data, uint64_t data_len) {
  const std::string& path = path_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (info.is_object())
        for (auto& [k, v] : info.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    FLASHMAP_CHECK(info.is_object() && info.contains("dtype") && info.contains("shape") &&
                       info.contains("data_offsets"),
                   "{}: tensor '{}' needs dtype, shape and data_offsets in the header", path, name);
    FLASHMAP_CHECK(info["dtype"].is_string(), "{}: tensor '{}': dtype is not a string", path, name);
    TensorView t;
    t.name = name;
    t.file = path;
    t.source = this;
    t.dtype = parse_dtype(info["dtype"].get<std::string>(), path, name);
    FLASHMAP_CHECK(info["shape"].is_array(), "{}: tensor '{}': shape is not an array", path, name);
    uint64_t numel = 1;
    for (auto& d : info["shape"]) {
      FLASHMAP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                     "{}: tensor '{}': shape has a bad dimension {}", path, name, d.dump());
      const uint64_t v = d.get<uint64_t>();
      FLASHMAP_CHECK(v == 0 || numel <= (uint64_t(1) << 48) / v,
                     "{}: tensor '{}': shape is too large", path, name);
      numel *= v;
      t.shape.push_back(int64_t(v));
    }
    auto& off = info["data_offsets"];
    FLASHMAP_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                       off[1].is_number_unsigned(),
                   "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    FLASHMAP_CHECK(begin <= end && end <= data_len,
                   "{}: tensor '{}': data_offsets [{}, {}] lie outside the data ({} bytes)", path,
                   name, begin, end, data_len);
    FLASHMAP_CHECK(end - begin == numel * dtype_size(t.dtype),
                   "{}: tensor '{}': {} bytes for shape {} of {} (expected {})", path, name,
                   end - begin, shape_str(t.shape), dtype_name(t.dtype),
                   numel * dtype_size(t.dtype));
    t.data = data + begin;
    ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    FLASHMAP_CHECK(ranges[i].first >= ranges[i - 1].second,
                   "{}: tensors overlap in the data (bytes {}..{} and {}..{})", path,
                   ranges[i - 1].first, ranges[i - 1].second, ranges[i].first, ranges[i].second);
}

SafetensorsFile::~SafetensorsFile() = default;

void SafetensorsFile::check_unchanged() const {
  if (map_) map_->check_unchanged();
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  FLASHMAP_CHECK(it != tensors_.end(), "{}: no tensor '{}'", path_, name);
  return it->second;
}

TensorData make_tensor(const std::string& name, const std::vector<int64_t>& shape,
                       const std::vector<float>& values, DType dtype) {
  TensorData t{name, dtype, shape, {}};
  t.bytes.resize(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&t.bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(&t.bytes[2 * i], &h, 2);
    }
  }
  return t;
}

namespace {
struct Blob {
  const std::string* name;
  DType dtype;
  const std::vector<int64_t>* shape;
  const void* data;
  size_t nbytes;
};

void write_blobs(const std::string& path, std::vector<Blob> blobs,
                 const std::map<std::string, std::string>& metadata) {
  std::sort(blobs.begin(), blobs.end(), [](auto& a, auto& b) { return *a.name < *b.name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& b : blobs) {
    header[*b.name] = {{"dtype", std::string(dtype_name(b.dtype))},
                       {"shape", *b.shape},
                       {"data_offsets", {offset, offset + b.nbytes}}};
    offset += b.nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  // Whole or not at all: a full disk or a read-only folder leaves no partial file under `path`.
  AtomicFile out(path);
  uint64_t n = h.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h);
  for (auto& b : blobs) out.write(b.data, b.nbytes);
  out.commit();
}
}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Blob> blobs;
  for (auto& t : tensors)
    blobs.push_back({&t.name, t.dtype, &t.shape, t.bytes.data(), t.bytes.size()});
  write_blobs(path, std::move(blobs), metadata);
}

void write_safetensors(const std::string& path, const std::vector<const TensorView*>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Blob> blobs;
  for (auto* t : tensors) blobs.push_back({&t->name, t->dtype, &t->shape, t->data, t->nbytes()});
  write_blobs(path, std::move(blobs), metadata);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  FLASHMAP_CHECK(fs::is_directory(dir, ec), "{}: not a directory", dir);
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shards;  // in order of first mention
  std::set<std::string> seen;       // a linear search per tensor is quadratic in a huge index
  std::map<std::string, std::string> weight_map;
  // symlink_status: a dangling link or a FIFO named like the index is refused when read, not
  // taken for an absent index.
  if (fs::symlink_status(index_path, ec).type() != fs::file_type::not_found) {
    json index;
    const std::string text = read_regular_file(index_path.string(), kMaxConfigFileBytes);
    check_json_depth(text, index_path.string());
    try {
      index = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(fmt::format("{}: not valid JSON ({})", index_path.string(), e.what()));
    }
    FLASHMAP_CHECK(
        index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
        "{}: needs an object 'weight_map'", index_path.string());
    for (auto& [name, file] : index["weight_map"].items()) {
      FLASHMAP_CHECK(file.is_string(), "{}: weight_map['{}'] is not a file name",
                     index_path.string(), name);
      const auto f = file.get<std::string>();
      FLASHMAP_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                     "{}: weight_map['{}'] = '{}' is not a file in the folder", index_path.string(),
                     name, f);
      weight_map[name] = f;
      if (seen.insert(f).second) shards.push_back(f);
    }
  } else {
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path gguf = fs::path(dir) / "model.gguf";
    if (fs::symlink_status(single, ec).type() == fs::file_type::not_found &&
        fs::symlink_status(gguf, ec).type() != fs::file_type::not_found) {
      open_gguf(gguf.string());
      return;
    }
    FLASHMAP_CHECK(fs::symlink_status(single, ec).type() != fs::file_type::not_found,
                   "{}: no model.safetensors, model.safetensors.index.json or model.gguf", dir);
    shards.push_back("model.safetensors");
  }
  for (auto& shard : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string()));
    for (auto& [name, t] : files_.back()->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || it->second != shard) continue;
      }
      index_[name] = &t;
    }
  }
  for (auto& [name, shard] : weight_map)
    FLASHMAP_CHECK(index_.count(name), "{}: index lists tensor '{}' in {}, which does not hold it",
                   index_path.string(), name, shard);
  index_quantized_releases();
}

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

void Checkpoint::add_dequantized(TensorView view, std::function<void(float*)> fill) {
  Dequantized& d = dequantized_.emplace_back();
  d.view = std::move(view);
  d.view.dtype = DType::F32;
  d.view.data = nullptr;
  d.view.source = nullptr;
  d.fill = std::move(fill);
  index_[d.view.name] = &d.view;
  dequantized_of_[&d.view] = &d;
}

void Checkpoint::open_gguf(const std::string& path) {
  // The file itself (through a link), where the other files of a split model lie.
  std::error_code ec;
  const fs::path file = fs::canonical(path, ec);
  FLASHMAP_CHECK(!ec, "{}: cannot open ({})", path, ec.message());
  gguf_ = std::make_unique<GgufFile>(file.string());
  for (const auto& [name, t] : qwen3_gguf_tensors(*gguf_)) {
    gguf_tensors_[name] = t;
    TensorView v;
    v.name = name;
    v.shape.assign(t->dims.rbegin(), t->dims.rend());
    v.file = t->file;  // of a split model, the part holding it
    v.data = t->data;
    if (const auto d = ggml_float_dtype(t->type)) {
      v.dtype = *d;
      index_[name] = &gguf_views_.emplace_back(std::move(v));
      continue;
    }
    add_dequantized(std::move(v), [t = t, file = gguf_.get()](float* out) {
      const int64_t n = t->dims.empty() ? 1 : t->dims[0], rows = t->rows();
      const uint64_t row_bytes = rows ? t->bytes / uint64_t(rows) : 0;
      ThreadPool::global().parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          dequantize_row(t->type, t->data + uint64_t(r) * row_bytes, out + r * n, n);
      });
      file->drop_pages(t->data, t->bytes);  // its blocks are read: the F32 copy is what is kept
    });
  }
}

namespace {

// float8_e4m3fn (torch's, ml_dtypes'): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinities, S.1111.111 is NaN; exponent 0 is subnormal (m / 8 · 2^-6).
float f8_e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 7;
  float v;
  if (e == 0xf && m == 7)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(float(m), -9);
  else
    v = std::ldexp(float(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

// Element i of a tensor whose data need not be aligned (safetensors offsets are any byte).
template <typename T>
T load_at(const void* data, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(data) + i * int64_t(sizeof(T)), sizeof(T));
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void Checkpoint::index_quantized_releases() {
  std::vector<std::pair<std::string, const TensorView*>> fp8, awq;
  for (const auto& [name, t] : index_) {
    if (t->dtype == DType::F8_E4M3) fp8.emplace_back(name, t);
    if (ends_with(name, ".qweight")) awq.emplace_back(name, t);
  }
  FLASHMAP_CHECK(fp8.empty() || awq.empty(), "{}: holds both FP8 ('{}') and AWQ ('{}') weights",
                 dir_, fp8.front().first, awq.front().first);
  quantization_ = !fp8.empty() ? "fp8" : !awq.empty() ? "awq" : "";
  // Qwen's FP8 (quantization_config: quant_method fp8, weight_block_size [128, 128]):
  // W[r, c] = fp8[r, c] · weight_scale_inv[r / 128, c / 128].
  constexpr int64_t kBlock = 128;
  for (const auto& [name, w] : fp8) {
    const std::string scale_name = name + "_scale_inv";
    FLASHMAP_CHECK(ends_with(name, ".weight") && index_.count(scale_name),
                   "{}: tensor '{}' is F8_E4M3 without '{}' (the block scales of an FP8 "
                   "checkpoint)",
                   w->file, name, scale_name);
    const TensorView* s = index_.at(scale_name);
    FLASHMAP_CHECK(w->shape.size() == 2, "{}: tensor '{}' has shape {}, expected a matrix", w->file,
                   name, shape_str(w->shape));
    const int64_t R = w->shape[0], C = w->shape[1];
    const std::vector<int64_t> want = {(R + kBlock - 1) / kBlock, (C + kBlock - 1) / kBlock};
    FLASHMAP_CHECK(s->shape == want && is_float(s->dtype),
                   "{}: tensor '{}' is {} {}, expected a float tensor of shape {} (one scale per "
                   "128 × 128 block of '{}' {})",
                   s->file, scale_name, dtype_name(s->dtype), shape_str(s->shape), shape_str(want),
                   name, shape_str(w->shape));
    add_dequantized(*w, [w = w, s = s, R, C](float* out) {
      const auto* q = static_cast<const uint8_t*>(w->data);
      const int64_t SC = (C + kBlock - 1) / kBlock;
      ThreadPool::global().parallel_for(R, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = 0; c < C; ++c)
            out[r * C + c] = f8_e4m3_to_f32(q[r * C + c]) *
                             float_element(s->data, s->dtype, (r / kBlock) * SC + c / kBlock);
      });
    });
  }
  // AWQ, GEMM packing (AutoAWQ; vLLM's awq_dequantize): qweight [in, out / 8] and qzeros
  // [in / group, out / 8] int32 hold 8 four-bit values each, output column 8j + k in the
  // nibble kAwqOrder[k]; scales [in / group, out]. W[o, i] = (q[i, o] − z[i / group, o]) ·
  // scales[i / group, o], exact in fp32 (vLLM's fp16 dequantization rounds it to fp16).
  static constexpr int kAwqOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (const auto& [qname, q] : awq) {
    const std::string prefix = qname.substr(0, qname.size() - std::string(".qweight").size());
    const std::string zname = prefix + ".qzeros", sname = prefix + ".scales",
                      wname = prefix + ".weight";
    FLASHMAP_CHECK(index_.count(zname) && index_.count(sname),
                   "{}: tensor '{}' without '{}' and '{}' (an AWQ checkpoint's)", q->file, qname,
                   zname, sname);
    FLASHMAP_CHECK(!index_.count(wname), "{}: both '{}' and the AWQ tensor '{}'", q->file, wname,
                   qname);
    const TensorView *z = index_.at(zname), *s = index_.at(sname);
    FLASHMAP_CHECK(q->dtype == DType::I32 && q->shape.size() == 2,
                   "{}: tensor '{}' is {} {}, "
                   "expected an I32 matrix [in, out / 8]",
                   q->file, qname, dtype_name(q->dtype), shape_str(q->shape));
    const int64_t in = q->shape[0], out = q->shape[1] * 8;
    FLASHMAP_CHECK(is_float(s->dtype) && s->shape.size() == 2 && s->shape[1] == out &&
                       s->shape[0] >= 1 && in % s->shape[0] == 0,
                   "{}: tensor '{}' is {} {}, expected a float matrix [groups, {}] with the {} "
                   "input rows of '{}' a multiple of its groups",
                   s->file, sname, dtype_name(s->dtype), shape_str(s->shape), out, in, qname);
    const int64_t groups = s->shape[0], group = in / groups;
    FLASHMAP_CHECK(z->dtype == DType::I32 && z->shape == std::vector<int64_t>({groups, out / 8}),
                   "{}: tensor '{}' is {} {}, expected I32 [{}, {}]", z->file, zname,
                   dtype_name(z->dtype), shape_str(z->shape), groups, out / 8);
    TensorView v = *q;
    v.name = wname;
    v.shape = {out, in};
    add_dequantized(std::move(v), [q = q, z = z, s = s, in, out, group](float* w) {
      const auto nibble = [](uint32_t packed, int64_t col) {
        return int((packed >> (4 * kAwqOrder[col % 8])) & 0xf);
      };
      ThreadPool::global().parallel_for(out, 8, [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t i = 0; i < in; ++i) {
            const int64_t g = i / group;
            const int d = nibble(load_at<uint32_t>(q->data, i * (out / 8) + o / 8), o) -
                          nibble(load_at<uint32_t>(z->data, g * (out / 8) + o / 8), o);
            w[o * in + i] = float(d) * float_element(s->data, s->dtype, g * out + o);
          }
      });
    });
    index_.erase(qname);
    index_.erase(zname);
    index_.erase(sname);
  }
  for (const auto& [name, w] : fp8) index_.erase(name + "_scale_inv");
}

std::unique_ptr<Checkpoint> Checkpoint::from_tensors(std::vector<TensorData> tensors,
                                                     const std::string& label) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = label;
  c->owned_ = std::move(tensors);
  c->owned_views_.reserve(c->owned_.size());
  for (auto& t : c->owned_) {
    c->owned_views_.push_back(TensorView{t.name, t.dtype, t.shape, t.bytes.data(), label, nullptr});
    FLASHMAP_ASSERT(c->owned_views_.back().nbytes() == t.bytes.size());
  }
  for (auto& v : c->owned_views_) c->index_[v.name] = &v;
  return c;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  FLASHMAP_CHECK(it != index_.end(), "{}: missing tensor '{}'", dir_, name);
  // A tensor is looked up before it is read: a file that shrank or was rewritten since it was
  // opened fails the load here rather than being read.
  if (it->second->source) it->second->source->check_unchanged();
  if (gguf_) gguf_->check_unchanged();
  const auto q = dequantized_of_.find(it->second);
  if (q == dequantized_of_.end()) return *it->second;
  Dequantized* d = q->second;
  const std::lock_guard lock(dequantize_mutex_);
  if (!d->view.data) {
    d->values.resize(size_t(d->view.numel()));
    d->fill(d->values.data());
    // What was read came from the files as they were mapped.
    if (gguf_) gguf_->check_unchanged();
    for (const auto& f : files_) f->check_unchanged();
    d->view.data = d->values.data();
  }
  return *it->second;
}

bool Checkpoint::in_memory(const std::string& name) const {
  const TensorView* t = header(name);
  return t && t->data && !t->source && !gguf_tensors_.contains(name);
}

const GgufTensor* Checkpoint::gguf_tensor(const std::string& name) const {
  const auto it = gguf_tensors_.find(name);
  if (it == gguf_tensors_.end()) return nullptr;
  gguf_->check_unchanged();
  return it->second;
}

void Checkpoint::release_gguf_tensor(const GgufTensor& g) const {
  FLASHMAP_ASSERT(gguf_);
  gguf_->drop_pages(g.data, g.bytes);
  gguf_->check_unchanged();
}

const TensorView& Checkpoint::get(const std::string& name,
                                  const std::vector<int64_t>& shape) const {
  const auto& t = get(name);
  FLASHMAP_CHECK(t.shape == shape, "{}: tensor '{}' has shape {}, expected {}", t.file, name,
                 shape_str(t.shape), shape_str(shape));
  FLASHMAP_CHECK(is_float(t.dtype), "{}: tensor '{}' has dtype {}, expected F32, BF16 or F16",
                 t.file, name, dtype_name(t.dtype));
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, _] : index_) out.push_back(n);
  return out;
}

const TensorView* Checkpoint::header(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

int64_t Checkpoint::bytes() const {
  int64_t n = 0;
  for (const auto& [name, view] : index_) n += int64_t(view->nbytes());
  return n;
}

int64_t Checkpoint::stored_bytes() const {
  int64_t n = 0;
  for (const auto& [name, view] : index_) {
    const auto g = gguf_tensors_.find(name);
    n += g != gguf_tensors_.end() ? int64_t(g->second->bytes) : int64_t(view->nbytes());
  }
  return n;
}

bool SafetensorsFile::drop_pages(const void* p, size_t n) const {
  return map_ && map_->drop_pages(p, n);
}

void Checkpoint::drop_pages(const TensorView& t) {
  for (const auto& f : files_) {
    if (!f->drop_pages(t.data, t.nbytes())) continue;
    // Called once a tensor has been read (packed): a file that changed meanwhile gave it zeros.
    f->check_unchanged();
    return;
  }
  if (const auto q = dequantized_of_.find(&t); q != dequantized_of_.end()) {
    const std::lock_guard lock(dequantize_mutex_);
    std::vector<float>().swap(q->second->values);
    q->second->view.data = nullptr;
    return;
  }
  if (gguf_ && gguf_->drop_pages(t.data, t.nbytes())) {
    gguf_->check_unchanged();
    return;
  }
  for (size_t i = 0; i < owned_views_.size(); ++i)
    if (&owned_views_[i] == &t) {
      std::vector<uint8_t>().swap(owned_[i].bytes);
      owned_views_[i].data = nullptr;
      return;
    }
}

}  // namespace flashmap
