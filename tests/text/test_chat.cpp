// ChatTemplate against transformers: tests/data/chat/expected/VARIANT/NAME.txt is what
// `tokenizer.apply_chat_template(request, tokenize=False)` returned for requests/NAME.json with the
// tokenizer folder tests/data/chat/VARIANT (NAME.error: transformers raised). All of it comes from
// tools/make_chat_goldens.py, never from flashmap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "flashmap/chat.h"
#include "text/jinja.h"

namespace {

namespace fs = std::filesystem;
using flashmap::ChatTemplate;
using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

fs::path data_dir() {
  fs::path rel = "tests/data/chat";
  if (fs::exists(rel)) return rel;
  return fs::path(FLASHMAP_SOURCE_DIR) / rel;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* const kVariants[] = {"qwen3", "qwen3-official", "multi-list", "multi-files"};

struct Golden {
  std::string variant, name;
};

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  fs::path requests = data_dir() / "requests";
  if (!fs::exists(requests)) return out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(requests))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  for (const char* v : kVariants)
    for (const auto& n : names) out.push_back({v, n});
  return out;
}

const ChatTemplate& chat_for(const std::string& variant) {
  // Parsed once per folder and shared by all cases, as a server would.
  static std::map<std::string, ChatTemplate> cache;
  auto it = cache.find(variant);
  if (it == cache.end())
    it = cache.emplace(variant, ChatTemplate::from_dir(data_dir() / variant)).first;
  return it->second;
}

class ChatGolden : public testing::TestWithParam<Golden> {};

TEST_P(ChatGolden, MatchesTransformers) {
  const Golden& g = GetParam();
  json request = json::parse(read(data_dir() / "requests" / (g.name + ".json")));
  fs::path expected_txt = data_dir() / "expected" / g.variant / (g.name + ".txt");
  fs::path expected_err = data_dir() / "expected" / g.variant / (g.name + ".error");
  const ChatTemplate& chat = chat_for(g.variant);
  if (fs::exists(expected_txt)) {
    EXPECT_EQ(chat.render(request), read(expected_txt));
  } else {
    ASSERT_TRUE(fs::exists(expected_err)) << "no golden for " << g.variant << "/" << g.name;
    EXPECT_THROW(chat.render(request), flashmap::Error) << "transformers: " << read(expected_err);
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, ChatGolden, testing::ValuesIn(goldens()),
                         [](const testing::TestParamInfo<Golden>& info) {
                           std::string n = info.param.variant + "_" + info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(ChatTemplate, GoldensArePresent) {
  EXPECT_GE(goldens().size(), 4u * 40u);
}

TEST(ChatTemplate, LoadsTemplateAndTokensFromTokenizerConfig) {
  const ChatTemplate& chat = chat_for("qwen3");
  json config = json::parse(read(data_dir() / "qwen3" / "tokenizer_config.json"));
  EXPECT_EQ(chat.source(), config["chat_template"].get<std::string>());
  EXPECT_EQ(chat.template_names(), std::vector<std::string>{"default"});
  ASSERT_TRUE(chat.eos_token().has_value());
  EXPECT_EQ(*chat.eos_token(), "<|im_end|>");
  EXPECT_FALSE(chat.bos_token().has_value());  // null in Qwen3's config
}

TEST(ChatTemplate, ChatTemplateJinjaTakesPrecedence) {
  const ChatTemplate& chat = chat_for("qwen3-official");
  EXPECT_EQ(chat.source(), read(data_dir() / "qwen3-official" / "chat_template.jinja"));
  EXPECT_EQ(chat.source().size(), 4168u);  // the official Qwen3-8B template, per SOURCE.md
}

TEST(ChatTemplate, ListFormTemplatesAndAddedTokenObjects) {
  const ChatTemplate& chat = chat_for("multi-list");
  EXPECT_EQ(chat.template_names(), (std::vector<std::string>{"default", "tool_use"}));
  ASSERT_TRUE(chat.bos_token().has_value());
  EXPECT_EQ(*chat.bos_token(), "<|endoftext|>");
  const ChatTemplate& files = chat_for("multi-files");
  EXPECT_EQ(files.template_names(), (std::vector<std::string>{"default", "tool_use"}));
}

TEST(ChatTemplate, TemplateFileOverride) {
  fs::path official = data_dir() / "qwen3-official" / "chat_template.jinja";
  ChatTemplate chat = ChatTemplate::from_file(official, data_dir() / "qwen3");
  json request = json::parse(read(data_dir() / "requests" / "tool_calls_dict_arguments.json"));
  EXPECT_EQ(chat.render(request),
            read(data_dir() / "expected" / "qwen3-official" / "tool_calls_dict_arguments.txt"));
  ASSERT_TRUE(chat.eos_token().has_value());
}

TEST(ChatTemplate, FolderWithoutTemplateIsAnError) {
  fs::path dir = fs::temp_directory_path() / "flashmap_chat_no_template";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  try {
    ChatTemplate::from_dir(dir);
    FAIL() << "expected an error";
  } catch (const flashmap::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no chat template"));
  }
  fs::remove_all(dir);
}

TEST(ChatTemplate, BrokenTemplateFailsAtLoadWithItsLine) {
  try {
    ChatTemplate chat("{% for m in messages %}\n{{ m.content }\n{% endfor %}");
    FAIL() << "expected a syntax error";
  } catch (const flashmap::jinja::TemplateError& e) {
    EXPECT_EQ(e.line(), 2);
  }
}

TEST(ChatTemplate, RejectsMalformedRequests) {
  const ChatTemplate& chat = chat_for("qwen3");
  EXPECT_THROW(chat.render(json::array()), flashmap::Error);
  EXPECT_THROW(chat.render(json{{"messages", json::array()}}), flashmap::Error);
  EXPECT_THROW(chat.render(json{{"messages", "hi"}}), flashmap::Error);
  EXPECT_THROW(chat.render(json::parse(R"({"messages": ["hi"]})")), flashmap::Error);
  EXPECT_THROW(chat.render(json::parse(R"({"messages": [{"role": "user", "content": "x"}],
                                           "tools": {"name": "f"}})")),
               flashmap::Error);
}

TEST(ChatTemplate, RaiseExceptionSurfacesWithLine) {
  ChatTemplate chat(
      "{%- for m in messages %}\n"
      "{%- if m.role not in ['user', 'assistant'] %}\n"
      "{{- raise_exception('Only user and assistant roles are supported!') }}\n"
      "{%- endif %}\n"
      "{%- endfor %}");
  try {
    chat.render(json::parse(R"({"messages": [{"role": "system", "content": "x"}]})"));
    FAIL() << "expected an error";
  } catch (const flashmap::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("line 3"));
    EXPECT_THAT(e.what(), HasSubstr("Only user and assistant roles are supported!"));
  }
}

}  // namespace
