#include "server/filters.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "server/api.h"

namespace flashmap::server {

using json = nlohmann::ordered_json;

std::string StopMatcher::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_)
    if (const size_t at = pending_.find(s); at < first) {
      first = at;
      matched_ = s;
    }
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

}  // namespace

std::string random_id(std::string_view prefix) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^
                                   std::random_device{}()};
  std::string id(prefix);
  id += '_';
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

std::string tool_call_id() {
  return random_id("call");
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
    // The model's text, so bounded like a request's: a value nested deeper than a body may be
    // would only cost stack in the copies and dumps below.
    const json call = parse_json_value(text.substr(body, close - body));
    if (call.is_discarded())
      return fail(fmt::format("tool call {} is not valid JSON", out.calls.size()));
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string())
      return fail(
          fmt::format("tool call {} is not an object with a string 'name'", out.calls.size()));
    json args = call.value("arguments", json::object());
    if (args.is_string()) {
      // Some models write the arguments as a JSON string; OpenAI's field is one anyway.
      args = parse_json_value(args.get<std::string>());
      if (args.is_discarded())
        return fail(fmt::format("tool call {} has arguments that are not JSON", out.calls.size()));
    }
    if (!args.is_object())
      return fail(
          fmt::format("tool call {} has arguments that are not an object", out.calls.size()));
    out.calls.push_back({{"id", tool_call_id()},
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
  // The streamer's deltas merged: each call's arguments are the model's own text, as the
  // streamed pieces add up to.
  RequiredCallStreamer streamer;
  json deltas = streamer.feed(text);
  for (auto& d : streamer.finish()) deltas.push_back(std::move(d));
  if (!streamer.error().empty()) return calls;
  for (const auto& d : deltas) {
    const size_t k = d["index"].get<size_t>();
    if (k == calls.size())
      calls.push_back({{"id", d["id"]},
                       {"type", "function"},
                       {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}});
    std::string& args = calls[k]["function"]["arguments"].get_ref<std::string&>();
    args += d["function"]["arguments"].get<std::string>();
  }
  return calls;
}

namespace {
// The head of a call, `{"name": "<name>", "<args_key>": ` followed by '{', at the start of `s`
// (whitespace allowed between tokens): a Qwen3 block's (args_key "arguments") or an item of a
// tool_choice "required" output ("parameters"). Need: `s` may still become one; None: it cannot.
enum class Head { Need, Match, None };
Head match_head(std::string_view s, size_t& length, std::string& name, std::string_view args_key) {
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
  const std::string quoted_key = fmt::format("\"{}\"", args_key);
  for (std::string_view l :
       {std::string_view(","), std::string_view(quoted_key), std::string_view(":")}) {
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

// How much of `s` a JSON value that began before it (its brackets so far in `d`) takes, up to
// and including its closing bracket; `closed` when it got there.
size_t scan_value(std::string_view s, JsonDepth& d, bool& closed) {
  size_t i = 0;
  closed = false;
  while (i < s.size() && !closed) closed = d.feed(s[i++]) < 0 && d.depth == 0;
  return i;
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
  const Head h = match_head(pending_, length, name, "arguments");
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
  args_ = {};
  return true;
}

bool ToolCallStreamer::step_args(Out& out) {
  bool closed = false;
  const size_t i = scan_value(pending_, args_, closed);
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

json RequiredCallStreamer::feed(std::string_view text) {
  json out = json::array();
  all_.append(text);
  pending_.append(text);
  auto skip_ws = [&] {
    const size_t n = pending_.find_first_not_of(" \t\r\n");
    pending_.erase(0, n == std::string::npos ? pending_.size() : n);
    return !pending_.empty();
  };
  for (bool progress = true; progress;) {
    progress = false;
    switch (state_) {
      case State::Open:
        if (!skip_ws()) break;
        if (pending_[0] != '[') {
          state_ = State::Held;
          break;
        }
        pending_.erase(0, 1);
        state_ = State::Item;
        progress = true;
        break;
      case State::Item: {
        size_t length = 0;
        std::string name;
        const Head h = match_head(pending_, length, name, "parameters");
        if (h == Head::Need) break;
        if (h == Head::None) {
          state_ = State::Held;  // parameters that are not an object: sent whole at the end
          break;
        }
        ++index_;
        out.push_back({{"index", index_},
                       {"id", tool_call_id()},
                       {"type", "function"},
                       {"function", {{"name", name}, {"arguments", ""}}}});
        pending_.erase(0, length);
        args_ = {};
        state_ = State::Args;
        progress = true;
        break;
      }
      case State::Args: {
        bool closed = false;
        const size_t i = scan_value(pending_, args_, closed);
        if (i > 0)
          out.push_back({{"index", index_}, {"function", {{"arguments", pending_.substr(0, i)}}}});
        pending_.erase(0, i);
        if (closed) {
          state_ = State::Tail;
          progress = true;
        }
        break;
      }
      case State::Tail:
        // The item's '}', then ',' (another item) or ']' (the end).
        if (!skip_ws()) break;
        if (pending_[0] == '}' && !item_closed_) {
          item_closed_ = true;
        } else if (pending_[0] == ',' && item_closed_) {
          state_ = State::Item;
          item_closed_ = false;
        } else if (pending_[0] == ']' && item_closed_) {
          state_ = State::End;
        } else {
          state_ = State::Held;
          break;
        }
        pending_.erase(0, 1);
        progress = true;
        break;
      case State::End:
      case State::Held:
        break;
    }
  }
  return out;
}

json RequiredCallStreamer::finish() {
  json out = json::array();
  const json parsed = parse_json_value(all_);
  bool ok = !parsed.is_discarded() && parsed.is_array() && !parsed.empty();
  for (size_t k = 0; ok && k < parsed.size(); ++k) {
    const auto& item = parsed[k];
    ok = item.is_object() && item.contains("name") && item["name"].is_string() &&
         item.contains("parameters");
  }
  if (!ok) {
    error_ = "the output is not a complete JSON array of {\"name\", \"parameters\"} calls";
    return out;
  }
  // What was held (an item of another shape) and the items after it, whole.
  for (size_t k = calls(); k < parsed.size(); ++k)
    out.push_back({{"index", k},
                   {"id", tool_call_id()},
                   {"type", "function"},
                   {"function",
                    {{"name", parsed[k]["name"]}, {"arguments", parsed[k]["parameters"].dump()}}}});
  index_ = int(parsed.size()) - 1;
  return out;
}

std::string RequiredCallStreamer::unsent() const {
  return calls() == 0 ? all_ : pending_;
}

}  // namespace flashmap::server
