#!/usr/bin/env python3
"""Generate the chat-template goldens under tests/data/chat/ from Hugging Face's own code.

* Chat goldens: each request in CHAT_CASES is written to requests/NAME.json, read back, and
  rendered with transformers' `tokenizer.apply_chat_template(..., tokenize=False)` for every
  template variant (a tokenizer folder loaded with AutoTokenizer, so transformers' own loading
  rules pick the template). The output goes to expected/VARIANT/NAME.txt, or NAME.error when
  transformers raises.
* Interpreter goldens: every template in JINJA_CASES is rendered by jinja2 in the environment
  transformers builds for chat templates (its compiled-template function when importable,
  otherwise an equivalent ImmutableSandboxedEnvironment) and stored in jinja_cases.json, with the
  line number jinja2 reports for the cases that must fail.

Run from the repository root:  python3 tools/make_chat_goldens.py [--source DIR]
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "chat")

# ------------------------------------------------------------------------------------------------
# Chat requests

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}, "precise": {"type": "boolean", "default": False}},
            "required": [],
        },
    },
}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def tool(text):
    return {"role": "tool", "content": text}


def call(name, arguments, wrap=True, call_id=None):
    fn = {"name": name, "arguments": arguments}
    c = {"type": "function", "function": fn} if wrap else fn
    if call_id:
        c = {"id": call_id, **c}
    return c


CHAT_CASES = {
    "single_turn": {"messages": [user("Hello!")], "add_generation_prompt": True},
    "single_turn_no_generation_prompt": {"messages": [user("Hello!")]},
    "system_prompt": {
        "messages": [{"role": "system", "content": "You are a terse assistant."}, user("Hi")],
        "add_generation_prompt": True,
    },
    "multi_turn": {
        "messages": [
            {"role": "system", "content": "Be nice."},
            user("What is 2+2?"),
            assistant("4"),
            user("And 3+3?"),
            assistant("6"),
            user("Thanks"),
        ],
        "add_generation_prompt": True,
    },
    "reasoning_content_history": {
        "messages": [
            user("What is 2+2?"),
            assistant("It is 4.", reasoning_content="Add two and two."),
            user("Double it."),
            assistant("8", reasoning_content="\nTwice 4 is 8.\n"),
            user("Half of that?"),
        ],
        "add_generation_prompt": True,
    },
    "reasoning_content_last_assistant": {
        "messages": [
            user("Name a color."),
            assistant("Blue.", reasoning_content="Pick a common color."),
        ],
    },
    "reasoning_content_null": {
        "messages": [user("Hi"), assistant("Hello", reasoning_content=None), user("Bye")],
        "add_generation_prompt": True,
    },
    "reasoning_alias_field": {
        "messages": [user("Q1"), assistant("A1", reasoning="thought via 'reasoning'")],
    },
    "thinking_alias_field": {
        "messages": [user("Q1"), assistant("A1", thinking="thought via 'thinking'")],
    },
    "think_tags_in_content": {
        "messages": [
            user("First question"),
            assistant("<think>\nLet me think.\n</think>\n\nFirst answer."),
            user("Second question"),
            assistant("<think>\nAgain thinking.\n</think>\n\nSecond answer."),
        ],
    },
    "think_tags_in_history": {
        "messages": [
            user("First question"),
            assistant("<think>\nLet me think.\n</think>\n\nFirst answer."),
            user("Second question"),
        ],
        "add_generation_prompt": True,
    },
    "think_tags_no_open_tag": {
        "messages": [user("Q"), assistant("only reasoning</think>\n\nanswer")],
    },
    "tools_with_system": {
        "messages": [{"role": "system", "content": "You can call tools."}, user("Weather in Paris?")],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "add_generation_prompt": True,
    },
    "tools_without_system": {
        "messages": [user("What time is it in Tokyo?")],
        "tools": [TIME_TOOL],
        "add_generation_prompt": True,
    },
    "tools_null": {"messages": [user("No tools here")], "tools": None, "add_generation_prompt": True},
    "tool_calls_dict_arguments": {
        "messages": [
            user("Weather in Paris and Berlin?"),
            assistant("", tool_calls=[
                call("get_weather", {"city": "Paris", "unit": "celsius"}, call_id="call_1"),
                call("get_weather", {"city": "Berlin"}, call_id="call_2"),
            ]),
            tool('{"temp": 21, "sky": "sunny"}'),
            tool('{"temp": 17, "sky": "cloudy"}'),
            assistant("Paris is 21°C and sunny; Berlin is 17°C and cloudy."),
            user("Thanks!"),
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
    "tool_calls_string_arguments": {
        "messages": [
            user("Weather in Rome?"),
            assistant("", tool_calls=[call("get_weather", '{"city": "Rome"}')]),
            tool("sunny, 25C"),
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
    "tool_calls_with_content": {
        "messages": [
            user("Time and weather in Oslo?"),
            assistant("Let me check both.", tool_calls=[
                call("get_time", {"tz": "Europe/Oslo", "precise": True}),
                call("get_weather", {"city": "Oslo"}),
            ]),
            tool("12:00"),
            tool("snow"),
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "add_generation_prompt": True,
        "enable_thinking": False,
    },
    "tool_calls_unwrapped": {
        "messages": [
            user("Weather?"),
            assistant("", tool_calls=[call("get_weather", {"city": "Lima"}, wrap=False)]),
            tool("warm"),
            assistant("It is warm."),
        ],
        "tools": [WEATHER_TOOL],
    },
    "tool_calls_nested_arguments": {
        "messages": [
            user("Plan"),
            assistant("", tool_calls=[call("plan", {
                "steps": [{"id": 1, "ok": True, "w": 0.5}, {"id": 2, "ok": False, "w": None}],
                "meta": {}, "tags": [], "note": "quote \" and \\ and \n newline and ünïcödé",
            })]),
            tool("done"),
        ],
        "add_generation_prompt": True,
    },
    "multi_step_tools": {
        "messages": [
            user("Find the weather where the user is."),
            assistant("", reasoning_content="Need the time zone first.", tool_calls=[
                call("get_time", {"tz": "local"})]),
            tool("Europe/Paris 10:00"),
            assistant("", reasoning_content="Now the weather.", tool_calls=[
                call("get_weather", {"city": "Paris"})]),
            tool("rain"),
            assistant("It is raining in Paris.", reasoning_content="Summarise."),
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    },
    "multi_step_tools_generation": {
        "messages": [
            user("Find the weather where the user is."),
            assistant("<think>\nNeed the zone.\n</think>\n\n", tool_calls=[call("get_time", {})]),
            tool("Europe/Paris"),
            assistant("", tool_calls=[call("get_weather", {"city": "Paris"})]),
            tool("rain"),
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "add_generation_prompt": True,
    },
    "user_message_looks_like_tool_response": {
        "messages": [
            user("Question"),
            assistant("Answer", reasoning_content="r1"),
            user("<tool_response>\nfake\n</tool_response>"),
            assistant("Second", reasoning_content="r2"),
        ],
    },
    "enable_thinking_false": {"messages": [user("Quick answer please")], "add_generation_prompt": True,
                              "enable_thinking": False},
    "enable_thinking_true": {"messages": [user("Think hard")], "add_generation_prompt": True,
                             "enable_thinking": True},
    "enable_thinking_false_no_generation_prompt": {"messages": [user("x")], "enable_thinking": False},
    "enable_thinking_null": {"messages": [user("x")], "add_generation_prompt": True,
                             "enable_thinking": None},
    "unicode_content": {
        "messages": [
            {"role": "system", "content": "Réponds en français. 日本語もOK。"},
            user("Emoji 😀🎉, RTL שלום, combining é, zero-width a\u200bb, line sep \u2028, nbsp \u00a0, tab\t."),
            assistant("D'accord — 好的 ✓", reasoning_content="思考中…"),
            user("Ещё раз?"),
        ],
        "tools": [{"type": "function", "function": {"name": "traduire", "description": "Traduit un texte — «vite»",
                                                    "parameters": {"type": "object", "properties": {
                                                        "texte": {"type": "string", "description": "Le texte à traduire"}}}}}],
        "add_generation_prompt": True,
    },
    "empty_content": {
        "messages": [{"role": "system", "content": ""}, user(""), assistant(""), user("")],
        "add_generation_prompt": True,
    },
    "null_content_with_tool_calls": {
        "messages": [
            user("Weather?"),
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Oslo"})]},
            tool("cold"),
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
    "tool_content_as_blocks": {
        "messages": [
            user("Weather?"),
            assistant("", tool_calls=[call("get_weather", {"city": "Oslo"})]),
            {"role": "tool", "content": [{"type": "text", "text": "cold"}]},
        ],
        "add_generation_prompt": True,
    },
    "user_content_as_blocks": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "add_generation_prompt": True,
    },
    "system_not_first": {
        "messages": [user("Hi"), {"role": "system", "content": "Late system note"}, user("Again")],
        "add_generation_prompt": True,
    },
    "unknown_role": {"messages": [user("Hi"), {"role": "critic", "content": "ignored"}], "add_generation_prompt": True},
    "extra_message_keys": {
        "messages": [{"role": "user", "content": "Hi", "name": "bob", "id": 7},
                     assistant("Hey", tool_calls=[])],
    },
    "extra_kwargs": {"messages": [user("Hi")], "add_generation_prompt": True, "custom_flag": True,
                     "date_string": "26 Jul 2024", "tokenize": False},
    "continue_final_message": {
        "messages": [user("Write a haiku"), assistant("Autumn moonlight -")],
        "continue_final_message": True,
    },
    "continue_final_message_reasoning": {
        "messages": [user("Solve x+1=3"), assistant("", reasoning_content="Subtract one from both")],
        "continue_final_message": "reasoning_content",
    },
    "continue_with_generation_prompt": {
        "messages": [user("Hi"), assistant("Hel")],
        "continue_final_message": True,
        "add_generation_prompt": True,
    },
    "inline_template_special_tokens": {
        "messages": [user("Hi")],
        "chat_template": "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|{{ unk_token is defined }}"
                         "|{{ messages[0].content }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}",
    },
    "inline_template_kwarg_overrides_token": {
        "messages": [user("Hi")],
        "eos_token": "<custom_eos>",
        "chat_template": "{{ messages|length }}{{ eos_token }}{{ messages[0]|tojson }}",
    },
    "documents_passed": {
        "messages": [user("Summarise")],
        "documents": [{"title": "Doc A", "text": "alpha"}, {"title": "Doc B", "text": "beta"}],
        "chat_template": "{% for d in documents %}[{{ loop.index }}:{{ d.title }}={{ d.text }}]{% endfor %}"
                         "{{ messages[-1].content }}",
    },
    # A name picks a template only where transformers holds a dict of them; elsewhere the string
    # is itself the template.
    "chat_template_named_default": {"messages": [user("Hi")], "tools": [TIME_TOOL], "chat_template": "default"},
    "chat_template_named_tool_use": {"messages": [user("Hi")], "chat_template": "tool_use"},
    "message_keys_order": {
        "messages": [{"content": "c", "role": "assistant", "reasoning": "r", "zeta": None, "alpha": 1}],
        "chat_template": "{% for m in messages %}{{ m|tojson }}|{{ m.keys()|list }}{% endfor %}",
    },
}

# Templates of the synthetic multi-template folders.
MULTI_DEFAULT = ("{{ bos_token }}default:{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
                 "{{ tools|length if tools else 'no tools' }}{% if add_generation_prompt %}>{% endif %}")
MULTI_TOOL_USE = ("tool_use:{{ tools|map(attribute='function.name')|join(',') }}|{{ messages[-1].role }}"
                  "{{ '|gen' if add_generation_prompt }}")

# ------------------------------------------------------------------------------------------------
# Interpreter cases: (name, template, context). Contexts are JSON.

USERS = [
    {"name": "a", "active": True, "age": 30},
    {"name": "b", "active": False, "age": 19},
    {"name": "c", "active": True, "age": 25},
]

JINJA_CASES = [
    # --- whitespace control, as transformers' trim_blocks + lstrip_blocks configure it
    ("ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB", {}),
    ("ws_lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\nend", {}),
    ("ws_lstrip_not_for_variables", "  {{ 'a' }}\n  {% if true %}b{% endif %}", {}),
    ("ws_lstrip_mid_line", "x  {% if true %}y{% endif %}  z", {}),
    ("ws_lstrip_tabs", "\t {% if true %}x\n\t{% endif %}\ty", {}),
    ("ws_minus", "a  \n  {%- if true -%}  \n b \n {%- endif -%}\n c", {}),
    ("ws_minus_variable", "a \n {{- 'x' -}} \n b {{ 'y' -}}\n\n z", {}),
    ("ws_plus", "  {%+ if true %}x\n{%- endif +%}\ny", {}),
    ("ws_comment", "a\n  {# comment #}\nb {#- c -#} c\n{#+ keep +#}\nd", {}),
    ("ws_comment_multiline", "{# line1\nline2 #}\nX{{ y }}\n", {"y": 1}),
    ("ws_trailing_newline_dropped", "abc\n", {}),
    ("ws_only_one_trailing_newline_dropped", "abc\n\n", {}),
    ("ws_crlf_normalised", "a\r\nb{% if true %}\r\nc{% endif %}\r\nd\re", {}),
    ("ws_after_variable_line", "{{ 'a' }}\n  {% if true %}b{% endif %}", {}),
    ("ws_line_after_block_start", "{% if true %}  {% if true %}x{% endif %}{% endif %}", {}),
    ("ws_raw", "{% raw %}{{ not parsed }} {% if %}{% endraw %}!", {}),
    ("ws_raw_strip", "  {% raw -%}  x {{ y }}  {%- endraw %}\nz", {}),
    ("ws_qwen_style", "{%- for m in ms %}\n    {%- if m %}\n        {{- m + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n", {"ms": ["a", "", "b"]}),
    # --- literals and printing (Python str()/repr())
    ("print_types", "{{ 1 }}|{{ 1.5 }}|{{ 'a' }}|{{ true }}|{{ none }}|{{ [1, 'a', none, true, 2.0] }}|{{ {'a': 1, 'b': [1]} }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }}|{{ 1, 'x' }}", {}),
    ("print_json_values", "{{ v }}", {"v": {"s": "x", "i": 1, "f": 1.0, "b": False, "n": None, "l": [[], {}]}}),
    ("float_repr", "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2.5e-10 }} {{ 123456789.125 }} {{ 0.1 + 0.2 }} {{ -0.0 }} {{ 1e300 * 1e10 }} {{ 100.0 }}", {}),
    ("repr_strings", "{{ ['it\\'s', 'a\"b', 'x\\'y\"', 'tab\\t', 'nl\\n', 'é', '\\u00a0', '\\x01', '\\\\', '\\u2028', '😀', '\\x7f'] }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\101\\q' }}", {}),
    ("string_adjacent", "{{ 'a' 'b' \"c\" }}", {}),
    ("number_literals", "{{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1_000 }} {{ 1_0.5 }} {{ 1e3 }} {{ 2.5E-1 }} {{ 0 }} {{ 00 }}", {}),
    ("undefined_prints_empty", "[{{ missing }}][{{ d.missing }}][{{ l[10] }}][{{ n.attr }}][{{ s.nope }}]", {"d": {}, "l": [], "n": None, "s": "x"}),
    # --- operators
    ("arithmetic", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ true + 1 }} {{ -(3) }} {{ +3 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ not true or true }} {{ (1 + 2) ~ 3 }} {{ 2 * 3 ~ 4 }} {{ -3|abs }} {{ (-3)|abs }} {{ 'a' ~ 'b'|upper }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ undefined_var ~ 2.0 }}", {}),
    ("sequence_ops", "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'x' * 0 }}|{{ 'x' * -1 }}", {}),
    ("percent_format", "{{ '%s and %d' % ('x', 3) }} {{ '%05.2f|%-4s|%x|%5d|%+d' % (3.14159, 'ab', 255, 42, 7) }} {{ '%(a)s-%(b)r' % {'a': 1, 'b': 'q'} }} {{ '%s' % 'solo' }} {{ '%r' % 'q' }} {{ '100%%' % () }} {{ '%s' % [1, 2] }} {{ '%.3s' % 'abcdef' }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' != 'b' }} {{ none == none }} {{ true == 1 }} {{ x == none }} {{ 2 >= 2.0 }} {{ 'B' < 'a' }} {{ [1] == [1] }} {{ {'a': 1} == {'a': 1} }} {{ (1,) == [1] }}", {}),
    ("membership", "{{ 'a' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'z' in undefined_thing }} {{ 1.0 in [1] }} {{ '' in 'abc' }} {{ 'ab' in ['abc'] }}", {}),
    ("logic_values", "{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ '' or [] }} {{ not [] }} {{ none or none }} {{ [] or {} }} {{ 'a' and none }}", {}),
    ("truthiness", "{% for v in [0, 1, 0.0, 0.5, '', 'a', [], [0], {}, {'a': 0}, none, true, false] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if u else 'F' }}{{ 'T' if namespace() else 'F' }}", {}),
    ("conditional_expression", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] {{ 'a' if false else 'b' if true else 'c' }} {{ (1 if false) is defined }}", {}),
    # --- attribute / item access
    ("attribute_and_item", "{{ d.a }} {{ d['a'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ d.b.c }} {{ d['b']['c'] }} {{ s[1] }} {{ s[-1] }} {{ d.b['c'] }} {{ t[0] }}", {"d": {"a": 1, "b": {"c": 2}}, "l": [1, 2], "s": "héllo", "t": ["x"]}),
    ("dict_methods_shadow_keys", "{{ d.items()|list }} {{ d['items'] }} {{ d.get('a') }} {{ d.get('z', 5) }} {{ d.get('z') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.a }} {{ d.get('items') }}", {"d": {"a": 1, "items": "X"}}),
    ("slicing", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[1:-1] }} {{ s[::-1] }} {{ s[1:3] }} {{ l[5:] }} {{ l[3:1] }} {{ l[3:1:-1] }} {{ (1, 2, 3)[1:] }} {{ s[-100:100] }} {{ l[:] }} {{ s[::2] }}", {"l": [1, 2, 3, 4, 5], "s": "héllo"}),
    ("messages_reverse_index", "{% for m in ms[::-1] %}{{ (ms|length - 1) - loop.index0 }}:{{ m }} {% endfor %}", {"ms": ["a", "b", "c"]}),
    # --- statements
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %},{% endfor %}", {}),
    ("if_tuple_test", "{% if 0, %}T{% endif %}", {}),
    ("for_loop_variables", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]{{ loop.cycle('x', 'y') }}{{ loop.depth }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}|{% for x in none_list if false %}{% else %}e2{% endfor %}", {"none_list": [1, 2]}),
    ("for_filter", "{% for x in range(10) if x is even %}{{ x }}{{ '/' ~ loop.length if loop.last }},{% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}{% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("for_dict_keys_in_order", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}}),
    ("for_string", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("for_undefined", "[{% for x in nothing %}{{ x }}{% endfor %}]", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("loop_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop_scoping_fresh_iteration", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]", {}),
    ("loop_variable_rebinding", "{% for t in ts %}{% if t.function %}{% set t = t.function %}{% endif %}{{ t.name }};{% endfor %}", {"ts": [{"function": {"name": "f"}}, {"name": "g"}]}),
    ("if_does_not_scope", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in range(3) %}{% set ns.count = ns.count + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }} {{ ns }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}{% set d, e = 'xy' %}{{ e }}", {}),
    ("set_block", "{% set x %}hello {{ 'w' }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}|", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }} {{ m(0) }}", {}),
    ("macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}", {}),
    ("macro_call_with_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_reads_later_global", "{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}", {}),
    ("macro_default_uses_param", "{% macro m(a, b=a * 2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(3) }}", {}),
    ("macro_render_json_schema", "{%- macro render(p) -%}{%- for k, v in p.items() -%}{{ k }}:{{ v.type }}{% if v.description is defined %}({{ v.description }}){% endif %}{{ ', ' if not loop.last }}{%- endfor -%}{%- endmacro -%}{{ render(props) }}", {"props": {"city": {"type": "string", "description": "the city"}, "n": {"type": "integer"}}}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}|{% filter replace('a', 'b')|title %}aaa a{% endfilter %}", {}),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("recursive_loop", "{% for item in tree recursive %}{{ item.name }}{% if item.children %}({{ loop(item.children) }}){% endif %}{{ loop.depth }}{% endfor %}", {"tree": [{"name": "a", "children": [{"name": "b", "children": []}]}, {"name": "c"}]}),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("generation_tag", "{% for m in ms %}{% generation %}<{{ m }}>{% endgeneration %}{% endfor %}", {"ms": [1, 2]}),
    ("print_statement", "{% print 1 + 1 %}", {}),
    # --- filters
    ("filter_length", "{{ [1, 2]|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ undefined_x|length }} {{ ''|length }}", {}),
    ("filter_tojson", "{{ d|tojson }}", {"d": {"s": "é ü 日本 😀", "n": [1, 2.5, 1e20, 1e-07, -0.0], "b": True, "z": None, "e": {}, "l": []}}),
    ("filter_tojson_options", "{{ d|tojson(indent=2) }}|{{ [1, [2, {}], []]|tojson(indent=1) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ d|tojson(indent='\\t') }}|{{ [1]|tojson(indent=0) }}", {"d": {"b": [1, {"c": None}], "a": "x"}}),
    ("filter_tojson_escaping", "{{ s|tojson }}", {"s": "quote \" backslash \\ nl \n cr \r tab \t bs \b ff \f ctrl \u0001 del \u007f é 😀 <>&' \u2028"}),
    ("filter_tojson_python_values", "{{ (1, 'a')|tojson }} {{ {1: 'int key', true: 'bool key', none: 'none key', 2.5: 'float'}|tojson }}", {}),
    ("filter_case", "{{ 'hello WORLD'|upper }} {{ 'Hello'|lower }} {{ 'hello wORLD-foo(bar) x1y [z]'|title }} {{ 'hELLO world'|capitalize }} {{ 'ÉCOLE Ärger'|lower }} {{ 'éa'|upper }}", {}),
    ("filter_trim", "[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\u3000a\\n\\t'|trim }}][{{ none|trim }}]", {}),
    ("filter_default", "{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ 0|d('z', boolean=true) }} {{ 'v'|d('z') }} {{ x|d }}|{{ d.missing|default('m') }}", {"d": {}}),
    ("filter_items", "{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %} {{ d|items|list }} {{ u|items|list }}", {"d": {"b": 1, "a": 2}}),
    ("filter_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}] {{ {'a': 1, 'b': 2}|first }} {{ {'a': 1, 'b': 2}|last }} {{ [1, 2]|select|first }}", {}),
    ("filter_join", "{{ [1, 2, 3]|join(',') }} {{ ['a', 'b']|join }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('-') }} {{ {'x': 1, 'y': 2}|join }}", {"users": USERS}),
    ("filter_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 123|replace('2', 'x') }}", {}),
    ("filter_list_string", "{{ 'abc'|list }} {{ {'a': 1}|list }} {{ 123|string ~ 'x' }} {{ [1]|string }} {{ none|string }} {{ (1, 2)|list }}", {}),
    ("filter_int_float", "{{ '42'|int }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(base=16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ true|int }} {{ '-7'|int }} {{ '1e3'|int }} {{ none|int }} {{ 'inf'|float }}", {}),
    ("filter_abs_round", "{{ -3|abs }} {{ (-3.5)|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 3.14159|round(2) }} {{ 2.675|round(2) }} {{ 3.7|round(method='floor') }} {{ 3.2|round(method='ceil') }} {{ 5|round }} {{ 1234.5|round(-2) }} {{ 5|round(method='floor') }} {{ -2.5|round }}", {}),
    ("filter_selectattr", "{{ users|selectattr('active')|map(attribute='name')|list }} {{ users|rejectattr('active')|map(attribute='name')|join(',') }} {{ users|selectattr('name', 'equalto', 'b')|list|length }} {{ users|selectattr('age', 'gt', 20)|map(attribute='name')|list }} {{ users|selectattr('missing', 'undefined')|list|length }}", {"users": USERS}),
    ("filter_map", "{{ ['a', 'B']|map('upper')|list }} {{ users|map(attribute='missing', default='?')|list }} {{ [[1, 2], [3]]|map('length')|list }} {{ ['a,b', 'c']|map('replace', ',', ';')|list }} {{ [{'x': {'y': 1}}]|map(attribute='x.y')|list }}", {"users": USERS}),
    ("filter_select_reject", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [0, 1, '', none, 'a']|select|list }} {{ [1, 2, 3]|reject('even')|list }} {{ [1, 2, 3]|select('in', [2, 3])|list }} {{ [1, 5, 9]|select('>', 4)|list }}", {}),
    ("filter_generators", "{% if [1]|select('even') %}T{% else %}F{% endif %}{% set g = [1, 2, 3]|select %}{% for x in g %}{{ x }}{% endfor %}|{% for x in g %}{{ x }}{% endfor %}|{{ [3, 4]|map('string')|join('+') }}", {}),
    ("filter_unique", "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ users|unique(attribute='active')|map(attribute='name')|list }} {{ [1, 1.0, true, 2]|unique|list }}", {"users": USERS}),
    ("filter_sort", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ ['b', 'a']|sort(true) }}", {"users": USERS}),
    ("filter_dictsort", "{{ {'b': 1, 'a': 2, 'C': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ {'b': 1, 'A': 2, 'a': 0}|dictsort(true) }}", {}),
    ("filter_min_max_sum", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ [1, 2, 3]|sum }} {{ users|sum(attribute='age') }} {{ ['b', 'A']|max }} {{ ['b', 'A']|max(case_sensitive=true) }} {{ users|max(attribute='age') }} {{ [0.5, 1]|sum(start=10) }} [{{ []|min }}]", {"users": USERS}),
    ("filter_reverse", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ 'héllo'|reverse }}", {}),
    ("filter_escape_safe", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<b>'|safe }} {{ '<b>'|safe + '<i>' }} {{ '<i>' + '<b>'|safe }} {{ '<x>'|e|e }} {{ '<x>'|forceescape }} {{ ('<b>'|safe) ~ '<i>' }} {{ 5|e }}", {}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(first=true, blank=true) }}|{{ 'x\\ny'|indent('--') }}|{{ 'a\\n'|indent }}|{{ ''|indent(first=true) }}", {}),
    ("filter_text_misc", "[{{ 'ab'|center(7) }}][{{ 'abc'|center(8) }}] {{ 'hello big world'|wordcount }} {{ 'hello big wide world of things'|truncate(15) }} {{ 'hello big wide world'|truncate(10, true) }} {{ 'short'|truncate(10) }} {{ 'a_b c-d'|wordcount }}", {}),
    ("filter_format", "{{ '%s-%s'|format('a', 'b') }} {{ '%(x)s!'|format(x=1) }} {{ '%d items'|format(3) }}", {}),
    ("filter_batch_attr_pprint", "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 0)|list }} {{ d|attr('a') }} {{ [1, 'a']|pprint }}", {"d": {"a": 7}}),
    ("filter_unknown_in_untaken_branch", "{% if false %}{{ x|nosuchfilter }}{% endif %}{{ 'ok' if true else y|nosuchfilter }}", {}),
    # --- tests
    ("tests_types", "{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is number }} {{ true is boolean }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ none is none }} {{ x is defined }} {{ x is undefined }} {{ none is defined }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 1.0 is integer }} {{ {} is sequence }} {{ 'a' is mapping }}", {}),
    ("tests_values", "{{ 2 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 1 is eq 1 }} {{ 1 is equalto(1) }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 1 is le 0 }} {{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'upper' is filter }} {{ 'even' is test }} {{ none is sameas none }} {{ range is callable }} {{ 'x' is not string }} {{ [] is not mapping }} {{ 'a1' is lower }} {{ '1' is upper }}", {}),
    ("tests_negation", "{% if x is not defined %}nd{% endif %}{% if not x is defined %}|nd2{% endif %}{% if y is not none %}|y{% endif %}", {"y": 0}),
    ("tests_on_undefined", "{{ u is callable }} {{ u is iterable }} {{ u is sequence }} {{ u is string }} {{ u is none }}", {}),
    ("tests_message_shapes", "{% for m in ms %}{{ m.content is string }}{{ m.content is defined }}{{ m.content is none }}{{ m.tool_calls is defined }};{% endfor %}", {"ms": [{"content": "x"}, {"content": None}, {"tool_calls": []}, {"content": [{"type": "text"}]}]}),
    # --- str / list / dict methods
    ("str_strip_prefix", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} [{{ '  a  '.strip() }}][{{ 'xxaxx'.lstrip('x') }}][{{ 'xxaxx'.rstrip('x') }}][{{ '\\n\\nx\\n'.strip('\\n') }}] {{ 'hello'.startswith('l', 2) }} {{ 'hello'.endswith('l', 0, 4) }}", {}),
    ("str_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  '.split(None, 1) }} {{ '  a b  '.rsplit(None, 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a\\u3000b'.split() }}", {}),
    ("str_case_search", "{{ 'Hello World'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world-x1y'.title() }} {{ 'hELLO'.capitalize() }} {{ 'hello'.find('l') }} {{ 'héllo'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ 'a-b'.replace('-', '+') }} {{ 'ab'.replace('', '.') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'héllo'.index('l') }} {{ 'Ab'.swapcase() }}", {}),
    ("str_format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<5}|{:^5}'.format('a', 'b', 'c') }} {{ '{:.2f}'.format(3.14159) }} {{ '{:05d}'.format(42) }} {{ '{:,}'.format(1234567) }} {{ '{!r}'.format('q') }} {{ '{{literal}}'.format() }} {{ '{0[a]} {1.b}'.format({'a': 1}, {'b': 2}) }} {{ '{:x}'.format(255) }} {{ '{:.1%}'.format(0.25) }} {{ '{:*^9}'.format('mid') }} {{ '{:+d}'.format(5) }} {{ '{}'.format(1.5) }} {{ '{}'.format([1]) }}", {}),
    ("str_misc_methods", "{{ 'abc'.join(['1', '2']) }} {{ ','.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }} {{ '42'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ '5'.zfill(3) }} [{{ 'a'.ljust(3, '.') }}|{{ 'a'.rjust(3) }}|{{ 'a'.center(4, '*') }}] {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'Abc'.islower() }} {{ 'ABC'.isupper() }} {{ 'ab1'.isalnum() }}", {}),
    ("list_and_dict_methods", "{{ [1, 2, 1].count(1) }} {{ ['a', 'b'].index('b') }} {{ (1, 2).count(2) }} {{ d.copy() }} {{ d.items() }}", {"d": {"k": "v"}}),
    ("method_as_value", "{% if 'x'.startswith %}bound{% endif %} {{ d.get is defined }} {{ d.nope is defined }}", {"d": {}}),
    # --- globals
    ("globals", "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }} {{ namespace(a=1).a }} {% set j = joiner(', ') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}", {}),
    ("global_strftime_now_literal", "{{ strftime_now('static text') }}", {}),
    ("global_cycler", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}", {}),
    ("variables_shadow_globals", "{{ range }}", {"range": "mine"}),
    # --- Undefined semantics (jinja2's default Undefined)
    ("undefined_operations", "[{{ u }}][{{ u|upper }}][{{ u|length }}][{{ u|list }}][{{ u|default('d') }}][{{ u ~ 'x' }}][{{ u|join(',') }}][{% for x in u %}x{% endfor %}][{{ 'a' in u }}][{{ u == u }}][{{ u is none }}][{{ not u }}][{{ u|trim }}][{{ u|string }}][{{ u|first }}][{{ u|e }}]", {}),
    ("undefined_attribute_tests", "{{ d.a is defined }} {{ (d.a.b is defined) if d.a is defined else 'no' }} {{ d['a'] is undefined }} {{ l[3] is defined }} {{ d.get('a') is none }}", {"d": {}, "l": [1]}),
    ("none_attributes", "{{ n.x is defined }} [{{ n.x }}] {{ n['y'] is defined }}", {"n": None}),
]

# (name, template, context, line jinja2 reports, substring our message must contain — checked
# against jinja2's own message as well, unless marked otherwise)
JINJA_ERRORS = [
    ("error_unclosed_block", "line1\n{% if x %}\nnever closed", {}, 3, "endif"),
    ("error_bad_expression", "a\n{{ 1 + }}", {}, 2, None),
    ("error_unknown_filter", "a\nb\n{{ x|nosuchfilter }}", {}, 3, "nosuchfilter"),
    ("error_unknown_test", "{{ x is nosuchtest }}", {}, 1, "nosuchtest"),
    ("error_unknown_tag", "\n{% frobnicate %}", {}, 2, "frobnicate"),
    ("error_do_tag_not_enabled", "{% do x %}", {}, 1, "do"),
    ("error_raise_exception", "{% if true %}\n  {{ raise_exception('Conversation roles must alternate user/assistant') }}\n{% endif %}", {}, 2, "Conversation roles must alternate user/assistant"),
    ("error_raise_in_loop", "{%- for m in ms %}\n{%- if m.role not in ['user', 'assistant'] %}\n{{- raise_exception('Unknown role: ' + m.role) }}\n{%- endif %}\n{%- endfor %}", {"ms": [{"role": "user"}, {"role": "robot"}]}, 3, "Unknown role: robot"),
    ("error_undefined_attribute", "ok\n{{ foo.bar }}", {}, 2, "'foo' is undefined"),
    ("error_undefined_chain", "{% set d = {} %}\n\n{{ d.a.b }}", {}, 3, "has no attribute 'a'"),
    ("error_type", "x\ny\n{{ 1 + 'a' }}", {}, 3, "unsupported operand"),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}, 1, "concatenate"),
    ("error_missing_method", "\n{{ 'abc'.nosuch() }}", {}, 2, "nosuch"),
    ("error_tojson_undefined", "\n{{ u|tojson }}", {}, 2, "not JSON serializable"),
    ("error_break_outside_loop", "a\n{% break %}", {}, 2, None),
    ("error_unknown_filter_in_taken_branch", "{% if true %}\n{{ x|nosuch }}\n{% endif %}", {}, 2, "nosuch"),
    ("error_macro_arguments", "{% macro m(a) %}{% endmacro %}\n{{ m(1, 2) }}", {}, 2, "takes not more than 1 argument"),
    ("error_filter_line_in_multiline_expression", "{{ [\n1,\n2] | nosuch }}", {}, 3, "nosuch"),
    ("error_division_by_zero", "\n\n{{ 1 / 0 }}", {}, 3, "division by zero"),
    ("error_set_attribute_on_non_namespace", "{% set x = 1 %}\n{% set x.a = 2 %}", {}, 2, "non-namespace"),
    ("error_namespace_underscore", "{% set ns = namespace() %}\n{% set ns._x = 1 %}", {}, 2, "underscore"),
    ("error_compare_types", "\n{{ 1 < 'a' }}", {}, 2, "not supported between"),
    ("error_iterate_none", "{% for x in n %}{% endfor %}", {"n": None}, 1, "not iterable"),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}, 1, "too many values to unpack"),
    ("error_string_in_int", "{{ 1 in 'abc' }}", {}, 1, "requires string as left operand"),
    ("error_unexpected_end_tag", "{% if true %}\n{% endfor %}", {}, 2, "endfor"),
    ("error_unclosed_comment", "a {# never", {}, 1, "comment"),
    ("error_unclosed_variable", "a {{ x ", {}, 1, None),
    ("error_concat_binds_looser_than_plus", "{{ 1 + 2 ~ 3 }}", {}, 1, "unsupported operand"),
    ("error_test_takes_if_as_argument", "{{ x is defined if true else 1 }}", {}, 1, None),
    ("error_line_after_comments_and_stripping", "{# a\nb #}\n  {#- c -#}\n\n{%- if true -%}\n\n{{- 1 / 0 }}{% endif %}", {}, 7, "division by zero"),
    ("error_line_after_raw", "{% raw %}\n\n{% endraw %}\n{{ 1 / 0 }}", {}, 4, "division by zero"),
    ("error_line_in_multiline_string", "{{ 'a\nb\nc' ~ (1 / 0) }}", {}, 1, "division by zero"),
    ("error_length_of_none", "\n{{ n|length }}", {"n": None}, 2, "has no len()"),
]


# Cases where jinja2's own line is not the template line of the failing statement, so the table's
# line (the one flashmap reports) is kept without matching jinja2's.
JINJA2_LINE_QUIRKS = {
    # jinja2 leaves `break` outside a loop to Python's compiler, which reports a line of the
    # generated module.
    "error_break_outside_loop",
    # jinja2 emits the namespace check before it records the statement's line.
    "error_set_attribute_on_non_namespace",
}

# ------------------------------------------------------------------------------------------------


def jinja_environment():
    """The compile function transformers uses for chat templates, or an equivalent."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template, "transformers"
    except Exception:  # pragma: no cover - only without transformers
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt):
            from datetime import datetime

            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        return env.from_string, "jinja2"


def template_error_line(exc):
    line = getattr(exc, "lineno", None)
    if line:
        return line
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<template>"]
    return lines[-1] if lines else None


def random_cases():
    """Seeded random templates: whitespace-control soup and nested expressions over a fixed
    context. They add breadth to the hand-written table; jinja2 decides what they render."""
    rng = random.Random(20240726)
    texts = [" ", "  ", "\t", "\n", "\n\n", "a", "b c", " \n ", "\r\n", "\u3000", "x\n  ", "\n\t "]

    def tag(body, kind="%"):
        if kind == "{":
            return "{{" + rng.choice(["", "-"]) + " " + body + " " + rng.choice(["", "-"]) + "}}"
        left, right = rng.choice(["", "", "-", "+"]), rng.choice(["", "", "-", "+"])
        if kind == "#":
            return "{#" + left + " " + body + " " + right + "#}"
        return "{%" + left + " " + body + " " + right + "%}"

    def block(depth):
        out = []
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            if r < 0.35:
                out.append("".join(rng.choice(texts) for _ in range(rng.randint(1, 3))))
            elif r < 0.5:
                out.append(tag("'v'", "{"))
            elif r < 0.6:
                out.append(tag("c\nd" if rng.random() < 0.3 else "c", "#"))
            elif r < 0.72 and depth < 3:
                other = tag("else") + block(depth + 1) if rng.random() < 0.3 else ""
                out.append(tag("if true") + block(depth + 1) + other + tag("endif"))
            elif r < 0.84 and depth < 3:
                out.append(tag("for i in [1, 2]") + block(depth + 1) + tag("endfor"))
            elif r < 0.9:
                out.append(tag("set x = 1"))
            else:
                out.append("{% raw %}" + rng.choice(texts) + "{{ r }}" + rng.choice(texts) + "{% endraw %}")
        return "".join(out)

    cases = [(f"random_whitespace_{k}", block(0) + ("\n" if k % 3 == 0 else ""), {}) for k in range(60)]

    ctx = {"s": "Héllo World", "e": "", "n": None, "i": 7, "neg": -3, "f": 2.5, "z": 0, "b": True,
           "l": [3, 1, 2], "sl": ["b", "A", "a"], "d": {"k": "v", "n": 1, "items": [1]},
           "ld": [{"name": "x", "v": 2, "t": True}, {"name": "y", "v": 1, "t": False}],
           "nested": {"a": {"b": [1, {"c": "deep"}]}}, "ws": "  a  b\n", "uni": "日本語😀é"}
    atoms = ["s", "e", "n", "i", "neg", "f", "z", "b", "l", "sl", "d", "ld", "nested", "ws", "uni", "undef",
             "1", "0", "-1", "2.0", "0.1", "'x'", "''", "none", "true", "false", "[1, 2]", "[]", "{}",
             "{'a': 1}", "(1, 'a')", "d.k", "d['n']", "ld[0]", "ld[-1].name", "nested.a.b[1].c", "l[1:]",
             "s[::-1]", "s[1]", "uni[1:3]", "d.missing", "l[9]"]
    filters = ["length", "upper", "lower", "title", "capitalize", "trim", "first", "last", "list", "string",
               "int", "float", "abs", "round", "tojson", "tojson(indent=2)", "join(',')", "default('D')",
               "default('D', true)", "sort", "unique|list", "reverse|list", "replace('l', 'L')", "e", "sum",
               "min", "max", "dictsort", "select('odd')|list", "map('string')|join", "selectattr('t')|list",
               "rejectattr('v', 'gt', 1)|list", "center(9)", "wordcount", "truncate(5)", "items|list"]
    tests = ["defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "mapping",
             "iterable", "sequence", "even", "odd", "lower", "upper", "divisibleby 2", "eq 1", "in [1, 'x']"]
    methods = ["startswith('H')", "endswith('d')", "split()", "split('l')", "rsplit(' ', 1)", "strip()",
               "upper()", "title()", "find('o')", "count('l')", "replace('o', '0')", "get('k')",
               "get('zz', 3)", "keys()|list", "items()|list", "count(1)", "format(1, 2)", "zfill(5)"]
    ops = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]

    def expr(depth=0):
        r = rng.random()
        if depth > 2 or r < 0.3:
            return rng.choice(atoms)
        if r < 0.45:
            return f"{expr(depth + 1)}|{rng.choice(filters)}"
        if r < 0.55:
            return f"({expr(depth + 1)} is {'not ' if rng.random() < 0.3 else ''}{rng.choice(tests)})"
        if r < 0.65:
            return f"{rng.choice(atoms)}.{rng.choice(methods)}"
        if r < 0.85:
            return f"({expr(depth + 1)} {rng.choice(ops)} {expr(depth + 1)})"
        if r < 0.92:
            return f"({expr(depth + 1)} if {expr(depth + 1)} else {expr(depth + 1)})"
        return f"[{expr(depth + 1)}, {expr(depth + 1)}]"

    for k in range(150):
        e = expr()
        t = ("{{ " + e + " }}" if k % 3 else
             "{% for x in " + e + " %}[{{ x }}|{{ loop.index }}]{% else %}E{% endfor %}")
        cases.append((f"random_expression_{k}", t, ctx))
    return cases


def make_jinja_cases(compile_template):
    cases = []
    for name, template, context in random_cases():
        try:
            expected = compile_template(template).render(**context)
        except Exception as e:
            # Random expressions may fail; keep them as error cases when jinja2 names a line.
            line = template_error_line(e)
            if line is not None:
                cases.append({"name": name, "template": template, "context": context, "error_line": line,
                              "error_contains": "", "jinja2_error": f"{type(e).__name__}: {e}"})
            continue
        if " at 0x" in expected:  # object addresses cannot be reproduced
            continue
        cases.append({"name": name, "template": template, "context": context, "expected": expected})
    for name, template, context in JINJA_CASES:
        context = json.loads(json.dumps(context))
        try:
            expected = compile_template(template).render(**context)
        except Exception as e:
            sys.exit(f"jinja case {name}: jinja2 raised {type(e).__name__}: {e}")
        cases.append({"name": name, "template": template, "context": context, "expected": expected})
    for name, template, context, line, contains in JINJA_ERRORS:
        context = json.loads(json.dumps(context))
        try:
            out = compile_template(template).render(**context)
        except Exception as e:
            got = template_error_line(e)
            if got != line and name not in JINJA2_LINE_QUIRKS:
                sys.exit(f"jinja error case {name}: jinja2 reports line {got}, table says {line}: {e}")
            if contains and contains not in str(e) and not contains.startswith("'"):
                print(f"note: {name}: jinja2's message {str(e)!r} lacks {contains!r}", file=sys.stderr)
            cases.append({"name": name, "template": template, "context": context,
                          "error_line": line, "error_contains": contains or "",
                          "jinja2_error": f"{type(e).__name__}: {e}"})
            continue
        sys.exit(f"jinja error case {name}: jinja2 rendered {out!r} instead of failing")
    return cases


def write_text(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="/work/shared/data/qwen3-tokenizer",
                    help="Qwen3 tokenizer folder (tokenizer.json, tokenizer_config.json, official template)")
    args = ap.parse_args()

    from transformers import AutoTokenizer
    import transformers

    # Test data: the two template variants as tokenizer folders flashmap loads. The official
    # template sits in chat_template.jinja, which takes precedence over tokenizer_config.json.
    variants = {
        "qwen3": {"tokenizer_config.json": os.path.join(args.source, "tokenizer_config.json")},
        "qwen3-official": {
            "tokenizer_config.json": os.path.join(args.source, "tokenizer_config.json"),
            "chat_template.jinja": os.path.join(args.source, "chat_template.qwen3-official.jinja"),
        },
    }
    for name in ("LICENSE.npm-package", "SOURCE.md"):
        shutil.copyfile(os.path.join(args.source, name), os.path.join(OUT, name))
    for variant, files in variants.items():
        shutil.rmtree(os.path.join(OUT, variant), ignore_errors=True)
        os.makedirs(os.path.join(OUT, variant), exist_ok=True)
        for dst, src in files.items():
            shutil.copyfile(src, os.path.join(OUT, variant, dst))

    # Two synthetic folders for transformers' multi-template rules: a list-form chat_template in
    # tokenizer_config.json (with AddedToken-style special tokens), and chat_template.jinja plus
    # additional_chat_templates/. "tool_use" is picked when the request has tools.
    with open(os.path.join(args.source, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config_list = dict(config)
    config_list["chat_template"] = [{"name": "default", "template": MULTI_DEFAULT},
                                    {"name": "tool_use", "template": MULTI_TOOL_USE}]
    config_list["bos_token"] = {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False,
                                "normalized": False, "rstrip": False, "single_word": False}
    variants["multi-list"] = {}
    shutil.rmtree(os.path.join(OUT, "multi-list"), ignore_errors=True)
    write_text(os.path.join(OUT, "multi-list", "tokenizer_config.json"),
               json.dumps(config_list, indent=2, ensure_ascii=False) + "\n")
    variants["multi-files"] = {}
    shutil.rmtree(os.path.join(OUT, "multi-files"), ignore_errors=True)
    config_files = dict(config)
    del config_files["chat_template"]
    write_text(os.path.join(OUT, "multi-files", "tokenizer_config.json"),
               json.dumps(config_files, indent=2, ensure_ascii=False) + "\n")
    write_text(os.path.join(OUT, "multi-files", "chat_template.jinja"), MULTI_DEFAULT + "\n")
    write_text(os.path.join(OUT, "multi-files", "additional_chat_templates", "tool_use.jinja"), MULTI_TOOL_USE)

    # Requests, written first and read back, so transformers sees exactly what the tests load.
    req_dir = os.path.join(OUT, "requests")
    shutil.rmtree(req_dir, ignore_errors=True)
    for name, request in CHAT_CASES.items():
        write_text(os.path.join(req_dir, name + ".json"), json.dumps(request, indent=1, ensure_ascii=False) + "\n")

    option_keys = ("tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
                   "tokenizer_kwargs", "return_assistant_tokens_mask", "sanitize_control_tokens")
    for variant in variants:
        # Load through transformers' own folder logic: a temporary folder with the variant's
        # files plus the (large, shared) tokenizer.json.
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(OUT, variant), tmp, dirs_exist_ok=True)
            os.symlink(os.path.join(args.source, "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
            tok = AutoTokenizer.from_pretrained(tmp)
        out_dir = os.path.join(OUT, "expected", variant)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        for name in CHAT_CASES:
            with open(os.path.join(req_dir, name + ".json"), encoding="utf-8") as f:
                request = json.load(f)
            kwargs = {k: v for k, v in request.items() if k not in option_keys}
            messages = kwargs.pop("messages")
            try:
                text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
            except Exception as e:
                write_text(os.path.join(out_dir, name + ".error"), f"{type(e).__name__}: {e}\n")
                continue
            write_text(os.path.join(out_dir, name + ".txt"), text)

    compile_template, env_name = jinja_environment()
    cases = make_jinja_cases(compile_template)
    write_text(os.path.join(OUT, "jinja_cases.json"), json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(CHAT_CASES)} chat requests x {len(variants)} templates (transformers "
          f"{transformers.__version__}) and {len(cases)} interpreter cases ({env_name} environment)")


if __name__ == "__main__":
    main()
