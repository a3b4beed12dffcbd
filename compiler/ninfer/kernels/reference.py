"""float64 numpy reference for every kernel family.

`reference(spec, *inputs)` takes the kernel's arguments in `spec.signature()` order,
without the trailing `out`, and returns what `out` should hold (as float64).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ninfer.quantize import kv_formats
from ninfer.quantize import weight_formats as quant

from . import gdn_reference
from .spec import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    GdnConvSpec,
    GdnGateSpec,
    GdnNormSpec,
    GdnRecurrentSpec,
    KernelSpec,
    KvStoreSpec,
    MatmulSpec,
    MoeCombineSpec,
    MoeRouterSpec,
    RMSNormSpec,
    RopeSpec,
    SigmoidGateSpec,
    SiluMulSpec,
)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def embedding(spec: EmbeddingSpec, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    return _f64(table)[np.clip(ids, 0, spec.vocab - 1)]


def rmsnorm(spec: RMSNormSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + spec.eps) * _f64(w)


def matmul(spec: MatmulSpec, x: np.ndarray, *weight_and_bias: np.ndarray) -> np.ndarray:
    """x @ w.T (+ bias) with w dequantized from its parts (quant.dequantize); for
    group-quantized formats x is first rounded as the kernels round it
    (quant.activation_roundtrip), and with spec.x_bf16 rounded to bf16, so the kernels match
    this up to float32 rounding."""
    layout = quant.part_layout(spec.wdtype, spec.n_out, spec.k, spec.layout)
    parts = {name: arr for (name, _, _), arr in zip(layout, weight_and_bias, strict=False)}
    w = quant.dequantize(parts, spec.wdtype, spec.k, spec.layout, spec.n_out)
    if spec.x_bf16:
        x = quant.round_bf16(x)
    out = _f64(quant.activation_roundtrip(x, spec.wdtype)) @ _f64(w).T
    if spec.bias:
        out += _f64(weight_and_bias[len(layout)])
    return out


def rope(
    spec: RopeSpec, x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray
) -> np.ndarray:
    half = spec.rot // 2
    p = np.clip(pos, 0, spec.max_pos - 1)
    c = _f64(cos)[p][:, None, :]  # [n, 1, half]
    s = _f64(sin)[p][:, None, :]
    x = _f64(x)
    x1, x2, rest = x[..., :half], x[..., half:spec.rot], x[..., spec.rot:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], axis=-1)


def silu_mul(spec: SiluMulSpec, gu: np.ndarray) -> np.ndarray:
    gu = _f64(gu)
    a, b = gu[:, : spec.inter], gu[:, spec.inter :]
    return a / (1.0 + np.exp(-a)) * b


def add(spec: AddSpec, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _f64(a) + _f64(b)


def attention(spec: AttentionSpec, q: np.ndarray, *args: np.ndarray) -> np.ndarray:
    """args: the k pool's parts, the v pool's parts (in spec.layout), pos, seq,
    block_tables. Pools in a KV format are decoded exactly (kv_formats.decode); rotated keys
    meet rotated queries."""
    nparts = len(spec.pool_args("k_pool"))

    def pool(parts: tuple[np.ndarray, ...]) -> np.ndarray:
        rows = [kv_formats.pool_to_rows(p, spec.layout, spec.block_size) for p in parts]
        return kv_formats.decode(spec.kv_dtype, rows)

    k_pool, v_pool = pool(args[:nparts]), pool(args[nparts:2 * nparts])
    pos, seq, block_tables = args[2 * nparts:]
    if spec.rotate:
        q = kv_formats.hadamard(q, spec.rotate)
    kv = np.repeat(np.arange(spec.kv_heads), spec.group)  # kv head of each query head
    bs = spec.block_size
    out = np.zeros(q.shape, np.float64)
    for i in range(q.shape[0]):
        p = int(np.clip(pos[i], 0, spec.max_ctx - 1))
        j = np.arange(p + 1)
        blocks = np.clip(block_tables[int(seq[i])][j // bs], 0, spec.kv_blocks - 1)
        rows = blocks * bs + j % bs
        k = _f64(k_pool[rows])[:, kv, :]  # [keys, heads, d]
        v = _f64(v_pool[rows])[:, kv, :]
        scores = np.einsum("hd,jhd->hj", _f64(q[i]), k) * spec.head_dim**-0.5
        scores -= scores.max(axis=-1, keepdims=True)
        w = np.exp(scores)
        w /= w.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("hj,jhd->hd", w, v)
    return out


def kv_store(spec: KvStoreSpec, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The values expected at pool[rows] (the rest of the pool is left as it was)."""
    return _f64(x)


def gdn_recurrent(spec: GdnRecurrentSpec, qkv: np.ndarray, gb: np.ndarray, pos: np.ndarray,
                  slot: np.ndarray, save: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Rows in order, each from and into its slot's state, a zero one at position 0, copied
    into slot save[i] after row i when save[i] >= 0 (`state` is not modified: the kernel's
    final states are `gdn_recurrent_states`)."""
    return _gdn_rows(spec, qkv, gb, pos, slot, save, state)[0]


def gdn_recurrent_states(spec: GdnRecurrentSpec, qkv: np.ndarray, gb: np.ndarray,
                         pos: np.ndarray, slot: np.ndarray, save: np.ndarray,
                         state: np.ndarray) -> np.ndarray:
    """What the kernel leaves in `state`."""
    return _gdn_rows(spec, qkv, gb, pos, slot, save, state)[1]


def _gdn_rows(spec: GdnRecurrentSpec, qkv: np.ndarray, gb: np.ndarray, pos: np.ndarray,
              slot: np.ndarray, save: np.ndarray,
              state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    states = _f64(state).copy()
    kw, H = spec.k_heads * spec.k_dim, spec.v_heads
    q = _f64(qkv[:, :kw]).reshape(-1, spec.k_heads, spec.k_dim)
    k = _f64(qkv[:, kw:2 * kw]).reshape(-1, spec.k_heads, spec.k_dim)
    v = _f64(qkv[:, 2 * kw:]).reshape(-1, H, spec.v_dim)
    g, beta = _f64(gb[:, :H]), _f64(gb[:, H:])
    out = np.zeros((len(slot), H, spec.v_dim))
    for i, s in enumerate(np.clip(slot, 0, spec.max_seqs - 1)):
        if pos[i] == 0:
            states[s] = 0.0
        o, states[s] = gdn_reference.delta_rule_recurrent(
            q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], states[s])
        out[i] = o[0]
        if save[i] >= 0:
            states[min(int(save[i]), spec.max_seqs - 1)] = states[s]
    return out, states


def gdn_conv(spec: GdnConvSpec, x: np.ndarray, weight: np.ndarray, pos: np.ndarray,
             slot: np.ndarray, save: np.ndarray, conv_state: np.ndarray) -> np.ndarray:
    """Rows in order, each after its slot's carried inputs, zeros at position 0, copied into
    slot save[i] after row i when save[i] >= 0 (`conv_state` is not modified: the
    kernel's final states are `gdn_conv_states`)."""
    return _conv_rows(spec, x, weight, pos, slot, save, conv_state)[0]


def gdn_conv_states(spec: GdnConvSpec, x: np.ndarray, weight: np.ndarray, pos: np.ndarray,
                    slot: np.ndarray, save: np.ndarray, conv_state: np.ndarray) -> np.ndarray:
    return _conv_rows(spec, x, weight, pos, slot, save, conv_state)[1]


def _conv_rows(spec: GdnConvSpec, x: np.ndarray, weight: np.ndarray, pos: np.ndarray,
               slot: np.ndarray, save: np.ndarray,
               conv_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    states = _f64(conv_state).copy()
    out = np.zeros((len(slot), spec.channels))
    for i, s in enumerate(np.clip(slot, 0, spec.max_seqs - 1)):
        if pos[i] == 0:
            states[s] = 0.0
        y, states[s] = gdn_reference.causal_conv1d(x[i:i + 1], weight, states[s])
        out[i] = y[0]
        if save[i] >= 0:
            states[min(int(save[i]), spec.max_seqs - 1)] = states[s]
    return out, states


def gdn_gate(spec: GdnGateSpec, ba: np.ndarray, A_log: np.ndarray,
             dt_bias: np.ndarray) -> np.ndarray:
    H = spec.v_heads
    g, beta = gdn_reference.gating(ba[:, H:], ba[:, :H], A_log, dt_bias)
    return np.concatenate([g, beta], axis=1)


def gdn_norm(spec: GdnNormSpec, o: np.ndarray, z: np.ndarray, weight: np.ndarray) -> np.ndarray:
    shape = (len(o), spec.v_heads, spec.v_dim)
    return gdn_reference.gated_rmsnorm(o.reshape(shape), z.reshape(shape), weight,
                                       spec.eps).reshape(len(o), -1)


def moe_router(spec: MoeRouterSpec, logits: np.ndarray) -> np.ndarray:
    """[ids | weights] per row, as float64 (`moe_router_parts` splits them)."""
    ids, w = moe_router_parts(spec, logits)
    return np.concatenate([ids.astype(np.float64), w], axis=1)


def moe_router_parts(spec: MoeRouterSpec, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [n, K], weights [n, K]): softmax, the top_k in descending order with a
    tie to the lower id (a stable sort), renormalised when the spec says."""
    x = _f64(logits)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :spec.top_k]
    w = np.take_along_axis(p, ids, axis=1)
    if spec.normalize:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w


def moe_combine(spec: MoeCombineSpec, y: np.ndarray, pos: np.ndarray, w: np.ndarray,
                x: np.ndarray, gate: np.ndarray, shared: np.ndarray) -> np.ndarray:
    routed = np.einsum("tk,tkh->th", _f64(w), _f64(y)[np.asarray(pos)])
    sg = 1.0 / (1.0 + np.exp(-(_f64(x) @ _f64(gate))))
    return routed + sg[:, None] * _f64(shared)


def sigmoid_gate(spec: SigmoidGateSpec, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    return _f64(x) / (1.0 + np.exp(-_f64(gate)))


_REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "embedding": embedding,
    "rmsnorm": rmsnorm,
    "matmul": matmul,
    "rope": rope,
    "silu_mul": silu_mul,
    "add": add,
    "attention": attention,
    "kv_store": kv_store,
    "gdn_recurrent": gdn_recurrent,
    "gdn_conv": gdn_conv,
    "gdn_gate": gdn_gate,
    "gdn_norm": gdn_norm,
    "sigmoid_gate": sigmoid_gate,
    "moe_router": moe_router,
    "moe_combine": moe_combine,
}


def reference(spec: KernelSpec, *inputs: np.ndarray | int) -> np.ndarray:
    """Expected `out` of `spec`'s kernel for `inputs` (signature order, without the
    outputs; a kernel with several outputs gets them side by side: moe_router)."""
    args = [a for a in spec.signature() if a.name != "out" and not a.name.startswith("out_")]
    expected = len(args)
    if len(inputs) != expected:
        names = ", ".join(a.name for a in args)
        raise TypeError(f"{spec.name()}: expected {expected} inputs ({names}), got {len(inputs)}")
    return _REFERENCES[spec.family](spec, *inputs)
