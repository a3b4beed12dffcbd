"""float64 numpy reference for every kernel family.

`reference(spec, *inputs)` takes the kernel's arguments in `spec.signature()` order,
without the trailing `out`, and returns what `out` should hold (as float64).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .spec import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SiluMulSpec,
)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def embedding(spec: EmbeddingSpec, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    return _f64(table)[np.clip(ids, 0, spec.vocab - 1)]


def rmsnorm(spec: RMSNormSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + spec.eps) * _f64(w)


def matmul(spec: MatmulSpec, x: np.ndarray, w: np.ndarray, *bias: np.ndarray) -> np.ndarray:
    out = _f64(x) @ _f64(w).T
    if spec.bias:
        out += _f64(bias[0])
    return out


def rope(
    spec: RopeSpec, x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray
) -> np.ndarray:
    half = spec.head_dim // 2
    p = np.clip(pos, 0, spec.max_pos - 1)
    c = _f64(cos)[p][:, None, :]  # [n, 1, half]
    s = _f64(sin)[p][:, None, :]
    x = _f64(x)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def silu_mul(spec: SiluMulSpec, gu: np.ndarray) -> np.ndarray:
    gu = _f64(gu)
    a, b = gu[:, : spec.inter], gu[:, spec.inter :]
    return a / (1.0 + np.exp(-a)) * b


def add(spec: AddSpec, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _f64(a) + _f64(b)


def attention(
    spec: AttentionSpec, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int
) -> np.ndarray:
    n = q.shape[0]
    ctx = pos0 + n
    q = _f64(q)
    kv = np.repeat(np.arange(spec.kv_heads), spec.group)  # kv head of each query head
    k = _f64(k_cache[:ctx])[:, kv, :]  # [ctx, heads, d]
    v = _f64(v_cache[:ctx])[:, kv, :]
    scores = np.einsum("ihd,jhd->hij", q, k) * spec.head_dim**-0.5
    causal = np.arange(ctx)[None, :] <= (pos0 + np.arange(n))[:, None]  # [n, ctx]
    scores = np.where(causal[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v)


_REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "embedding": embedding,
    "rmsnorm": rmsnorm,
    "matmul": matmul,
    "rope": rope,
    "silu_mul": silu_mul,
    "add": add,
    "attention": attention,
}


def reference(spec: KernelSpec, *inputs: np.ndarray | int) -> np.ndarray:
    """Expected `out` of `spec`'s kernel for `inputs` (signature order, without `out`)."""
    expected = len(spec.signature()) - 1
    if len(inputs) != expected:
        names = ", ".join(a.name for a in spec.signature()[:-1])
        raise TypeError(f"{spec.name()}: expected {expected} inputs ({names}), got {len(inputs)}")
    return _REFERENCES[spec.family](spec, *inputs)
