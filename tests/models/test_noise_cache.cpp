// The noise factor's disk cache (models/noise_cache.h): a second load of the same target reads
// the factor a first one computed, bit for bit; a truncated, corrupt or foreign file is ignored
// (and replaced), never used; FLASHMAP_CACHE_DIR=off writes nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/flashmap.h"
#include "models/noise_cache.h"
#include "models/qwen3.h"

using namespace flashmap;
namespace fs = std::filesystem;

namespace {
const std::string kA = "tests/fixtures/tiny-a";

class NoiseCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flashmap-noise-cache-" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    setenv("FLASHMAP_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("FLASHMAP_CACHE_DIR");
    fs::remove_all(dir_);
  }
  // A fresh drafter over `target`: its factor, and whether it came from the cache.
  std::pair<std::vector<float>, bool> factor() {
    FlashMapModel draft(kA + "/draft", target_);
    const auto f = draft.noise_factor();
    return {f, draft.noise_factor_from_cache()};
  }
  std::string file() {
    const Weight& E = target_.embedding();
    return noise_cache::path(dir_.string(), noise_cache::key(E), E.cols);
  }
  Qwen3Model target_{kA + "/target"};
  fs::path dir_;
};
}  // namespace

TEST_F(NoiseCache, ASecondLoadReadsTheFactorBitForBit) {
  const auto [computed, cached0] = factor();
  EXPECT_FALSE(cached0);
  ASSERT_TRUE(fs::exists(file()));
  const auto [read, cached1] = factor();
  EXPECT_TRUE(cached1);
  EXPECT_EQ(read, computed);
  // L Lᵀ = EᵀE within fp32 rounding: what is read is the factor, not just a file's bytes.
  const Weight& E = target_.embedding();
  const int64_t H = E.cols, V = E.rows;
  std::vector<float> e(size_t(V * H));
  for (int64_t r = 0; r < V; ++r) E.row_f32(r, e.data() + r * H);
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < H; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double g = 0, ll = 0;
      for (int64_t v = 0; v < V; ++v) g += double(e[size_t(v * H + i)]) * e[size_t(v * H + j)];
      for (int64_t k = 0; k <= j; ++k)
        ll += double(read[size_t(i * H + k)]) * read[size_t(j * H + k)];
      worst = std::max(worst, std::abs(g - ll));
      scale = std::max(scale, std::abs(g));
    }
  EXPECT_LT(worst, 1e-4 * scale);
}

TEST_F(NoiseCache, BadFilesAreIgnoredAndReplaced) {
  const auto [computed, cached0] = factor();
  ASSERT_FALSE(cached0);
  const std::string f = file();
  std::string bytes;
  {
    std::ifstream in(f, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) {
    std::ofstream out(f, std::ios::binary | std::ios::trunc);
    out.write(b.data(), std::streamsize(b.size()));
  };
  std::string corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= 0x10;  // a payload byte: the checksum catches it
  std::string foreign = bytes;
  foreign[8] ^= 0x01;  // the key in the header: made for another embedding
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  for (const std::string& bad : {bytes.substr(0, bytes.size() - 1), bytes.substr(0, 40), corrupt,
                                 foreign, wrong_magic, std::string()}) {
    write(bad);
    const auto [f2, cached] = factor();
    EXPECT_FALSE(cached);
    EXPECT_EQ(f2, computed);
    // Replaced by a good file: the next load reads it.
    EXPECT_TRUE(factor().second);
  }
}

TEST_F(NoiseCache, OffWritesNothing) {
  setenv("FLASHMAP_CACHE_DIR", "off", 1);
  EXPECT_EQ(noise_cache::dir(), "");
  const auto [f, cached] = factor();
  EXPECT_FALSE(cached);
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_FALSE(factor().second);
}

// The factor formed on its own thread (what a large target's drafter does from its load on) is
// the one formed in place, bit for bit, and drafts may run meanwhile.
TEST_F(NoiseCache, TheBackgroundFactorIsTheOneFormedInPlace) {
  setenv("FLASHMAP_CACHE_DIR", "off", 1);
  const auto [in_place, cached] = factor();
  ASSERT_FALSE(cached);
  FlashMapModel draft(kA + "/draft", target_);
  draft.start_noise_factor();
  auto ctx = draft.new_context();
  Rng rng(3);
  std::vector<float> logits(size_t(draft.block_size()) * size_t(target_.config().vocab_size));
  for (int i = 0; i < 3; ++i) {
    FlashMapModel::Request r{&ctx, 5, {FlashMapModel::Noise::Draw, nullptr, &rng}};
    draft.draft({&r, 1}, 1, logits.data());
  }
  EXPECT_EQ(draft.noise_factor(), in_place);
  EXPECT_TRUE(draft.noise_factor_ready());
}
