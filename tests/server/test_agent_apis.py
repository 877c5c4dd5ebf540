#!/usr/bin/env python3
"""The APIs coding agents speak, against `flashmap serve`, with the official clients.

    python3 tests/server/test_agent_apis.py BUILD/flashmap

* Tool prompts: every conversation of tests/data/chat/api_prompts.json (made by transformers'
  apply_chat_template from the official Qwen3 template, tools/make_api_goldens.py) gives the
  server the same prompt ids through /tokenize and /v1/chat/completions, and the same count
  through /v1/responses and /v1/messages(/count_tokens).
* OpenAI's Responses API (the `openai` package): plain, streamed, forced and streamed function
  calls, a function_call_output fed back, JSON output, reasoning items, incomplete answers, the
  errors of what a stateless server cannot do.
* Anthropic's Messages API (the `anthropic` package): plain, streamed, forced tool_use,
  input_json_delta, tool_result fed back, count_tokens equal to the usage, stop sequences,
  thinking blocks, x-api-key, errors in Anthropic's shape.
* The same engine path: on the built-in pair (target + FlashMap drafter) the three chat-shaped
  APIs give the same greedy text, speculating.

Models: a random Qwen3 with the real vocabulary (tests/server/text_model.py), and the built-in
pair. Both packages come from PyPI (scripts/setup).
"""

import json
import os
import sys
import tempfile
import unittest

import serve_process
from test_server_e2e import post, request
from text_model import official_tokenizer, write_text_model

FLASHMAP = None
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GOLDENS = os.path.join(ROOT, "tests", "data", "chat", "api_prompts.json")

# A bounded schema: at temperature 0.8 the random model ends its calls within max_tokens.
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def clients():
    try:
        import anthropic
        import openai
    except ImportError as e:  # pragma: no cover
        raise AssertionError("the openai and anthropic packages are missing: run scripts/setup") from e
    return openai, anthropic


class TextServer:
    """A server on the random Qwen3 with the official template, started once per class."""

    @classmethod
    def start(cls, *extra):
        cls.tmp = tempfile.TemporaryDirectory()
        model = os.path.join(cls.tmp.name, "model")
        write_text_model(model)
        tok = official_tokenizer(os.path.join(cls.tmp.name, "tok"))
        cls.proc, cls.port, cls.log = serve_process.start(
            [FLASHMAP, "serve", "--target", model, "--tokenizer", tok, "--port", "0",
             "--served-model-name", "text", *extra])

    @classmethod
    def stop(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()
        cls.tmp.cleanup()


class ToolPromptTest(unittest.TestCase):
    """Tool conversations get the ids transformers makes from the official template."""

    @classmethod
    def setUpClass(cls):
        TextServer.start()
        cls.port = TextServer.port
        with open(GOLDENS, encoding="utf-8") as f:
            cls.cases = json.load(f)["cases"]

    @classmethod
    def tearDownClass(cls):
        TextServer.stop()

    def test_prompts_equal_transformers(self):
        endpoints = set()
        for case in self.cases:
            with self.subTest(case=case["name"]):
                body, ids = case["body"], case["ids"]
                endpoints.add(case["endpoint"])
                if case["endpoint"] == "chat":
                    status, tok = post(self.port, body, path="/tokenize")
                    self.assertEqual(status, 200, tok)
                    self.assertEqual(tok["tokens"], ids)
                    status, r = post(self.port, dict(body, max_tokens=1, return_token_ids=True),
                                     path="/v1/chat/completions")
                    self.assertEqual(status, 200, r)
                    self.assertEqual(r["prompt_token_ids"], ids)
                    self.assertEqual(r["usage"]["prompt_tokens"], len(ids))
                elif case["endpoint"] == "responses":
                    status, r = post(self.port, dict(body, max_output_tokens=1),
                                     path="/v1/responses")
                    self.assertEqual(status, 200, r)
                    self.assertEqual(r["usage"]["input_tokens"], len(ids))
                    # The twin sent as a chat request is the same prompt (the translation).
                    twin = case["twin"]
                    chat = {"messages": twin["messages"], "max_tokens": 1,
                            "return_token_ids": True, "chat_template_kwargs": twin["kwargs"]}
                    if twin["tools"]:
                        chat["tools"] = twin["tools"]
                    status, c = post(self.port, chat, path="/v1/chat/completions")
                    self.assertEqual(status, 200, c)
                    self.assertEqual(c["prompt_token_ids"], ids)
                else:
                    count = {k: v for k, v in body.items() if k != "max_tokens"}
                    status, n = post(self.port, count, path="/v1/messages/count_tokens")
                    self.assertEqual(status, 200, n)
                    self.assertEqual(n, {"input_tokens": len(ids)})
                    status, r = post(self.port, dict(body, max_tokens=1), path="/v1/messages")
                    self.assertEqual(status, 200, r)
                    u = r["usage"]
                    self.assertEqual(u["input_tokens"] + u["cache_read_input_tokens"] +
                                     u["cache_creation_input_tokens"], len(ids))
        self.assertEqual(endpoints, {"chat", "responses", "messages"})

    def test_key_order_is_the_clients(self):
        # The same tool with its keys sorted is another prompt: the server keeps each order.
        case = next(c for c in self.cases if c["name"] == "chat_tools_on_a_user_turn")
        resorted = json.loads(json.dumps(case["body"], sort_keys=True))
        status, tok = post(self.port, resorted, path="/tokenize")
        self.assertEqual(status, 200, tok)
        self.assertNotEqual(tok["tokens"], case["ids"])
        status, again = post(self.port, case["body"], path="/tokenize")
        self.assertEqual(again["tokens"], case["ids"])


class ResponsesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        TextServer.start()
        cls.port = TextServer.port
        openai, _ = clients()
        cls.openai = openai
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.port}/v1", api_key="none",
                                   max_retries=0)

    @classmethod
    def tearDownClass(cls):
        TextServer.stop()

    def chat_text(self, messages, max_tokens, **extra):
        status, r = post(self.port, dict({"messages": messages, "max_tokens": max_tokens,
                                          "temperature": 0}, **extra),
                         path="/v1/chat/completions")
        self.assertEqual(status, 200, r)
        return r["choices"][0]

    def test_plain_and_streamed_equal_chat(self):
        r = self.client.responses.create(model="text", input="Say hello.", max_output_tokens=12,
                                         temperature=0, instructions="Be brief.",
                                         metadata={"run": "1"}, extra_body=NO_THINK)
        self.assertEqual(r.object, "response")
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.metadata, {"run": "1"})
        self.assertEqual(r.instructions, "Be brief.")
        self.assertEqual(r.store, False)
        want = self.chat_text([{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Say hello."}], 12, **NO_THINK)
        self.assertEqual(r.output_text, want["message"]["content"])
        self.assertEqual(r.status, "incomplete" if want["finish_reason"] == "length"
                         else "completed")
        if r.status == "incomplete":
            self.assertEqual(r.incomplete_details.reason, "max_output_tokens")
        self.assertEqual(r.usage.output_tokens, 12 if r.status == "incomplete"
                         else r.usage.output_tokens)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens)
        # Streamed: typed events in order, adding up to the same text and usage.
        events = list(self.client.responses.create(
            model="text", input="Say hello.", max_output_tokens=12, temperature=0,
            instructions="Be brief.", stream=True, extra_body=NO_THINK))
        types = [e.type for e in events]
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        self.assertEqual(types[-1], "response.incomplete" if r.status == "incomplete"
                         else "response.completed")
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, r.output_text)
        done = next(e for e in events if e.type == "response.output_text.done")
        self.assertEqual(done.text, r.output_text)
        final = events[-1].response
        self.assertEqual(final.output_text, r.output_text)
        self.assertEqual(final.usage.output_tokens, r.usage.output_tokens)
        self.assertEqual({e.response.id for e in events if hasattr(e, "response")}, {final.id})

    def function_tools(self):
        return [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                 "parameters": WEATHER},
                {"type": "function", "name": "get_time", "parameters": ZONE}]

    def test_forced_function_call_streamed_and_fed_back(self):
        import jsonschema
        args = dict(model="text", input="Weather in Paris?", tools=self.function_tools(),
                    tool_choice={"type": "function", "name": "get_weather"},
                    max_output_tokens=80, temperature=0.8, extra_body=dict(NO_THINK, seed=5))
        r = self.client.responses.create(**args)
        self.assertEqual(r.status, "completed", r)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1)
        call = calls[0]
        self.assertEqual(call.name, "get_weather")
        self.assertTrue(call.call_id.startswith("call_"))
        self.assertTrue(call.id.startswith("fc_"))
        jsonschema.validate(json.loads(call.arguments), WEATHER)
        # The stream helper accumulates the same call from the argument deltas.
        with self.client.responses.stream(**args) as s:
            events = list(s)
            final = s.get_final_response()
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        self.assertGreater(len(deltas), 1)
        self.assertEqual("".join(deltas), call.arguments)
        streamed = [o for o in final.output if o.type == "function_call"]
        self.assertEqual(streamed[0].arguments, call.arguments)
        self.assertEqual(next(e for e in events
                              if e.type == "response.function_call_arguments.done").arguments,
                         call.arguments)
        # The call and its output fed back: the next turn runs on them.
        second = self.client.responses.create(
            model="text", tools=self.function_tools(), max_output_tokens=6, temperature=0,
            extra_body=NO_THINK,
            input=[{"role": "user", "content": "Weather in Paris?"},
                   {"type": "function_call", "call_id": call.call_id, "name": call.name,
                    "arguments": call.arguments},
                   {"type": "function_call_output", "call_id": call.call_id,
                    "output": "sunny, 21 C"}])
        self.assertIn(second.status, ("completed", "incomplete"))
        self.assertGreater(second.usage.input_tokens, r.usage.input_tokens)

    def test_required_calls_and_json_output(self):
        import jsonschema
        r = self.client.responses.create(
            model="text", input="Time?", tools=self.function_tools(), tool_choice="required",
            parallel_tool_calls=False, max_output_tokens=120, temperature=0.8,
            extra_body=dict(NO_THINK, seed=2))
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1, r)
        schema = WEATHER if calls[0].name == "get_weather" else ZONE
        jsonschema.validate(json.loads(calls[0].arguments), schema)
        # text.format json_schema: the output text follows the schema.
        r = self.client.responses.create(
            model="text", input="Plan a trip.", max_output_tokens=80, temperature=0.8,
            extra_body=dict(NO_THINK, seed=1),
            text={"format": {"type": "json_schema", "name": "trip", "schema": WEATHER}})
        self.assertEqual(r.status, "completed", r)
        jsonschema.validate(json.loads(r.output_text), WEATHER)
        self.assertEqual(r.text.format.type, "json_schema")

    def test_errors_name_the_field(self):
        cases = [
            ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
            ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
            ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
             "input[0].call_id"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
             "input[0].content[0].type"),
            ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
            ({"input": "x", "max_output_tokens": 10 ** 7}, "max_output_tokens"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
            ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
            ({"input": "x", "temperature": -1}, "temperature"),
            ({"input": []}, "input"),
            ({}, "input"),
        ]
        for body, param in cases:
            with self.subTest(param=param):
                status, r = post(self.port, body, path="/v1/responses")
                self.assertEqual(status, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
                self.assertIn(param.split("[")[0].split(".")[0], r["error"]["message"])
        with self.assertRaises(self.openai.BadRequestError) as e:
            self.client.responses.create(model="text", input="x", previous_response_id="resp_1")
        self.assertIn("stores none", str(e.exception))


class ReasoningTest(unittest.TestCase):
    """Reasoning items and thinking blocks, on a template that leaves the prompt inside an open
    think block (so that the random model's output starts as reasoning)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        model = os.path.join(cls.tmp.name, "model")
        write_text_model(model)
        tok = official_tokenizer(os.path.join(cls.tmp.name, "tok"))
        with open(os.path.join(tok, "chat_template.jinja"), "w") as f:
            f.write("{{ '<|im_start|>user\\n' + messages[-1].content + '<|im_end|>\\n' }}"
                    "{{ '<|im_start|>assistant\\n<think>\\n' }}")
        cls.proc, cls.port, cls.log = serve_process.start(
            [FLASHMAP, "serve", "--target", model, "--tokenizer", tok, "--port", "0",
             "--served-model-name", "flashmap"])
        cls.openai, cls.anthropic = clients()

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()
        cls.tmp.cleanup()

    def test_reasoning_item_and_thinking_blocks(self):
        status, chat = post(self.port, {"messages": [{"role": "user", "content": "Why?"}],
                                        "max_tokens": 10, "temperature": 0},
                            path="/v1/chat/completions")
        self.assertEqual(status, 200, chat)
        reasoning = chat["choices"][0]["message"]["reasoning_content"]
        self.assertTrue(reasoning)
        client = self.openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x",
                                    max_retries=0)
        r = client.responses.create(model="flashmap", input="Why?", max_output_tokens=10,
                                    temperature=0)
        items = [o for o in r.output if o.type == "reasoning"]
        self.assertEqual(len(items), 1)
        self.assertEqual(items[0].content[0].text, reasoning)
        self.assertGreater(r.usage.output_tokens_details.reasoning_tokens, 0)
        events = list(client.responses.create(model="flashmap", input="Why?",
                                              max_output_tokens=10, temperature=0, stream=True))
        self.assertEqual("".join(e.delta for e in events
                                 if e.type == "response.reasoning_text.delta"), reasoning)
        a = self.anthropic.Anthropic(base_url=f"http://127.0.0.1:{self.port}", api_key="x",
                                     max_retries=0)
        m = a.messages.create(model="flashmap", max_tokens=10,
                              messages=[{"role": "user", "content": "Why?"}],
                              extra_body={"temperature": 0})
        self.assertEqual(m.content[0].type, "thinking")
        self.assertEqual(m.content[0].thinking, reasoning)
        with a.messages.stream(model="flashmap", max_tokens=10,
                               messages=[{"role": "user", "content": "Why?"}],
                               extra_body={"temperature": 0}) as s:
            kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
            final = s.get_final_message()
        self.assertIn("thinking_delta", kinds)
        self.assertEqual(final.content[0].thinking, reasoning)


class MessagesTest(unittest.TestCase):
    KEY = "sk-ant-test"

    @classmethod
    def setUpClass(cls):
        TextServer.start("--api-key", cls.KEY)
        cls.port = TextServer.port
        _, anthropic = clients()
        cls.anthropic = anthropic
        cls.client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{cls.port}",
                                         api_key=cls.KEY, max_retries=0)

    @classmethod
    def tearDownClass(cls):
        TextServer.stop()

    TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER},
             {"name": "get_time", "input_schema": ZONE}]

    def test_plain_streamed_and_counted(self):
        msgs = [{"role": "user", "content": "Say hello."}]
        m = self.client.messages.create(model="text", max_tokens=12, messages=msgs,
                                        system="Be brief.",
                                        thinking={"type": "disabled"},
                                        extra_body={"temperature": 0})
        self.assertEqual(m.type, "message")
        self.assertTrue(m.id.startswith("msg_"))
        self.assertEqual(m.role, "assistant")
        self.assertIn(m.stop_reason, ("end_turn", "max_tokens"))
        text = "".join(b.text for b in m.content if b.type == "text")
        status, chat = post(self.port, {"messages": [{"role": "system", "content": "Be brief."}] +
                                        msgs, "max_tokens": 12, "temperature": 0, **NO_THINK},
                            path="/v1/chat/completions",
                            headers={"Authorization": "Bearer " + self.KEY})
        self.assertEqual(status, 200, chat)
        self.assertEqual(text, chat["choices"][0]["message"]["content"])
        n = self.client.messages.count_tokens(model="text", messages=msgs, system="Be brief.",
                                              thinking={"type": "disabled"})
        u = m.usage
        self.assertEqual(n.input_tokens, u.input_tokens + u.cache_read_input_tokens +
                         u.cache_creation_input_tokens)
        self.assertEqual(n.input_tokens, chat["usage"]["prompt_tokens"])
        with self.client.messages.stream(model="text", max_tokens=12, messages=msgs,
                                         system="Be brief.", thinking={"type": "disabled"},
                                         extra_body={"temperature": 0}) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(streamed, text)
        self.assertEqual(final.stop_reason, m.stop_reason)
        self.assertEqual(final.usage.output_tokens, m.usage.output_tokens)

    def test_stop_sequence(self):
        msgs = [{"role": "user", "content": "Count."}]
        m = self.client.messages.create(model="text", max_tokens=24, messages=msgs,
                                        thinking={"type": "disabled"},
                                        extra_body={"temperature": 0})
        text = m.content[0].text
        stop = text[len(text) // 2:len(text) // 2 + 3]
        self.assertTrue(stop.strip(), text)
        cut = self.client.messages.create(model="text", max_tokens=24, messages=msgs,
                                          thinking={"type": "disabled"}, stop_sequences=[stop],
                                          extra_body={"temperature": 0})
        self.assertEqual(cut.stop_reason, "stop_sequence")
        self.assertEqual(cut.stop_sequence, stop)
        self.assertEqual("".join(b.text for b in cut.content if b.type == "text"),
                         text[:text.index(stop)])

    def test_forced_tool_use_streamed_and_fed_back(self):
        import jsonschema
        args = dict(model="text", max_tokens=80, tools=self.TOOLS,
                    messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tool_choice={"type": "tool", "name": "get_weather"},
                    extra_body=dict(NO_THINK, temperature=0.8, seed=5))
        m = self.client.messages.create(**args)
        self.assertEqual(m.stop_reason, "tool_use", m)
        uses = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1)
        self.assertEqual(uses[0].name, "get_weather")
        self.assertTrue(uses[0].id.startswith("toolu_"))
        jsonschema.validate(uses[0].input, WEATHER)
        with self.client.messages.stream(**args) as s:
            events = list(s)
            final = s.get_final_message()
        partial = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]
        self.assertGreater(len(partial), 1)
        self.assertEqual(json.loads("".join(partial)), uses[0].input)
        self.assertEqual(final.content[0].input, uses[0].input)
        self.assertEqual(final.stop_reason, "tool_use")
        # tool_choice any: one of the tools.
        anyc = self.client.messages.create(**dict(args, tool_choice={
            "type": "any", "disable_parallel_tool_use": True}, extra_body=dict(
                NO_THINK, temperature=0.8, seed=2), max_tokens=120))
        uses_any = [b for b in anyc.content if b.type == "tool_use"]
        self.assertEqual(len(uses_any), 1, anyc)
        # The result fed back, as string content and as text blocks.
        for content in ("sunny, 21 C", [{"type": "text", "text": "sunny"},
                                        {"type": "text", "text": "21 C"}]):
            history = [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": m.content},
                       {"role": "user", "content": [{"type": "tool_result",
                                                     "tool_use_id": uses[0].id,
                                                     "content": content}]}]
            r = self.client.messages.create(model="text", max_tokens=4, tools=self.TOOLS,
                                            messages=history, thinking={"type": "disabled"})
            self.assertIn(r.stop_reason, ("end_turn", "max_tokens", "tool_use"))
            n = self.client.messages.count_tokens(model="text", tools=self.TOOLS,
                                                  messages=history, thinking={"type": "disabled"})
            self.assertEqual(n.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens)

    def test_auth_and_error_shapes(self):
        bad = self.anthropic.Anthropic(base_url=f"http://127.0.0.1:{self.port}",
                                       api_key="wrong", max_retries=0)
        with self.assertRaises(self.anthropic.AuthenticationError) as e:
            bad.messages.create(model="text", max_tokens=1,
                                messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["type"], "error")
        self.assertEqual(e.exception.body["error"]["type"], "authentication_error")
        # Bearer works too; the errors stay in Anthropic's shape on its paths.
        status, r = post(self.port, {"messages": [{"role": "user", "content": "x"}]},
                         path="/v1/messages", headers={"Authorization": "Bearer " + self.KEY})
        self.assertEqual(status, 400)
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", r["error"]["message"])
        with self.assertRaises(self.anthropic.BadRequestError) as e:
            self.client.messages.create(
                model="text", max_tokens=1,
                messages=[{"role": "user", "content": [{"type": "tool_result",
                                                        "tool_use_id": "toolu_x",
                                                        "content": "x"}]}])
        self.assertIn("tool_use_id", e.exception.body["error"]["message"])
        status, r = post(self.port, {"max_tokens": 10 ** 7,
                                     "messages": [{"role": "user", "content": "x"}]},
                         path="/v1/messages", headers={"x-api-key": self.KEY})
        self.assertEqual(status, 400)
        self.assertIn("max_tokens", r["error"]["message"])
        status, payload = request(self.port, "GET", "/v1/messages/nope",
                                  headers={"x-api-key": self.KEY})
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(payload)["type"], "error")


class SameEnginePathTest(unittest.TestCase):
    """Chat completions, Responses and Messages decode the same tokens, speculating."""

    @classmethod
    def setUpClass(cls):
        pair = os.path.join(ROOT, "models", "default")
        cls.proc, cls.port, cls.log = serve_process.start(
            [FLASHMAP, "serve", "--target", os.path.join(pair, "target"), "--draft",
             os.path.join(pair, "draft"), "--port", "0", "--served-model-name", "default",
             "--spec-policy", "always"])

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.wait()

    def test_three_apis_one_output(self):
        prompt = "The secret of a happy life is"
        status, chat = post(self.port, {"messages": [{"role": "user", "content": prompt}],
                                        "max_tokens": 48, "temperature": 0},
                            path="/v1/chat/completions")
        self.assertEqual(status, 200, chat)
        text = chat["choices"][0]["message"]["content"]
        self.assertGreater(chat["acceptance_length"], 1.0)  # it speculated
        status, resp = post(self.port, {"input": prompt, "max_output_tokens": 48,
                                        "temperature": 0}, path="/v1/responses")
        self.assertEqual(status, 200, resp)
        out = "".join(p["text"] for o in resp["output"] if o["type"] == "message"
                      for p in o["content"])
        self.assertEqual(out, text)
        status, msg = post(self.port, {"messages": [{"role": "user", "content": prompt}],
                                       "max_tokens": 48, "temperature": 0}, path="/v1/messages")
        self.assertEqual(status, 200, msg)
        self.assertEqual("".join(b["text"] for b in msg["content"] if b["type"] == "text"), text)
        # Seeded sampling is the same draw on every API.
        seeded = {"temperature": 1.0, "seed": 7}
        status, a = post(self.port, {"messages": [{"role": "user", "content": prompt}],
                                     "max_tokens": 32, **seeded}, path="/v1/chat/completions")
        status, b = post(self.port, {"input": prompt, "max_output_tokens": 32, **seeded},
                         path="/v1/responses")
        status, c = post(self.port, {"messages": [{"role": "user", "content": prompt}],
                                     "max_tokens": 32, **seeded}, path="/v1/messages")
        want = a["choices"][0]["message"]["content"]
        self.assertEqual("".join(p["text"] for o in b["output"] if o["type"] == "message"
                                 for p in o["content"]), want)
        self.assertEqual("".join(x["text"] for x in c["content"] if x["type"] == "text"), want)
        # Metrics count each endpoint's requests.
        status, payload = request(self.port, "GET", "/metrics")
        text = payload.decode()
        for path in ("/v1/responses", "/v1/messages"):
            self.assertIn('endpoint="%s",status="200"} 2' % path, text)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    FLASHMAP = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)
