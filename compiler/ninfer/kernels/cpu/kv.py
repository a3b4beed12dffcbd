"""KV-cache formats on the CPU: the expressions that read a stored value as float32, the
store kernel that writes new keys/values in a format, and the Hadamard rotation.

The layouts are those of ninfer.quantize.kv_formats (its numpy `encode` is the reference the
store kernel matches bit for bit). Values are addressed as vectors of VW lanes: element
d = dv * VW + v of a head, with v the vectorized lane, so that every format loads VW
consecutive stored values (int4: VW consecutive bytes, all low or all high nibbles) and
one scale per vector (a group of 32 spans 32 / VW whole vectors).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from ninfer.quantize.kv_formats import FP8_MAX, KV_GROUP, kv_format

from ..spec import KvStoreSpec
from .common import (
    F32,
    VECTOR_LANES,
    bf16_bits,
    bf16_float,
    f32,
    for_rows,
    hmax,
    i64,
    scratch,
    serial_rows,
)

VW = VECTOR_LANES
GV = KV_GROUP // VW  # vectors per scale group
assert KV_GROUP % (2 * VW) == 0, "an int4 group must split into whole low/high vectors"

_F16_MAX = 65504.0


def _u32(value: int) -> tirx.PrimExpr:
    return tirx.const(value, "uint32")


def _u16(value: int) -> tirx.PrimExpr:
    return tirx.const(value, "uint16")


def _i32(value: int) -> tirx.PrimExpr:
    return tirx.const(value, "int32")


def storage_width(kv_dtype: str, head_dim: int) -> int:
    """Stored elements per head vector (int4: two values per byte)."""
    return head_dim // 2 if kv_format(kv_dtype).bits == 4 else head_dim


def line_elems(kv_dtype: str) -> int:
    """Stored elements per 64-byte cache line."""
    return 64 // np.dtype(kv_format(kv_dtype).storage).itemsize


def pool_index(layout: str, kv_heads: int, block_size: int, rows: int, block: tirx.PrimExpr,
               slot: tirx.PrimExpr, head: tirx.PrimExpr) -> tuple[tirx.PrimExpr, tirx.PrimExpr]:
    """(row, head) indices of the pool arrays' declared shape [rows, kv_heads, ...] that
    hold head `head` of the token in slot `slot` of block `block`, in `layout`
    (kv_formats.KV_LAYOUTS)."""
    if layout == "rows":
        return block * block_size + slot, head
    if layout == "planes":  # the head's plane of `rows` tokens
        at = head * rows + block * block_size + slot
    else:
        at = (block * kv_heads + head) * block_size + slot  # the head's run of the block
    return at // kv_heads, at % kv_heads


def load(kv_dtype: str, data: tirx.Buffer, scales: tirx.Buffer, row: tirx.PrimExpr,
         head: tirx.PrimExpr, dv: tirx.PrimExpr, v: tirx.PrimExpr,
         lanes: int = VW) -> tirx.PrimExpr:
    """Value dv * lanes + v of head `head` in pool row `row`, as float32 (lanes: a divisor
    of 16; the layouts do not depend on it). `scales` is only read by the scaled formats
    (pass `data` for the others)."""
    if 16 % lanes:
        raise ValueError(f"kv.load: lanes must divide 16, got {lanes}")
    e = dv * lanes + v
    if kv_dtype == "f32":
        return data[row, head, e]
    if kv_dtype == "f16":
        return tirx.Cast(F32, data[row, head, e])
    if kv_dtype == "bf16":
        return bf16_float(data[row, head, e])
    if kv_dtype == "fp8":
        # e4m3 -> the float16 with the same bits shifted into place (exponent field e,
        # mantissa m << 7, subnormals included), x 2^8 for the bias difference (15 - 7):
        # one widening, a shift, an or, vcvtph2ps and a multiply per vector
        u = tirx.Cast("uint16", data[row, head, e])
        h = ((u & _u16(0x80)) << _u16(8)) | ((u & _u16(0x7F)) << _u16(7))
        return tirx.Cast(F32, tirx.reinterpret("float16", h)) * f32(256.0)
    gv = KV_GROUP // lanes  # vectors per scale group
    scale = tirx.Cast(F32, scales[row, head, dv // gv])
    if kv_dtype == "int8":
        return tirx.Cast(F32, data[row, head, e]) * scale
    if kv_dtype == "int4":
        # element w of a group of 32: the low nibble of its byte w % 16 for w < 16, else
        # the high one; a vector of `lanes` elements is one run of bytes, one shift
        byte = dv // gv * (KV_GROUP // 2) + dv % gv * lanes % (KV_GROUP // 2) + v
        shift = tirx.Cast("int32", dv % gv * lanes // (KV_GROUP // 2) * 4)
        nib = (tirx.Cast("int32", data[row, head, byte]) >> shift) & _i32(15)
        return tirx.Cast(F32, nib) * scale - f32(8.0) * scale  # one FMA
    raise ValueError(f"no CPU KV load for {kv_dtype!r}")


def _encode_float(kv_dtype: str, x: tirx.PrimExpr) -> tirx.PrimExpr:
    """x (float32) in a scale-free format's storage dtype, rounded as kv_formats.encode."""
    if kv_dtype == "f32":
        return x
    if kv_dtype == "f16":
        return tirx.Cast("float16", tirx.max(tirx.min(x, f32(_F16_MAX)), f32(-_F16_MAX)))
    if kv_dtype == "bf16":
        return bf16_bits(x)
    if kv_dtype == "fp8":
        bits = tirx.reinterpret("uint32", x)
        a = tirx.min(tirx.reinterpret(F32, bits & _u32(0x7FFFFFFF)), f32(FP8_MAX))
        ab = tirx.reinterpret("uint32", a)
        normal = (ab - _u32(120 << 23) + _u32(0x7FFFF) + ((ab >> _u32(20)) & _u32(1))) >> _u32(20)
        sub = tirx.Cast("uint32", tirx.Cast("int32", tirx.nearbyint(a * f32(512.0))))
        code = tirx.Select(a < f32(2.0**-6), sub, normal)
        return tirx.Cast("uint8", code | ((bits >> _u32(24)) & _u32(0x80)))
    raise ValueError(f"{kv_dtype!r} is not a scale-free KV format")


def hadamard(width: int, block: int) -> object:
    """A TVMScript macro (buf, r): buf[r, 0:width] = buf[r, 0:width] @ H (unnormalized
    Walsh-Hadamard butterflies in blocks of `block`; the caller folds in 1/sqrt(block))."""
    stages = int(math.log2(block))
    assert 1 << stages == block and width % block == 0

    @T.macro
    def rotate(buf, r):
        for stage in T.unroll(stages):
            for i in range(width // 2):
                h = T.bind(T.shift_left(i64(1), T.Cast("int64", stage)))
                a = T.bind(i // h * (h * 2) + i % h)
                x0 = T.bind(buf[r, a])
                x1 = T.bind(buf[r, a + h])
                buf[r, a] = x0 + x1
                buf[r, a + h] = x0 - x1

    return rotate


def kv_store(spec: KvStoreSpec) -> tirx.PrimFunc:
    """Stores n new key or value rows in `spec.kv_dtype` (ninfer.quantize.kv_formats.encode)."""
    W, R, D, P = spec.width, spec.pool_rows, spec.head_dim, spec.rotate
    KVH, BS1, LAYOUT = spec.kv_heads, max(spec.block_size, 1), spec.layout
    fmt = kv_format(spec.kv_dtype)
    if D % VW:
        raise NotImplementedError(f"{spec.name()}: head_dim must be a multiple of {VW}")
    DV = D // VW
    DS = storage_width(spec.kv_dtype, D)
    NG = D // KV_GROUP if fmt.scaled else 1
    QMAX = 127 if fmt.bits == 8 else 7
    pre = 1.0 / math.sqrt(P) if P else 1.0
    dtype = spec.kv_dtype
    rotate = hadamard(D, P) if P else None
    ROT, SCALED, Q8 = P > 0, fmt.scaled, fmt.bits == 8

    @T.macro
    def store_head(x, i, tok, hd, out, sc):
        # token row `tok` of the pool, head hd, at (row, hd_) of the arrays' shape
        row = T.bind(pool_index(LAYOUT, KVH, BS1, R, tok // BS1, tok % BS1, hd)[0])
        hd_ = T.bind(pool_index(LAYOUT, KVH, BS1, R, tok // BS1, tok % BS1, hd)[1])
        t = scratch((1, D))
        for dv in range(DV):
            for v in T.vectorized(VW):
                t[0, dv * VW + v] = x[i, hd * D + dv * VW + v] * f32(pre)
        if ROT:
            rotate(t, 0)
        if not SCALED:
            for dv in range(DV):
                for v in T.vectorized(VW):
                    out[row, hd_, dv * VW + v] = _encode_float(dtype, t[0, dv * VW + v])
        else:
            vec = scratch((1, VW))
            for gi in range(NG):
                for v in T.vectorized(VW):
                    vec[0, v] = T.abs(t[0, gi * KV_GROUP + v])
                for k in range(1, GV):
                    for v in T.vectorized(VW):
                        vec[0, v] = T.max(vec[0, v], T.abs(t[0, gi * KV_GROUP + k * VW + v]))
                d16 = T.bind(T.Cast("float16", hmax(vec, 0) / f32(QMAX)))
                sc[row, hd_, gi] = d16
                dd = T.bind(T.Cast(F32, d16))
                inv = T.bind(T.Select(dd == f32(0.0), f32(0.0), f32(1.0) / dd))
                if Q8:
                    for k in range(GV):
                        for v in T.vectorized(VW):
                            out[row, hd_, gi * KV_GROUP + k * VW + v] = T.Cast("int8", T.Cast(
                                "int32", T.max(T.min(T.nearbyint(
                                    t[0, gi * KV_GROUP + k * VW + v] * inv), f32(QMAX)),
                                    f32(-QMAX))))
                else:
                    for k in range(GV // 2):
                        for v in T.vectorized(VW):
                            out[row, hd_, gi * (KV_GROUP // 2) + k * VW + v] = T.Cast(
                                "uint8",
                                _nibble(t[0, gi * KV_GROUP + k * VW + v] * inv, QMAX)
                                | (_nibble(t[0, gi * KV_GROUP + KV_GROUP // 2 + k * VW + v]
                                           * inv, QMAX) << _i32(4)))

    @T.macro
    def store_row(bufs, i):
        x, rows, out, sc = bufs
        tok = T.bind(T.Cast("int64", rows[i]))
        if tok >= i64(0) and tok < i64(R):
            for hd in range(KVH):
                store_head(x, i, tok, hd, out, sc)

    SERIAL = serial_rows(8 * W)  # a row: W floats in, at most as many bytes out

    if fmt.scaled:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, rows_h: T.handle, out_h: T.handle, sc_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(W)), F32)
            rows = T.match_buffer(rows_h, (n,), "int32")
            out = T.match_buffer(out_h, (i64(R), i64(KVH), i64(DS)), fmt.storage)
            sc = T.match_buffer(sc_h, (i64(R), i64(KVH), i64(NG)), "float16")
            for_rows(n, SERIAL, store_row, (x, rows, out, sc))

        return kernel

    @T.prim_func(private=True)
    def plain(x_h: T.handle, rows_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(W)), F32)
        rows = T.match_buffer(rows_h, (n,), "int32")
        out = T.match_buffer(out_h, (i64(R), i64(KVH), i64(DS)), fmt.storage)
        for_rows(n, SERIAL, store_row, (x, rows, out, out))

    return plain


def _nibble(x: tirx.PrimExpr, qmax: int) -> tirx.PrimExpr:
    """round-half-even(x) clamped to [-qmax, qmax], offset by 8 (int32)."""
    q = tirx.max(tirx.min(tirx.nearbyint(x), f32(qmax)), f32(-qmax))
    return tirx.Cast("int32", q) + _i32(8)
