// The one text codec (include/flashmap/text.h) over a Hugging Face tokenizer folder, checked
// against transformers' own ids and chat renderings (tests/data, never flashmap's output).
#include <flashmap/errors.h>
#include <flashmap/text.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "text/utf8.h"

using flashmap::TextCodec;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kQwenDir = "tests/data/qwen3-tokenizer";
const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f) << p;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh folder holding `files` (copied from `from`), removed with the object.
struct TempFolder {
  fs::path dir;
  TempFolder(const std::string& name, const std::vector<std::pair<fs::path, std::string>>& files) {
    dir = fs::temp_directory_path() / ("flashmap_codec_" + name + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& [from, as] : files) fs::copy_file(from, dir / as);
  }
  ~TempFolder() { fs::remove_all(dir); }
};

const TextCodec& qwen() {
  static const TextCodec text = TextCodec::from_dir(kQwenDir);
  return text;
}

}  // namespace

TEST(TextCodec, EncodesAsTransformersDoes) {
  const TextCodec& text = qwen();
  // tests/data/tokenizer_golden.jsonl: transformers' ids for tokenizer_corpus.jsonl.
  std::ifstream corpus("tests/data/tokenizer_corpus.jsonl"),
      golden("tests/data/tokenizer_golden.jsonl");
  ASSERT_TRUE(corpus && golden);
  std::vector<std::string> texts;
  for (std::string line; std::getline(corpus, line);) texts.push_back(json::parse(line));
  size_t checked = 0;
  for (std::string line; std::getline(golden, line) && checked < 200;) {
    const json r = json::parse(line);
    if (r["kind"] != "encode") continue;
    const std::string& t = texts.at(r["i"].get<size_t>());
    EXPECT_EQ(text.encode(t), r["ids"].get<std::vector<int32_t>>()) << t;
    ++checked;
  }
  EXPECT_GT(checked, 50u);
  EXPECT_EQ(text.vocab_size(), 151669u);  // Qwen3's tokenizer.json: ids 0..151668
}

TEST(TextCodec, UnknownIdsFailDecodeAndShowAsReplacement) {
  const TextCodec& text = qwen();
  const std::vector<int32_t> hello = text.encode("Hello"), world = text.encode(" world");
  std::vector<int32_t> ids = hello;
  ids.push_back(int32_t(text.vocab_size()));  // names no token (a padding row of a model)
  ids.insert(ids.end(), world.begin(), world.end());
  EXPECT_THROW(text.decode(ids, true), flashmap::Error);
  EXPECT_EQ(text.decode_shown(ids), "Hello" + kReplacement + " world");
  auto s = text.stream();
  std::string out;
  for (int32_t id : ids) out += s.push(id);
  EXPECT_EQ(out + s.flush(), "Hello" + kReplacement + " world");
}

TEST(TextCodec, StreamNeverSplitsACharacterAndEqualsDecode) {
  const TextCodec& text = qwen();
  const std::string sample = "漢字 😀 café, naïve — ok";
  const auto ids = text.encode(sample);
  auto s = text.stream();
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = s.push(id);
    EXPECT_TRUE(flashmap::utf8::valid(piece)) << "a piece split a character";
    joined += piece;
  }
  joined += s.flush();
  EXPECT_EQ(joined, sample);
  EXPECT_EQ(text.decode(ids, true), sample);
}

TEST(TextCodec, ChatRendersAsTransformersDoes) {
  // qwen3/: the template in tokenizer_config.json, with the ids of qwen3-tokenizer.
  const fs::path data = "tests/data/chat";
  TempFolder folder("chat", {{fs::path(kQwenDir) / "tokenizer.json", "tokenizer.json"},
                             {data / "qwen3" / "tokenizer_config.json", "tokenizer_config.json"}});
  const TextCodec text = TextCodec::from_dir(folder.dir.string());
  for (const char* name : {"single_turn", "multi_turn", "tool_calls_with_content",
                           "enable_thinking_false", "unicode_content"}) {
    SCOPED_TRACE(name);
    const auto request =
        nlohmann::ordered_json::parse(read(data / "requests" / (std::string(name) + ".json")));
    const std::string want = read(data / "expected" / "qwen3" / (std::string(name) + ".txt"));
    EXPECT_EQ(text.render_chat(request), want);
    // A copy shares the loaded template; so do threads asking at once.
    const TextCodec copy = text;
    EXPECT_EQ(&copy.chat_template(), &text.chat_template());
  }
  std::vector<std::thread> threads;
  std::vector<std::string> got(4);
  const auto request = nlohmann::ordered_json::parse(read(data / "requests" / "single_turn.json"));
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = text.render_chat(request); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, read(data / "expected" / "qwen3" / "single_turn.txt"));
}

TEST(TextCodec, AFolderWithoutATemplateStillEncodes) {
  TempFolder folder("plain", {{fs::path(kQwenDir) / "tokenizer.json", "tokenizer.json"}});
  const TextCodec text = TextCodec::from_dir(folder.dir.string());
  EXPECT_EQ(text.decode(text.encode("still works"), false), "still works");
  const auto request =
      nlohmann::ordered_json::parse(R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_THROW(text.render_chat(request), flashmap::Error);
  EXPECT_THROW(text.chat_template(), flashmap::Error);  // asked again: still refused, no crash
  EXPECT_THROW(TextCodec::from_dir((folder.dir / "missing").string()), flashmap::Error);
}
