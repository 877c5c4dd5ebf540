#!/usr/bin/env python3
"""Golden filtered distributions from transformers' logits warpers (temperature, top-k, top-p,
min-p, applied in the order transformers applies them), for tests/spec/test_sampling.cpp.

    python3 tools/make_sampling_goldens.py > tests/data/sampling_golden.json
"""
import json

import torch
from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

gen = torch.Generator().manual_seed(0)
cases = []
for i, (V, T, k, p, m) in enumerate([(50, 1.0, 0, 1.0, 0.0), (50, 0.7, 5, 1.0, 0.0), (64, 1.3, 0, 0.9, 0.0),
                                     (64, 0.5, 0, 1.0, 0.1), (100, 0.8, 20, 0.95, 0.0), (100, 1.0, 10, 0.8, 0.05),
                                     (33, 2.0, 0, 0.5, 0.0), (33, 0.6, 3, 0.99, 0.2), (200, 1.0, 0, 0.3, 0.0)]):
    logits = torch.randn(1, V, generator=gen) * 3
    scores = TemperatureLogitsWarper(T)(None, logits.clone())
    if k:
        scores = TopKLogitsWarper(k)(None, scores)
    if p < 1.0:
        scores = TopPLogitsWarper(p)(None, scores)
    if m > 0:
        scores = MinPLogitsWarper(m)(None, scores)
    probs = scores.softmax(-1)[0]
    cases.append({"logits": logits[0].tolist(), "temperature": T, "top_k": k, "top_p": p, "min_p": m,
                  "probs": probs.tolist()})
print(json.dumps({"source": "transformers " + __import__("transformers").__version__ + " logits warpers",
                  "cases": cases}))
