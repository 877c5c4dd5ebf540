// Read-only mappings of model files that survive the file changing under them.
//
// A mapped file that is truncated (or rewritten in place by `cp`, which truncates first) makes
// every read of a page past its new end a SIGBUS, which kills the process wherever the read
// happens: while the weights are packed at load, or while a server looks up embedding rows. Here
// a process-wide SIGBUS handler answers such a read inside a registered mapping with a page of
// zeros and marks the mapping as changed (one line on stderr says which file), so the read
// returns; the code reading it then checks the mapping (check_unchanged) and fails the load with
// an error instead. A SIGBUS anywhere else goes to the handler that was there before (or kills
// the process as it always did).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashmap {

class MappedFile {
 public:
  // Maps [0, size) of the open regular file `fd`, which it owns from here on, even when it throws
  // flashmap::Error (kept open: the file's size and modification time are compared with the
  // mapping's later). `path` names it in errors.
  MappedFile(int fd, size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool contains(const void* p, size_t n) const;
  // Hands the whole pages inside [p, p + n) back to the kernel (they are read again from the
  // file if touched): once a weight is packed into memory of its own, its file pages need not
  // stay resident. False when the range is not in this mapping.
  bool drop_pages(const void* p, size_t n) const;

  // Throws flashmap::Error naming the file when it no longer holds what was mapped: a read found
  // it shorter (and got zeros), or it is now shorter or was modified since it was opened.
  void check_unchanged() const;
  // The same as a message, empty while the file is unchanged.
  std::string change() const;

 private:
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  int64_t mtime_ns_ = 0;
  int slot_ = -1;  // in the SIGBUS handler's table; -1: not guarded (the table was full)
};

// The first mapped file (of those still mapped) that changed since it was mapped, as
// MappedFile::change() words it; empty when none did. Checks every mapping's size and
// modification time, so that a server can tell that the weights it reads are no longer the
// ones it loaded.
std::string changed_mapped_file();

}  // namespace flashmap
