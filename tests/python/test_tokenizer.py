"""Tokenizer and chat templates against the CLI (`flashmap tokenize`, `flashmap render`) and, where
it is installed, transformers' tokenizer."""
import json
import subprocess

import pytest

import flashmap_engine as fe
from conftest import DEFAULT, ROOT, cli_path

QWEN3 = ROOT / "tests" / "data" / "qwen3-tokenizer"
TEXTS = ["Tell me a fortune", "héllo  wörld\n\n\tπ ≈ 3.14159 — 你好 🙂", "<|im_start|>user\nhi<|im_end|>", ""]
MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


def render_cli(tok_dir, request):
    out = subprocess.run([cli_path(), "render", "--tokenizer", str(tok_dir), "--request", "-"],
                         input=json.dumps(request), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_engine_tokenizer(engines):
    e = engines("default")
    assert e.tokenizer is not None and e.tokenizer.vocab_size > 0
    assert engines("tiny-a").tokenizer is None  # the fixture target has no tokenizer.json
    ids = e.tokenizer.encode("Tell me a fortune")
    assert e.tokenizer.decode(ids) == "Tell me a fortune"
    out = e.generate(ids, 16)
    assert isinstance(e.tokenizer.decode(out.ids, skip_special_tokens=True), str)


@pytest.mark.parametrize("tok_dir", [QWEN3, DEFAULT / "target"])
def test_encode_decode_equal_cli(cli, tok_dir):
    t = fe.Tokenizer(str(tok_dir))
    for text in TEXTS:
        ids = t.encode(text)
        assert ids == json.loads(cli("tokenize", "--tokenizer", tok_dir, "--text", text))
        assert t.decode(ids) == text


@pytest.mark.parametrize("kwargs", [dict(), dict(enable_thinking=False), dict(enable_thinking=True),
                                    dict(tools=TOOLS), dict(add_generation_prompt=False)])
def test_chat_template_equals_cli(cli, kwargs):
    t = fe.Tokenizer(str(QWEN3))
    request = {"messages": MESSAGES, "add_generation_prompt": True, **kwargs}
    want = render_cli(QWEN3, request)
    assert t.apply_chat_template(MESSAGES, tokenize=False, **kwargs) == want
    assert t.apply_chat_template(MESSAGES, **kwargs) == t.encode(want)


def test_chat_template_equals_transformers():
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN3))
    t = fe.Tokenizer(str(QWEN3))
    for kwargs in [dict(), dict(enable_thinking=False), dict(tools=TOOLS)]:
        want = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)
        assert t.apply_chat_template(MESSAGES, tokenize=False, **kwargs) == want
    for text in TEXTS:
        assert t.encode(text) == hf.encode(text, add_special_tokens=False)


def test_tokenizer_errors(engines):
    with pytest.raises(fe.Error, match="tokenizer.json"):
        fe.Tokenizer("no-such-dir")
    t = engines("default").tokenizer
    with pytest.raises(fe.Error):
        t.decode([10 ** 9])
    with pytest.raises(TypeError):
        t.apply_chat_template([{"role": "user", "content": object()}])
    with pytest.raises(TypeError):
        t.encode(5)
