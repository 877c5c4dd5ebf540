// A Qwen3 GGUF (llama.cpp's file, one or split) as a Hugging Face folder this engine and
// transformers load: config.json and generation_config.json from the GGUF's metadata
// (`qwen3.*`, `tokenizer.ggml.*_token_id`), model.safetensors with the tensors under their
// transformers names, and, when the GGUF holds its tokenizer (`tokenizer.ggml.model` "gpt2" with
// the "qwen2" pre-tokenizer), tokenizer.json and tokenizer_config.json (with
// `tokenizer.chat_template`).
//
// F32, F16 and BF16 tensors are copied byte for byte; quantized ones (Q8_0, Q4_K, Q6_K, ...) are
// dequantized to F32 as ggml does (io/gguf.h), so the folder computes what the GGUF computes.
// Tensors are written one row block at a time: memory stays a few MB whatever the model's size.
// Or the folder links to the GGUF instead (GgufTensors::Link), whose tensors are then read in
// place. The folder is written beside OUT and renamed into place (OUT only replaced with `force`).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flashmap {

class GgufFile;
struct GgufTensor;

struct GgufConvertResult {
  size_t tensors = 0;                    // tensors written
  std::vector<std::string> dequantized;  // "name (Q4_K)" for each tensor turned into F32
  bool tokenizer = false;                // tokenizer.json written from the GGUF's vocabulary
  bool chat_template = false;            // tokenizer_config.json carries the GGUF's chat template
};

// Whether `path` is a file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

// How a converted folder holds the tensors: Copy writes model.safetensors (quantized tensors
// dequantized); Link writes model.gguf, a symbolic link to the GGUF, whose tensors Checkpoint
// then maps in place (io/safetensors.h).
enum class GgufTensors { Copy, Link };

// Converts the GGUF at `in` (the first file of a split model) to the folder `out`; throws
// flashmap::Error naming the file and the field or tensor at fault (OUT left as it was).
GgufConvertResult convert_gguf(const std::string& in, const std::string& out, bool force,
                               GgufTensors mode = GgufTensors::Copy);

// The tensors of a Qwen3 GGUF under their transformers names, after the checks conversion makes
// (the architecture, each name one of a Qwen3 of the file's block count); throws naming the file.
std::vector<std::pair<std::string, const GgufTensor*>> qwen3_gguf_tensors(const GgufFile& f);

// The model folder of a Qwen3 GGUF given as a target (`--target model.gguf`): a Link folder
// made once per file (path, size and modification time) in cache_dir() (io/files.h) and reused
// after that: a few files of metadata and the link; the tensors are never copied.
std::string gguf_model_folder(const std::string& path);

}  // namespace flashmap
