// A fresh folder under the system's temporary directory, removed with everything in it when the
// test ends: tests that write model folders, caches or converted files work inside one.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/check.h"

namespace flashmap::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "flashmap-test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    FLASHMAP_CHECK(::mkdtemp(t.data()) != nullptr, "cannot make a temporary folder from {}", t);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // The names of the folder's entries, sorted (what a step left beside its outputs).
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::filesystem::path path;
};

}  // namespace flashmap::testing
