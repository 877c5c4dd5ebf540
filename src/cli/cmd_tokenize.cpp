// `flashmap tokenize --tokenizer DIR`: text to ids (or ids to text with --decode), for checking
// the tokenizer against Hugging Face from a shell.
//
//   flashmap tokenize --tokenizer DIR --text "Hello"            -> [9707]
//   flashmap tokenize --tokenizer DIR --jsonl in.jsonl          one JSON string per line in,
//                                                               one JSON array of ids per line out
//   flashmap tokenize --tokenizer DIR --decode --text "[9707]"  -> "Hello"
//   flashmap tokenize --tokenizer DIR --decode --jsonl ids.jsonl [--skip-special-tokens]
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "flashmap/tokenizer.h"
#include "io/files.h"

namespace flashmap::cli {
namespace {

struct TokenizeOptions {
  std::string dir, text, jsonl;
  bool has_text = false, has_jsonl = false;
  bool decode = false;
  bool skip_special = false;
};

using json = nlohmann::json;

std::vector<int32_t> parse_ids(const std::string& s, const std::string& where) {
  check_json_depth(s, where);  // "[[[[...]]]]" would overflow the stack when printed back
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: expected a JSON array of ids: {}", where, e.what()));
  }
  if (!j.is_array()) throw Error(fmt::format("{}: expected a JSON array of ids", where));
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      throw Error(fmt::format("{}: {} is not a token id", where, v.dump()));
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

std::string parse_text(const std::string& s, const std::string& where) {
  check_json_depth(s, where);
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: expected a JSON string: {}", where, e.what()));
  }
  if (!j.is_string()) throw Error(fmt::format("{}: expected a JSON string", where));
  return j.get<std::string>();
}

// One line of output: ids as a JSON array, or text as a JSON string (non-ASCII kept as UTF-8).
std::string process(const Tokenizer& tok, const TokenizeOptions& o, const std::string& input,
                    const std::string& where, bool input_is_json) {
  if (o.decode) {
    const std::string text = tok.decode(parse_ids(input, where), o.skip_special);
    return json(text).dump();
  }
  const std::string text = input_is_json ? parse_text(input, where) : input;
  return json(tok.encode(text)).dump();
}

void run(const TokenizeOptions& o) {
  FLASHMAP_CHECK(o.has_text != o.has_jsonl, "tokenize: give either --text or --jsonl");
  const Tokenizer tok = Tokenizer::from_dir(o.dir);
  if (o.has_text) {
    std::cout << process(tok, o, o.text, "--text", /*input_is_json=*/false) << "\n";
    return;
  }
  std::ifstream file;
  std::istream* in = &std::cin;
  if (o.jsonl != "-") {
    // A directory opens as a stream that reads nothing: it would print nothing and succeed.
    std::error_code ec;
    FLASHMAP_CHECK(!std::filesystem::is_directory(o.jsonl, ec),
                   "cannot read --jsonl file '{}': it is a directory", o.jsonl);
    file.open(o.jsonl, std::ios::binary);
    FLASHMAP_CHECK(file, "cannot open --jsonl file '{}'", o.jsonl);
    in = &file;
  }
  std::string line, out;
  size_t lineno = 0;
  while (std::getline(*in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    out += process(tok, o, line, fmt::format("{}:{}", o.jsonl, lineno), /*input_is_json=*/true);
    out += '\n';
    if (out.size() > (1 << 20)) {
      std::cout << out;
      out.clear();
    }
  }
  std::cout << out << std::flush;
}

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  cmd->add_option("--tokenizer", o->dir, "Folder with tokenizer.json")
      ->required()
      ->check(non_empty());
  CLI::Option* text = cmd->add_option(
      "--text", o->text, "Text to encode (with --decode: a JSON array of ids, e.g. \"[1,2,3]\")");
  CLI::Option* jsonl =
      cmd->add_option("--jsonl", o->jsonl,
                      "File ('-' for stdin) with one JSON string per line (with --decode: one JSON "
                      "array of ids per line); prints one result per line")
          ->check(non_empty());
  auto* decode = cmd->add_flag("--decode", o->decode, "Decode ids to text instead of encoding");
  cmd->add_flag("--skip-special-tokens", o->skip_special,
                "With --decode, drop special tokens such as <|im_end|>")
      ->needs(decode);
  cmd->callback([o, text, jsonl] {
    o->has_text = text->count() > 0;
    o->has_jsonl = jsonl->count() > 0;
    run(*o);
  });
}

}  // namespace

FLASHMAP_COMMAND(register_tokenize);

}  // namespace flashmap::cli
