#include "models/noise_cache.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/dtype.h"
#include "io/files.h"

namespace flashmap::noise_cache {

namespace {

constexpr char kMagic[8] = {'F', 'M', 'N', 'O', 'I', 'S', 'E', '1'};

// The file: this header, then H·H float32 (L row-major), then XXH3-64 of those floats.
struct Header {
  char magic[8];
  uint64_t key, hidden, vocab;
};

void warn(const std::string& file, const std::string& what) {
  fmt::print(stderr, "flashmap: warning: ignoring the noise-factor cache {}: {}\n", file, what);
}

}  // namespace

std::string dir() {
  return cache_dir();
}

uint64_t key(const Weight& e) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  if (e.blocks) {  // its encoding and its bytes (never equal to a float table's key)
    const uint64_t head[4] = {~uint64_t(0), e.blocks->tag, uint64_t(e.rows), uint64_t(e.cols)};
    XXH3_64bits_update(st, head, sizeof(head));
    XXH3_64bits_update(st, e.blocks->bytes.data(), e.blocks->bytes.size());
  } else {
    const int64_t shape[3] = {int64_t(e.dtype), e.rows, e.cols};
    XXH3_64bits_update(st, shape, sizeof(shape));
    XXH3_64bits_update(st, e.data, size_t(e.rows) * size_t(e.cols) * dtype_size(e.dtype));
  }
  const uint64_t k = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return k;
}

std::string path(const std::string& dir, uint64_t key, int64_t hidden) {
  return (std::filesystem::path(dir) / fmt::format("noise-factor-{:016x}-h{}.bin", key, hidden))
      .string();
}

std::optional<std::vector<float>> load(const std::string& dir, uint64_t key, int64_t hidden,
                                       int64_t vocab) {
  if (dir.empty()) return std::nullopt;
  const std::string file = path(dir, key, hidden);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::nullopt;
  const size_t n = size_t(hidden) * size_t(hidden);
  const uintmax_t want = sizeof(Header) + n * sizeof(float) + sizeof(uint64_t);
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec || size != want) {
    warn(file, fmt::format("{} bytes, expected {}", ec ? 0 : size, want));
    return std::nullopt;
  }
  std::ifstream in(file, std::ios::binary);
  Header h{};
  std::vector<float> factor(n);
  uint64_t sum = 0;
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  in.read(reinterpret_cast<char*>(factor.data()), std::streamsize(n * sizeof(float)));
  in.read(reinterpret_cast<char*>(&sum), sizeof(sum));
  if (!in) {
    warn(file, "cannot read it");
    return std::nullopt;
  }
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    warn(file, "not a noise-factor file");
    return std::nullopt;
  }
  if (h.key != key || h.hidden != uint64_t(hidden) || h.vocab != uint64_t(vocab)) {
    warn(file, "made for another embedding");
    return std::nullopt;
  }
  if (XXH3_64bits(factor.data(), n * sizeof(float)) != sum) {
    warn(file, "its checksum does not match (corrupt)");
    return std::nullopt;
  }
  return factor;
}

void store(const std::string& dir, uint64_t key, int64_t hidden, int64_t vocab,
           const std::vector<float>& factor) {
  if (dir.empty()) return;
  const std::string file = path(dir, key, hidden);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.key = key;
  h.hidden = uint64_t(hidden);
  h.vocab = uint64_t(vocab);
  const uint64_t sum = XXH3_64bits(factor.data(), factor.size() * sizeof(float));
  // Through a temporary file and a rename: a full disk or a read-only folder leaves no partial
  // file under the cache's name, only this warning.
  try {
    AtomicFile out(file);
    out.write(&h, sizeof(h));
    out.write(factor.data(), factor.size() * sizeof(float));
    out.write(&sum, sizeof(sum));
    out.commit();
  } catch (const Error& e) {
    fmt::print(stderr, "flashmap: warning: could not write the noise-factor cache: {}\n", e.what());
  }
}

}  // namespace flashmap::noise_cache
