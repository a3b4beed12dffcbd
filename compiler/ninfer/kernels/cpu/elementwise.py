"""Row-wise CPU kernels: embedding, RMSNorm, RoPE, SiLU-mul, residual add, KV store.

Each kernel runs its rows in parallel, or on the calling thread where a call touches
little memory (common.serial_rows: a decode step's rows, where the thread pool's fork and
join would cost more than the work); within a row the long axis is walked in chunks of
VECTOR_LANES (a vectorized loop) followed by a scalar loop over the remainder. The
remainder loop has extent 0 when the axis is a multiple of the vector width and then
disappears from the generated code.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..spec import (
    AddSpec,
    EmbeddingSpec,
    KvStoreSpec,
    RMSNormSpec,
    RopeSpec,
    SigmoidGateSpec,
    SiluMulSpec,
)
from .common import F32, VECTOR_LANES, f32, fast_exp, for_rows, hsum, i64, scratch, serial_rows

VW = VECTOR_LANES


def embedding(spec: EmbeddingSpec) -> tirx.PrimFunc:
    H, V = spec.hidden, spec.vocab
    HV, HT = divmod(H, VW)
    SERIAL = serial_rows(8 * H)

    @T.macro
    def row(bufs, i):
        ids, table, out = bufs
        r = T.bind(T.max(T.min(T.Cast("int64", ids[i]), i64(V - 1)), i64(0)))
        for c in range(HV):
            for v in T.vectorized(VW):
                out[i, c * VW + v] = table[r, c * VW + v]
        for t in range(HT):
            out[i, HV * VW + t] = table[r, HV * VW + t]

    @T.prim_func(private=True)
    def kernel(ids_h: T.handle, table_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        ids = T.match_buffer(ids_h, (n,), "int32")
        table = T.match_buffer(table_h, (i64(V), i64(H)), F32)
        out = T.match_buffer(out_h, (n, i64(H)), F32)
        for_rows(n, SERIAL, row, (ids, table, out))

    return kernel


def rmsnorm(spec: RMSNormSpec) -> tirx.PrimFunc:
    H = spec.hidden
    HV, HT = divmod(H, VW)
    inv_h, eps = 1.0 / H, spec.eps
    SERIAL = serial_rows(8 * H)

    @T.macro
    def row(bufs, i):
        x, w, out = bufs
        acc = scratch((VW,))
        sumsq = scratch((1,))
        for v in T.vectorized(VW):
            acc[v] = f32(0.0)
        for c in range(HV):
            for v in T.vectorized(VW):
                acc[v] = acc[v] + x[i, c * VW + v] * x[i, c * VW + v]
        sumsq[0] = hsum(acc)
        for t in range(HT):
            sumsq[0] = sumsq[0] + x[i, HV * VW + t] * x[i, HV * VW + t]
        inv_rms = T.bind(f32(1.0) / T.sqrt(sumsq[0] * f32(inv_h) + f32(eps)))
        for c in range(HV):
            for v in T.vectorized(VW):
                out[i, c * VW + v] = x[i, c * VW + v] * inv_rms * w[c * VW + v]
        for t in range(HT):
            out[i, HV * VW + t] = x[i, HV * VW + t] * inv_rms * w[HV * VW + t]

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(H)), F32)
        w = T.match_buffer(w_h, (i64(H),), F32)
        out = T.match_buffer(out_h, (n, i64(H)), F32)
        for_rows(n, SERIAL, row, (x, w, out))

    return kernel


def rope(spec: RopeSpec) -> tirx.PrimFunc:
    NH, D, P = spec.heads, spec.head_dim, spec.max_pos
    R = spec.rot
    half = R // 2
    DV, DT = divmod(half, VW)
    SERIAL = serial_rows(8 * D)  # (row, head) pairs

    @T.macro
    def head(bufs, ih):
        x, pos, cos, sin, out = bufs
        i = T.bind(ih // NH)
        h = T.bind(ih % NH)
        p = T.bind(T.max(T.min(T.Cast("int64", pos[i]), i64(P - 1)), i64(0)))
        for c in range(DV):
            for v in T.vectorized(VW):
                out[i, h, c * VW + v] = (
                    x[i, h, c * VW + v] * cos[p, c * VW + v]
                    - x[i, h, c * VW + v + half] * sin[p, c * VW + v]
                )
                out[i, h, c * VW + v + half] = (
                    x[i, h, c * VW + v + half] * cos[p, c * VW + v]
                    + x[i, h, c * VW + v] * sin[p, c * VW + v]
                )
        for t in range(DT):
            d = T.bind(DV * VW + t)
            out[i, h, d] = x[i, h, d] * cos[p, d] - x[i, h, d + half] * sin[p, d]
            out[i, h, d + half] = x[i, h, d + half] * cos[p, d] + x[i, h, d] * sin[p, d]
        for d in range(R, D):  # partial rotary: the other dims pass through
            out[i, h, d] = x[i, h, d]

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, pos_h: T.handle, cos_h: T.handle, sin_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(NH), i64(D)), F32)
        pos = T.match_buffer(pos_h, (n,), "int32")
        cos = T.match_buffer(cos_h, (i64(P), i64(half)), F32)
        sin = T.match_buffer(sin_h, (i64(P), i64(half)), F32)
        out = T.match_buffer(out_h, (n, i64(NH), i64(D)), F32)
        for_rows(n * NH, SERIAL, head, (x, pos, cos, sin, out))

    return kernel


def silu_mul(spec: SiluMulSpec) -> tirx.PrimFunc:
    inter = spec.inter
    IV, IT = divmod(inter, VW)
    SERIAL = serial_rows(12 * inter)

    def silu_times(a: tirx.PrimExpr, b: tirx.PrimExpr) -> tirx.PrimExpr:
        return a / (f32(1.0) + fast_exp(f32(0.0) - a)) * b

    @T.macro
    def row(bufs, i):
        gu, out = bufs
        for c in range(IV):
            for v in T.vectorized(VW):
                out[i, c * VW + v] = silu_times(gu[i, c * VW + v], gu[i, c * VW + v + inter])
        for t in range(IT):
            out[i, IV * VW + t] = silu_times(gu[i, IV * VW + t], gu[i, IV * VW + t + inter])

    @T.prim_func(private=True)
    def kernel(gu_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        gu = T.match_buffer(gu_h, (n, i64(2 * inter)), F32)
        out = T.match_buffer(out_h, (n, i64(inter)), F32)
        for_rows(n, SERIAL, row, (gu, out))

    return kernel


def sigmoid_gate(spec: SigmoidGateSpec) -> tirx.PrimFunc:
    W = spec.width
    WV, WT = divmod(W, VW)
    SERIAL = serial_rows(12 * W)

    def gated(a: tirx.PrimExpr, g: tirx.PrimExpr) -> tirx.PrimExpr:
        return a / (f32(1.0) + fast_exp(f32(0.0) - g))

    @T.macro
    def row(bufs, i):
        x, gate, out = bufs
        for c in range(WV):
            for v in T.vectorized(VW):
                out[i, c * VW + v] = gated(x[i, c * VW + v], gate[i, c * VW + v])
        for t in range(WT):
            out[i, WV * VW + t] = gated(x[i, WV * VW + t], gate[i, WV * VW + t])

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, g_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(W)), F32)
        gate = T.match_buffer(g_h, (n, i64(W)), F32)
        out = T.match_buffer(out_h, (n, i64(W)), F32)
        for_rows(n, SERIAL, row, (x, gate, out))

    return kernel


def add(spec: AddSpec) -> tirx.PrimFunc:
    H = spec.hidden
    HV, HT = divmod(H, VW)
    SERIAL = serial_rows(12 * H)

    @T.macro
    def row(bufs, i):
        a, b, out = bufs
        for c in range(HV):
            for v in T.vectorized(VW):
                out[i, c * VW + v] = a[i, c * VW + v] + b[i, c * VW + v]
        for t in range(HT):
            out[i, HV * VW + t] = a[i, HV * VW + t] + b[i, HV * VW + t]

    @T.prim_func(private=True)
    def kernel(a_h: T.handle, b_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        a = T.match_buffer(a_h, (n, i64(H)), F32)
        b = T.match_buffer(b_h, (n, i64(H)), F32)
        out = T.match_buffer(out_h, (n, i64(H)), F32)
        for_rows(n, SERIAL, row, (a, b, out))

    return kernel


def kv_store(spec: KvStoreSpec) -> tirx.PrimFunc:
    W, R = spec.width, spec.pool_rows
    WV, WT = divmod(W, VW)
    SERIAL = serial_rows(8 * W)

    @T.macro
    def row(bufs, i):
        x, rows, out = bufs
        r = T.bind(T.Cast("int64", rows[i]))
        if r >= i64(0) and r < i64(R):
            for c in range(WV):
                for v in T.vectorized(VW):
                    out[r, c * VW + v] = x[i, c * VW + v]
            for t in range(WT):
                out[r, WV * VW + t] = x[i, WV * VW + t]

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, rows_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(W)), F32)
        rows = T.match_buffer(rows_h, (n,), "int32")
        out = T.match_buffer(out_h, (i64(R), i64(W)), F32)
        for_rows(n, SERIAL, row, (x, rows, out))

    return kernel
