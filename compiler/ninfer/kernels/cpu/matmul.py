"""CPU matmul out = x @ w.T (+ bias) with w stored [n_out, k].

Both operands are contiguous along k, so the micro-kernel is a block of dot products:
MR rows of x against NR rows of w, with MR * NR vector accumulators of `lanes` floats
held in registers while k advances one vector at a time; each accumulator is summed
horizontally at the end. This needs no packing or transposition of w.

- "gemv" (decode, a few rows): parallel over tiles of NR output columns, rows taken two
  (or, for an odd count, last three) at a time. Memory-bound: w streams through once per
  call, its NR rows stay in L1 while the few x rows are reused against them. Tile jb holds
  the rows jb, jb + N/NR, jb + 2N/NR, ...: one from each of NR equal parts of w, so a
  thread's contiguous range of tiles reads NR long sequential streams, each prefetched
  PF_BYTES ahead (NR adjacent rows instead start NR short streams per tile, which the
  hardware prefetchers follow worse: 10-22% slower, RESULTS 2026-12-01). One row's NR
  accumulator chains cannot hide the FMA latency; 2-3 rows' can.
- "gemm" (prefill): MR x NR register tile, k split into KB-long blocks and rows into
  MB-row blocks so that an x block stays in L2 while w panels stream past it; parallel over
  panels of output columns (each thread owns its columns, so no reduction across threads).

Vectors have matmul_lanes() float32 lanes: 16 on AVX-512 hosts (where the gemm tile is 6 x 4:
32 registers), else 8.

Leftovers are handled by narrower loops: rows that do not fill an MR tile run 2-row and
1-row micro-kernels, columns that do not fill an NR tile run a 1-column one, and k % lanes
trailing products are added by a scalar loop.

16-bit float weights (f16: IEEE half, converted by vcvtph2ps; bf16: stored as uint16 bits,
widened and shifted into the top half of a float32) are converted in registers as they
are loaded; everything else is the float32 kernel. Group-quantized formats are in
qmatmul.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ..spec import MatmulSpec
from .common import F32, VECTOR_LANES, f32, host_has_avx512, hsum, i64, prefetch, scratch


@dataclass(frozen=True)
class MatmulTiles:
    """Register and cache tile sizes (16 ymm registers: MR * NR accumulators + loads)."""

    mr: int  # rows of x per micro-kernel
    nr: int  # rows of w (output columns) per micro-kernel
    kb: int  # k elements per cache block (multiple of VW)
    mb: int  # rows of x per cache block (multiple of mr)
    panels: int  # desired number of column panels to spread over threads


# Both schedules add k in the same KB-long blocks, each block's vector accumulators summed
# horizontally into out in block order, so a row's result is bitwise the same whichever
# schedule (and whatever other rows) computed it: batch invariance of the engine.
K_BLOCK = 1024
GEMV_TILES = MatmulTiles(mr=1, nr=4, kb=K_BLOCK, mb=1, panels=0)
PF_BYTES = 2048  # gemv: prefetch distance along each row's stream (1-2 KiB measured alike)
GEMM_TILES = MatmulTiles(mr=4, nr=3, kb=K_BLOCK, mb=32, panels=16)
# AVX-512 (32 registers): 6 x 4 accumulators, 6 x loads and a w vector. The 4 x 3 tile at
# 16 lanes reloads x from L2 too often per FMA (f32 prefill 125 against 190 GFLOP/s, f16 104
# against 170; RESULTS 2026-12-01).
GEMM_TILES_512 = MatmulTiles(mr=6, nr=4, kb=K_BLOCK, mb=36, panels=16)


def matmul_lanes() -> int:
    """float32 lanes of the float matmuls' vectors: 16 where the host has AVX-512 (prefill
    1.5-2.2x faster than on 8 lanes, multi-row decode up to 1.6x), else 8. gemv and gemm
    use the same width, so their summation order stays the same."""
    return 16 if host_has_avx512() else VECTOR_LANES


def matmul(spec: MatmulSpec) -> tirx.PrimFunc:
    lanes = matmul_lanes()
    if spec.schedule == "gemv":
        tiles = GEMV_TILES
    else:
        tiles = GEMM_TILES_512 if lanes == 16 else GEMM_TILES
    return _matmul(spec, tiles, lanes)


# Storage dtype of the weight buffer per float weight format (quantize.weight_formats layouts).
_W_STORAGE = {"float32": F32, "f16": "float16", "bf16": "uint16"}


def _weight(w: tirx.Buffer, wdtype: str, j: tirx.PrimExpr, k: tirx.PrimExpr) -> tirx.PrimExpr:
    """w[j, k] as float32."""
    if wdtype == "f16":
        return tirx.Cast(F32, w[j, k])
    if wdtype == "bf16":
        bits = tirx.Cast("uint32", w[j, k]) << tirx.const(16, "uint32")
        return tirx.reinterpret(F32, bits)
    return w[j, k]


def _matmul(spec: MatmulSpec, tl: MatmulTiles, VW: int) -> tirx.PrimFunc:
    K, N, has_bias = spec.k, spec.n_out, spec.bias
    WD = spec.wdtype
    if WD not in _W_STORAGE:
        raise ValueError(f"cpu_matmul: no float kernel for weight format {WD!r}")
    WS = _W_STORAGE[WD]
    MR, NR = tl.mr, tl.nr
    KV = K // VW  # full k vectors
    K0 = KV * VW  # start of the scalar k tail
    KT = K - K0
    KBV = max(1, min(KV, tl.kb // VW))  # k vectors per cache block
    # Software prefetch of w, in k vectors between prefetches of each row: once per cache
    # line, or twice for up to 4 rows (a core drops a prefetch when its miss buffers are
    # full, and the second try made 2-4 rows 2-7% faster; RESULTS 2026-11-30). More rows
    # make more passes over each tile and are less memory-bound: there the extra
    # instructions cost (8 rows: 10-15% slower with two per line in every pass, 3-5% in
    # the first).
    PF_LINE = 64 // (VW * (4 if WD == "float32" else 2))
    PF_HALF = max(1, PF_LINE // 2)
    # One row of 16-bit weights prefetches too: converting w in registers makes its loop
    # long enough that the hardware prefetcher falls behind (11-22% faster with it); one
    # row of f32 gained nothing.
    PF_ONE_ROW = PF_HALF if WD != "float32" else 0
    PF_AHEAD = PF_BYTES // (4 if WD == "float32" else 2)  # in weights
    NKB = -(-KV // KBV) if KV else 0
    MB = tl.mb
    NJB = N // NR  # full column tiles
    N0 = NJB * NR  # first column of the tail
    if tl.panels:
        G = max(1, min(64, -(-NJB // tl.panels)))  # column tiles per parallel panel
    else:
        G = 1
    NP = -(-NJB // G)

    @T.macro
    def micro(x, w, out, acc, i0, j0, kv0, kvn, R, C, pf=0, cs=1):
        # out[i0:i0+R, j0 + c*cs] += x[i0:i0+R, k] . w[j0 + c*cs, k] for c < C, over k in the
        # kv0..kv0+kvn vectors
        for r in T.unroll(R):
            for c in T.unroll(C):
                for v in T.vectorized(VW):
                    acc[r, c, v] = f32(0.0)
        for kv in range(kvn):
            if pf > 0:  # every pf k vectors (gemv only)
                if (kv0 + kv) % pf == 0:
                    for c in T.unroll(C):  # each row's stream PF_BYTES ahead (on into
                        # the row that follows it in memory, the stream's next tile)
                        T.evaluate(prefetch(w, 0, T.min(
                            (j0 + c * cs) * K + (kv0 + kv) * VW + PF_AHEAD, i64(N * K - 1))))
            for r in T.unroll(R):
                for c in T.unroll(C):
                    for v in T.vectorized(VW):
                        acc[r, c, v] = acc[r, c, v] + (
                            x[i0 + r, (kv0 + kv) * VW + v]
                            * _weight(w, WD, j0 + c * cs, (kv0 + kv) * VW + v)
                        )
        for r in T.unroll(R):
            for c in T.unroll(C):
                out[i0 + r, j0 + c * cs] = out[i0 + r, j0 + c * cs] + hsum(acc, r, c, lanes=VW)

    @T.macro
    def init_and_tail(x, w, bias, out, n, j0, jn, cs=1):
        # out[:, j0 + c*cs] = bias (or 0) for c < jn, plus the scalar k tail.
        for i in range(n):
            for c in range(jn):
                if has_bias:
                    out[i, j0 + c * cs] = bias[j0 + c * cs]
                else:
                    out[i, j0 + c * cs] = f32(0.0)
                for t in range(KT):
                    out[i, j0 + c * cs] = out[i, j0 + c * cs] + x[i, K0 + t] * _weight(
                        w, WD, j0 + c * cs, K0 + t)

    @T.macro
    def gemv_body(x, w, bias, out, n):
        for jb in T.parallel(NJB):
            acc = scratch((3, NR, VW))
            init_and_tail(x, w, bias, out, n, jb, NR, NJB)  # rows jb + c * NJB
            for kb in range(NKB):
                kv0 = T.bind(kb * KBV)
                kvn = T.bind(T.min(KBV, KV - kv0))
                # rows two at a time: 2 x NR independent accumulators hide the FMA latency
                # that one row's NR chains cannot (batched decode costs ~half per row)
                # Rows in pairs, an odd count ending in a triple (3 x NR = 12 accumulators);
                # one row alone runs the 1-row kernel. Multi-row calls also prefetch w
                # PF_ROWS rows ahead: their FMAs take long enough that the hardware
                # prefetcher alone falls behind (a single f32 row does not gain).
                odd = T.bind(n % 2)
                pairs = T.bind((n - 3 * odd) // 2)
                if pairs > 0:
                    if n <= 4:
                        micro(x, w, out, acc, 0, jb, kv0, kvn, 2, NR, PF_HALF, NJB)
                    else:
                        micro(x, w, out, acc, 0, jb, kv0, kvn, 2, NR, PF_LINE, NJB)
                for ip in range(1, pairs):
                    micro(x, w, out, acc, ip * 2, jb, kv0, kvn, 2, NR, PF_LINE, NJB)
                if odd == 1:
                    if n == 3:
                        micro(x, w, out, acc, 0, jb, kv0, kvn, 3, NR, PF_HALF, NJB)
                    elif n > 3:
                        micro(x, w, out, acc, n - 3, jb, kv0, kvn, 3, NR, PF_LINE, NJB)
                    else:
                        micro(x, w, out, acc, 0, jb, kv0, kvn, 1, NR, PF_ONE_ROW, NJB)

    @T.macro
    def gemm_body(x, w, bias, out, n):
        for p in T.parallel(NP):
            acc = scratch((MR, NR, VW))
            jb_end = T.bind(T.min(p * G + G, NJB))
            init_and_tail(x, w, bias, out, n, p * G * NR, jb_end * NR - p * G * NR)
            for kb in range(NKB):
                kv0 = T.bind(kb * KBV)
                kvn = T.bind(T.min(KBV, KV - kv0))
                for io in range((n + (MB - 1)) // MB):
                    rows = T.bind(T.min(n - io * MB, i64(MB)))
                    full = T.bind(rows // MR * MR)
                    for jb in range(p * G, jb_end):
                        for ib in range(rows // MR):
                            micro(x, w, out, acc, io * MB + ib * MR, jb * NR, kv0, kvn, MR,
                                  NR)
                        for ip in range((rows - full) // 2):  # leftover rows: pairs, one
                            micro(x, w, out, acc, io * MB + full + ip * 2, jb * NR, kv0,
                                  kvn, 2, NR)
                        for ii in range(full + (rows - full) // 2 * 2, rows):
                            micro(x, w, out, acc, io * MB + ii, jb * NR, kv0, kvn, 1, NR)

    @T.macro
    def column_tail(x, w, bias, out, n):
        # The N % NR last columns, one at a time.
        for jt in T.parallel(N - N0):
            acc = scratch((1, 1, VW))
            init_and_tail(x, w, bias, out, n, N0 + jt, 1)
            for kb in range(NKB):
                for i in range(n):
                    micro(x, w, out, acc, i, N0 + jt, kb * KBV, T.min(KBV, KV - kb * KBV), 1, 1)

    @T.macro
    def body(x, w, bias, out, n):
        if MR == 1:
            gemv_body(x, w, bias, out, n)
        else:
            gemm_body(x, w, bias, out, n)
        if N0 < N:
            column_tail(x, w, bias, out, n)

    if has_bias:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, w_h: T.handle, b_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            w = T.match_buffer(w_h, (i64(N), i64(K)), WS)
            bias = T.match_buffer(b_h, (i64(N),), F32)
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, w, bias, out, n)

    else:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, w_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            w = T.match_buffer(w_h, (i64(N), i64(K)), WS)
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, w, None, out, n)

    return kernel
