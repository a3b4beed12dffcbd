"""The sampling defaults of a checkpoint's generation_config.json, as vLLM takes them.

vLLM's ``--generation-config auto`` (its default) reads ``GenerationConfig.to_diff_dict()``
(the values that differ from transformers' own defaults) and keeps only temperature,
top_p, top_k, min_p, repetition_penalty and max_new_tokens (renamed max_tokens); a request
that leaves one of them out gets the checkpoint's value. The result goes into the
artifact manifest as "generation_config"; ninfer-server applies it unless started with
``--generation-config ninfer``. Its eos_token_id is read by frontend/tokenizer.py.
"""

from __future__ import annotations

from typing import Any

from ninfer.frontend.config import FrontendError

# transformers' GenerationConfig defaults: a value equal to one of these is not in
# to_diff_dict(), so vLLM does not apply it.
_HF_DEFAULTS: dict[str, float | None] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None,
    "repetition_penalty": 1.0, "max_new_tokens": None}

_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (-1, 1 << 30),
    "min_p": (0.0, 1.0), "repetition_penalty": (0.0, 1e9), "max_new_tokens": (1, 1 << 30)}


def generation_defaults(generation_config: dict[str, Any]) -> dict[str, float | int]:
    """{"temperature": .., "top_p": .., "top_k": .., "min_p": .., "repetition_penalty": ..,
    "max_tokens": ..}, only the keys the checkpoint sets to a non-default value."""
    out: dict[str, float | int] = {}
    for key, default in _HF_DEFAULTS.items():
        value = generation_config.get(key)
        if value is None or value == default:
            continue
        lo, hi = _RANGES[key]
        integral = key in ("top_k", "max_new_tokens")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (integral and not isinstance(value, int)) or not lo <= value <= hi):
            raise FrontendError(f"generation_config.json: {key} = {value!r} is not a valid "
                                f"default (expected {'an integer' if integral else 'a number'} "
                                f"in [{lo}, {hi}])")
        if key in ("top_p", "repetition_penalty") and value <= 0:
            raise FrontendError(f"generation_config.json: {key} must be > 0, got {value!r}")
        out["max_tokens" if key == "max_new_tokens" else key] = value
    return out
