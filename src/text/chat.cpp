#include "flashmap/chat.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"
#include "io/files.h"
#include "text/jinja.h"
#include "text/utf8.h"

namespace flashmap {

namespace fs = std::filesystem;
using jinja::Dict;
using jinja::Value;
using jinja::ValueList;

struct ChatTemplate::Impl {
  std::vector<std::pair<std::string, std::string>> sources;  // name -> source, load order
  std::vector<jinja::Template> templates;                    // parsed, same order
  std::vector<std::pair<std::string, std::string>> special_tokens;
  std::optional<std::string> bos, eos;
  // transformers keeps a dict of named templates (list-form chat_template, or extra .jinja
  // files) or a single string; names are only looked up in the dict form.
  bool named = false;

  const jinja::Template* find(std::string_view name) const {
    for (size_t i = 0; i < sources.size(); ++i)
      if (sources[i].first == name) return &templates[i];
    return nullptr;
  }
};

namespace {

// A file of the tokenizer folder: regular (a FIFO would block the read), of a sane size.
std::string read_file(const fs::path& path) {
  return read_regular_file(path.string(), kMaxConfigFileBytes);
}

// Whether the folder has an entry by this name: a FIFO or a dangling link counts, and is refused
// by read_file rather than silently skipped.
bool present(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found;
}

// transformers reads chat_template.jinja in text mode, which turns \r\n and \r into \n.
std::string universal_newlines(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

nlohmann::ordered_json read_json(const fs::path& path) {
  const std::string text = read_file(path);
  check_json_depth(text, path.string());
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: invalid JSON: {}", path.string(), e.what()));
  }
}

// The named special tokens transformers puts in special_tokens_map (and so in the template's
// variables): str(token) of each one that is set.
std::vector<std::pair<std::string, std::string>> special_tokens_of(
    const nlohmann::ordered_json& config) {
  static const char* const kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : kNames) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) {
      out.emplace_back(name, it->get<std::string>());
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out.emplace_back(name, (*it)["content"].get<std::string>());
    }
  }
  return out;
}

std::shared_ptr<ChatTemplate::Impl> make_impl(
    std::vector<std::pair<std::string, std::string>> sources,
    std::vector<std::pair<std::string, std::string>> special_tokens,
    const std::vector<std::string>& labels) {
  auto impl = std::make_shared<ChatTemplate::Impl>();
  for (size_t i = 0; i < sources.size(); ++i)
    impl->templates.emplace_back(sources[i].second, labels[i]);
  impl->sources = std::move(sources);
  for (const auto& [k, v] : special_tokens) {
    if (k == "bos_token") impl->bos = v;
    if (k == "eos_token") impl->eos = v;
  }
  impl->special_tokens = std::move(special_tokens);
  return impl;
}

bool is_python_space(uint32_t cp) {
  return jinja::pystr::is_space(cp);
}

// Python's str.strip() / rstrip() with the default (Unicode whitespace) characters.
std::string py_strip(const std::string& s, bool left) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t q = begin;
      if (!is_python_space(jinja::pystr::decode(s, q))) break;
      begin = q;
    }
  }
  while (end > begin) {
    const size_t start = utf8::prev(s, end, begin);
    size_t q = start;
    if (!is_python_space(jinja::pystr::decode(s, q))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// What transformers' _normalize_chat_messages and _alias_reasoning_fields do to a message:
// null-valued keys are dropped; a reasoning text given as reasoning_content, thinking or
// reasoning (first non-null wins) is exposed as {"thinking": r, **message, "reasoning_content": r}.
Value normalize_message(const nlohmann::ordered_json& m, size_t index) {
  if (!m.is_object())
    throw Error(
        fmt::format("Chat messages should be dicts, but message {} is {}", index, m.type_name()));
  Dict d;
  for (const auto& [k, v] : m.items())
    if (!v.is_null()) d.items.emplace_back(Value(k), jinja::from_json(v));
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if ((reasoning = d.find(key))) break;
  }
  if (reasoning) {
    Value r = *reasoning;
    Dict aliased;
    aliased.items.reserve(d.items.size() + 2);
    aliased.items.emplace_back(Value("thinking"), r);
    for (auto& kv : d.items) aliased.set(kv.first, kv.second);
    aliased.set(Value("reasoning_content"), r);
    return Value::dict(std::move(aliased));
  }
  return Value::dict(std::move(d));
}

Value list_of_objects(const nlohmann::ordered_json& j, const char* what) {
  if (j.is_null()) return Value::none();
  if (!j.is_array())
    throw Error(fmt::format("request field '{}' must be a list of objects or null", what));
  for (const auto& e : j)
    if (!e.is_object())
      throw Error(fmt::format("request field '{}' must be a list of objects (JSON schemas)", what));
  return jinja::from_json(j);
}

// Arguments of apply_chat_template that steer tokenization only and never reach the template.
bool is_tokenizer_option(const std::string& key) {
  static const char* const kKeys[] = {
      "tokenize",       "padding",     "truncation",       "max_length",
      "return_tensors", "return_dict", "tokenizer_kwargs", "return_assistant_tokens_mask"};
  return std::any_of(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; });
}

constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

ChatTemplate::ChatTemplate(std::string source,
                           std::vector<std::pair<std::string, std::string>> special_tokens)
    : impl_(make_impl({{"default", std::move(source)}}, std::move(special_tokens),
                      {"chat template"})) {}

ChatTemplate ChatTemplate::from_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format("tokenizer folder {} does not exist", dir.string()));
  fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (present(config_path)) config = read_json(config_path);
  std::vector<std::pair<std::string, std::string>> sources;
  std::vector<std::string> labels;
  // A chat_template.jinja (and the extra named templates beside it) replaces whatever
  // tokenizer_config.json holds.
  fs::path jinja_path = dir / "chat_template.jinja";
  if (present(jinja_path)) {
    sources.emplace_back("default", universal_newlines(read_file(jinja_path)));
    labels.push_back(jinja_path.string());
  }
  fs::path extra_dir = dir / "additional_chat_templates";
  if (fs::is_directory(extra_dir, ec)) {
    std::vector<fs::path> files;
    for (auto it = fs::directory_iterator(extra_dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec))
      if (it->path().extension() == ".jinja") files.push_back(it->path());
    FLASHMAP_CHECK(!ec, "{}: cannot list ({})", extra_dir.string(), ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      sources.emplace_back(f.stem().string(), universal_newlines(read_file(f)));
      labels.push_back(f.string());
    }
  }
  bool named = !sources.empty() && !(sources.size() == 1 && sources[0].first == "default");
  if (sources.empty()) {
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null())
      throw Error(
          fmt::format("{} has no chat template (neither chat_template.jinja nor a chat_template in "
                      "tokenizer_config.json)",
                      dir.string()));
    if (it->is_string()) {
      sources.emplace_back("default", it->get<std::string>());
      labels.push_back(config_path.string() + " chat_template");
    } else if (it->is_array()) {
      named = true;
      for (const auto& t : *it) {
        FLASHMAP_CHECK(t.is_object() && t.contains("name") && t.contains("template") &&
                           t["name"].is_string() && t["template"].is_string(),
                       "{}: chat_template list entries must be {{name, template}} objects",
                       config_path.string());
        sources.emplace_back(t["name"].get<std::string>(), t["template"].get<std::string>());
        labels.push_back(
            fmt::format("{} chat_template '{}'", config_path.string(), sources.back().first));
      }
    } else {
      throw Error(
          fmt::format("{}: chat_template must be a string or a list", config_path.string()));
    }
  }
  auto impl = make_impl(std::move(sources), special_tokens_of(config), labels);
  impl->named = named;
  return ChatTemplate(std::move(impl));
}

ChatTemplate ChatTemplate::from_file(const fs::path& template_file, const fs::path& tokenizer_dir) {
  std::vector<std::pair<std::string, std::string>> tokens;
  if (!tokenizer_dir.empty() && present(tokenizer_dir / "tokenizer_config.json"))
    tokens = special_tokens_of(read_json(tokenizer_dir / "tokenizer_config.json"));
  // Named by the user: a pipe (process substitution) is fine too.
  const std::string source = read_input_file(template_file.string(), kMaxConfigFileBytes);
  return ChatTemplate(make_impl({{"default", universal_newlines(source)}}, std::move(tokens),
                                {template_file.string()}));
}

const std::string& ChatTemplate::source() const {
  for (const auto& [name, src] : impl_->sources)
    if (name == "default") return src;
  return impl_->sources.front().second;
}

std::vector<std::string> ChatTemplate::template_names() const {
  std::vector<std::string> names;
  for (const auto& s : impl_->sources) names.push_back(s.first);
  return names;
}

const std::optional<std::string>& ChatTemplate::bos_token() const {
  return impl_->bos;
}
const std::optional<std::string>& ChatTemplate::eos_token() const {
  return impl_->eos;
}
const std::vector<std::pair<std::string, std::string>>& ChatTemplate::special_tokens() const {
  return impl_->special_tokens;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& request) const {
  jinja::RenderScope limits;  // the request's values count towards the render's limits
  try {
    return render_impl(request);
  } catch (const jinja::RenderError& e) {  // from converting the request's JSON
    throw Error("chat request: " + e.message);
  }
}

std::string ChatTemplate::render_impl(const nlohmann::ordered_json& request) const {
  if (!request.is_object()) throw Error("chat request must be a JSON object");
  auto messages_it = request.find("messages");
  if (messages_it == request.end() || !messages_it->is_array())
    throw Error("chat request needs a 'messages' list");
  const auto& messages_json = *messages_it;
  if (messages_json.empty())
    throw Error(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  if (messages_json[0].is_array())
    throw Error("batched conversations are not supported; render one conversation per request");

  auto get = [&](const char* key) -> const nlohmann::ordered_json* {
    auto it = request.find(key);
    return it == request.end() ? nullptr : &*it;
  };
  auto json_truthy = [](const nlohmann::ordered_json* j) {
    if (!j || j->is_null()) return false;
    if (j->is_boolean()) return j->get<bool>();
    if (j->is_number()) return j->get<double>() != 0;
    if (j->is_string() || j->is_array() || j->is_object()) return !j->empty();
    return true;
  };

  const nlohmann::ordered_json* tools_json = get("tools");
  bool has_tools = tools_json && !tools_json->is_null();

  // Template choice: transformers' get_chat_template.
  const jinja::Template* tpl = nullptr;
  const std::string* tpl_source = nullptr;
  std::optional<jinja::Template> inline_tpl;
  std::string inline_source;
  if (const auto* ct = get("chat_template"); ct && !ct->is_null()) {
    if (!ct->is_string()) throw Error("request field 'chat_template' must be a string");
    const std::string& name = ct->get_ref<const std::string&>();
    for (size_t i = 0; impl_->named && i < impl_->sources.size(); ++i) {
      if (impl_->sources[i].first == name) {
        tpl = &impl_->templates[i];
        tpl_source = &impl_->sources[i].second;
      }
    }
    if (!tpl) {
      inline_source = name;
      inline_tpl.emplace(inline_source, "request chat_template");
      tpl = &*inline_tpl;
      tpl_source = &inline_source;
    }
  } else if (!impl_->named) {
    tpl = &impl_->templates[0];
    tpl_source = &impl_->sources[0].second;
  } else {
    const char* want = has_tools && impl_->find("tool_use") ? "tool_use" : "default";
    for (size_t i = 0; i < impl_->sources.size(); ++i) {
      if (impl_->sources[i].first == want) {
        tpl = &impl_->templates[i];
        tpl_source = &impl_->sources[i].second;
      }
    }
    if (!tpl) {
      std::vector<std::string> names = template_names();
      std::sort(names.begin(), names.end());
      throw Error(fmt::format(
          "This model has multiple chat templates with no default specified; name one with the "
          "request's 'chat_template' field. Available: {}",
          fmt::join(names, ", ")));
    }
  }

  const nlohmann::ordered_json* cfm = get("continue_final_message");
  bool continuing = json_truthy(cfm);
  bool add_generation_prompt = json_truthy(get("add_generation_prompt"));
  if (continuing && add_generation_prompt)
    throw Error(
        "continue_final_message and add_generation_prompt are not compatible. Use "
        "continue_final_message when you want the model to continue the final message, and "
        "add_generation_prompt when you want to add a header that will prompt it to start a new "
        "assistant message instead.");
  if (json_truthy(get("sanitize_control_tokens")))
    throw Error("sanitize_control_tokens=True requires tokenization; render returns text");

  ValueList messages;
  messages.reserve(messages_json.size());
  for (size_t i = 0; i < messages_json.size(); ++i)
    messages.push_back(normalize_message(messages_json[i], i));

  // continue_final_message: tag the final message's text, render, and cut at the tag, exactly as
  // transformers does, so the prompt ends inside that message.
  std::string final_message;
  if (continuing) {
    std::string field = cfm->is_string() ? cfm->get<std::string>() : "content";
    Dict last = messages.back().dict();
    const Value* final_value = last.find(field);
    if (!final_value || final_value->is_none())
      throw Error(fmt::format(
          "continue_final_message is set but the final message has no \"{}\" to continue!", field));
    std::vector<std::string> fields{field};
    if (field == "reasoning_content" || field == "thinking" || field == "reasoning") {
      fields.clear();
      for (const char* f : {"reasoning_content", "thinking", "reasoning"}) {
        const Value* v = last.find(f);
        if (v && jinja::equal(*v, *final_value)) fields.push_back(f);
      }
    }
    bool in_template = std::any_of(fields.begin(), fields.end(), [&](const std::string& f) {
      return tpl_source->find(f) != std::string::npos;
    });
    if (!in_template)
      throw Error(fmt::format(
          "continue_final_message is set to \"{}\" but this is not an accepted field in the "
          "chat_template",
          field));
    if (final_value->is_sequence()) {
      ValueList blocks = final_value->items();
      bool found = false;
      for (size_t i = blocks.size(); i-- > 0;) {
        if (!blocks[i].is_dict()) continue;
        const Value* text = blocks[i].dict().find("text");
        if (!text) continue;
        if (!text->is_string())
          throw Error("continue_final_message: the text block is not a string");
        final_message = text->str();
        Dict block = blocks[i].dict();
        block.set(Value("text"), Value(final_message + std::string(kContinueTag)));
        blocks[i] = Value::dict(std::move(block));
        found = true;
        break;
      }
      if (!found)
        throw Error(
            "continue_final_message is set but we could not find any text to continue in the "
            "final message!");
      last.set(Value(field), Value::list(std::move(blocks)));
    } else {
      if (!final_value->is_string())
        throw Error(
            fmt::format("continue_final_message: \"{}\" of the final message is not text", field));
      final_message = final_value->str();
      for (const auto& f : fields) {
        const Value* v = last.find(f);
        if (!v || !v->is_string())
          throw Error(fmt::format("continue_final_message: \"{}\" is not text", f));
        last.set(Value(f), Value(v->str() + std::string(kContinueTag)));
      }
    }
    messages.back() = Value::dict(std::move(last));
  }

  // Variables: special tokens, then the request's extra keys (which override them), then the
  // named arguments render_jinja_template always passes.
  std::vector<std::pair<std::string, Value>> vars;
  for (const auto& [k, v] : impl_->special_tokens) vars.emplace_back(k, Value(v));
  for (const auto& [k, v] : request.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt" ||
        k == "continue_final_message" || k == "chat_template" || k == "sanitize_control_tokens" ||
        is_tokenizer_option(k))
      continue;
    auto existing = std::find_if(vars.begin(), vars.end(),
                                 [&key = k](const auto& p) { return p.first == key; });
    Value value = jinja::from_json(v);
    if (existing != vars.end())
      existing->second = std::move(value);
    else
      vars.emplace_back(k, std::move(value));
  }
  vars.emplace_back("messages", Value::list(std::move(messages)));
  vars.emplace_back("tools", tools_json ? list_of_objects(*tools_json, "tools") : Value::none());
  const auto* docs = get("documents");
  vars.emplace_back("documents", docs ? list_of_objects(*docs, "documents") : Value::none());
  vars.emplace_back("add_generation_prompt", Value(add_generation_prompt));

  std::string rendered = tpl->render(vars);

  if (continuing) {
    std::string tag_core = py_strip(std::string(kContinueTag), true);
    if (rendered.find(py_strip(final_message, true)) == std::string::npos ||
        rendered.find(tag_core) == std::string::npos)
      throw Error(
          "continue_final_message is set but the final message does not appear in the chat after "
          "applying the chat template! This can happen if the chat template deletes portions of "
          "the final message.");
    size_t loc = rendered.rfind(tag_core);
    if (rendered.compare(loc, kContinueTag.size(), kContinueTag) == 0)
      rendered.resize(loc);
    else
      rendered = py_strip(rendered.substr(0, loc), false);
  }
  return rendered;
}

}  // namespace flashmap
