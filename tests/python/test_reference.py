"""The reference package flashmap==0.1.0 (torch + transformers) and flashmap_engine.spec_generate
give the same greedy output on the committed fixture pair tests/fixtures/tiny-a (and the shipped
pair). Skipped where the reference is not installed (CI has no torch)."""
import numpy as np
import pytest

import flashmap_engine as fe
from conftest import PAIRS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("flashmap")


@pytest.fixture(scope="module")
def reference():
    made = {}

    def get(name):
        if name not in made:
            pair = PAIRS[name]
            target = transformers.Qwen3ForCausalLM.from_pretrained(
                str(pair / "target"), dtype=torch.float32).eval()
            draft = transformers.AutoModel.from_pretrained(
                str(pair / "draft"), dtype=torch.float32).eval()
            made[name] = (target, draft)
        return made[name]

    return get


@pytest.mark.parametrize("pair", ["tiny-a", "default"])
@pytest.mark.parametrize("stop", [None, "one"])
def test_greedy_equals_reference(reference, engines, pair, stop):
    target, draft = reference(pair)
    e = engines(pair)
    gen = torch.Generator().manual_seed(17)
    for n in range(3):
        prompt = torch.randint(1, e.vocab_size, (1, 6 + 5 * n), generator=gen)
        stop_ids = None
        with torch.no_grad():
            ref = draft.spec_generate(target, prompt, max_new_tokens=40, temperature=0.0)
            if stop is not None:  # a token the output holds, so that it does stop early
                ref = draft.spec_generate(target, prompt, max_new_tokens=40, temperature=0.0,
                                          stop_token_ids=[])
                stop_ids = [int(ref.sequences[0, prompt.shape[1] + 5])]
                ref = draft.spec_generate(target, prompt, max_new_tokens=40, temperature=0.0,
                                          stop_token_ids=stop_ids)
                assert ref.num_new_tokens <= 6
        for inp in (prompt, prompt.numpy()):  # a torch tensor as the reference takes, or numpy
            ours = fe.spec_generate(e, inp, max_new_tokens=40, temperature=0.0,
                                    stop_token_ids=stop_ids)
            assert isinstance(ours.sequences, np.ndarray) and ours.sequences.dtype == np.int64
            assert ours.sequences.tolist() == ref.sequences.tolist()
            assert ours.num_new_tokens == ref.num_new_tokens
            # The acceptance lengths depend on the drafter's Gaussian noise (torch's generator
            # there, the engine's here), so only their meaning is compared: tokens per pass.
            for out in (ours, ref):
                k = draft.config.block_size
                assert all(1 <= a <= k + 1 for a in out.acceptance_lengths)
                assert sum(out.acceptance_lengths) + 1 >= out.num_new_tokens
            assert ours.acceptance_length == pytest.approx(
                sum(ours.acceptance_lengths) / max(len(ours.acceptance_lengths), 1))
