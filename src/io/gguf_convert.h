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
// The folder is written beside OUT and renamed into place (OUT only replaced with `force`).
#pragma once

#include <string>
#include <vector>

namespace flashmap {

struct GgufConvertResult {
  size_t tensors = 0;                    // tensors written
  std::vector<std::string> dequantized;  // "name (Q4_K)" for each tensor turned into F32
  bool tokenizer = false;                // tokenizer.json written from the GGUF's vocabulary
  bool chat_template = false;            // tokenizer_config.json carries the GGUF's chat template
};

// Whether `path` is a file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

// Converts the GGUF at `in` (the first file of a split model) to the folder `out`; throws
// flashmap::Error naming the file and the field or tensor at fault (OUT left as it was).
GgufConvertResult convert_gguf(const std::string& in, const std::string& out, bool force);

}  // namespace flashmap
