"""CPU float matmul out = x @ w.T (+ bias), w stored in 64-column panels.

The weight comes in the "panels" layout of quantize.weight_formats: w[p, k, c] is the
weight of output column 64 p + c at input k, so for each k a panel's 64 outputs are
contiguous. The micro-kernel is an outer product: for each k it loads CV vectors of a
panel's columns, broadcasts x[i, k] for each of its R rows and adds the products into
R x CV vector accumulators held in registers. Every output is thus one sequential chain
acc = acc + x[i, k] * w[k] over k = 0, 1, ..., K - 1, started from the bias (or 0), and
nothing else: no lane split, no horizontal sum, no dependence on how many rows a call has
or how they are tiled. A chain cut into k blocks (gemm) stores its float32 partial in out
and resumes from it, which is the same arithmetic. So a row's result is bitwise the same
whichever schedule computed it and whatever other rows came with it (the engine's batch
invariance), and on any vector width: 8 and 16 lanes give the same bits.

- "gemv" (decode, a few rows): parallel over sub-panels (CV vectors of one panel); a
  thread's contiguous range of them is one sequential stream of w, read once. Up to MR
  rows run in one pass over the whole k range; more rows are k-blocked like the gemm.
  1-3 rows read GEMV_STREAMS whole panels at once, prefetched PF_BYTES ahead; with
  spec.streams == 1 one panel and no software prefetch (chosen per host at compile time,
  ninfer.roofline.host_gemv_streams).
- "gemm" (prefill): parallel over (sub-panel, block of MB rows); k is cut into blocks of
  KB so that the CV x KB block of w stays in L1 while the block's rows pass over it in
  tiles of MR (x comes from L2 as broadcasts: R scalars per CV vector loads).

Compared with the [n_out, k] dot-product kernel this replaced, x is read as scalars
instead of as vectors reloaded for every tile of w, and w by one stream per thread.

Panels whose columns run past n_out (the last one, when n_out % 64 != 0) hold zero
padding; their outputs are computed whole-k in one block and stored with a column mask.

16-bit float weights (f16: IEEE half, converted by vcvtph2ps; bf16: stored as uint16 bits,
widened and shifted into the top half of a float32) are converted in registers as they
are loaded. Group-quantized formats are in qmatmul.py.

With MatmulSpec.x_bf16 (the plan's default for bf16 weights, --cpu-bf16-activations)
bf16 weights multiply x rounded to bf16 (nearest even; as llama.cpp's BF16 path), and k
goes in pairs: each output's chain is acc = acc + x[k+1] w[k+1], then acc = acc + x[k] w[k],
for k = 0, 2, 4, ... (an odd last k alone), each product exact in float32. That is what
vdpbf16ps computes (bf16dot), one instruction for two k steps of 16 columns, twice the
arithmetic rate of widening w for vfmadd; hosts without AVX512_BF16 run the same chain as
two FMAs. The results are the same bits either way, except that the instruction flushes
subnormal inputs and results to zero; within one host every schedule runs the same one,
so batch invariance holds as above. The gemm's k blocks hold whole pairs. With the
instruction, the micro-kernel rounds its rows of x once a k block (vcvtneps2bf16) and its
accumulators hold their columns in bf16dot.PAIR_COLUMNS order, put back in order as they
are stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ninfer.quantize.weight_formats import PANEL

from ..spec import MatmulSpec
from . import bf16dot
from .common import (
    F32,
    bf16_bits,
    bf16_float,
    f32,
    host_has,
    host_vector_lanes,
    i64,
    prefetch,
    scratch,
)


@dataclass(frozen=True)
class MatmulTiles:
    """Register tile (MR rows x CV vectors of accumulators) and cache blocking."""

    mr: int  # rows of x per micro-kernel (at most 6: the remainder dispatch below)
    cv: int  # vectors of output columns per micro-kernel (a sub-panel)
    kb_bytes: int  # bytes of w per k block of a sub-panel (gemm; fits in L1)
    mb: int  # rows per parallel task (gemm)


# AVX-512, 32 registers: 6 x 4 accumulators, 4 w vectors, a broadcast. AVX2, 16 registers:
# 6 x 2 (as the classic Haswell 6 x 16 sgemm kernel).
TILES_512 = MatmulTiles(mr=6, cv=4, kb_bytes=32768, mb=64)
TILES_256 = MatmulTiles(mr=6, cv=2, kb_bytes=32768, mb=64)
GEMM_PF_BLOCKS = 2
# gemm k block of w with vdpbf16ps (bf16 weights): each block's fixed costs (rounding x,
# ordering the accumulators' columns) weigh twice as much as with FMAs, so 1024 k a block
# (w from L2, prefetched): 318 -> 350 GFLOP/s on Zen 4 (RESULTS 2026-12-06, session 29)
DP_KB_BYTES = 131072
# bf16 x: k values rounded into a stack buffer at a time (even). The gemv takes all of k in
# one pass, and a buffer of all of it made 1.5 MB stack frames at k = 28672; 256: 18 KB,
# and the gemm and gemv read as fast as with 1024 (343 / 336 GFLOP/s, session 30)
XS_K = 256
# gemv: streams of w (whole panels) per thread for 1, 2 and 3 rows, by float32 lanes
# (accumulators: rows x streams x PANEL / lanes). 16 lanes: two streams prefetched 1 KB
# ahead read 2-8% faster for one row and 15-20% faster for two than four or three streams
# 2 KB ahead, in huge pages (RESULTS 2026-12-05); one stream is 5-10% slower. 8 lanes: a
# panel is 8 vectors, and 16-24 accumulators spill some to L1 but still read faster than
# narrower sub-panels or a single stream for one row (RESULTS 2026-12-03).
GEMV_STREAMS = {16: (2, 2, 2), 8: (2, 1, 1)}
# gemv: software prefetch distance along each stream, by float32 lanes (0: hardware
# prefetch only); 8 lanes keeps the 2 KB its streams were measured with on AVX2 (session 18)
PF_BYTES = {16: 1024, 8: 2048}


def matmul_lanes() -> int:
    """float32 lanes of the float matmuls' vectors: 16 where the host has AVX-512, else 8.
    The result does not depend on it (see the module docstring)."""
    return host_vector_lanes()


def use_dpbf16() -> bool:
    """bf16 weights: one vdpbf16ps per pair of k steps where the host has AVX512_BF16 (and
    the kernels use 16 lanes); elsewhere two FMAs in the instruction's order, which give the
    same results but where it flushes a subnormal to zero."""
    return host_vector_lanes() == bf16dot.LANES and host_has("avx512bf16")


def matmul(spec: MatmulSpec) -> tirx.PrimFunc:
    lanes = matmul_lanes()
    return _matmul(spec, TILES_512 if lanes == 16 else TILES_256, lanes)


# Storage dtype of the weight buffer per float weight format (quantize.weight_formats layouts).
_W_STORAGE = {"float32": F32, "f16": "float16", "bf16": "uint16"}


def _weight(w: tirx.Buffer, wdtype: str, p: tirx.PrimExpr, k: tirx.PrimExpr,
            c: tirx.PrimExpr) -> tirx.PrimExpr:
    """w[p, k, c] as float32."""
    if wdtype == "f16":
        return tirx.Cast(F32, w[p, k, c])
    if wdtype == "bf16":
        return bf16_float(w[p, k, c])
    return w[p, k, c]


def _matmul(spec: MatmulSpec, tl: MatmulTiles, VW: int) -> tirx.PrimFunc:
    K, N, has_bias = spec.k, spec.n_out, spec.bias
    WD = spec.wdtype
    if WD not in _W_STORAGE:
        raise ValueError(f"cpu_matmul: no float kernel for weight format {WD!r}")
    if spec.layout != "panels":
        raise ValueError(f"cpu_matmul: float weights must be in the panels layout, got "
                         f"{spec.layout!r}")
    WS = _W_STORAGE[WD]
    WB = 4 if WD == "float32" else 2
    MR, CV = tl.mr, tl.cv
    if not 1 <= MR <= 6:
        raise ValueError(f"cpu_matmul: mr must be 1..6, got {MR}")
    SC = CV * VW  # columns per sub-panel
    if PANEL % SC:
        raise ValueError(f"cpu_matmul: {CV} x {VW} columns do not divide a panel of {PANEL}")
    SUB = PANEL // SC  # sub-panels per panel
    CVF = PANEL // VW  # vectors of a whole panel (the gemv's streams)
    # spec.streams == 1: one stream a thread, hardware prefetch only (see ninfer.roofline)
    GST = (1, 1, 1) if spec.streams == 1 else GEMV_STREAMS[VW]
    NPAN = -(-N // PANEL)
    NPF = N // PANEL  # panels without padding
    NS = NPF * SUB  # their sub-panels
    N0 = NPF * PANEL
    NST = -(-(N - N0) // SC)  # sub-panels of the padded panel with a valid column
    # bf16: x is rounded to bf16 and k is taken in pairs (see the module docstring); k blocks
    # hold whole pairs, so only the last one ends in a single step
    PAIRS = spec.x_bf16
    DP = PAIRS and use_dpbf16() and VW == bf16dot.LANES
    KB = max(1, min(K, (DP_KB_BYTES if DP else tl.kb_bytes) // (SC * WB)))
    if PAIRS and KB < K:
        KB -= KB % 2
    MB = tl.mb
    LINE = 64 // WB  # weights per cache line
    PF_AHEAD = 0 if spec.streams == 1 else PF_BYTES[VW] // WB
    # gemm: the first row tile of each k block prefetches w GEMM_PF_BLOCKS blocks ahead
    GEMM_PF = GEMM_PF_BLOCKS * KB * PANEL

    def _lines(CW):
        # cache lines of one k step of a sub-panel of CW vectors
        return max(1, CW * VW // LINE)

    def _pan(sj, CW):
        # panel of sub-panel sj (sub-panels of CW vectors)
        return sj // (PANEL // (CW * VW))

    def _pcol(sj, CW):
        # first column of sub-panel sj within its panel
        return sj % (PANEL // (CW * VW)) * (CW * VW)

    def _col(s, sd, c, CW=CV):
        # first output column of accumulator vector c (stream c // CW) of sub-panel s
        sj = s + c // CW * sd
        return _pan(sj, CW) * PANEL + _pcol(sj, CW) + c % CW * VW

    @T.macro
    def prefetch_step(w, s, k, pf, ST, sd, CW):
        if pf > 0:  # pf weights ahead along each stream
            for j in T.unroll(ST):
                for ln in T.unroll(_lines(CW)):
                    T.evaluate(prefetch(w, 0, 0, (_pan(s + j * sd, CW) * K + k) * PANEL
                                        + _pcol(s + j * sd, CW) + ln * LINE + pf))

    # DP: accumulator vectors 2 j and 2 j + 1 of a micro-kernel are one float32 x32,
    # acc[r, j, 0:32], holding their 32 columns in bf16dot.PAIR_COLUMNS order
    R32 = tirx.Ramp(i64(0), i64(1), 2 * VW)
    TO_PAIRS = [tirx.IntImm("int32", c) for c in bf16dot.PAIR_COLUMNS]
    FROM_PAIRS = [tirx.IntImm("int32", bf16dot.PAIR_COLUMNS.index(c)) for c in range(2 * VW)]

    def acc_shape(R, C):
        # the accumulators of R rows x C vectors (one buffer an iteration: common.scratch)
        return (R, C // 2, 2 * VW) if DP else (R, C, VW)

    def _ac(c):
        # index of accumulator vector c in its buffer, and of its first lane
        return c // 2 if DP else c

    def _av(c, v):
        return c % 2 * VW + v if DP else v

    def _lane_col(s, sd, c, v, CW):
        # output column of lane v of accumulator vector c
        if DP:
            return _col(s, sd, c - c % 2, CW) + bf16dot.pair_column(c % 2 * VW + v)
        return _col(s, sd, c, CW) + v

    def _w32(w, s, sd, c, CW, k):
        # uint16 x32: the bf16 weights of accumulator vectors c, c + 1 at k
        sj = s + c // CW * sd
        return w[_pan(sj, CW), k, tirx.Ramp(_pcol(sj, CW) + c % CW * VW, i64(1), 2 * VW)]

    @T.macro
    def fma_pair(w, acc, r, s, sd, c, CW, xs, kx, k, two):
        # acc += x[k+1] w[k+1] (when two), then acc += x[k] w[k]; xs[kx] holds x[k] (bf16)
        if two:
            for v in T.vectorized(VW):
                acc[r, c, v] = acc[r, c, v] + bf16_float(xs[r, kx + 1]) * _weight(
                    w, WD, _pan(s + c // CW * sd, CW), k + 1,
                    _pcol(s + c // CW * sd, CW) + c % CW * VW + v)
        for v in T.vectorized(VW):
            acc[r, c, v] = acc[r, c, v] + bf16_float(xs[r, kx]) * _weight(
                w, WD, _pan(s + c // CW * sd, CW), k,
                _pcol(s + c // CW * sd, CW) + c % CW * VW + v)

    @T.macro
    def pair_steps(x, w, acc, i0, s, k0, kn, R, pf, ST, sd, CW, kcap):
        # bf16 weights: per sub-block of at most XS_K k (whole pairs but the last), rows
        # i0..i0+R of x rounded to bf16 (xs; a zero after the last), then per pair of k:
        # acc += x[k+1] w[k+1], acc += x[k] w[k] (vdpbf16ps, or two FMAs: the product of
        # two bf16 values is exact in float32); an odd last k alone (vdpbf16ps: with a zero
        # weight and x at k + 1). The sub-blocks bound xs on the stack (the gemv takes all
        # of k at once) and leave the chain as it is.
        XB = T.meta_var(min(kcap, XS_K))
        xs = scratch((R, XB + 2), "uint16")
        for xb in range((kn + (XB - 1)) // XB):
            b0 = T.bind(k0 + xb * XB)
            bn = T.bind(T.min(kn - xb * XB, XB))
            for r in T.unroll(R):
                for kq in range(bn // VW):
                    if DP:
                        xs[r, tirx.Ramp(kq * VW, i64(1), VW)] = bf16dot.round_bf16(
                            x[i0 + r, tirx.Ramp(b0 + kq * VW, i64(1), VW)])
                    else:
                        for v in T.vectorized(VW):
                            xs[r, kq * VW + v] = bf16_bits(x[i0 + r, b0 + kq * VW + v])
                for kt in range(bn % VW):
                    xs[r, bn // VW * VW + kt] = bf16_bits(x[i0 + r, b0 + bn // VW * VW + kt])
                xs[r, bn] = T.uint16(0)
            for kp in range(bn // 2):
                prefetch_step(w, s, b0 + 2 * kp, pf, ST, sd, CW)
                prefetch_step(w, s, b0 + 2 * kp + 1, pf, ST, sd, CW)
                for r in T.unroll(R):
                    if DP:
                        for c2 in T.unroll(ST * CW // 2):
                            acc[r, c2, R32] = bf16dot.dot(
                                acc[r, c2, R32], _w32(w, s, sd, 2 * c2, CW, b0 + 2 * kp),
                                _w32(w, s, sd, 2 * c2, CW, b0 + 2 * kp + 1),
                                xs[r, tirx.Ramp(2 * kp, i64(1), 2)])
                    else:
                        for c in T.unroll(ST * CW):
                            fma_pair(w, acc, r, s, sd, c, CW, xs, 2 * kp, b0 + 2 * kp, True)
            if bn % 2 == 1:
                for r in T.unroll(R):
                    if DP:
                        for c2 in T.unroll(ST * CW // 2):
                            acc[r, c2, R32] = bf16dot.dot(
                                acc[r, c2, R32], _w32(w, s, sd, 2 * c2, CW, b0 + bn - 1),
                                tirx.Broadcast(tirx.const(0, "uint16"), 2 * VW),
                                xs[r, tirx.Ramp(bn - 1, i64(1), 2)])
                    else:
                        for c in T.unroll(ST * CW):
                            fma_pair(w, acc, r, s, sd, c, CW, xs, bn - 1, b0 + bn - 1, False)

    @T.macro
    def micro(x, w, bias, out, acc, i0, s, k0, kn, R, tail, pf, ST=1, sd=0, CW=CV, kcap=K):
        # Rows i0..i0+R of the sub-panels s + j * sd, j < ST, of CW vectors each (panel
        # s // (PANEL // (CW * VW)), vectors (s % ...) * CW ..), k0..k0+kn: resume the
        # chains from out (or start them from the bias at k0 = 0), add the products, store
        # them back. ST > 1 reads ST streams of w at once (more memory-level parallelism
        # for a single row). kn <= kcap (a Python int: bounds bf16's scratch of x).
        for r in T.unroll(R):
            if DP and not tail:  # 32 columns a pair of vectors, in PAIR_COLUMNS order
                for c2 in T.unroll(ST * CW // 2):
                    if k0 == 0:
                        if has_bias:
                            acc[r, c2, R32] = tirx.Shuffle(
                                [bias[tirx.Ramp(_col(s, sd, 2 * c2, CW), i64(1), 2 * VW)]],
                                TO_PAIRS)
                        else:
                            acc[r, c2, R32] = tirx.Broadcast(f32(0.0), 2 * VW)
                    else:
                        acc[r, c2, R32] = tirx.Shuffle(
                            [out[i0 + r, tirx.Ramp(_col(s, sd, 2 * c2, CW), i64(1), 2 * VW)]],
                            TO_PAIRS)
            else:  # with DP only the tail gets here: acc then indexed by _ac / _av alone
                for c in T.unroll(ST * CW):
                    if tail:  # k0 == 0 here; columns past N start (and stay) unused
                        for v in range(VW):
                            if has_bias:
                                acc[r, _ac(c), _av(c, v)] = T.if_then_else(
                                    _lane_col(s, sd, c, v, CW) < N,
                                    bias[T.min(_lane_col(s, sd, c, v, CW), N - 1)], f32(0.0))
                            else:
                                acc[r, _ac(c), _av(c, v)] = f32(0.0)
                    elif k0 == 0:
                        for v in T.vectorized(VW):
                            if has_bias:
                                acc[r, c, v] = bias[_col(s, sd, c, CW) + v]
                            else:
                                acc[r, c, v] = f32(0.0)
                    else:
                        for v in T.vectorized(VW):
                            acc[r, c, v] = out[i0 + r, _col(s, sd, c, CW) + v]
        if PAIRS:
            pair_steps(x, w, acc, i0, s, k0, kn, R, pf, ST, sd, CW, kcap)
        else:
            for kk in range(kn):
                prefetch_step(w, s, k0 + kk, pf, ST, sd, CW)
                for r in T.unroll(R):
                    for c in T.unroll(ST * CW):
                        for v in T.vectorized(VW):
                            acc[r, c, v] = acc[r, c, v] + (
                                x[i0 + r, k0 + kk] * _weight(
                                    w, WD, _pan(s + c // CW * sd, CW), k0 + kk,
                                    _pcol(s + c // CW * sd, CW) + c % CW * VW + v))
        for r in T.unroll(R):
            if DP and not tail:
                for c2 in T.unroll(ST * CW // 2):
                    out[i0 + r, tirx.Ramp(_col(s, sd, 2 * c2, CW), i64(1), 2 * VW)] = (
                        tirx.Shuffle([acc[r, c2, R32]], FROM_PAIRS))
            else:
                for c in T.unroll(ST * CW):
                    if tail:
                        for v in range(VW):
                            if _lane_col(s, sd, c, v, CW) < N:
                                out[i0 + r, _lane_col(s, sd, c, v, CW)] = acc[
                                    r, _ac(c), _av(c, v)]
                    else:
                        for v in T.vectorized(VW):
                            out[i0 + r, _col(s, sd, c, CW) + v] = acc[r, c, v]

    @T.macro
    def rows_body(x, w, bias, out, acc, r0, nr, s, kbn, tail, pf, pf_first, kcap=KB):
        # Rows r0..r0+nr of sub-panel s, k in blocks of kbn <= kcap (tail: kbn = K).
        for kb in range((K + kbn - 1) // kbn):
            k0 = T.bind(kb * kbn)
            kn = T.bind(T.min(kbn, K - k0))
            if nr >= MR:  # the first tile prefetches the next block (gemm)
                micro(x, w, bias, out, acc, r0, s, k0, kn, MR, tail, pf_first, kcap=kcap)
            for it in range(1, nr // MR):
                micro(x, w, bias, out, acc, r0 + it * MR, s, k0, kn, MR, tail, pf, kcap=kcap)
            rem = T.bind(nr % MR)
            i0 = T.bind(r0 + nr - rem)
            if MR > 1:
                if rem == 1:
                    micro(x, w, bias, out, acc, i0, s, k0, kn, 1, tail, pf, kcap=kcap)
            if MR > 2:
                if rem == 2:
                    micro(x, w, bias, out, acc, i0, s, k0, kn, 2, tail, pf, kcap=kcap)
            if MR > 3:
                if rem == 3:
                    micro(x, w, bias, out, acc, i0, s, k0, kn, 3, tail, pf, kcap=kcap)
            if MR > 4:
                if rem == 4:
                    micro(x, w, bias, out, acc, i0, s, k0, kn, 4, tail, pf, kcap=kcap)
            if MR > 5:
                if rem == 5:
                    micro(x, w, bias, out, acc, i0, s, k0, kn, 5, tail, pf, kcap=kcap)

    @T.macro
    def streams(x, w, bias, out, R, ST):
        # R rows over the whole k range, ST whole panels NPF // ST apart at once, then the
        # NPF % ST left over one at a time: each stream reads its panel's k rows in order,
        # every byte of every cache line it touches (a sub-panel narrower than the panel
        # reads part of each line and leaves the rest to a later pass: 30-50% slower on
        # AVX2, RESULTS 2026-12-03)
        for s in T.parallel(NPF // ST):
            acc = scratch(acc_shape(R, ST * CVF))
            micro(x, w, bias, out, acc, 0, s, 0, K, R, False, PF_AHEAD, ST, NPF // ST, CVF)
        if NPF % ST > 0:
            for s in T.parallel(NPF % ST):
                acc = scratch(acc_shape(R, CVF))
                micro(x, w, bias, out, acc, 0, NPF // ST * ST + s, 0, K, R, False, PF_AHEAD,
                      1, 0, CVF)

    @T.macro
    def gemv_body(x, w, bias, out, n):
        # One row alone, 2 or 3 rows: whole panels, several streams of w per thread (a
        # single stream reads 15-35% slower; RESULTS 2026-12-02) as far as the registers
        # allow.
        if n == 1 and NPF >= GST[0]:
            streams(x, w, bias, out, 1, GST[0])
        elif n == 2 and NPF >= GST[1]:
            streams(x, w, bias, out, 2, GST[1])
        elif n == 3 and NPF >= GST[2]:
            streams(x, w, bias, out, 3, GST[2])
        else:
            for s in T.parallel(NS):
                acc = scratch(acc_shape(MR, CV))
                # up to MR rows: one pass over the whole k range; more: k blocks in L1
                kbn = T.bind(T.if_then_else(n <= MR, i64(K), i64(KB)))
                rows_body(x, w, bias, out, acc, 0, n, s, kbn, False, PF_AHEAD, PF_AHEAD, K)
        if NST > 0:
            for st in T.parallel(NST):
                acc = scratch(acc_shape(MR, CV))
                rows_body(x, w, bias, out, acc, 0, n, NS + st, i64(K), True, 0, 0, K)

    @T.macro
    def gemm_body(x, w, bias, out, n):
        nrb = T.bind((n + (MB - 1)) // MB)
        for t in T.parallel(NS * nrb):
            acc = scratch(acc_shape(MR, CV))
            r0 = T.bind(t % nrb * MB)
            rows_body(x, w, bias, out, acc, r0, T.min(i64(MB), n - r0), t // nrb, i64(KB),
                      False, 0, GEMM_PF)
        if NST > 0:
            for t in T.parallel(NST * nrb):
                acc = scratch(acc_shape(MR, CV))
                r0 = T.bind(t % nrb * MB)
                rows_body(x, w, bias, out, acc, r0, T.min(i64(MB), n - r0), NS + t // nrb,
                          i64(K), True, 0, 0, K)

    @T.macro
    def body(x, w, bias, out, n):
        if spec.schedule == "gemv":
            gemv_body(x, w, bias, out, n)
        else:
            gemm_body(x, w, bias, out, n)

    if has_bias:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, w_h: T.handle, b_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            w = T.match_buffer(w_h, (i64(NPAN), i64(K), i64(PANEL)), WS)
            bias = T.match_buffer(b_h, (i64(N),), F32)
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, w, bias, out, n)

    else:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, w_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            w = T.match_buffer(w_h, (i64(NPAN), i64(K), i64(PANEL)), WS)
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, w, None, out, n)

    return kernel
