// Encoding arbitrary bytes and decoding arbitrary ids with real tokenizers: the default pair's
// (byte-level BPE, 2048 ids) and Qwen3's (151,669 ids, special tokens), both NFC. The first byte
// picks the tokenizer and the operation; properties checked: encode refuses only invalid UTF-8
// and gives ids in the vocabulary, decode of encode gives ASCII text back, decode gives valid
// UTF-8, and a streamed decode equals a whole one.
#include <flashmap/tokenizer.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"
#include "text/utf8.h"

using namespace flashmap;

namespace {

const Tokenizer& tokenizer(int which) {
  static const Tokenizer small =
      Tokenizer::from_dir(fuzz::source_dir() + "/models/default/target");
  static const Tokenizer qwen = Tokenizer::from_dir(fuzz::source_dir() + "/tests/data/qwen3-tokenizer");
  return which == 0 ? small : qwen;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizer(0);
  (void)tokenizer(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 16)) return 0;
  const int which = data[0] & 1;
  const int op = (data[0] >> 1) % 3;
  const bool skip = data[0] & 8;
  const Tokenizer& tok = tokenizer(which);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<int32_t> ids;
  if (op == 0) {
    // Bytes to ids (and back).
    if (!fuzz::expect_clean("encode", [&] { ids = tok.encode(rest); })) {
      FUZZ_REQUIRE(!utf8::valid(rest), "encode refused valid UTF-8");
      return 0;
    }
    for (int32_t id : ids)
      FUZZ_REQUIRE(id >= 0 && size_t(id) < tok.vocab_size(), "encode gave id {}", id);
    // ASCII text is its own NFC form, and byte-level BPE spells every byte: decode gives it back.
    const bool ascii = std::all_of(rest.begin(), rest.end(), [](char c) { return uint8_t(c) < 128; });
    if (ascii && !skip) {
      std::string back;
      fuzz::expect_clean("decode", [&] { back = tok.decode(ids, false); });
      FUZZ_REQUIRE(back == rest, "decode(encode(text)) != text");
    }
  } else {
    // Little-endian int32 ids; op 2 keeps them in the vocabulary.
    for (size_t i = 0; i + 4 <= rest.size(); i += 4) {
      int32_t id;
      std::memcpy(&id, rest.data() + i, 4);
      if (op == 2) id = int32_t(uint32_t(id) % uint32_t(tok.vocab_size()));
      ids.push_back(id);
    }
  }
  std::string whole;
  const bool decoded = fuzz::expect_clean("decode", [&] { whole = tok.decode(ids, skip); });
  FUZZ_REQUIRE(!decoded || utf8::valid(whole), "decode gave invalid UTF-8");
  Tokenizer::StreamDecoder s(tok, skip);
  std::string streamed;
  fuzz::expect_clean("stream", [&] {
    for (int32_t id : ids) streamed += s.push(id);
    streamed += s.flush();
  });
  if (decoded) FUZZ_REQUIRE(streamed == whole, "streamed decode differs from decode");
  return 0;
}
