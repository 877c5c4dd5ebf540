// Reading the files of model and tokenizer folders, and JSON from anywhere, without trusting them.
// Those files are found by name (config.json, model.safetensors, tokenizer.json, ...), so anything
// but a regular file there is a mistake or an attack: a FIFO blocks open() forever, a device reads
// forever, a directory fails late and obscurely. JSON is parsed iteratively by nlohmann::json, but
// dumped, compared and walked recursively, so 100k levels of '[' overflow the stack later on.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace flashmap {

// Deepest nesting of arrays and objects accepted in JSON input. Configs and tokenizers nest a few
// levels; chat requests with tool schemas a dozen or two.
inline constexpr int kMaxJsonDepth = 64;

// Largest config-like JSON file read whole (config.json, generation_config.json,
// model.safetensors.index.json, tokenizer_config.json, chat templates): real ones are kilobytes.
inline constexpr size_t kMaxConfigFileBytes = size_t(64) << 20;

// Throws flashmap::Error "WHAT: JSON nested deeper than 64 levels" when `text` nests arrays and
// objects deeper than kMaxJsonDepth (brackets inside strings do not count). Linear, allocates
// nothing; call it before parsing.
void check_json_depth(std::string_view text, const std::string& what);

// Opens `path` read-only if it is a regular file, else throws flashmap::Error naming it
// ("PATH: cannot open (No such file or directory)", "PATH: not a regular file (a FIFO)"). stat()
// comes first, since opening a FIFO would block; the descriptor is checked again with fstat()
// in case the file was swapped in between. The caller closes the descriptor.
int open_regular_file(const std::string& path);

// The whole of the regular file `path`; a file larger than `max_bytes` is refused before it is
// read ("PATH: N bytes, more than the M this file may have").
std::string read_regular_file(const std::string& path, size_t max_bytes);

// Where the engine keeps what it makes once and reuses (the noise factors of a drafter's target,
// the model folders of GGUF targets): $FLASHMAP_CACHE_DIR, else $XDG_CACHE_HOME/flashmap, else
// $HOME/.cache/flashmap; empty with FLASHMAP_CACHE_DIR=off or no home.
std::string cache_dir();

// A file named on the command line: a regular file, or a pipe or terminal (process substitution,
// /dev/stdin), read to its end; more than `max_bytes` is refused, and so is a directory.
std::string read_input_file(const std::string& path, size_t max_bytes);

// A file written whole or not at all: the bytes go to a new temporary file beside `path`
// ("PATH.tmp-..."), which commit() flushes to the disk and renames to `path`. A failure on the
// way (a read-only folder, a full disk, a file size limit) throws flashmap::Error naming `path`
// and the system's reason ("PATH: cannot write (No space left on device)") and removes the
// temporary file, so that `path` holds either what it held before or the complete new file,
// never part of one. Destroyed without commit(): the temporary file is removed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();

 private:
  void fail(const char* what);  // removes the temporary file and throws
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace flashmap
