// tokenizer.json loading (BPE model, vocab, merges, added tokens, normalizer, pre-tokenizer,
// decoder), then the loaded tokenizer used: a fixed text encoded, its ids decoded and streamed,
// every id's bytes looked up.
#include <flashmap/tokenizer.h>

#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"

using namespace flashmap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string path =
      fuzz::input_file(std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean("Tokenizer::from_file", [&] {
    const Tokenizer tok = Tokenizer::from_file(path);
    const size_t n = tok.vocab_size();
    FUZZ_REQUIRE(n <= (size_t(1) << 24), "vocab_size {} past the tokenizer's id bound", n);
    std::vector<int32_t> ids;
    fuzz::expect_clean("encode", [&] {
      ids = tok.encode("Hello, world! <|im_start|>user\n  tabs\there 123 héllo 日本語 🙂\r\n");
    });
    for (int32_t id : ids)
      FUZZ_REQUIRE(id >= 0 && size_t(id) < n, "encode gave id {} of a vocabulary of {}", id, n);
    for (bool skip : {false, true}) {
      std::string whole;
      if (!fuzz::expect_clean("decode", [&] { whole = tok.decode(ids, skip); })) continue;
      Tokenizer::StreamDecoder s(tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += s.push(id);
      streamed += s.flush();
      FUZZ_REQUIRE(streamed == whole, "streamed decode differs from decode");
    }
    for (size_t id = 0; id < std::min<size_t>(n, 4096); ++id) {
      (void)tok.id_to_token(int32_t(id));
      (void)tok.token_bytes(int32_t(id));
      (void)tok.is_special(int32_t(id));
    }
  });
  return 0;
}
