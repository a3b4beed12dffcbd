"""transformers as the reference of a greedy run (tests/test_hybrid.py, the GPU check)."""

from __future__ import annotations

from typing import Any


def greedy_cached(model: Any, ids: list[int], n: int) -> list[int]:
    """n argmax tokens of `model` (a transformers causal LM) after `ids`, stepped through
    the model's own cache (a hybrid's recurrent state included) and past any
    end-of-sequence token, as a request with ignore_eos asks (generate would stop)."""
    import torch

    out: list[int] = []
    with torch.no_grad():
        step = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            out.append(int(step.logits[0, -1].argmax()))
            step = model(torch.tensor([out[-1:]]), past_key_values=step.past_key_values,
                         use_cache=True)
    return out
