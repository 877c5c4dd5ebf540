#!/usr/bin/env python3
"""Generate tests/data/chat/api_prompts.json: the prompt ids of tool conversations, made by
Hugging Face transformers' `apply_chat_template` from the official Qwen3 template.

Each case is a request body as a client sends it to one endpoint of `flashmap serve` (keys in the
client's order, as json.dumps writes them):

* chat: a /v1/chat/completions body. transformers gets its messages, tools and
  chat_template_kwargs as they are, except that tool-call arguments given as a JSON string are
  parsed first, as vLLM does before rendering (so both forms render the same object).
* responses, messages: a /v1/responses or /v1/messages body, with its chat twin written out by hand
  here (`twin`): the conversation the server's documented translation must produce
  (docs/AGENT_APIS.md). transformers renders the twin.

The test (tests/server/test_agent_apis.py) sends each body and compares: chat's prompt ids
(return_token_ids) and /tokenize ids with these ids, the Responses usage.input_tokens and the
Messages count_tokens / usage with their number.

Run from the repository root:  python3 tools/make_api_goldens.py
"""

import json
import os
import shutil
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "tests", "data", "qwen3-tokenizer")
OUT = os.path.join(ROOT, "tests", "data", "chat", "api_prompts.json")

# Tools whose keys are not in sorted order at any level, with nested schemas.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "required": ["city", "days"],
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"], "type": "string"},
            },
        },
        "description": "Weather forecast for a city",
    },
}
SEARCH = {
    "function": {
        "description": "Search files; returns matching paths",
        "name": "search_files",
        "strict": True,
        "parameters": {
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "zone": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                        "ext": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
                    },
                    "additionalProperties": False,
                },
                "limit": {"default": 10, "type": "integer"},
            },
            "type": "object",
            "required": ["query"],
        },
    },
    "type": "function",
}


def responses_tool(chat_tool):
    """A chat tool in the Responses API's flat shape, keys in another order again."""
    fn = chat_tool["function"]
    flat = {"type": "function", "name": fn["name"], "parameters": fn["parameters"]}
    if "description" in fn:
        flat["description"] = fn["description"]
    flat["strict"] = False
    return flat


def messages_tool(chat_tool):
    """A chat tool in the Messages API's shape."""
    fn = chat_tool["function"]
    tool = {"name": fn["name"]}
    if "description" in fn:
        tool["description"] = fn["description"]
    tool["input_schema"] = fn["parameters"]
    return tool


def twin_tool(chat_tool):
    """What the server's translation makes of a Responses or Messages tool: a chat tool with
    name, description, parameters (strict dropped)."""
    fn = chat_tool["function"]
    out = {"name": fn["name"]}
    if "description" in fn:
        out["description"] = fn["description"]
    out["parameters"] = fn["parameters"]
    return {"type": "function", "function": out}


def user(text):
    return {"role": "user", "content": text}


CHAT = {
    # The first case of the report: tools on one user turn.
    "chat_tools_on_a_user_turn": {
        "messages": [user("Weather in Paris for 3 days?")],
        "tools": [WEATHER],
    },
    "chat_system_and_nested_tools": {
        "messages": [{"role": "system", "content": "You are a careful assistant."},
                     user("Find the notes about Zürich.")],
        "tools": [SEARCH, WEATHER],
    },
    # A call with multi-key arguments (an object, and a JSON string in another key order), its
    # results fed back, the answer, the next question.
    "chat_tool_call_round_trip": {
        "messages": [
            user("Weather in Oslo and Lima?"),
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": {"unit": "celsius", "days": 2, "city": "Oslo"}}},
                {"id": "call_b", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": '{"days": 1, "city": "Lima", "unit": "fahrenheit"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": '{"sky": "snow", "temp": -3}'},
            {"role": "tool", "tool_call_id": "call_b", "content": "sunny, 77F"},
            {"role": "assistant", "content": "Oslo: snow, -3°C. Lima: sunny, 77°F."},
            user("And Zürich?"),
        ],
        "tools": [WEATHER, SEARCH],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "chat_reasoning_then_call": {
        "messages": [
            user("Search my notes for 'tea'."),
            {"role": "assistant", "content": "", "reasoning_content": "The user wants a search.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "search_files",
                 "arguments": {"query": "tea", "filters": {"ext": ["md"], "zone": None},
                               "limit": 3}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "notes/tea.md"},
        ],
        "tools": [SEARCH],
    },
}

RESPONSES = {
    "responses_instructions_and_tools": (
        {"instructions": "Answer briefly.", "input": "Weather in Paris for 3 days?",
         "tools": [responses_tool(WEATHER), responses_tool(SEARCH)]},
        {"messages": [{"role": "system", "content": "Answer briefly."},
                      user("Weather in Paris for 3 days?")],
         "tools": [twin_tool(WEATHER), twin_tool(SEARCH)]},
    ),
    "responses_function_call_round_trip": (
        {"input": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Weather in Oslo?"},
                         {"type": "input_text", "text": "Two days, please."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Call get_weather for Oslo."}]},
            {"type": "function_call", "call_id": "call_x", "name": "get_weather",
             "arguments": '{"unit": "celsius", "city": "Oslo", "days": 2}'},
            {"type": "function_call_output", "call_id": "call_x", "output": "snow, -3 C"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Snow, -3°C.", "annotations": []}]},
            {"role": "user", "content": "Thanks. And Lima?"}],
         "tools": [responses_tool(WEATHER)], "reasoning": {"effort": "low"}},
        {"messages": [
            user("Weather in Oslo?\nTwo days, please."),
            {"role": "assistant", "content": "", "reasoning_content": "Call get_weather for Oslo.",
             "tool_calls": [{"id": "call_x", "type": "function", "function": {
                 "name": "get_weather",
                 "arguments": {"unit": "celsius", "city": "Oslo", "days": 2}}}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "snow, -3 C"},
            {"role": "assistant", "content": "Snow, -3°C."},
            user("Thanks. And Lima?")],
         "tools": [twin_tool(WEATHER)], "enable_thinking": True},
    ),
    "responses_developer_message_without_thinking": (
        {"input": [{"role": "developer", "content": "Use tools when useful."},
                   {"role": "user", "content": [{"type": "input_text", "text": "Find tea."}]}],
         "tools": [responses_tool(SEARCH)], "reasoning": {"effort": "minimal"}},
        {"messages": [{"role": "system", "content": "Use tools when useful."}, user("Find tea.")],
         "tools": [twin_tool(SEARCH)], "enable_thinking": False},
    ),
}

MESSAGES = {
    "messages_system_blocks_and_tools": (
        {"max_tokens": 8,
         "system": [{"type": "text", "text": "You are a coding agent. "},
                    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
         "tools": [messages_tool(SEARCH), messages_tool(WEATHER)],
         "messages": [user("Find the notes about tea.")]},
        {"messages": [{"role": "system", "content": "You are a coding agent. Be brief."},
                      user("Find the notes about tea.")],
         "tools": [twin_tool(SEARCH), twin_tool(WEATHER)]},
    ),
    "messages_tool_use_round_trip": (
        {"max_tokens": 8, "tools": [messages_tool(WEATHER)], "thinking": {"type": "disabled"},
         "messages": [
             user("Weather in Oslo and Lima?"),
             {"role": "assistant", "content": [
                 {"type": "thinking", "thinking": "Two calls.", "signature": ""},
                 {"type": "text", "text": "Checking both."},
                 {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                  "input": {"unit": "celsius", "city": "Oslo", "days": 1}},
                 {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                  "input": {"days": 2, "city": "Lima"}}]},
             {"role": "user", "content": [
                 {"type": "tool_result", "tool_use_id": "toolu_1", "content": "snow"},
                 {"type": "tool_result", "tool_use_id": "toolu_2",
                  "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "25C"}]},
                 {"type": "text", "text": "Summarize."}]}]},
        {"messages": [
            user("Weather in Oslo and Lima?"),
            {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two calls.",
             "tool_calls": [
                 {"id": "toolu_1", "type": "function", "function": {
                     "name": "get_weather", "arguments": {"unit": "celsius", "city": "Oslo", "days": 1}}},
                 {"id": "toolu_2", "type": "function", "function": {
                     "name": "get_weather", "arguments": {"days": 2, "city": "Lima"}}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "snow"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "sunny\n25C"},
            user("Summarize.")],
         "tools": [twin_tool(WEATHER)], "enable_thinking": False},
    ),
    "messages_thinking_enabled": (
        {"max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 2048},
         "system": "Think first.", "messages": [user("Is 91 prime?")]},
        {"messages": [{"role": "system", "content": "Think first."}, user("Is 91 prime?")],
         "enable_thinking": True},
    ),
}


def vllm_arguments(messages):
    """Tool-call arguments given as JSON strings, parsed (vLLM's rule before rendering)."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"].get("arguments"), str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    from transformers import AutoTokenizer  # noqa: PLC0415 (a tool dependency only)

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOKENIZER, name), tmp)
        shutil.copy(os.path.join(TOKENIZER, "chat_template.qwen3-official.jinja"),
                    os.path.join(tmp, "chat_template.jinja"))
        tok = AutoTokenizer.from_pretrained(tmp)

        def ids(messages, tools=None, **kwargs):
            out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                          tokenize=True, **kwargs)
            return list(out["input_ids"] if hasattr(out, "keys") else out)

        cases = []
        for name, body in CHAT.items():
            kwargs = body.get("chat_template_kwargs", {})
            cases.append({"name": name, "endpoint": "chat", "body": body,
                          "ids": ids(vllm_arguments(body["messages"]), body.get("tools"), **kwargs)})
        for endpoint, table in (("responses", RESPONSES), ("messages", MESSAGES)):
            for name, (body, twin) in table.items():
                twin = dict(twin)
                messages, tools = twin.pop("messages"), twin.pop("tools", None)
                cases.append({"name": name, "endpoint": endpoint, "body": body, "twin":
                              {"messages": messages, "tools": tools, "kwargs": twin},
                              "ids": ids(messages, tools, **twin)})
    import transformers  # noqa: PLC0415

    doc = {"generated_by": "tools/make_api_goldens.py",
           "transformers": transformers.__version__,
           "template": "tests/data/qwen3-tokenizer/chat_template.qwen3-official.jinja",
           "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
