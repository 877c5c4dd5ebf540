// The tokenizer against Hugging Face `tokenizers`: every expected id and string here was produced
// by HF (tools/make_tokenizer_goldens.py), never by flashmap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/check.h"
#include "error_of.h"
#include "flashmap/tokenizer.h"
#include "text/unicode.h"
#include "text/utf8.h"

using flashmap::testing::error_of;

namespace {

using flashmap::Tokenizer;
using json = nlohmann::json;
using ::testing::HasSubstr;

const char* kQwenDir = "tests/data/qwen3-tokenizer";
const char* kCorpus = "tests/data/tokenizer_corpus.jsonl";
const char* kGolden = "tests/data/tokenizer_golden.jsonl";

struct Data {
  std::vector<std::string> corpus;
  std::vector<json> encode, decode, tokenizers, tiny, tiny_decode;
};

const Data& data() {
  static const Data d = [] {
    Data d;
    std::ifstream c(kCorpus);
    EXPECT_TRUE(c) << kCorpus;
    for (std::string line; std::getline(c, line);) d.corpus.push_back(json::parse(line));
    std::ifstream g(kGolden);
    EXPECT_TRUE(g) << kGolden;
    for (std::string line; std::getline(g, line);) {
      json r = json::parse(line);
      const std::string kind = r["kind"];
      if (kind == "encode")
        d.encode.push_back(std::move(r));
      else if (kind == "decode")
        d.decode.push_back(std::move(r));
      else if (kind == "tokenizer")
        d.tokenizers.push_back(std::move(r));
      else if (kind == "tiny")
        d.tiny.push_back(std::move(r));
      else if (kind == "tiny_decode")
        d.tiny_decode.push_back(std::move(r));
    }
    return d;
  }();
  return d;
}

const Tokenizer& qwen() {
  static const Tokenizer t = Tokenizer::from_dir(kQwenDir);
  return t;
}

std::string preview(std::string_view s) {
  const std::string p =
      json(std::string(s.substr(0, 80))).dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? p + "..." : p;
}

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

std::string temp_path(const std::string& name) {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path() /
             ("flashmap-tok-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string write_temp(const std::string& name, const std::string& content) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

bool valid_utf8(std::string_view s) {
  return flashmap::utf8::valid(s);
}

// ---------------------------------------------------------------------------------------------
// Goldens

TEST(TokenizerGolden, CorpusIsLargeAndAdversarial) {
  const Data& d = data();
  ASSERT_GT(d.corpus.size(), 3000u);
  ASSERT_EQ(d.encode.size(), d.corpus.size());
  size_t bytes = 0, longest = 0;
  for (const auto& s : d.corpus) {
    bytes += s.size();
    longest = std::max(longest, s.size());
  }
  EXPECT_GT(bytes, 500'000u);
  EXPECT_GT(longest, 10'000u);
}

TEST(TokenizerGolden, Qwen3EncodeMatchesHF) {
  const Data& d = data();
  size_t bad = 0;
  for (const json& r : d.encode) {
    const std::string& text = d.corpus.at(r["i"].get<size_t>());
    const auto ids = qwen().encode(text);
    if (ids != ids_of(r["ids"])) {
      if (++bad <= 10)
        ADD_FAILURE() << "line " << r["i"] << " " << preview(text) << "\n  ours: " << json(ids)
                      << "\n  HF:   " << r["ids"];
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << d.encode.size() << " lines";
}

TEST(TokenizerGolden, Qwen3DecodeOfEncodeIsNfcText) {
  const Data& d = data();
  size_t bad = 0;
  for (const json& r : d.encode) {
    const std::string& text = d.corpus.at(r["i"].get<size_t>());
    // HF's decode(encode(x)); for valid text it is x normalized (x itself when x is NFC).
    const std::string expected = r.contains("decoded") ? r["decoded"].get<std::string>() : text;
    if (!r.contains("nfc")) {
      EXPECT_EQ(expected, text);
    }
    const std::string ours = qwen().decode(ids_of(r["ids"]));
    if (ours != expected && ++bad <= 10)
      ADD_FAILURE() << "line " << r["i"] << " " << preview(text) << " -> " << preview(ours);
  }
  EXPECT_EQ(bad, 0u);
}

TEST(TokenizerGolden, NfcMatchesHFNormalizer) {
  const Data& d = data();
  size_t bad = 0, changed = 0;
  for (const json& r : d.encode) {
    const std::string& text = d.corpus.at(r["i"].get<size_t>());
    const std::string expected = r.contains("nfc") ? r["nfc"].get<std::string>() : text;
    std::string out;
    const std::string ours = flashmap::text::nfc(text, out) ? out : text;
    changed += r.contains("nfc");
    if (ours != expected && ++bad <= 10)
      ADD_FAILURE() << "line " << r["i"] << " " << preview(text) << " -> " << preview(ours)
                    << " HF " << preview(expected);
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(changed, 100u);  // the corpus does exercise composition
}

TEST(TokenizerGolden, Qwen3DecodeMatchesHF) {
  const Data& d = data();
  ASSERT_GT(d.decode.size(), 300u);
  for (const json& r : d.decode)
    EXPECT_EQ(qwen().decode(ids_of(r["ids"]), r["skip_special"].get<bool>()),
              r["text"].get<std::string>())
        << "ids " << r["ids"] << " skip_special " << r["skip_special"];
}

TEST(TokenizerGolden, SmallTokenizersMatchHF) {
  const Data& d = data();
  ASSERT_GE(d.tokenizers.size(), 10u);
  bool saw_string_merges = false;
  for (const json& t : d.tokenizers) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    const json& merges = t["json"]["model"]["merges"];
    ASSERT_FALSE(merges.empty());
    saw_string_merges |= merges[0].is_string();
    const Tokenizer tok = Tokenizer::from_file(write_temp("tokenizer.json", t["json"].dump()));
    size_t checked = 0, bad = 0;
    for (const json& r : d.tiny) {
      if (r["name"] != name) continue;
      ++checked;
      const std::string& text = d.corpus.at(r["i"].get<size_t>());
      const auto ids = tok.encode(text);
      if (ids != ids_of(r["ids"]) && ++bad <= 5)
        ADD_FAILURE() << "line " << r["i"] << " " << preview(text) << "\n  ours: " << json(ids)
                      << "\n  HF:   " << r["ids"];
    }
    EXPECT_GT(checked, 100u);
    EXPECT_EQ(bad, 0u) << "of " << checked;
    for (const json& r : d.tiny_decode) {
      if (r["name"] != name) continue;
      EXPECT_EQ(tok.decode(ids_of(r["ids"]), r["skip_special"].get<bool>()),
                r["text"].get<std::string>())
          << "ids " << r["ids"];
    }
  }
  EXPECT_TRUE(saw_string_merges) << "no tokenizer with \"a b\" merges in the goldens";
  // The Qwen3 file itself uses the ["a", "b"] form.
  std::ifstream f(std::string(kQwenDir) + "/tokenizer.json");
  const json q = json::parse(f);
  EXPECT_TRUE(q["model"]["merges"][0].is_array());
}

TEST(TokenizerGolden, ConcurrentEncodeMatchesHF) {
  const Data& d = data();
  std::atomic<size_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = t; k < d.encode.size(); k += 2) {
        const json& r = d.encode[k];
        if (qwen().encode(d.corpus[r["i"].get<size_t>()]) != ids_of(r["ids"])) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary facts of the Qwen3 file

TEST(Tokenizer, Qwen3VocabularyAndSpecialTokens) {
  const Tokenizer& t = qwen();
  EXPECT_EQ(t.vocab_size(), 151669u);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_to_id("</think>"), 151668);
  EXPECT_EQ(t.token_to_id("!"), 0);
  EXPECT_EQ(t.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(t.id_to_token(151645), "<|im_end|>");
  EXPECT_EQ(t.id_to_token(220), "Ġ");
  EXPECT_TRUE(t.is_special(151644));
  EXPECT_FALSE(t.is_special(151657));  // <tool_call> is added but not special
  EXPECT_FALSE(t.is_special(220));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(1 << 20));
}

// ---------------------------------------------------------------------------------------------
// Streaming decoder

int32_t byte_token(const Tokenizer& t, uint8_t b) {
  std::string s;
  flashmap::utf8::append(s, flashmap::text::byte_to_char(b));
  return t.token_to_id(s).value();
}

TEST(TokenizerStream, ConcatenatedPushesEqualDecode) {
  const Data& d = data();
  size_t held_back = 0;
  for (bool skip : {true, false}) {
    for (const json& r : d.encode) {
      const auto ids = ids_of(r["ids"]);
      Tokenizer::StreamDecoder sd(qwen(), skip);
      std::string all;
      for (int32_t id : ids) {
        const std::string piece = sd.push(id);
        ASSERT_TRUE(valid_utf8(piece)) << "line " << r["i"];
        held_back += piece.empty();
        all += piece;
      }
      all += sd.flush();
      ASSERT_EQ(all, qwen().decode(ids, skip)) << "line " << r["i"];
    }
  }
  EXPECT_GT(held_back, 1000u);  // byte tokens that end inside a character do occur
}

TEST(TokenizerStream, EmojiSplitIntoByteTokens) {
  const Tokenizer& t = qwen();
  const std::string family = "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9";  // 👨‍👩
  Tokenizer::StreamDecoder sd(t);
  std::vector<std::string> out;
  for (unsigned char b : family) out.push_back(sd.push(byte_token(t, b)));
  EXPECT_EQ(out, (std::vector<std::string>{"", "", "", "\xF0\x9F\x91\xA8", "", "", "\xE2\x80\x8D",
                                           "", "", "", "\xF0\x9F\x91\xA9"}));
  EXPECT_EQ(sd.flush(), "");
}

TEST(TokenizerStream, BrokenSequencesBecomeReplacementCharacters) {
  const Tokenizer& t = qwen();
  // F0 9F is cut short by 'A': one U+FFFD, as Rust's from_utf8_lossy (and so HF) gives.
  const std::vector<int32_t> ids = {byte_token(t, 0xF0), byte_token(t, 0x9F), byte_token(t, 'A'),
                                    byte_token(t, 0xE4), byte_token(t, 0xBD)};
  Tokenizer::StreamDecoder sd(t);
  std::string all;
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(sd.push(ids[3]), "");
  EXPECT_EQ(sd.push(ids[4]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // a truncated character at the end
  EXPECT_EQ(t.decode(ids),
            "\xEF\xBF\xBD"
            "A"
            "\xEF\xBF\xBD");
}

TEST(TokenizerStream, SkipsSpecialTokensByDefault) {
  const Tokenizer& t = qwen();
  Tokenizer::StreamDecoder sd(t);
  EXPECT_EQ(sd.push(151644), "");
  EXPECT_EQ(sd.push(151657), "<tool_call>");  // added, not special
  Tokenizer::StreamDecoder keep(t, false);
  EXPECT_EQ(keep.push(151644), "<|im_start|>");
  EXPECT_THAT(error_of([&] { sd.push(151669); }), HasSubstr("151669"));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(TokenizerErrors, InvalidUtf8NamesTheByteOffset) {
  const Tokenizer& t = qwen();
  const std::pair<std::string, size_t> cases[] = {
      {"abc\xFF", 3},               // never valid
      {"ab\xC3", 2},                // truncated at the end
      {"\xC3(", 0},                 // bad continuation
      {"hello \xC0\x80", 6},        // overlong NUL
      {"x\xE0\x80\xAF", 1},         // overlong '/'
      {"12345678\xED\xA0\x80", 8},  // UTF-16 surrogate
      {"\xF4\x90\x80\x80", 0},      // past U+10FFFF
      {"<|im_start|>\x80", 12},
  };
  for (const auto& [text, offset] : cases) {
    const std::string msg = error_of([&, &text = text] { t.encode(text); });
    EXPECT_THAT(msg, HasSubstr("invalid UTF-8")) << preview(text);
    EXPECT_THAT(msg, HasSubstr(fmt::format("offset {}", offset))) << msg;
  }
}

TEST(TokenizerErrors, DecodeOfUnknownIdNamesTheId) {
  const Tokenizer& t = qwen();
  const std::vector<int32_t> too_big = {9707, 151669};
  EXPECT_THAT(error_of([&] { t.decode(too_big); }), HasSubstr("151669"));
  const std::vector<int32_t> negative = {-5};
  EXPECT_THAT(error_of([&] { t.decode(negative); }), HasSubstr("-5"));
  EXPECT_THAT(error_of([&] { t.id_to_token(200000); }), HasSubstr("200000"));
}

TEST(TokenizerErrors, MissingFileIsNamed) {
  EXPECT_THAT(error_of([] { Tokenizer::from_dir("/nonexistent/dir"); }),
              HasSubstr("/nonexistent/dir/tokenizer.json"));
}

TEST(TokenizerErrors, MalformedJsonNamesTheFile) {
  const std::string path = write_temp("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  const std::string msg = error_of([&] { Tokenizer::from_file(path); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("not valid JSON"));
}

json minimal_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    flashmap::utf8::append(s, flashmap::text::byte_to_char(static_cast<uint8_t>(b)));
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}}};
}

std::string load_error(const json& j) {
  const std::string path = write_temp("tokenizer.json", j.dump());
  const std::string msg = error_of([&] { Tokenizer::from_file(path); });
  EXPECT_THAT(msg, HasSubstr(path));
  return msg;
}

TEST(TokenizerErrors, MinimalTokenizerLoads) {
  const std::string path = write_temp("tokenizer.json", minimal_tokenizer().dump());
  const Tokenizer t = Tokenizer::from_file(path);
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{256, 'c'}));
}

TEST(TokenizerErrors, UnsupportedPartsNameTheField) {
  json j = minimal_tokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(load_error(j), HasSubstr("model.type: unsupported model type 'WordPiece'"));

  j = minimal_tokenizer();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  EXPECT_THAT(load_error(j), HasSubstr("normalizer.normalizers[1].type: unsupported normalizer"));

  j = minimal_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_THAT(load_error(j),
              HasSubstr("pre_tokenizer.type: unsupported pre-tokenizer 'Whitespace'"));

  j = minimal_tokenizer();
  j["pre_tokenizer"] = nullptr;
  EXPECT_THAT(load_error(j), HasSubstr("no ByteLevel pre-tokenizer"));

  j = minimal_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(load_error(j), HasSubstr("decoder.type: unsupported decoder 'WordPiece'"));

  j = minimal_tokenizer();
  j["model"]["merges"] = {"a b", "ab"};
  EXPECT_THAT(load_error(j), HasSubstr("model.merges[1]"));

  j = minimal_tokenizer();
  j["model"]["merges"] = json::array({json::array({"a", "x y"})});
  EXPECT_THAT(load_error(j), HasSubstr("model.merges[0]: merge of 'a' and 'x y'"));

  j = minimal_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_THAT(load_error(j), HasSubstr("pre_tokenizer.pattern: cannot compile regex"));

  j = minimal_tokenizer();
  j.erase("model");
  EXPECT_THAT(load_error(j), HasSubstr("model: missing"));
}

// ---------------------------------------------------------------------------------------------
// Unicode helpers

TEST(TokenizerUnicode, LongInputs) {
  // Deep regex backtracking (a long space run before \S) must not fail.
  const std::string spaces(300'000, ' ');
  const auto ids = qwen().encode(spaces + "x");
  EXPECT_EQ(qwen().decode(ids), spaces + "x");
}

}  // namespace
