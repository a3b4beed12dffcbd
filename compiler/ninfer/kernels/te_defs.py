"""The math of every kernel family as an unscheduled TE PrimFunc.

`te_primfunc(spec)` returns a PrimFunc whose parameters are exactly `spec.signature()`
(same names, order, dtypes and shapes; `n` is a symbolic int64, every other index is int64
too) and whose body is a plain TE compute graph with no schedule. The GPU kernels are
schedules of these functions (schedules change loops, memory scopes and thread mapping,
never the math), and tests/kernels/test_te_defs.py builds each one unscheduled for the
CPU and compares it with the float64 reference; together that proves the math of the
CUDA kernels on machines without a GPU.

Intermediate tensors are named so that schedules can find their blocks by name.
Index clamping (embedding ids, rope positions) matches reference.py. Paged attention and
KV-cache stores have no TE definition: their CUDA kernels are hand-written
(kernels/cuda/attention.py); `TE_FAMILIES` names the families defined here.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import te, tirx

from .spec import (
    AddSpec,
    EmbeddingSpec,
    KernelSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SigmoidGateSpec,
    SiluMulSpec,
)

F32 = "float32"
INDEX = "int64"  # the single index dtype of every kernel (see TVM_NOTES: no int32/int64 mix)


def i64(value: int) -> tirx.IntImm:
    return tirx.IntImm(INDEX, value)


def f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def _tokens() -> tirx.Var:
    return tirx.Var("n", INDEX)


def _clamp(index: tirx.PrimExpr, size: int) -> tirx.PrimExpr:
    return tirx.max(tirx.min(index.astype(INDEX), i64(size - 1)), i64(0))


def embedding(spec: EmbeddingSpec) -> tirx.PrimFunc:
    n = _tokens()
    ids = te.placeholder((n,), "int32", "ids")
    table = te.placeholder((i64(spec.vocab), i64(spec.hidden)), spec.wdtype, "table")
    out = te.compute(
        (n, i64(spec.hidden)),
        lambda i, c: table[_clamp(ids[i], spec.vocab), c].astype(F32),
        name="out",
    )
    return te.create_prim_func([ids, table, out])


def rmsnorm(spec: RMSNormSpec) -> tirx.PrimFunc:
    n, H = _tokens(), i64(spec.hidden)
    x = te.placeholder((n, H), F32, "x")
    w = te.placeholder((H,), F32, "w")
    k = te.reduce_axis((i64(0), H), "k")
    sumsq = te.compute((n,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="sumsq")
    out = te.compute(
        (n, H),
        lambda i, c: x[i, c] * tirx.rsqrt(sumsq[i] * f32(1.0 / spec.hidden) + f32(spec.eps)) * w[c],
        name="out",
    )
    return te.create_prim_func([x, w, out])


# Float weight formats the TE matmul reads (quantize.weight_formats layouts): storage dtype of w.
_W_STORAGE = {"float32": F32, "f16": "float16", "bf16": "uint16"}


def _widen(wdtype: str, value: tirx.PrimExpr) -> tirx.PrimExpr:
    """A stored weight as float32: f16 converts; bf16 (uint16 bits) becomes the top half
    of a float32, which is exact."""
    if wdtype == "bf16":
        return tirx.reinterpret(F32, value.astype("uint32") << tirx.const(16, "uint32"))
    return value.astype(F32)


def matmul(spec: MatmulSpec) -> tirx.PrimFunc:
    """out[i, j] = sum_k x[i, k] * w[j, k] (+ bias[j]); the product is block "matmul".
    w is float32, f16 or bf16, widened to float32 as it is read."""
    if spec.wdtype not in _W_STORAGE:
        raise NotImplementedError(
            f"{spec.name()}: weight format {spec.wdtype} has hand-written kernels "
            f"(cpu/qmatmul.py, cuda/qmatmul.py); the TE matmul reads "
            f"{', '.join(_W_STORAGE)} weights"
        )
    n, K, N = _tokens(), i64(spec.k), i64(spec.n_out)
    x = te.placeholder((n, K), F32, "x")
    w = te.placeholder((N, K), _W_STORAGE[spec.wdtype], "w")
    k = te.reduce_axis((i64(0), K), "k")

    def product(i: tirx.PrimExpr, j: tirx.PrimExpr) -> tirx.PrimExpr:
        return te.sum(x[i, k] * _widen(spec.wdtype, w[j, k]), axis=k)

    if not spec.bias:
        out = te.compute((n, N), product, name="out")
        return te.create_prim_func([x, w, out])
    bias = te.placeholder((N,), F32, "bias")
    mm = te.compute((n, N), product, name="matmul")
    out = te.compute((n, N), lambda i, j: mm[i, j] + bias[j], name="out")
    return te.create_prim_func([x, w, bias, out])


def rope(spec: RopeSpec) -> tirx.PrimFunc:
    """out[d] = x[d] * cos[d % h] + sign(d) * x[(d + h) % R] * sin[d % h], sign = -1 below h,
    for d < R (the rotated dims); out[d] = x[d] above."""
    n, NH, D = _tokens(), i64(spec.heads), i64(spec.head_dim)
    R, half = i64(spec.rot), i64(spec.rot // 2)
    x = te.placeholder((n, NH, D), F32, "x")
    pos = te.placeholder((n,), "int32", "pos")
    cos = te.placeholder((i64(spec.max_pos), half), F32, "cos")
    sin = te.placeholder((i64(spec.max_pos), half), F32, "sin")

    def rotate(i: tirx.PrimExpr, h: tirx.PrimExpr, d: tirx.PrimExpr) -> tirx.PrimExpr:
        p = _clamp(pos[i], spec.max_pos)
        dr = tirx.min(d, R - 1)  # rotated dims only; the others pass through
        partner = x[i, h, (dr + half) % R]
        signed = tirx.if_then_else(dr < half, f32(0.0) - partner, partner)
        rotated = x[i, h, dr] * cos[p, dr % half] + signed * sin[p, dr % half]
        if spec.rot == spec.head_dim:
            return rotated
        return tirx.if_then_else(d < R, rotated, x[i, h, d])

    out = te.compute((n, NH, D), rotate, name="out")
    return te.create_prim_func([x, pos, cos, sin, out])


def sigmoid_gate(spec: SigmoidGateSpec) -> tirx.PrimFunc:
    n, W = _tokens(), i64(spec.width)
    x = te.placeholder((n, W), F32, "x")
    gate = te.placeholder((n, W), F32, "gate")
    out = te.compute((n, W), lambda i, c: x[i, c] / (f32(1.0) + tirx.exp(f32(0.0) - gate[i, c])),
                     name="out")
    return te.create_prim_func([x, gate, out])


def silu_mul(spec: SiluMulSpec) -> tirx.PrimFunc:
    n, inter = _tokens(), i64(spec.inter)
    gu = te.placeholder((n, i64(2 * spec.inter)), F32, "gu")

    def silu_times(i: tirx.PrimExpr, c: tirx.PrimExpr) -> tirx.PrimExpr:
        a = gu[i, c]
        return a / (f32(1.0) + tirx.exp(f32(0.0) - a)) * gu[i, c + inter]

    out = te.compute((n, inter), silu_times, name="out")
    return te.create_prim_func([gu, out])


def add(spec: AddSpec) -> tirx.PrimFunc:
    n, H = _tokens(), i64(spec.hidden)
    a = te.placeholder((n, H), F32, "a")
    b = te.placeholder((n, H), F32, "b")
    out = te.compute((n, H), lambda i, c: a[i, c] + b[i, c], name="out")
    return te.create_prim_func([a, b, out])


_BUILDERS: dict[str, Callable[..., tirx.PrimFunc]] = {
    "embedding": embedding,
    "rmsnorm": rmsnorm,
    "matmul": matmul,
    "rope": rope,
    "silu_mul": silu_mul,
    "sigmoid_gate": sigmoid_gate,
    "add": add,
}
TE_FAMILIES = frozenset(_BUILDERS)


def te_primfunc(spec: KernelSpec) -> tirx.PrimFunc:
    """The unscheduled PrimFunc of `spec`, exported as `spec.name()`."""
    try:
        build = _BUILDERS[spec.family]
    except KeyError:
        raise NotImplementedError(f"no TE definition for family {spec.family!r}") from None
    return build(spec).with_attr("global_symbol", spec.name())
