"""flashmap_engine: the flashmap C++ engine from Python (no torch needed).

    from flashmap_engine import Engine
    engine = Engine("models/default/target", "models/default/draft")
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a fortune"}])
    out = engine.generate(ids, max_new_tokens=64)
    print(engine.tokenizer.decode(out.ids), out.acceptance_length)

The module is named flashmap_engine (distribution flashmap-engine) so that it can live next to the
reference package, whose module is flashmap.
"""
import json
import os
from dataclasses import dataclass, field

import numpy as np

from ._core import Engine, Error, GenerateResult, Tokenizer, TokenStream, cpu_threads

__all__ = ["Engine", "Error", "GenerateResult", "Tokenizer", "TokenStream", "cpu_threads",
           "FlashMapGenerateOutput", "spec_generate"]
__version__ = "0.1.0"


@dataclass
class FlashMapGenerateOutput:
    """The reference's FlashMapGenerateOutput, with numpy in place of torch: ``sequences``
    (prompt and generated tokens, int64, shape (1, length)), ``num_new_tokens`` and
    ``acceptance_lengths`` (tokens committed by each target forward pass). ``result`` is the
    engine's GenerateResult (timings, finish reason), which the reference does not have."""

    sequences: np.ndarray
    num_new_tokens: int
    acceptance_lengths: list = field(default_factory=list)
    result: GenerateResult = None

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per target forward pass."""
        return sum(self.acceptance_lengths) / max(len(self.acceptance_lengths), 1)


def _draft_num_steps(engine):
    if engine.steps is not None:
        return engine.steps
    if engine.draft_dir is None or engine.draft_dir == "ngram":  # no jumps to count
        return None
    with open(os.path.join(engine.draft_dir, "config.json")) as f:
        return json.load(f).get("num_steps")


def spec_generate(engine, input_ids, max_new_tokens=256, temperature=0.0, num_steps=None,
                  stop_token_ids=None, generator=None, seed=None):
    """The reference's ``draft.spec_generate(target, input_ids, ...)`` on an Engine, with the
    same arguments and returned fields. ``input_ids``: shape (1, P) or (P,), a list or any
    integer array. ``num_steps`` must be the engine's (it is fixed when the engine loads:
    ``Engine(..., steps=N)``). ``generator``: a torch.Generator's ``initial_seed()`` seeds the
    engine's own sampler (``seed`` does the same directly); sampled tokens are then reproducible
    but are not torch's draws. Greedy output equals the reference's."""
    if num_steps is not None and num_steps != _draft_num_steps(engine):
        raise ValueError(f"num_steps={num_steps}: this engine drafts with "
                         f"{_draft_num_steps(engine)} steps; make it with Engine(..., steps={num_steps})")
    if generator is not None and seed is None:
        seed = int(generator.initial_seed())
    prompt = input_ids
    if hasattr(prompt, "detach"):  # a torch tensor, for callers of the reference
        prompt = prompt.detach().cpu().numpy()
    prompt = np.asarray(prompt)
    if prompt.ndim == 2 and prompt.shape[0] != 1:
        raise ValueError("spec_generate decodes one sequence at a time")
    # As the reference: no top-k, top-p or min-p filter, whatever generation_config.json says.
    r = engine.generate(prompt, max_new_tokens, temperature=temperature, top_k=0, top_p=1.0,
                        min_p=0.0, seed=seed, stop_token_ids=stop_token_ids)
    sequences = np.concatenate([prompt.reshape(-1).astype(np.int64), r.ids.astype(np.int64)])[None]
    return FlashMapGenerateOutput(sequences=sequences, num_new_tokens=len(r.ids),
                                  acceptance_lengths=[int(a) for a in r.acceptance_lengths],
                                  result=r)
