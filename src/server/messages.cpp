#include "server/messages.h"

#include <fmt/format.h>

#include <functional>
#include <set>

#include "server/fields.h"
#include "server/filters.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

namespace {

// Fields of the chat request that keep their name here: the Messages API's own sampling fields,
// and vLLM-style extensions.
constexpr std::string_view kPassed[] = {"temperature",
                                        "top_p",
                                        "top_k",
                                        "stream",
                                        "seed",
                                        "min_p",
                                        "repetition_penalty",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "speculative",
                                        "logit_bias",
                                        "min_tokens"};

// Block types that need what this server does not have (vision, documents, server tools).
bool unsupported_block(const std::string& type) {
  return type == "image" || type == "document" || type == "search_result" ||
         type == "server_tool_use" || type == "web_search_tool_result" ||
         type == "code_execution_tool_result" || type == "mcp_tool_use" ||
         type == "mcp_tool_result" || type == "container_upload";
}

[[noreturn]] void bad_block(const std::string& p, const std::string& type, const char* role) {
  if (unsupported_block(type))
    bad(p + ".type",
        fmt::format("'{}.type' is '{}': only text, tool_use, tool_result and thinking blocks "
                    "are supported (no images, documents or server tools)",
                    p, printable(type, 60)),
        "unsupported_content");
  bad(p + ".type", fmt::format("'{}.type' is '{}', which a {} message cannot hold", p,
                               printable(type, 60), role));
}

// f(block, its path, its type) for each content block of the array `where` names, each checked
// to be an object with a type.
template <class F>
void each_block(const json& blocks, const std::string& where, F&& f) {
  for (size_t j = 0; j < blocks.size(); ++j) {
    const std::string p = fmt::format("{}[{}]", where, j);
    check_object_at(blocks[j], p);
    f(blocks[j], p, *get_string_at(blocks[j], "type", p, true));
  }
}

// Texts joined with a separator, and whether there was any.
struct Joined {
  const char* sep = "\n";
  std::string text;
  bool any = false;
  void add(const std::string& t) {
    if (any) text += sep;
    text += t;
    any = true;
  }
};

// Text blocks ({"type": "text", "text": ...}) joined with `sep`; `where` names the array.
std::string text_blocks(const json& blocks, const std::string& where, const char* sep) {
  Joined text{.sep = sep, .text = {}, .any = false};
  each_block(blocks, where, [&](const json& b, const std::string& p, const std::string& type) {
    if (type != "text") bad_block(p, type, "text-only");
    text.add(*get_string_at(b, "text", p, true));
  });
  return text.text;
}

class MessagesReader {
 public:
  json messages = json::array();
  bool prefill = false;  // the last message is the assistant's, to be continued

  void read(const json& msgs) {
    if (!msgs.is_array()) bad("messages", "'messages' must be an array", "invalid_type");
    if (msgs.empty()) bad("messages", "'messages' must not be empty");
    for (size_t i = 0; i < msgs.size(); ++i)
      message(msgs[i], fmt::format("messages[{}]", i), i + 1 == msgs.size());
  }

 private:
  void message(const json& m, const std::string& p, bool last) {
    check_object_at(m, p);
    const std::string role = *get_string_at(m, "role", p, true);
    if (role != "user" && role != "assistant")
      bad(p + ".role",
          fmt::format("'{}.role' must be user or assistant, got '{}'", p, printable(role, 40)));
    const json* content = field(m, "content");
    if (!content)
      bad(p + ".content", fmt::format("'{}.content' is required", p), "missing_required_parameter");
    const std::string where = p + ".content";
    if (content->is_string()) {
      messages.push_back({{"role", role}, {"content", *content}});
      prefill = last && role == "assistant";
      return;
    }
    if (!content->is_array())
      bad(where, fmt::format("'{}' must be a string or an array of content blocks", where),
          "invalid_type");
    if (content->empty()) bad(where, fmt::format("'{}' must not be empty", where));
    if (role == "user")
      user(*content, where);
    else
      assistant(*content, where, last);
  }

  void user(const json& blocks, const std::string& where) {
    Joined text;
    each_block(blocks, where, [&](const json& b, const std::string& p, const std::string& type) {
      if (type == "text")
        text.add(*get_string_at(b, "text", p, true));
      else if (type == "tool_result")
        tool_result(b, p);
      else
        bad_block(p, type, "user");
    });
    // The tool results (already added) answer the calls; the user's text comes after them.
    if (text.any) messages.push_back({{"role", "user"}, {"content", std::move(text.text)}});
  }

  void tool_result(const json& b, const std::string& p) {
    const std::string id = *get_string_at(b, "tool_use_id", p, true);
    if (!tool_ids_.contains(id))
      bad(p + ".tool_use_id",
          fmt::format("'{}.tool_use_id' is '{}', but no tool_use block before it has that id", p,
                      printable(id, 80)));
    get_bool_at(b, "is_error", p);
    std::string text;
    if (const json* c = field(b, "content")) {
      if (c->is_string())
        text = c->get<std::string>();
      else if (c->is_array())
        text = text_blocks(*c, p + ".content", "\n");
      else
        bad(p + ".content",
            fmt::format("'{}.content' must be a string or an array of text blocks", p),
            "invalid_type");
    }
    messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(text)}});
  }

  void assistant(const json& blocks, const std::string& where, bool last) {
    json m = {{"role", "assistant"}, {"content", ""}};
    Joined text;
    std::string reasoning;
    each_block(blocks, where, [&](const json& b, const std::string& p, const std::string& type) {
      if (type == "text") {
        text.add(*get_string_at(b, "text", p, true));
      } else if (type == "thinking") {
        reasoning += *get_string_at(b, "thinking", p, true);
        get_string_at(b, "signature", p);
      } else if (type == "redacted_thinking") {
        // Encrypted by another provider: nothing this model can read.
      } else if (type == "tool_use") {
        const std::string id = *get_string_at(b, "id", p, true);
        const std::string name = *get_string_at(b, "name", p, true);
        const json* input = field(b, "input");
        if (!input)
          bad(p + ".input", fmt::format("'{}.input' is required", p), "missing_required_parameter");
        check_object_at(*input, p + ".input");
        tool_ids_.insert(id);
        if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
        m["tool_calls"].push_back({{"id", id},
                                   {"type", "function"},
                                   {"function", {{"name", name}, {"arguments", *input}}}});
      } else {
        bad_block(p, type, "assistant");
      }
    });
    m["content"] = std::move(text.text);
    if (!reasoning.empty()) m["reasoning_content"] = std::move(reasoning);
    if (last && m.contains("tool_calls"))
      bad(where,
          fmt::format("'{}' ends the conversation with tool_use blocks: give their tool_result "
                      "blocks in a user message after it",
                      where));
    prefill = last;
    messages.push_back(std::move(m));
  }

  std::set<std::string> tool_ids_;
};

json chat_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    check_object_at(tools[i], p);
    if (auto type = get_string_at(tools[i], "type", p); type && *type != "custom")
      bad(p + ".type",
          fmt::format("'{}.type' is '{}': only custom tools (name, description, input_schema) "
                      "are supported, no server or client-defined built-in tools",
                      p, printable(*type, 60)),
          "unsupported_parameter");
    json fn = {{"name", *get_string_at(tools[i], "name", p, true)}};
    if (auto d = get_string_at(tools[i], "description", p)) fn["description"] = *d;
    const json* schema = field(tools[i], "input_schema");
    if (!schema)
      bad(p + ".input_schema", fmt::format("'{}.input_schema' is required", p),
          "missing_required_parameter");
    check_object_at(*schema, p + ".input_schema");
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice as the chat request's tool_choice and parallel_tool_calls.
void chat_tool_choice(const json& tc, json& chat) {
  check_object_at(tc, "tool_choice");
  const std::string type = *get_string_at(tc, "type", "tool_choice", true);
  if (type == "auto")
    chat["tool_choice"] = "auto";
  else if (type == "any")
    chat["tool_choice"] = "required";
  else if (type == "none")
    chat["tool_choice"] = "none";
  else if (type == "tool")
    chat["tool_choice"] = {
        {"type", "function"},
        {"function", {{"name", *get_string_at(tc, "name", "tool_choice", true)}}}};
  else
    bad("tool_choice.type",
        fmt::format("'tool_choice.type' must be auto, any, tool or none, got '{}'",
                    printable(type, 40)));
  if (get_bool_at(tc, "disable_parallel_tool_use", "tool_choice").value_or(false))
    chat["parallel_tool_calls"] = false;
}

// thinking: Qwen3's thinking on (enabled, adaptive, between_tools) or off (disabled). The budget
// and the display are read, not acted on: Qwen3 has no budget of its own, and its thinking is
// always returned.
json thinking_of(const json& t) {
  check_object_at(t, "thinking");
  const std::string type = *get_string_at(t, "type", "thinking", true);
  if (type == "disabled") return false;
  if (type != "enabled" && type != "adaptive" && type != "between_tools")
    bad("thinking.type",
        fmt::format("'thinking.type' must be enabled, adaptive, between_tools or disabled, got "
                    "'{}'",
                    printable(type, 40)));
  get_string_at(t, "display", "thinking");
  if (const json* b = field(t, "budget_tokens"); b && !b->is_number_integer())
    bad("thinking.budget_tokens", "'thinking.budget_tokens' must be an integer", "invalid_type");
  return true;
}

}  // namespace

TranslatedRequest parse_messages_request(const json& body, const std::string& served_model,
                                         bool count_tokens) {
  if (!body.is_object())
    throw ApiError(400,
                   fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  TranslatedRequest t;
  json chat = json::object();
  if (const json* m = field(body, "model")) chat["model"] = *m;

  MessagesReader reader;
  if (const json* sys = field(body, "system")) {
    if (sys->is_string())
      reader.messages.push_back({{"role", "system"}, {"content", *sys}});
    else if (sys->is_array())
      reader.messages.push_back({{"role", "system"}, {"content", text_blocks(*sys, "system", "")}});
    else
      bad("system", "'system' must be a string or an array of text blocks", "invalid_type");
  }
  const json* msgs = field(body, "messages");
  if (!msgs) bad("messages", "'messages' is required", "missing_required_parameter");
  reader.read(*msgs);
  chat["messages"] = std::move(reader.messages);

  json kwargs = json::object();
  if (const json* kw = field(body, "chat_template_kwargs")) {
    check_object_at(*kw, "chat_template_kwargs");
    kwargs = *kw;
  }
  if (const json* th = field(body, "thinking")) {
    const json on = thinking_of(*th);
    if (!kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = on;
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);
  if (const json* tools = field(body, "tools")) chat["tools"] = chat_tools(*tools);
  if (const json* tc = field(body, "tool_choice")) chat_tool_choice(*tc, chat);

  if (!count_tokens) {
    const auto mt = get_int(body, "max_tokens");
    if (!mt) bad("max_tokens", "'max_tokens' is required", "missing_required_parameter");
    if (*mt < 1) bad("max_tokens", fmt::format("'max_tokens' must be at least 1, got {}", *mt));
    chat["max_tokens"] = *mt;
  }
  if (const json* stops = field(body, "stop_sequences")) chat["stop"] = *stops;
  // output_config: a JSON schema for the text (structured output); the effort is Claude's.
  if (const json* oc = field(body, "output_config")) {
    check_object_at(*oc, "output_config");
    get_string_at(*oc, "effort", "output_config");
    if (const json* f = field(*oc, "format")) {
      check_object_at(*f, "output_config.format");
      const std::string type = *get_string_at(*f, "type", "output_config.format", true);
      if (type != "json_schema")
        bad("output_config.format.type",
            fmt::format("'output_config.format.type' must be json_schema, got '{}'",
                        printable(type, 40)));
      const json* schema = field(*f, "schema");
      if (!schema)
        bad("output_config.format.schema", "'output_config.format.schema' is required",
            "missing_required_parameter");
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
    }
  }
  for (std::string_view k : kPassed)
    if (auto it = body.find(k); it != body.end()) chat[std::string(k)] = *it;
  if (const json* md = field(body, "metadata")) {
    check_object_at(*md, "metadata");
    get_string_at(*md, "user_id", "metadata");
  }
  for (const char* k :
       {"service_tier", "speed", "inference_geo", "user_profile_id", "workspace_id"})
    get_string_at(body, k, "");
  if (const json* mcp = field(body, "mcp_servers"); mcp && !(mcp->is_array() && mcp->empty()))
    bad("mcp_servers", "'mcp_servers' is not supported (no server-side tools)",
        "unsupported_parameter");

  t.g = parse_translated_chat(chat, served_model,
                              {{"stop", "stop_sequences"}, {"response_format", "output_config"}});
  if (reader.prefill) {
    // The assistant's last message is the start of the answer: continued, not closed.
    t.g.chat_request["add_generation_prompt"] = false;
    t.g.chat_request["continue_final_message"] = true;
  }
  t.unknown = fields_not_in(
      body, kPassed,
      {"model",         "messages",    "system",        "max_tokens",      "stop_sequences",
       "tools",         "tool_choice", "thinking",      "metadata",        "output_config",
       "service_tier",  "speed",       "inference_geo", "user_profile_id", "workspace_id",
       "cache_control", "container",   "diagnostics",   "mcp_servers",     "chat_template_kwargs"});
  return t;
}

json anthropic_error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

namespace {

// The content blocks of a message, built from a choice's chat deltas; with `emit` set, also the
// stream's content_block_start / delta / stop events.
class ContentBlocks {
 public:
  using Emit = std::function<void(const std::string& type, json fields)>;
  explicit ContentBlocks(Emit emit = {}) : emit_(std::move(emit)) {}

  json blocks = json::array();
  bool has_tool_use = false;

  void take(const ChatDelta& d) {
    if (!d.reasoning.empty()) {
      if (kind_ != Kind::Thinking)
        open(Kind::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      text_ += d.reasoning;
      delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (kind_ != Kind::Text) open(Kind::Text, {{"type", "text"}, {"text", ""}});
      text_ += d.content;
      delta({{"type", "text_delta"}, {"text", d.content}});
    }
    if (d.calls.is_array())
      for (const auto& call : d.calls) call_delta(call);
  }

  // Closes the open block. A tool_use's input is its arguments parsed (a call cut short by
  // max_tokens, whose arguments do not parse, keeps what it had: {} when not streamed).
  void finish() {
    if (kind_ == Kind::None) return;
    if (kind_ == Kind::Thinking) {
      block_["thinking"] = text_;
    } else if (kind_ == Kind::Text) {
      block_["text"] = text_;
    } else {
      json input = parse_json_value(text_.empty() ? std::string("{}") : text_);
      block_["input"] = input.is_object() ? std::move(input) : json::object();
    }
    if (emit_) emit_("content_block_stop", {{"index", blocks.size()}});
    blocks.push_back(std::move(block_));
    block_ = nullptr;
    kind_ = Kind::None;
    text_.clear();
  }

 private:
  enum class Kind { None, Thinking, Text, ToolUse };

  void open(Kind kind, json block) {
    finish();
    kind_ = kind;
    block_ = std::move(block);
    if (emit_) emit_("content_block_start", {{"index", blocks.size()}, {"content_block", block_}});
  }

  void delta(json d) {
    if (emit_) emit_("content_block_delta", {{"index", blocks.size()}, {"delta", std::move(d)}});
  }

  // An OpenAI tool_calls delta: a new call (with its id and name) opens a tool_use block.
  void call_delta(const json& d) {
    const json& fn = d.value("function", json::object());
    if (d.contains("id")) {
      // The call's id with Anthropic's prefix (call_X -> toolu_X).
      std::string id = d["id"].get<std::string>();
      if (id.starts_with("call_")) id = "toolu_" + id.substr(5);
      open(Kind::ToolUse, {{"type", "tool_use"},
                           {"id", id},
                           {"name", fn.value("name", "")},
                           {"input", json::object()}});
      has_tool_use = true;
    }
    const std::string args = fn.value("arguments", "");
    if (kind_ != Kind::ToolUse || args.empty()) return;
    text_ += args;
    delta({{"type", "input_json_delta"}, {"partial_json", args}});
  }

  Emit emit_;
  Kind kind_ = Kind::None;
  json block_;
  std::string text_;
};

// stop_reason and stop_sequence of the (only) choice.
std::pair<json, json> stop_of(const Generation& gen, bool tool_use) {
  const Choice& c = gen.choices.front();
  if (c.reason == "length") return {"max_tokens", nullptr};
  if (tool_use) return {"tool_use", nullptr};
  if (c.out.stop.stopped()) return {"stop_sequence", c.out.stop.matched()};
  return {"end_turn", nullptr};
}

// Anthropic's usage: input_tokens are the prompt's tokens not read from the prefix cache (those
// are cache_read_input_tokens; the three input counts add up to the prompt).
json usage_of(const Generation& gen) {
  const Choice& c = gen.choices.front();
  const size_t prompt = c.req->params.prompt.size();
  const size_t cached = std::min(size_t(std::max<int64_t>(c.req->cached_tokens(), 0)), prompt);
  return {{"input_tokens", prompt - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", c.out.ids.size()}};
}

json message_object(const Generation& gen, json content) {
  return {{"id", gen.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", gen.model},
          {"content", std::move(content)},
          {"stop_reason", nullptr},
          {"stop_sequence", nullptr},
          {"usage", usage_of(gen)}};
}

class MessagesEvents final : public EventFormat {
 public:
  explicit MessagesEvents(std::shared_ptr<Generation> gen)
      : gen_(std::move(gen)),
        blocks_([this](const std::string& type, json fields) { add(type, std::move(fields)); }) {}

  std::string open() override {
    add("message_start", {{"message", message_object(*gen_, json::array())}});
    return take();
  }

  std::string step(size_t, Choice& c, const std::string& piece, const std::vector<int32_t>&,
                   size_t) override {
    blocks_.take(chat_delta(*gen_, c, piece));
    if (!c.reason.empty()) blocks_.finish();
    return take();
  }

  std::string close(bool failed) override {
    if (failed) return {};  // the error event ends the stream
    auto [reason, sequence] = stop_of(*gen_, blocks_.has_tool_use);
    add("message_delta", {{"delta", {{"stop_reason", reason}, {"stop_sequence", sequence}}},
                          {"usage", usage_of(*gen_)}});
    add("message_stop", json::object());
    return take();
  }

  std::string fail(const std::string& message) override {
    return named_event("error", anthropic_error_body(500, message));
  }

  std::string keep_alive() override { return named_event("ping", {{"type", "ping"}}); }

 private:
  void add(const std::string& type, json fields) {
    json e = {{"type", type}};
    for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = *it;
    buf_ += named_event(type, e);
  }
  std::string take() { return std::exchange(buf_, {}); }

  std::shared_ptr<Generation> gen_;
  ContentBlocks blocks_;
  std::string buf_;
};

}  // namespace

json messages_body(Generation& gen) {
  Choice& c = gen.choices.front();
  ContentBlocks blocks;
  blocks.take(chat_delta(gen, c, c.out.text));
  blocks.finish();
  json m = message_object(gen, std::move(blocks.blocks));
  auto [reason, sequence] = stop_of(gen, blocks.has_tool_use);
  m["stop_reason"] = reason;
  m["stop_sequence"] = sequence;
  return m;
}

std::unique_ptr<EventFormat> messages_events(std::shared_ptr<Generation> gen) {
  return std::make_unique<MessagesEvents>(std::move(gen));
}

}  // namespace flashmap::server
