"""Engine.generate against the CLI (`flashmap generate --json`) on the same inputs."""
import numpy as np
import pytest

from conftest import PAIRS


def prompts(vocab, n=3, seed=11):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=int(rng.integers(4, 20))).tolist() for _ in range(n)]


@pytest.mark.parametrize("pair", ["tiny-a", "default"])
@pytest.mark.parametrize("draft,steps", [(True, None), (True, 2), (False, None)])
def test_greedy_ids_equal_cli(cli, engines, pair, draft, steps):
    e = engines(pair, draft, steps)
    # Greedy ids do not depend on the seed; the acceptance lengths do (the drafter's noise).
    extra = ["--temperature", "0", "--seed", "42"] + (["--no-draft"] if not draft else [])
    if steps:
        extra += ["--steps", steps]
    for prompt in prompts(e.vocab_size):
        ref = cli.generate(PAIRS[pair], prompt, 48, *extra)
        out = e.generate(prompt, 48, seed=42)
        assert out.ids.tolist() == ref["ids"]
        assert out.acceptance_lengths.tolist() == ref["acceptance_lengths"]
        assert out.accepted_at.tolist() == ref["accepted_at"]
        assert out.finish_reason == ref["finish_reason"]
        assert out.rounds == ref["rounds"]
        assert out.acceptance_length == pytest.approx(ref["acceptance_length"])


def test_seeded_sampling_equals_cli(cli, engines):
    # A seeded request draws each token from (seed, position): the CLI's draws with that seed.
    e = engines("default")
    for prompt in prompts(e.vocab_size, n=2, seed=3):
        ref = cli.generate(PAIRS["default"], prompt, 40, "--temperature", "0.8", "--top-k", "20",
                           "--top-p", "0.9", "--seed", "1234")
        out = e.generate(prompt, 40, temperature=0.8, top_k=20, top_p=0.9, seed=1234)
        assert out.ids.tolist() == ref["ids"]


def test_stop_ids_default_and_explicit(cli, engines):
    e = engines("default")
    assert e.eos_token_ids == [0]  # models/default/target/generation_config.json
    prompt = prompts(e.vocab_size, n=1, seed=5)[0]
    ref = cli.generate(PAIRS["default"], prompt, 200, "--temperature", "0")
    out = e.generate(prompt, 200)
    assert out.ids.tolist() == ref["ids"]
    ref = cli.generate(PAIRS["default"], prompt, 30, "--temperature", "0", "--stop-ids", "none")
    assert e.generate(prompt, 30, stop_token_ids=[]).ids.tolist() == ref["ids"]
    # Stopping at the third generated token: the output ends there, finish_reason "stop".
    stop = ref["ids"][2]
    out = e.generate(prompt, 30, stop_token_ids=[stop])
    first = ref["ids"].index(stop)
    assert out.ids.tolist() == ref["ids"][:first + 1] and out.finish_reason == "stop"


def test_input_forms_give_the_same_ids(engines):
    e = engines("tiny-a")
    prompt = prompts(e.vocab_size, n=1, seed=9)[0]
    want = e.generate(prompt, 16).ids.tolist()
    arr = np.array(prompt)
    for form in [tuple(prompt), arr.astype(np.int64), arr.astype(np.int32), arr.astype(np.uint16),
                 arr[None, :], np.repeat(arr, 2)[::2], memoryview(arr.astype(np.int32))]:
        assert e.generate(form, 16).ids.tolist() == want


def test_result_fields(engines):
    e = engines("default")
    out = e.generate([5, 6, 7, 8], 32, stop_token_ids=[])
    assert out.ids.dtype == np.int32 and out.ids.shape == (32,)
    assert out.finish_reason == "length"
    assert out.ids.flags.owndata is False  # a view of the engine's buffer, not a copy
    t = out.timings_ms
    assert set(t) == {"prefill", "draft", "verify", "accept", "total"}
    assert t["total"] >= t["verify"] > 0 and t["draft"] > 0
    assert out.tau == out.acceptance_length == pytest.approx(
        sum(out.acceptance_lengths) / len(out.acceptance_lengths))
    assert len(out.accepted_at) == e.block_size == 8
    assert e.device == "cpu" and e.draft_dir.endswith("draft")


@pytest.mark.parametrize("tree", ["topk:12", "paths:2+topk:16", "auto"])
def test_draft_tree_greedy_equals_target_alone(engines, tree):
    # Draft trees (EngineOptions::draft_tree) are lossless: greedy ids equal the target's own.
    from flashmap_engine import Engine
    pair = PAIRS["default"]
    e = Engine(str(pair / "target"), str(pair / "draft"), draft_tree=tree)
    assert e.draft_tree == tree
    alone = engines("default", draft=False)
    for prompt in prompts(e.vocab_size, n=2, seed=7):
        assert e.generate(prompt, 48).ids.tolist() == alone.generate(prompt, 48).ids.tolist()
    e.close()


def test_draft_cut_greedy_equals_target_alone(engines):
    # Rounds that verify only the drafts that pay (EngineOptions::draft_cut "on") are lossless.
    from flashmap_engine import Engine
    pair = PAIRS["default"]
    alone = engines("default", False)
    for cut in ("on", "random:3"):
        e = Engine(str(pair / "target"), str(pair / "draft"), draft_cut=cut)
        for prompt in prompts(e.vocab_size, n=2, seed=5):
            assert (e.generate(prompt, 40, seed=1).ids.tolist()
                    == alone.generate(prompt, 40, seed=1).ids.tolist())


def test_bad_draft_tree_is_an_error():
    from flashmap_engine import Engine, Error
    pair = PAIRS["default"]
    with pytest.raises(Error, match=r"'paths:0' needs a count in \[1, 64\]"):
        Engine(str(pair / "target"), str(pair / "draft"), draft_tree="paths:0")
    with pytest.raises(Error, match="needs a drafter"):
        Engine(str(pair / "target"), draft_tree="topk:8")


def test_a_gguf_target_decodes_as_the_folder_it_came_from(engines, tmp_path, monkeypatch):
    # A Qwen3 GGUF as the target (read in place through a model folder made in the cache):
    # tiny-a's target written as an F32 GGUF, with tiny-a's drafter, gives the folder's ids.
    from flashmap_engine import Engine

    from conftest import ROOT, TINY_A

    monkeypatch.setenv("FLASHMAP_CACHE_DIR", str(tmp_path))
    gguf = ROOT / "tests" / "fixtures" / "gguf"
    e = Engine(str(gguf / "tiny-a-f32.gguf"), str(TINY_A / "draft"))
    assert e.target_dir == str(gguf / "tiny-a-f32.gguf")
    want = engines("tiny-a")
    for prompt in prompts(e.vocab_size, n=2, seed=7):
        assert (e.generate(prompt, 32, temperature=0.0).ids.tolist() ==
                want.generate(prompt, 32, temperature=0.0).ids.tolist())
    # A GGUF that holds its tokenizer brings it.
    q = Engine(str(gguf / "qwen3-q4km.gguf"))
    assert q.tokenizer is not None
    assert q.tokenizer.decode(q.tokenizer.encode("hello there")) == "hello there"
