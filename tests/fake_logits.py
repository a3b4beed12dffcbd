"""The fake model's logits (tests/native/fake_model.h) in Python, and the engine's greedy
decoding over them with every logits processor, so HTTP tests of the fake server can
assert exact tokens and logprobs.

FakeModel: a row's logits are 27 draws of mt19937_64 seeded with an FNV-1a style hash of
the tokens at positions 0..pos, each (draw % 1000) / 250 in float32, the end-of-sequence
token's minus 1.5. The processors follow runtime_cpp/engine (sampling.h): min_tokens masks
the end-of-sequence (unless ignore_eos) and stop_token_ids, then logit_bias, then the
penalties (vLLM's formulas), all in float32 as the engine computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

VOCAB = 27
EOS = 26
_M64 = (1 << 64) - 1


class _MT19937_64:
    def __init__(self, seed: int) -> None:
        self.mt = [0] * 312
        self.mt[0] = seed & _M64
        for i in range(1, 312):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & _M64
        self.index = 312

    def _twist(self) -> None:
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.index = 0

    def __call__(self) -> int:
        if self.index >= 312:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & _M64


def logits(tokens: list[int]) -> np.ndarray:
    """The fake model's logits after `tokens` (prompt and generated so far)."""
    h = 1469598103934665603
    for t in tokens:
        h = ((h ^ (t + 1)) * 1099511628211) & _M64
    g = _MT19937_64(h)
    out = np.array([g() % 1000 for _ in range(VOCAB)], dtype=np.float32) / np.float32(250)
    out[EOS] -= np.float32(1.5)
    return out


def logprobs(row: np.ndarray) -> np.ndarray:
    """log-softmax as the engine computes it (double sums, float results)."""
    x = row.astype(np.float64)
    top = x.max()
    norm = top + math.log(float(np.exp(x - top).sum()))
    return (x - norm).astype(np.float32)


@dataclass
class Params:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


def processed(row: np.ndarray, prompt: list[int], out: list[int], p: Params) -> np.ndarray:
    """`row` after the engine's logits processors, `out` the tokens generated so far."""
    row = row.copy()
    f32 = np.float32
    if len(out) < p.min_tokens:
        if not p.ignore_eos:
            row[EOS] = -np.inf
        for t in p.stop_token_ids:
            row[t] = -np.inf
    for t, b in p.logit_bias.items():
        row[t] = f32(row[t] + f32(b))
    counts: dict[int, int] = {}
    for t in out:
        counts[t] = counts.get(t, 0) + 1
    if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
        rep = f32(p.repetition_penalty)
        for t in set(prompt) | set(counts):
            v = row[t]
            if rep != f32(1):
                v = f32(v / rep) if v > 0 else f32(v * rep)
            if counts.get(t, 0):
                v = f32(v - f32(f32(p.frequency_penalty) * f32(counts[t])))
                v = f32(v - f32(p.presence_penalty))
            row[t] = v
    return row


@dataclass
class Greedy:
    tokens: list[int]  # sent (an end-of-sequence or stop token is not)
    finish: str
    generated: int  # counted in usage
    logprobs: list[float]  # raw logprob of each sent token


def greedy(prompt: list[int], max_tokens: int, p: Params | None = None) -> Greedy:
    """What the engine's greedy decoding (temperature 0) sends for `prompt`."""
    p = p or Params()
    out: list[int] = []
    lps: list[float] = []
    while True:
        raw = logits(prompt + out)
        t = int(np.argmax(processed(raw, prompt, out, p)))
        if (t == EOS and not p.ignore_eos) or t in p.stop_token_ids:
            return Greedy(out, "stop", len(out) + 1, lps)
        out.append(t)
        lps.append(float(logprobs(raw)[t]))
        if len(out) >= max_tokens:
            return Greedy(out, "length", len(out), lps)
