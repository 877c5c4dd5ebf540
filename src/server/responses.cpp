#include "server/responses.h"

#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <set>
#include <span>

#include "server/fields.h"
#include "server/filters.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

namespace {

// Fields of the chat request that keep their name here (the chat parser checks them): the
// Responses API's own sampling fields, and vLLM-style extensions.
constexpr std::string_view kPassed[] = {
    "temperature", "top_p",       "parallel_tool_calls", "stream",           "top_k",
    "min_p",       "seed",        "repetition_penalty",  "presence_penalty", "frequency_penalty",
    "stop",        "speculative", "logit_bias",          "min_tokens"};

// Part types that hold text in a message's content, and the key of their text.
const char* text_key(const std::string& type) {
  if (type == "input_text" || type == "output_text" || type == "text") return "text";
  if (type == "refusal") return "refusal";
  return nullptr;
}

// A message's (or a function_call_output's) content as one string: a string, or text parts
// joined with "\n" as chat content parts are.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad(where, fmt::format("'{}' must be a string or an array of content parts", where),
        "invalid_type");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string p = fmt::format("{}[{}]", where, j);
    check_object_at(content[j], p);
    const std::string type = *get_string_at(content[j], "type", p, true);
    const char* key = text_key(type);
    if (!key) {
      const bool media = type == "input_image" || type == "input_file" || type == "input_audio";
      bad(p + ".type",
          media ? fmt::format("'{}.type' is '{}': only text parts are supported (this server has "
                              "no image, audio or file input)",
                              p, printable(type, 40))
                : fmt::format("'{}.type' must be input_text, output_text or refusal, got '{}'", p,
                              printable(type, 40)),
          media ? "unsupported_content" : "invalid_value");
    }
    if (j > 0) text += '\n';
    text += *get_string_at(content[j], key, p, true);
  }
  return text;
}

// `input` as chat messages. Items on the assistant's side (reasoning, an assistant message,
// function calls) gather into one assistant message until an item of another side comes, as a
// chat client would write the same turn.
class InputReader {
 public:
  json messages = json::array();

  void read(const json& input) {
    if (input.is_string()) {
      flush();
      messages.push_back({{"role", "user"}, {"content", input}});
      return;
    }
    if (!input.is_array())
      bad("input", "'input' must be a string or an array of items", "invalid_type");
    if (input.empty()) bad("input", "'input' must not be empty");
    for (size_t i = 0; i < input.size(); ++i) item(input[i], fmt::format("input[{}]", i));
    flush();
  }

 private:
  void flush() {
    if (!assistant_.is_null()) messages.push_back(std::move(assistant_));
    assistant_ = nullptr;
  }
  // The assistant message being gathered; a fresh one when the current one already has text
  // or calls and `fresh_after_text` is set.
  json& assistant(bool fresh_after_text) {
    if (!assistant_.is_null() && fresh_after_text &&
        (!assistant_["content"].get<std::string>().empty() || assistant_.contains("tool_calls")))
      flush();
    if (assistant_.is_null()) assistant_ = {{"role", "assistant"}, {"content", ""}};
    return assistant_;
  }

  void item(const json& it, const std::string& p) {
    check_object_at(it, p);
    const auto type = get_string_at(it, "type", p);
    if (!type || *type == "message") return message(it, p);
    if (*type == "function_call") return function_call(it, p);
    if (*type == "function_call_output") return function_output(it, p);
    if (*type == "reasoning") return reasoning(it, p);
    if (*type == "item_reference")
      bad(p + ".type",
          fmt::format("'{}' is an item_reference: this server stores no responses, so input "
                      "must carry every item itself",
                      p),
          "unsupported_parameter");
    bad(p + ".type",
        fmt::format("'{}.type' is '{}': input items are messages, function_call, "
                    "function_call_output and reasoning (no hosted tools here)",
                    p, printable(*type, 60)),
        "unsupported_parameter");
  }

  void message(const json& it, const std::string& p) {
    std::string role = *get_string_at(it, "role", p, true);
    const json* content = field(it, "content");
    if (!content)
      bad(p + ".content", fmt::format("'{}.content' is required", p), "missing_required_parameter");
    std::string text = content_text(*content, p + ".content");
    if (role == "assistant") {
      assistant(true)["content"] = std::move(text);
      return;
    }
    // Qwen3's template knows system, not developer: a developer message is a system message.
    if (role == "developer") role = "system";
    if (role != "user" && role != "system")
      bad(p + ".role",
          fmt::format("'{}.role' must be user, assistant, system or developer, got '{}'", p,
                      printable(role, 40)));
    flush();
    messages.push_back({{"role", role}, {"content", std::move(text)}});
  }

  void function_call(const json& it, const std::string& p) {
    const std::string call_id = *get_string_at(it, "call_id", p, true);
    const std::string name = *get_string_at(it, "name", p, true);
    const std::string args = get_string_at(it, "arguments", p).value_or("{}");
    // Parsed here (in its key order) so that an error names this item.
    json parsed = parse_json_value(args);
    if (!parsed.is_object())
      bad(p + ".arguments", fmt::format("'{}.arguments' must be a JSON object (as a string)", p));
    call_ids_.insert(call_id);
    json& a = assistant(false);
    if (!a.contains("tool_calls")) a["tool_calls"] = json::array();
    a["tool_calls"].push_back({{"id", call_id},
                               {"type", "function"},
                               {"function", {{"name", name}, {"arguments", std::move(parsed)}}}});
  }

  void function_output(const json& it, const std::string& p) {
    const std::string call_id = *get_string_at(it, "call_id", p, true);
    if (!call_ids_.contains(call_id))
      bad(p + ".call_id",
          fmt::format("'{}.call_id' is '{}', but no function_call before it has that call_id", p,
                      printable(call_id, 80)));
    const json* output = field(it, "output");
    if (!output)
      bad(p + ".output", fmt::format("'{}.output' is required", p), "missing_required_parameter");
    std::string text = content_text(*output, p + ".output");
    flush();
    messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
  }

  void reasoning(const json& it, const std::string& p) {
    // Its text: the reasoning_text parts, else the summary's (encrypted content is not ours).
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json* parts = field(it, key);
      if (!parts) continue;
      const std::string q = p + "." + key;
      if (!parts->is_array()) bad(q, fmt::format("'{}' must be an array", q), "invalid_type");
      for (size_t j = 0; j < parts->size(); ++j) {
        const std::string r = fmt::format("{}[{}]", q, j);
        check_object_at((*parts)[j], r);
        if (j > 0) text += '\n';
        text += *get_string_at((*parts)[j], "text", r, true);
      }
      if (!text.empty()) break;
    }
    json& a = assistant(true);
    a["reasoning_content"] = std::move(text);
  }

  json assistant_;
  std::set<std::string> call_ids_;
};

// tools: function tools only, as chat tools.
json chat_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array", "invalid_type");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = fmt::format("tools[{}]", i);
    check_object_at(tools[i], p);
    const std::string type = *get_string_at(tools[i], "type", p, true);
    if (type != "function")
      bad(p + ".type",
          fmt::format("'{}.type' is '{}': only function tools are supported (no hosted tools)", p,
                      printable(type, 60)),
          "unsupported_parameter");
    json fn = {{"name", *get_string_at(tools[i], "name", p, true)}};
    if (auto d = get_string_at(tools[i], "description", p)) fn["description"] = *d;
    if (const json* params = field(tools[i], "parameters")) {
      check_object_at(*params, p + ".parameters");
      fn["parameters"] = *params;
    }
    get_bool_at(tools[i], "strict", p);
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

json chat_tool_choice(const json& tc) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s != "auto" && s != "none" && s != "required")
      bad("tool_choice",
          fmt::format("'tool_choice' must be auto, none, required or a function, got '{}'",
                      printable(s, 40)));
    return tc;
  }
  check_object_at(tc, "tool_choice");
  const std::string type = *get_string_at(tc, "type", "tool_choice", true);
  if (type != "function")
    bad("tool_choice.type",
        fmt::format("'tool_choice.type' is '{}': only function tools are supported",
                    printable(type, 60)),
        "unsupported_parameter");
  return {{"type", "function"},
          {"function", {{"name", *get_string_at(tc, "name", "tool_choice", true)}}}};
}

// text.format as the chat request's response_format (null: plain text).
json chat_response_format(const json& text) {
  check_object_at(text, "text");
  if (auto v = get_string_at(text, "verbosity", "text");
      v && *v != "low" && *v != "medium" && *v != "high")
    bad("text.verbosity", "'text.verbosity' must be low, medium or high");
  const json* f = field(text, "format");
  if (!f) return nullptr;
  check_object_at(*f, "text.format");
  const std::string type = *get_string_at(*f, "type", "text.format", true);
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    bad("text.format.type",
        fmt::format("'text.format.type' must be text, json_object or json_schema, got '{}'",
                    printable(type, 40)));
  json schema = {{"name", get_string_at(*f, "name", "text.format").value_or("response")}};
  const json* s = field(*f, "schema");
  if (!s)
    bad("text.format.schema", "'text.format.schema' is required", "missing_required_parameter");
  check_object_at(*s, "text.format.schema");
  schema["schema"] = *s;
  if (auto strict = get_bool_at(*f, "strict", "text.format")) schema["strict"] = *strict;
  get_string_at(*f, "description", "text.format");
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

// reasoning.effort: Qwen3's thinking off for none and minimal, on for the others; null when the
// request leaves it to the template's default.
json thinking_of(const json& reasoning) {
  check_object_at(reasoning, "reasoning");
  get_string_at(reasoning, "summary", "reasoning");
  get_string_at(reasoning, "generate_summary", "reasoning");
  const auto effort = get_string_at(reasoning, "effort", "reasoning");
  if (!effort) return nullptr;
  if (*effort == "none" || *effort == "minimal") return false;
  if (*effort == "low" || *effort == "medium" || *effort == "high" || *effort == "xhigh")
    return true;
  bad("reasoning.effort",
      fmt::format("'reasoning.effort' must be none, minimal, low, medium, high or xhigh, got '{}'",
                  printable(*effort, 40)));
}

json checked_metadata(const json& m) {
  check_object_at(m, "metadata");
  if (m.size() > 16) bad("metadata", "'metadata' holds at most 16 keys");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.key().size() > 64) bad("metadata", "'metadata' keys are at most 64 characters");
    if (!it->is_string() || it->get_ref<const std::string&>().size() > 512)
      bad("metadata", "'metadata' values must be strings of at most 512 characters",
          "invalid_type");
  }
  return m;
}

// Fields that need responses or prompts kept on the server: refused with a clear reason.
void refuse_stateful(const json& body) {
  if (field(body, "previous_response_id"))
    bad("previous_response_id",
        "'previous_response_id' needs stored responses, and this server stores none (store is "
        "always false): send the whole conversation in 'input'",
        "unsupported_parameter");
  if (field(body, "conversation"))
    bad("conversation",
        "'conversation' needs stored conversations, and this server stores none: send the whole "
        "conversation in 'input'",
        "unsupported_parameter");
  if (field(body, "prompt"))
    bad("prompt", "'prompt' (a stored prompt template) is not supported: send 'input'",
        "unsupported_parameter");
  if (get_bool(body, "background").value_or(false))
    bad("background", "'background' responses are not supported (they need stored responses)",
        "unsupported_parameter");
}

}  // namespace

TranslatedRequest parse_responses_request(const json& body, const std::string& served_model) {
  if (!body.is_object())
    throw ApiError(400,
                   fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  refuse_stateful(body);
  TranslatedRequest t;
  json& echo = t.echo;
  json chat = json::object();
  if (const json* m = field(body, "model")) chat["model"] = *m;

  InputReader reader;
  const auto instructions = get_string_at(body, "instructions", "");
  if (instructions) reader.messages.push_back({{"role", "system"}, {"content", *instructions}});
  const json* input = field(body, "input");
  if (!input) bad("input", "'input' is required", "missing_required_parameter");
  reader.read(*input);
  chat["messages"] = std::move(reader.messages);

  json kwargs = json::object();
  if (const json* kw = field(body, "chat_template_kwargs")) {
    check_object_at(*kw, "chat_template_kwargs");
    kwargs = *kw;
  }
  echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  if (const json* r = field(body, "reasoning")) {
    const json thinking = thinking_of(*r);
    if (!thinking.is_null() && !kwargs.contains("enable_thinking"))
      kwargs["enable_thinking"] = thinking;
    echo["reasoning"] = {{"effort", r->value("effort", json(nullptr))},
                         {"summary", r->value("summary", json(nullptr))}};
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);

  echo["tools"] = json::array();
  if (const json* tools = field(body, "tools")) {
    chat["tools"] = chat_tools(*tools);
    echo["tools"] = *tools;
  }
  echo["tool_choice"] = "auto";
  if (const json* tc = field(body, "tool_choice")) {
    chat["tool_choice"] = chat_tool_choice(*tc);
    echo["tool_choice"] = *tc;
  }
  echo["text"] = {{"format", {{"type", "text"}}}};
  if (const json* text = field(body, "text")) {
    json rf = chat_response_format(*text);
    if (!rf.is_null()) chat["response_format"] = std::move(rf);
    if (const json* f = field(*text, "format")) echo["text"] = {{"format", *f}};
  }
  echo["max_output_tokens"] = nullptr;
  if (auto mt = get_int(body, "max_output_tokens")) {
    if (*mt < 1)
      bad("max_output_tokens", fmt::format("'max_output_tokens' must be at least 1, got {}", *mt));
    chat["max_tokens"] = *mt;
    echo["max_output_tokens"] = *mt;
  }
  for (std::string_view k : kPassed)
    if (auto it = body.find(k); it != body.end()) chat[std::string(k)] = *it;

  // Logprobs are returned when `include` asks for them, with top_logprobs alternatives.
  bool logprobs = false;
  if (const json* inc = field(body, "include")) {
    if (!inc->is_array()) bad("include", "'include' must be an array of strings", "invalid_type");
    for (const auto& v : *inc) {
      if (!v.is_string()) bad("include", "'include' must be an array of strings", "invalid_type");
      logprobs = logprobs || v == "message.output_text.logprobs";
    }
  }
  echo["top_logprobs"] = 0;
  if (auto top = get_int(body, "top_logprobs")) {
    if (*top < 0 || *top > kMaxTopLogprobs)
      bad("top_logprobs",
          fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *top));
    echo["top_logprobs"] = *top;
    if (logprobs) chat["top_logprobs"] = *top;
  }
  if (logprobs) chat["logprobs"] = true;

  // Read only to be repeated in the answer (checked for their types).
  echo["instructions"] = instructions ? json(*instructions) : json(nullptr);
  echo["metadata"] = json::object();
  if (const json* m = field(body, "metadata")) echo["metadata"] = checked_metadata(*m);
  echo["parallel_tool_calls"] = get_bool(body, "parallel_tool_calls").value_or(true);
  get_bool(body, "store");
  echo["store"] = false;
  echo["truncation"] = "disabled";
  if (auto tr = get_string_at(body, "truncation", "")) {
    if (*tr != "auto" && *tr != "disabled")
      bad("truncation", "'truncation' must be auto or disabled");
    echo["truncation"] = *tr;
  }
  echo["user"] = nullptr;
  if (auto u = get_string_at(body, "user", "")) echo["user"] = *u;
  for (const char* k :
       {"safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier"})
    get_string_at(body, k, "");
  echo["max_tool_calls"] = nullptr;
  if (auto n = get_int(body, "max_tool_calls")) {
    if (*n < 1) bad("max_tool_calls", "'max_tool_calls' must be at least 1");
    echo["max_tool_calls"] = *n;
  }
  if (const json* so = field(body, "stream_options")) {
    check_object_at(*so, "stream_options");
    get_bool_at(*so, "include_obfuscation", "stream_options");
  }

  t.g = parse_translated_chat(chat, served_model,
                              {{"messages", "input"},
                               {"max_tokens", "max_output_tokens"},
                               {"response_format", "text.format"}});
  t.unknown = fields_not_in(body, kPassed,
                            {"model",
                             "input",
                             "instructions",
                             "tools",
                             "tool_choice",
                             "max_output_tokens",
                             "top_logprobs",
                             "text",
                             "reasoning",
                             "metadata",
                             "store",
                             "previous_response_id",
                             "conversation",
                             "background",
                             "prompt",
                             "truncation",
                             "include",
                             "user",
                             "safety_identifier",
                             "prompt_cache_key",
                             "prompt_cache_retention",
                             "service_tier",
                             "max_tool_calls",
                             "stream_options",
                             "chat_template_kwargs"});
  return t;
}

namespace {

// The output items of a response, built from a choice's chat deltas; with `emit` set, also the
// stream's events for each item as it opens, grows and closes.
class OutputItems {
 public:
  using Emit = std::function<void(const std::string& type, json fields)>;
  explicit OutputItems(Emit emit = {}) : emit_(std::move(emit)) {}

  json items = json::array();

  // `logprobs`: OpenAI's logprob entries of the content's tokens (an array, maybe empty).
  void take(const ChatDelta& d, const json& logprobs) {
    if (!d.reasoning.empty()) {
      if (kind_ != Kind::Reasoning)
        open(Kind::Reasoning, {{"id", random_id("rs")},
                               {"type", "reasoning"},
                               {"summary", json::array()},
                               {"content", json::array()}});
      text_ += d.reasoning;
      send("response.reasoning_text.delta", {{"content_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (kind_ != Kind::Message)
        open(Kind::Message, {{"id", random_id("msg")},
                             {"type", "message"},
                             {"status", "in_progress"},
                             {"role", "assistant"},
                             {"content", json::array()}});
      text_ += d.content;
      for (const auto& lp : logprobs) logprobs_.push_back(lp);
      send("response.output_text.delta",
           {{"content_index", 0}, {"delta", d.content}, {"logprobs", logprobs}});
    }
    if (d.calls.is_array())
      for (const auto& call : d.calls) call_delta(call);
  }

  // Closes the open item; `status` is completed or incomplete.
  void finish(const std::string& status) {
    if (kind_ == Kind::None) return;
    json& it = item_;
    if (kind_ == Kind::Reasoning) {
      const json part = {{"type", "reasoning_text"}, {"text", text_}};
      send("response.reasoning_text.done", {{"content_index", 0}, {"text", text_}});
      send("response.content_part.done", {{"content_index", 0}, {"part", part}});
      it["content"] = json::array({part});
    } else if (kind_ == Kind::Message) {
      const json part = {{"type", "output_text"},
                         {"text", text_},
                         {"annotations", json::array()},
                         {"logprobs", logprobs_}};
      send("response.output_text.done",
           {{"content_index", 0}, {"text", text_}, {"logprobs", logprobs_}});
      send("response.content_part.done", {{"content_index", 0}, {"part", part}});
      it["content"] = json::array({part});
      it["status"] = status;
    } else {
      it["arguments"] = text_;
      it["status"] = status;
      send("response.function_call_arguments.done", {{"name", it["name"]}, {"arguments", text_}});
    }
    if (emit_) emit_("response.output_item.done", {{"output_index", items.size()}, {"item", it}});
    items.push_back(std::move(item_));
    item_ = nullptr;
    kind_ = Kind::None;
    text_.clear();
    logprobs_ = json::array();
  }

 private:
  enum class Kind { None, Reasoning, Message, Call };

  void open(Kind kind, json item) {
    finish("completed");
    kind_ = kind;
    item_ = std::move(item);
    if (!emit_) return;
    emit_("response.output_item.added", {{"output_index", items.size()}, {"item", item_}});
    if (kind == Kind::Reasoning)
      send("response.content_part.added",
           {{"content_index", 0}, {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
    else if (kind == Kind::Message)
      send("response.content_part.added", {{"content_index", 0},
                                           {"part",
                                            {{"type", "output_text"},
                                             {"text", ""},
                                             {"annotations", json::array()},
                                             {"logprobs", json::array()}}}});
  }

  // An OpenAI tool_calls delta: a new call (with its id and name) opens a function_call item.
  void call_delta(const json& d) {
    const json& fn = d.value("function", json::object());
    if (d.contains("id")) {
      open(Kind::Call, {{"id", random_id("fc")},
                        {"type", "function_call"},
                        {"status", "in_progress"},
                        {"arguments", ""},
                        {"call_id", d["id"]},
                        {"name", fn.value("name", "")}});
    }
    const std::string args = fn.value("arguments", "");
    if (kind_ != Kind::Call || args.empty()) return;
    text_ += args;
    send("response.function_call_arguments.delta", {{"delta", args}});
  }

  // An event about the open item: its output_index and item_id first.
  void send(const std::string& type, json fields) {
    if (!emit_) return;
    json f = {{"item_id", item_["id"]}, {"output_index", items.size()}};
    for (auto it = fields.begin(); it != fields.end(); ++it) f[it.key()] = *it;
    emit_(type, std::move(f));
  }

  Emit emit_;
  Kind kind_ = Kind::None;
  json item_;
  std::string text_;
  json logprobs_ = json::array();
};

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool incomplete(const Generation& gen) {
  return gen.choices.front().reason == "length";
}

// The response object around `output`; `status` in_progress, completed, incomplete or failed.
json response_object(const Generation& gen, const std::string& status, json output,
                     bool with_usage) {
  const json& e = gen.request_echo;
  const Choice& c = gen.choices.front();
  const SamplingParams& s = c.req->params.sampling;
  json r = {{"id", gen.id},
            {"object", "response"},
            {"created_at", gen.created},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", nullptr}};
  if (status == "completed" || status == "incomplete") r["completed_at"] = unix_time();
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  for (const char* k : {"instructions", "max_output_tokens", "max_tool_calls"}) r[k] = e.at(k);
  r["model"] = gen.model;
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = e.at("parallel_tool_calls");
  r["previous_response_id"] = nullptr;
  r["reasoning"] = e.at("reasoning");
  r["store"] = false;
  r["temperature"] = s.temperature;
  r["text"] = e.at("text");
  r["tool_choice"] = e.at("tool_choice");
  r["tools"] = e.at("tools");
  r["top_logprobs"] = e.at("top_logprobs");
  r["top_p"] = s.top_p;
  r["truncation"] = e.at("truncation");
  r["usage"] = nullptr;
  if (with_usage) {
    const size_t input = c.req->params.prompt.size(), output_tokens = c.out.ids.size();
    r["usage"] = {{"input_tokens", input},
                  {"input_tokens_details", {{"cached_tokens", c.req->cached_tokens()}}},
                  {"output_tokens", output_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", gen.reasoning_tokens(c)}}},
                  {"total_tokens", input + output_tokens}};
  }
  r["user"] = e.at("user");
  r["metadata"] = e.at("metadata");
  return r;
}

json content_logprobs(const Generation& gen, std::span<const TokenLogprob> lps) {
  if (!gen.want_logprobs() || lps.empty()) return json::array();
  return gen.logprobs_json(lps, 0)["content"];
}

class ResponsesEvents final : public EventFormat {
 public:
  explicit ResponsesEvents(std::shared_ptr<Generation> gen)
      : gen_(std::move(gen)),
        items_([this](const std::string& type, json fields) { add(type, std::move(fields)); }) {}

  std::string open() override {
    add("response.created", {{"response", response_object(*gen_, "in_progress", {}, false)}});
    add("response.in_progress", {{"response", response_object(*gen_, "in_progress", {}, false)}});
    return take();
  }

  std::string step(size_t, Choice& c, const std::string& piece, const std::vector<int32_t>& ids,
                   size_t lp_from) override {
    const ChatDelta d = chat_delta(*gen_, c, piece);
    items_.take(d, ids.empty() ? json::array()
                               : content_logprobs(*gen_, std::span(c.logprobs).subspan(lp_from)));
    if (!c.reason.empty()) items_.finish(incomplete(*gen_) ? "incomplete" : "completed");
    return take();
  }

  std::string close(bool failed) override {
    if (failed) {
      json r = response_object(*gen_, "failed", items_.items, false);
      r["error"] = {{"code", "server_error"}, {"message", error_}};
      add("response.failed", {{"response", std::move(r)}});
    } else {
      const bool cut = incomplete(*gen_);
      add(cut ? "response.incomplete" : "response.completed",
          {{"response",
            response_object(*gen_, cut ? "incomplete" : "completed", items_.items, true)}});
    }
    return take();
  }

  std::string fail(const std::string& message) override {
    error_ = message;
    add("error", {{"code", "server_error"}, {"message", message}, {"param", nullptr}});
    return take();
  }

 private:
  void add(const std::string& type, json fields) {
    json e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = *it;
    buf_ += named_event(type, e);
  }
  std::string take() { return std::exchange(buf_, {}); }

  std::shared_ptr<Generation> gen_;
  OutputItems items_;
  std::string buf_, error_;
  int64_t seq_ = 0;
};

}  // namespace

json responses_body(Generation& gen) {
  Choice& c = gen.choices.front();
  OutputItems items;
  const ChatDelta d = chat_delta(gen, c, c.out.text);
  // The message's logprobs: the tokens after the think block.
  const size_t skip = std::min(gen.reasoning_tokens(c), c.logprobs.size());
  items.take(d, content_logprobs(gen, std::span(c.logprobs).subspan(skip)));
  const bool cut = incomplete(gen);
  items.finish(cut ? "incomplete" : "completed");
  return response_object(gen, cut ? "incomplete" : "completed", std::move(items.items), true);
}

std::unique_ptr<EventFormat> responses_events(std::shared_ptr<Generation> gen) {
  return std::make_unique<ResponsesEvents>(std::move(gen));
}

}  // namespace flashmap::server
