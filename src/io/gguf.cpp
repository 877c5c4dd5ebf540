#include "io/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/check.h"
#include "core/dtype.h"
#include "io/files.h"
#include "io/mapped_file.h"

namespace flashmap {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian

// GGUF's metadata value types, by their code: how each is stored, and the fewest bytes one takes
// (a string: its 8-byte length; an array: its element type and 8-byte count).
enum class Kind : uint8_t { Unsigned, Signed, Float, Bool, String, Array };
struct ValueType {
  Kind kind;
  uint8_t bytes;
};
constexpr ValueType kValueTypes[] = {
    {Kind::Unsigned, 1}, {Kind::Signed, 1}, {Kind::Unsigned, 2}, {Kind::Signed, 2},
    {Kind::Unsigned, 4}, {Kind::Signed, 4}, {Kind::Float, 4},    {Kind::Bool, 1},
    {Kind::String, 8},   {Kind::Array, 12}, {Kind::Unsigned, 8}, {Kind::Signed, 8},
    {Kind::Float, 8},
};

// 0 for a code that is not a value type.
uint64_t min_size(uint32_t type) {
  return type < std::size(kValueTypes) ? kValueTypes[type].bytes : 0;
}

// Reads from a mapped file, every read checked against its size first.
struct Reader {
  const uint8_t* p;
  uint64_t size, pos = 0;
  const std::string& path;

  void need(uint64_t n, const std::string& what) const {
    FLASHMAP_CHECK(n <= size - pos,
                   "{}: {} ({} bytes at offset {}) runs past the end of the file ({} bytes): "
                   "truncated or not a GGUF file",
                   path, what, n, pos, size);
  }
  template <typename T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  // An n-byte little-endian number's bits (n <= 8).
  uint64_t bits(int n, const std::string& what) {
    need(uint64_t(n), what);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[pos + uint64_t(i)];
    pos += uint64_t(n);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t n = get<uint64_t>(what + "'s length");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p + pos), size_t(n));
    pos += n;
    return s;
  }
};

GgufValue read_value(Reader& r, uint32_t type, const std::string& what, int depth) {
  FLASHMAP_CHECK(min_size(type) > 0, "{}: {} has unknown value type {}", r.path, what, type);
  const ValueType t = kValueTypes[type];
  GgufValue v;
  v.type = type;
  switch (t.kind) {
    case Kind::Unsigned:
      v.v = r.bits(t.bytes, what);
      break;
    case Kind::Signed: {
      const int unused = 64 - 8 * t.bytes;  // sign-extends from the value's top bit
      v.v = int64_t(r.bits(t.bytes, what) << unused) >> unused;
      break;
    }
    case Kind::Float: {
      const uint64_t b = r.bits(t.bytes, what);
      v.v = t.bytes == 4 ? double(std::bit_cast<float>(uint32_t(b))) : std::bit_cast<double>(b);
      break;
    }
    case Kind::Bool: {
      const uint64_t b = r.bits(1, what);
      FLASHMAP_CHECK(b <= 1, "{}: {} is a bool of value {}", r.path, what, b);
      v.v = b != 0;
      break;
    }
    case Kind::String:
      v.v = r.str(what);
      break;
    case Kind::Array: {
      FLASHMAP_CHECK(depth < GgufFile::kMaxArrayDepth, "{}: {} nests arrays deeper than {}", r.path,
                     what, GgufFile::kMaxArrayDepth);
      const uint32_t elem = r.get<uint32_t>(what + "'s element type");
      FLASHMAP_CHECK(min_size(elem) > 0, "{}: {} holds elements of unknown type {}", r.path, what,
                     elem);
      const uint64_t n = r.get<uint64_t>(what + "'s length");
      // Every element takes at least min_size bytes: a count the rest of the file cannot hold
      // is refused before anything is allocated.
      FLASHMAP_CHECK(n <= (r.size - r.pos) / min_size(elem),
                     "{}: {} claims {} elements, more than the rest of the file holds", r.path,
                     what, n);
      std::vector<GgufValue> items;
      items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i)
        items.push_back(read_value(r, elem, fmt::format("{}[{}]", what, i), depth + 1));
      v.v = std::move(items);
      break;
    }
  }
  return v;
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
      return "F32";
    case GgmlType::F16:
      return "F16";
    case GgmlType::BF16:
      return "BF16";
    case GgmlType::Q4_0:
      return "Q4_0";
    case GgmlType::Q4_1:
      return "Q4_1";
    case GgmlType::Q5_0:
      return "Q5_0";
    case GgmlType::Q5_1:
      return "Q5_1";
    case GgmlType::Q8_0:
      return "Q8_0";
    case GgmlType::Q4_K:
      return "Q4_K";
    case GgmlType::Q5_K:
      return "Q5_K";
    case GgmlType::Q6_K:
      return "Q6_K";
  }
  return fmt::format("type {}", type);
}

bool ggml_type_known(uint32_t type) {
  return ggml_type_name(type).rfind("type ", 0) != 0;
}

std::optional<DType> ggml_float_dtype(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return DType::F32;
    case GgmlType::F16:
      return DType::F16;
    case GgmlType::BF16:
      return DType::BF16;
    default:
      return std::nullopt;
  }
}

int64_t ggml_block_elems(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
      return 1;
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
      return 32;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return 256;
  }
  return 0;
}

int64_t ggml_block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return 4;
    case GgmlType::F16:
    case GgmlType::BF16:
      return 2;
    case GgmlType::Q4_0:
      return 18;
    case GgmlType::Q4_1:
      return 20;
    case GgmlType::Q5_0:
      return 22;
    case GgmlType::Q5_1:
      return 24;
    case GgmlType::Q8_0:
      return 34;
    case GgmlType::Q4_K:
      return 144;
    case GgmlType::Q5_K:
      return 176;
    case GgmlType::Q6_K:
      return 210;
  }
  return 0;
}

namespace {

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// A K-quant block's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K and Q5_K blocks: d, dmin, the 6-bit scales and mins, then 32 bytes of nibbles qs per
// pair of sub-blocks (the first one's codes in the low nibbles); Q5_K's sub-block j has its fifth
// bits at bit j of the 32 bytes qh.
void unpack_k_min(const uint8_t* block, const uint8_t* qh, const uint8_t* qs, uint16_t& d,
                  uint16_t& dmin, uint8_t (&sc)[8], uint8_t (&m)[8], uint8_t (&q)[256]) {
  std::memcpy(&d, block, 2);
  std::memcpy(&dmin, block + 2, 2);
  for (int j = 0; j < 8; ++j) scale_min_k4(j, block + 4, sc[j], m[j]);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      const int h = qh ? qh[l] >> (2 * p) : 0;
      q[64 * p + l] = uint8_t((qs[32 * p + l] & 0xF) | (h & 1) << 4);
      q[64 * p + 32 + l] = uint8_t((qs[32 * p + l] >> 4) | (h >> 1 & 1) << 4);
    }
}

}  // namespace

void unpack_q4_k(const uint8_t* block, uint16_t& d, uint16_t& dmin, uint8_t (&sc)[8],
                 uint8_t (&m)[8], uint8_t (&q)[256]) {
  unpack_k_min(block, nullptr, block + 16, d, dmin, sc, m, q);
}

void unpack_q5_k(const uint8_t* block, uint16_t& d, uint16_t& dmin, uint8_t (&sc)[8],
                 uint8_t (&m)[8], uint8_t (&q)[256]) {
  unpack_k_min(block, block + 16, block + 48, d, dmin, sc, m, q);
}

void unpack_q6_k(const uint8_t* block, uint16_t& d, int8_t (&sc)[16], uint8_t (&q)[256]) {
  std::memcpy(sc, block + 192, 16);
  std::memcpy(&d, block + 208, 2);
  // Per half of 128: the low 4 bits of codes l and l + 64 in ql[l]'s nibbles (l < 64), the high
  // 2 bits of codes l, l + 32, l + 64, l + 96 in qh[l] (l < 32), two at a time from bit 0.
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32) {
    uint8_t* o = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      o[l] = uint8_t((ql[l] & 0xF) | (qh[l] & 3) << 4);
      o[l + 32] = uint8_t((ql[l + 32] & 0xF) | (qh[l] >> 2 & 3) << 4);
      o[l + 64] = uint8_t((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
      o[l + 96] = uint8_t((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
    }
  }
}

// The 32 five-bit codes of a Q5_0 or Q5_1 block (low nibbles in qs, fifth bits in the 32-bit qh):
// f(i, code) for element i.
template <class F>
void five_bit_codes(const uint8_t* qh_bytes, const uint8_t* qs, F&& f) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    f(j, int((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)));
    f(j + 16, int((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)));
  }
}

void dequantize_row(GgmlType type, const uint8_t* src, float* y, int64_t n) {
  const int64_t QK = ggml_block_elems(type), bytes = ggml_block_bytes(type);
  FLASHMAP_ASSERT(QK > 0 && n % QK == 0);
  const int64_t blocks = n / QK;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* x = src + b * bytes;
    switch (type) {
      case GgmlType::F32:
        std::memcpy(y, x, 4);
        break;
      case GgmlType::F16:
        *y = half(x);
        break;
      case GgmlType::BF16: {
        uint16_t h;
        std::memcpy(&h, x, 2);
        *y = bf16_to_f32(h);
        break;
      }
      case GgmlType::Q8_0: {
        const float d = half(x);
        for (int j = 0; j < 32; ++j) y[j] = float(int8_t(x[2 + j])) * d;
        break;
      }
      case GgmlType::Q4_0: {
        const float d = half(x);
        const uint8_t* qs = x + 2;
        for (int j = 0; j < 16; ++j) {
          y[j] = float(int(qs[j] & 0x0F) - 8) * d;
          y[j + 16] = float(int(qs[j] >> 4) - 8) * d;
        }
        break;
      }
      case GgmlType::Q4_1: {
        const float d = half(x), m = half(x + 2);
        const uint8_t* qs = x + 4;
        for (int j = 0; j < 16; ++j) {
          y[j] = float(qs[j] & 0x0F) * d + m;
          y[j + 16] = float(qs[j] >> 4) * d + m;
        }
        break;
      }
      case GgmlType::Q5_0: {
        const float d = half(x);
        five_bit_codes(x + 2, x + 6, [&](int i, int q) { y[i] = float(q - 16) * d; });
        break;
      }
      case GgmlType::Q5_1: {
        const float d = half(x), m = half(x + 2);
        five_bit_codes(x + 4, x + 8, [&](int i, int q) { y[i] = float(q) * d + m; });
        break;
      }
      case GgmlType::Q4_K: {
        // unpack_q4_k's codes, read in place (32 bytes per pair of sub-blocks, the first one's
        // in the low nibbles) so that the loops vectorize.
        const float d = half(x), dmin = half(x + 2);
        const uint8_t* qs = x + 16;
        for (int j = 0; j < 8; j += 2, qs += 32) {
          uint8_t sc, m;
          scale_min_k4(j, x + 4, sc, m);
          const float d1 = d * sc, m1 = dmin * m;
          scale_min_k4(j + 1, x + 4, sc, m);
          const float d2 = d * sc, m2 = dmin * m;
          for (int l = 0; l < 32; ++l) y[32 * j + l] = d1 * float(qs[l] & 0xF) - m1;
          for (int l = 0; l < 32; ++l) y[32 * j + 32 + l] = d2 * float(qs[l] >> 4) - m2;
        }
        break;
      }
      case GgmlType::Q5_K: {
        const float d = half(x), dmin = half(x + 2);
        const uint8_t* scales = x + 4;
        const uint8_t* qh = x + 16;
        const uint8_t* ql = x + 48;
        float* out = y;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
          uint8_t sc, m;
          scale_min_k4(is, scales, sc, m);
          const float d1 = d * sc, m1 = dmin * m;
          scale_min_k4(is + 1, scales, sc, m);
          const float d2 = d * sc, m2 = dmin * m;
          for (int l = 0; l < 32; ++l)
            *out++ = d1 * float((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
          for (int l = 0; l < 32; ++l)
            *out++ = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
          ql += 32;
          u1 = uint8_t(u1 << 2);
          u2 = uint8_t(u2 << 2);
        }
        break;
      }
      case GgmlType::Q6_K: {
        const uint8_t* ql = x;
        const uint8_t* qh = x + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
        const float d = half(x + 208);
        float* out = y;
        for (int n128 = 0; n128 < 256; n128 += 128) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            out[l] = d * float(sc[is + 0]) * float(q1);
            out[l + 32] = d * float(sc[is + 2]) * float(q2);
            out[l + 64] = d * float(sc[is + 4]) * float(q3);
            out[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
          out += 128;
          ql += 64;
          qh += 32;
          sc += 8;
        }
        break;
      }
    }
    y += QK;
  }
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  read_one(path, true);
  // A split model: NAME-00001-of-0000N.gguf names its N − 1 siblings.
  const auto count = integer("split.count");
  if (!count || *count <= 1) return;
  FLASHMAP_CHECK(*count <= kMaxSplits, "{}: split.count is {}, more than {}", path, *count,
                 kMaxSplits);
  static const std::regex kSplit(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  FLASHMAP_CHECK(std::regex_match(path, m, kSplit) && std::stoll(m[2].str()) == 1 &&
                     std::stoll(m[3].str()) == *count,
                 "{}: split.count is {}, but the name is not NAME-00001-of-{:05d}.gguf", path,
                 *count, *count);
  for (int64_t i = 2; i <= *count; ++i)
    read_one(fmt::format("{}-{:05d}-of-{:05d}.gguf", m[1].str(), i, *count), false);
}

GgufFile::~GgufFile() = default;

void GgufFile::read_one(const std::string& path, bool first) {
  const int fd = open_regular_file(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    FLASHMAP_CHECK(false, "{}: cannot stat ({})", path, std::strerror(errno));
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 24) {
    ::close(fd);
    FLASHMAP_CHECK(false, "{}: not a GGUF file ({} bytes, shorter than its header)", path, size);
  }
  auto map = std::make_unique<MappedFile>(fd, size_t(size), path);  // owns fd
  Reader r{map->data(), size, 0, path};
  FLASHMAP_CHECK(r.get<uint32_t>("magic") == kMagic, "{}: not a GGUF file (no GGUF magic)", path);
  const uint32_t version = r.get<uint32_t>("version");
  FLASHMAP_CHECK(version == 2 || version == 3,
                 "{}: GGUF version {} (this engine reads versions 2 and 3)", path, version);
  const uint64_t n_tensors = r.get<uint64_t>("tensor_count");
  const uint64_t n_kv = r.get<uint64_t>("metadata_kv_count");
  // A tensor's entry takes at least 8 + 4 + 8 + 4 + 8 bytes, a key/value at least 8 + 4 + 1.
  FLASHMAP_CHECK(n_tensors <= kMaxTensors && n_tensors <= size / 32,
                 "{}: tensor_count {} is more than the file can hold", path, n_tensors);
  FLASHMAP_CHECK(n_kv <= kMaxMetadata && n_kv <= size / 13,
                 "{}: metadata_kv_count {} is more than the file can hold", path, n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = r.str(fmt::format("metadata key {}", i));
    const uint32_t type = r.get<uint32_t>(fmt::format("metadata '{}''s type", key));
    GgufValue v = read_value(r, type, fmt::format("metadata '{}'", key), 0);
    FLASHMAP_CHECK(!first || metadata_.count(key) == 0, "{}: metadata key '{}' appears twice", path,
                   key);
    if (first) metadata_.emplace(key, std::move(v));
  }
  uint64_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); first && it != metadata_.end()) {
    const auto* a = std::get_if<uint64_t>(&it->second.v);
    FLASHMAP_CHECK(a && *a >= 1 && *a <= 65536 && (*a & (*a - 1)) == 0,
                   "{}: general.alignment must be a power of two up to 65536", path);
    alignment = *a;
  }
  struct Entry {
    GgufTensor t;
    uint64_t offset;
  };
  std::vector<Entry> entries;
  entries.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Entry e;
    e.t.name = r.str(fmt::format("tensor {}'s name", i));
    const std::string what = fmt::format("tensor '{}'", e.t.name);
    const uint32_t n_dims = r.get<uint32_t>(what + "'s n_dims");
    FLASHMAP_CHECK(n_dims >= 1 && n_dims <= uint32_t(kMaxDims), "{}: {} has {} dimensions", path,
                   what, n_dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.get<uint64_t>(what + "'s dimensions");
      FLASHMAP_CHECK(
          dim >= 1 && dim <= (uint64_t(1) << 40) && uint64_t(numel) <= (uint64_t(1) << 48) / dim,
          "{}: {} has dimension {} = {}, or more than 2^48 elements", path, what, d, dim);
      e.t.dims.push_back(int64_t(dim));
      numel *= int64_t(dim);
    }
    const uint32_t type = r.get<uint32_t>(what + "'s type");
    FLASHMAP_CHECK(ggml_type_known(type),
                   "{}: {} has {}, which this engine does not read (F32, F16, BF16, Q4_0, Q4_1, "
                   "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                   path, what, ggml_type_name(type));
    e.t.type = GgmlType(type);
    const int64_t qk = ggml_block_elems(e.t.type);
    FLASHMAP_CHECK(e.t.dims[0] % qk == 0,
                   "{}: {} is {} with rows of {} elements, not a multiple of its {}-element blocks",
                   path, what, ggml_type_name(type), e.t.dims[0], qk);
    e.t.bytes = uint64_t(numel / qk) * uint64_t(ggml_block_bytes(e.t.type));
    e.offset = r.get<uint64_t>(what + "'s offset");
    FLASHMAP_CHECK(e.offset % alignment == 0, "{}: {}'s offset {} is not aligned to {}", path, what,
                   e.offset, alignment);
    e.t.file = path;
    entries.push_back(std::move(e));
  }
  const uint64_t data_start = (r.pos + alignment - 1) / alignment * alignment;
  FLASHMAP_CHECK(data_start <= size || entries.empty(),
                 "{}: the tensor data would start past the end of the file", path);
  const uint64_t data_len = data_start <= size ? size - data_start : 0;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.offset < b.offset; });
  uint64_t end = 0;
  for (auto& e : entries) {
    FLASHMAP_CHECK(e.offset <= data_len && e.t.bytes <= data_len - e.offset,
                   "{}: tensor '{}' ({} bytes at offset {}) runs past the end of the data ({} "
                   "bytes): truncated",
                   path, e.t.name, e.t.bytes, e.offset, data_len);
    FLASHMAP_CHECK(e.offset >= end, "{}: tensor '{}' overlaps the tensor before it", path,
                   e.t.name);
    end = e.offset + e.t.bytes;
    e.t.data = map->data() + data_start + e.offset;
    e.t.file_offset = data_start + e.offset;
    FLASHMAP_CHECK(tensors_.count(e.t.name) == 0, "{}: tensor '{}' appears twice", path, e.t.name);
    std::string name = e.t.name;
    tensors_.emplace(std::move(name), std::move(e.t));
  }
  maps_.push_back(std::move(map));
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  FLASHMAP_CHECK(it != tensors_.end(), "{}: no tensor '{}'", path_, name);
  return it->second;
}

std::optional<std::string> GgufFile::string(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  const auto* s = std::get_if<std::string>(&it->second.v);
  FLASHMAP_CHECK(s, "{}: metadata '{}' is not a string", path_, key);
  return *s;
}

std::optional<int64_t> GgufFile::integer(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&it->second.v)) return *i;
  const auto* u = std::get_if<uint64_t>(&it->second.v);
  FLASHMAP_CHECK(u && *u <= uint64_t(INT64_MAX), "{}: metadata '{}' is not an integer", path_, key);
  return int64_t(*u);
}

std::optional<double> GgufFile::number(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  if (const auto* d = std::get_if<double>(&it->second.v)) return *d;
  return double(*integer(key));
}

const std::vector<GgufValue>* GgufFile::array(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return nullptr;
  const auto* a = std::get_if<std::vector<GgufValue>>(&it->second.v);
  FLASHMAP_CHECK(a, "{}: metadata '{}' is not an array", path_, key);
  return a;
}

void GgufFile::check_unchanged() const {
  for (const auto& m : maps_) m->check_unchanged();
}

bool GgufFile::drop_pages(const void* p, size_t n) const {
  for (const auto& m : maps_)
    if (m->drop_pages(p, n)) return true;
  return false;
}

}  // namespace flashmap
