#include "server/filters.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "server/api.h"

namespace flashmap::server {

using json = nlohmann::json;

std::string StopMatcher::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

namespace {
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
}

bool prompt_opens_think(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen), close = prompt.rfind(kThinkClose);
  return open != std::string_view::npos && (close == std::string_view::npos || open > close);
}

ReasoningSplitter::Piece ReasoningSplitter::feed(std::string_view text) {
  Piece out;
  pending_.append(text);
  if (state_ == State::Start) {
    if (pending_.size() < kThinkOpen.size() && kThinkOpen.starts_with(pending_)) return out;
    if (pending_.starts_with(kThinkOpen)) {
      pending_.erase(0, kThinkOpen.size());
      state_ = State::Reasoning;
    } else {
      state_ = State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    saw_ = true;
    const size_t end = pending_.find(kThinkClose);
    if (end == std::string::npos) {
      // Hold back the longest tail that could start "</think>".
      size_t hold = std::min(pending_.size(), kThinkClose.size() - 1);
      while (hold > 0 &&
             !kThinkClose.starts_with(std::string_view(pending_).substr(pending_.size() - hold)))
        --hold;
      out.reasoning = pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    out.reasoning = pending_.substr(0, end);
    pending_.erase(0, end + kThinkClose.size());
    state_ = State::Content;
  }
  out.content = std::exchange(pending_, {});
  return out;
}

ReasoningSplitter::Piece ReasoningSplitter::finish() {
  Piece out;
  if (state_ == State::Reasoning)
    out.reasoning = std::exchange(pending_, {});
  else
    out.content = std::exchange(pending_, {});
  return out;
}

namespace {
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

bool blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

std::string make_call_id() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}
}  // namespace

std::string tool_call_id() {
  return make_call_id();
}

ToolCalls parse_tool_calls(const std::string& text) {
  ToolCalls out;
  size_t pos = 0;
  bool first = true;
  auto fail = [&](std::string why) {
    out.calls = json::array();
    out.content = text;
    out.error = std::move(why);
    return out;
  };
  for (;;) {
    const size_t open = text.find(kToolOpen, pos);
    const std::string_view outside = std::string_view(text).substr(
        pos, open == std::string::npos ? std::string::npos : open - pos);
    if (first || !blank(outside)) out.content += outside;
    first = false;
    if (open == std::string::npos) break;
    const size_t body = open + kToolOpen.size();
    const size_t close = text.find(kToolClose, body);
    if (close == std::string::npos)
      return fail(fmt::format("tool call {} is not closed with </tool_call>", out.calls.size()));
    json call;
    try {
      call = json::parse(text.substr(body, close - body));
    } catch (const json::exception&) {
      return fail(fmt::format("tool call {} is not valid JSON", out.calls.size()));
    }
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string())
      return fail(
          fmt::format("tool call {} is not an object with a string 'name'", out.calls.size()));
    json args = call.value("arguments", json::object());
    if (args.is_string()) {
      // Some models write the arguments as a JSON string; OpenAI's field is one anyway.
      try {
        args = json::parse(args.get<std::string>());
      } catch (const json::exception&) {
        return fail(fmt::format("tool call {} has arguments that are not JSON", out.calls.size()));
      }
    }
    if (!args.is_object())
      return fail(
          fmt::format("tool call {} has arguments that are not an object", out.calls.size()));
    out.calls.push_back({{"id", make_call_id()},
                         {"type", "function"},
                         {"function", {{"name", call["name"]}, {"arguments", dump_json(args)}}}});
    pos = close + kToolClose.size();
  }
  return out;
}

json forced_tool_calls(const std::string& text, const std::string& name) {
  json calls = json::array();
  if (!name.empty()) {
    if (!json::accept(text)) return calls;
    calls.push_back({{"id", tool_call_id()},
                     {"type", "function"},
                     {"function", {{"name", name}, {"arguments", text}}}});
    return calls;
  }
  const auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_array()) return calls;
  for (const auto& item : parsed)
    calls.push_back(
        {{"id", tool_call_id()},
         {"type", "function"},
         {"function", {{"name", item.at("name")}, {"arguments", item.at("parameters").dump()}}}});
  return calls;
}

namespace {
// The head of a Qwen3 call block, `{"name": "<name>", "arguments": `, at the start of `s`
// (whitespace allowed between tokens). Need: `s` may still become one; None: it cannot.
enum class Head { Need, Match, None };
Head match_head(std::string_view s, size_t& length, std::string& name) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto lit = [&](std::string_view l) -> Head {
    ws();
    const size_t n = std::min(l.size(), s.size() - i);
    if (s.substr(i, n) != l.substr(0, n)) return Head::None;
    if (n < l.size()) return Head::Need;
    i += n;
    return Head::Match;
  };
  for (std::string_view l : {"{", "\"name\"", ":", "\""}) {
    const Head h = lit(l);
    if (h != Head::Match) return h;
  }
  std::string raw = "\"";
  for (bool esc = false;; ++i) {
    if (i >= s.size()) return Head::Need;
    const char c = s[i];
    raw += c;
    if (esc) {
      esc = false;
    } else if (c == '\\') {
      esc = true;
    } else if (c == '"') {
      ++i;
      break;
    }
  }
  for (std::string_view l : {",", "\"arguments\"", ":"}) {
    const Head h = lit(l);
    if (h != Head::Match) return h;
  }
  ws();
  if (i >= s.size()) return Head::Need;
  if (s[i] != '{') return Head::None;  // arguments as a string: held to the end
  try {
    name = json::parse(raw).get<std::string>();
  } catch (const json::exception&) {
    return Head::None;
  }
  length = i;
  return Head::Match;
}

// How much of the end of `s` could be the start of `tag` (held back until decided).
size_t partial_tag(std::string_view s, std::string_view tag) {
  size_t hold = std::min(s.size(), tag.size() - 1);
  while (hold > 0 && !tag.starts_with(s.substr(s.size() - hold))) --hold;
  return hold;
}
}  // namespace

// Each step_* consumes what it can of pending_ in its state; true when the state changed (the
// next state may consume more).
bool ToolCallStreamer::step_text(Out& out) {
  const size_t open = pending_.find(kToolOpen);
  const size_t cut =
      open != std::string::npos ? open : pending_.size() - partial_tag(pending_, kToolOpen);
  std::string text = pending_.substr(0, cut);
  pending_.erase(0, cut);
  if (!started_) {
    out.content += text;
  } else {
    // After a block: shown unless it stays blank up to the next block or the end.
    between_ += text;
    if (open != std::string::npos) {
      if (!blank(between_)) out.content += between_;
      between_.clear();
    }
  }
  if (open == std::string::npos) return false;
  pending_.erase(0, kToolOpen.size());
  state_ = State::Head;
  started_ = true;
  return true;
}

bool ToolCallStreamer::step_head(Out& out) {
  size_t length = 0;
  std::string name;
  const Head h = match_head(pending_, length, name);
  if (h == Head::Need) return false;
  if (h == Head::None) {
    state_ = State::Held;  // another shape: parse_tool_calls decides at the end
    return false;
  }
  ++index_;
  out.calls.push_back({{"index", index_},
                       {"id", tool_call_id()},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", ""}}}});
  pending_.erase(0, length);
  state_ = State::Args;
  depth_ = 0;
  in_string_ = escaped_ = false;
  return true;
}

bool ToolCallStreamer::step_args(Out& out) {
  size_t i = 0;
  bool closed = false;
  for (; i < pending_.size() && !closed; ++i) {
    const char c = pending_[i];
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      closed = --depth_ == 0;
    }
  }
  if (i > 0)
    out.calls.push_back({{"index", index_}, {"function", {{"arguments", pending_.substr(0, i)}}}});
  pending_.erase(0, i);
  if (closed) state_ = State::Tail;
  return closed;
}

void ToolCallStreamer::step(Out& out) {
  for (bool progress = true; progress;) {
    switch (state_) {
      case State::Text:
        progress = step_text(out);
        break;
      case State::Head:
        progress = step_head(out);
        break;
      case State::Args:
        progress = step_args(out);
        break;
      case State::Tail: {
        const size_t close = pending_.find(kToolClose);
        progress = close != std::string::npos;
        if (progress) {
          pending_.erase(0, close + kToolClose.size());
          state_ = State::Text;
        }
        break;
      }
      case State::Held:
        progress = false;
        break;
    }
  }
}

ToolCallStreamer::Out ToolCallStreamer::feed(std::string_view text) {
  Out out;
  all_.append(text);
  pending_.append(text);
  step(out);
  return out;
}

ToolCallStreamer::Out ToolCallStreamer::finish() {
  Out out;
  const ToolCalls whole = parse_tool_calls(all_);
  if (!whole.error.empty()) {
    error_ = whole.error;
  } else if (whole.calls.size() != calls() || state_ == State::Held) {
    // Blocks of another shape (held): send what the parse found that was not streamed.
    for (size_t k = calls(); k < whole.calls.size(); ++k) {
      json c = whole.calls[k];
      c["index"] = k;
      out.calls.push_back(std::move(c));
    }
    index_ = int(whole.calls.size()) - 1;
    return out;
  }
  if (!error_.empty()) {
    // The unsent rest as content.
    if (state_ == State::Text) {
      out.content = between_ + pending_;
    } else {
      out.content = std::string(kToolOpen) + pending_;
    }
    return out;
  }
  if (state_ == State::Text && !blank(between_ + pending_)) out.content = between_ + pending_;
  if (!started_) out.content = pending_;
  return out;
}

}  // namespace flashmap::server
