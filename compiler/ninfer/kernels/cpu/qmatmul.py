"""CPU matmul out = x @ dequant(w).T (+ bias) for group-quantized weights (q8gG, q4gG).

The weight layout is `quantize.weight_formats`'s: per row, groups of G weights along k with one
float16 scale d; q8 stores int8 q, q4 stores two offset-binary nibbles per byte (low
nibble = even k). Dequantizing to float32 for FMAs costs a widening, a conversion and an
FMA per 8 weights (plus the nibble unpack), which on this AVX2 machine runs at ~1/4 of
memory speed for q4. Instead, as in llama.cpp, the activations are quantized too and each
group is an exact integer dot product, 32 multiply-adds per instruction:

1. Before the parallel loop (gemv: serially; gemm: parallel over rows), every row of x is
   cut into the same groups of G and rounded to int8 with one float32 scale
   dx = max|x| / 127 per group (numpy model: `quant.quantize_activations`), into
   workspace buffers. For q4 the int8 values of every 64-long chunk of k are stored evens
   first, then odds, to line up with the low and high nibbles of 32 weight bytes, and
   each group's offset correction -8 * sum(xq) is kept (as float); for q8, |xq| is kept.
2. Group dot products with AVX2 integer instructions (LLVM intrinsics called from TIR):
   - q4: 32 weight bytes -> lo = b & 15, hi = b >> 4 (the unsigned nibble q + 8);
     vpmaddubsw(lo, xq_even) + vpmaddubsw(hi, xq_odd) [+ the same for the next 64 k of
     a 128 group] -> 16 x int16 (at most 8 * 15 * 127 = 15240: no saturation), then
     vpmaddwd with ones -> 8 x int32.
   - q8: vpmaddubsw(|xq|, vpsignb(q, xq)) -> 16 x int16 (at most 2 * 127 * 127 < 2^15),
     vpmaddwd with ones -> 8 x int32.
   Where the host has AVX-VNNI, vpdpbusd does each vpmaddubsw + vpmaddwd in one instruction
   (int32 lanes directly; the same integers, since the int16 step never saturates here).
3. Per k block of K_BLOCK (groups g0..): acc (8 float lanes) starts as the q4 offset
   corrections sum over the block's groups of d * dx * (-8 * sum xq), 8 groups per
   vector; then acc += float(dot) * (d * dx) group after group, and the lanes of acc are
   added into out, block after block.

Schedules. gemv: one task per (NR weight rows N/NR apart, up to GEMV_ROWS x rows), row
tiles innermost, so that a thread's contiguous range of tasks reads NR long streams of w
(RESULTS 2026-12-02: how many streams read fastest depends on the machine); the task's
rows use each unpacked weight vector (the last task takes the 1-3 rows left); each stream
is prefetched PREFETCH_BYTES ahead (rows are short, e.g. 2 KB for q4 at k = 4096, and the
hardware prefetchers alone lose time at every row start), and the scale rows
SCALE_PF_TILES column tiles ahead; the N % NR last columns run one at a time; the rows'
d * dx are computed first, 8 per vcvtph2ps + vmulps, and read back by vbroadcastss.
gemm: MR x NR tiles, k blocks, row blocks, parallel over column
panels. Both perform exactly the operations above in the same order
for every (row, column), so a row's result is bitwise the same in either schedule and
whatever the other rows are (batch invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import tirx as irb

from ninfer.quantize.weight_formats import check_k, format_info

from ..spec import MatmulSpec
from .common import F32, f32, hmax, host_has, hsum, i64, prefetch, scratch

LANES = 8  # int32 / float32 lanes of a ymm register
BYTES = 32  # int8 lanes of a ymm register

# k values per block whose lane sums are added into out (multiple of every group size).
K_BLOCK = 1024
# gemv: each task prefetches the weight array this many bytes ahead of what it reads
# (2-8 KB measured alike; none: ~20% slower on q4 at k = 4096).
PREFETCH_BYTES = 4096
# gemv: each task prefetches the scale rows of the column tile this many tiles ahead (0:
# none; 4 on top of 2 streams: +2-5% for 1-2 rows on the Zen 5 VM, RESULTS session 12)
SCALE_PF_TILES = 4
SCALES_PER_LINE = 64 // 2  # float16 scales per cache line


@dataclass(frozen=True)
class QTiles:
    mr: int  # rows of x per micro-kernel
    nr: int  # weight rows (output columns) per micro-kernel
    mb: int  # rows of x per cache block (multiple of mr)
    panels: int  # desired number of column panels (0: one task per column tile)


# gemv: a task's NR columns are N / NR apart, so a thread reads NR streams of w (and NR of
# scales). 2 streams: 4 read ~20% faster than 1 on the session-11 VM and ~12% slower than
# 2 on the Zen 5 one (RESULTS 2026-12-02); 2 is within a few % of the best on both.
GEMV_TILES = QTiles(mr=1, nr=2, mb=1, panels=0)
GEMV_ROWS = 4  # gemv: rows of x per task (1..4; the last task of a call takes the rest)
GEMM_TILES = QTiles(mr=4, nr=2, mb=32, panels=16)


def _llvm(dtype: str, name: str, *args: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.call_llvm_pure_intrin(dtype, name, *args)


def _maddubs(u8: tirx.PrimExpr, s8: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpmaddubsw: 16 x int16 = u8[2i] * s8[2i] + u8[2i+1] * s8[2i+1] (saturating)."""
    return _llvm("int16x16", "llvm.x86.avx2.pmadd.ub.sw", u8, s8)


def _maddwd(a: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpmaddwd with ones: 8 x int32 = a[2i] + a[2i+1]."""
    ones = tirx.Broadcast(tirx.const(1, "int16"), 16)
    return _llvm("int32x8", "llvm.x86.avx2.pmadd.wd", a, ones)


def _dpbusd(acc: tirx.PrimExpr, u8: tirx.PrimExpr, s8: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpdpbusd (AVX-VNNI): 8 x int32 = acc + the sums of 4 adjacent u8 * s8 products, without
    an int16 step (so equal to maddwd(maddubs(u8, s8)) wherever that does not saturate,
    which the ranges above rule out)."""
    # LLVM 20 and later type the byte operands <32 x i8> (before: <8 x i32>).
    return _llvm("int32x8", "llvm.x86.avx512.vpdpbusd.256", acc, u8, s8)


def use_vnni() -> bool:
    """The group dots use vpdpbusd where the host has it (one instruction for vpmaddubsw +
    vpmaddwd; the integer results are the same)."""
    return host_has("avxvnni") or (host_has("avx512vnni") and host_has("avx512vl"))


def _psignb(a: tirx.PrimExpr, b: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpsignb: a * sign(b) per int8 lane (0 where b == 0)."""
    return _llvm("int8x32", "llvm.x86.avx2.psign.b", a, b)


def _vec(base: tirx.PrimExpr, lanes: int) -> tirx.Ramp:
    return tirx.Ramp(base, i64(1), lanes)


def qmatmul(spec: MatmulSpec) -> tirx.PrimFunc:
    tiles = GEMV_TILES if spec.schedule == "gemv" else GEMM_TILES
    return _qmatmul(spec, tiles)


def _qmatmul(spec: MatmulSpec, tl: QTiles) -> tirx.PrimFunc:
    info = format_info(spec.wdtype)
    if not info.quantized or info.bits not in (4, 8):
        raise ValueError(f"cpu_qmatmul: {spec.wdtype} is not a group-quantized format")
    K, N, has_bias = spec.k, spec.n_out, spec.bias
    check_k(spec.wdtype, K)
    G = info.group
    Q4 = info.bits == 4
    if Q4 and G % 64:
        raise ValueError(f"cpu_qmatmul: q4 groups must be multiples of 64, got {G}")
    if not Q4 and G != BYTES:
        raise ValueError(f"cpu_qmatmul: q8 groups must be {BYTES} long, got {G}")
    NG = K // G  # groups per row
    GB = K_BLOCK // G  # groups per k block
    NKB = -(-NG // GB)
    KQ = K // 2 if Q4 else K  # bytes of q per row
    GQ = KQ // NG  # bytes of q per group
    QDT = "uint8" if Q4 else "int8"
    MR, NR, MB = tl.mr, tl.nr, tl.mb
    NJB = N // NR
    N0 = NJB * NR
    G_PANEL = max(1, min(64, -(-NJB // tl.panels))) if tl.panels else 1
    NP = -(-NJB // G_PANEL)

    vnni = use_vnni()
    # gemm, q8, VNNI: x is stored as xu = xq + 128 (unsigned) and each group's dot is
    # vpdpbusd(-128 * sum(q), xu, q) = sum(xq * q): one instruction per (row, column, group)
    # instead of vpsignb + vpdpbusd; the -128 * sum(q) of a column tile's groups are made
    # once per k block and row block (fill_wsums). The same integers, so the same bits as
    # the gemv's vpsignb path.
    OFFSET = vnni and not Q4 and MR > 1
    zero = tirx.Broadcast(tirx.const(0, "int32"), LANES)
    ones_u8 = tirx.Broadcast(tirx.const(1, "uint8"), BYTES)
    seven = tirx.Broadcast(tirx.const(7, "int32"), LANES)

    def group_dot(q, xq, xa, i, j, g, wn=None, c=0, gl=0):
        """int32x8 whose lanes sum to the exact integer dot of group g (row i, column j;
        OFFSET: wn[c, gl] holds its -128 * sum(q))."""
        if Q4:
            acc = zero if vnni else None
            for c in range(G // 64):
                wb = q[j, _vec(g * (G // 2) + c * BYTES, BYTES)]
                lo = wb & tirx.Broadcast(tirx.const(15, "uint8"), BYTES)
                hi = wb >> tirx.Broadcast(tirx.const(4, "uint8"), BYTES)
                xe = xq[i, _vec(g * G + c * 64, BYTES)]
                xo = xq[i, _vec(g * G + c * 64 + BYTES, BYTES)]
                if vnni:
                    acc = _dpbusd(_dpbusd(acc, lo, xe), hi, xo)
                else:
                    p = _maddubs(lo, xe) + _maddubs(hi, xo)
                    acc = p if acc is None else acc + p
            return acc if vnni else _maddwd(acc)
        wb = q[j, _vec(g * G, BYTES)]
        if OFFSET:
            return _dpbusd(wn[c, gl, _vec(i64(0), LANES)], xa[i, _vec(g * G, BYTES)], wb)
        ws = _psignb(wb, xq[i, _vec(g * G, BYTES)])
        if vnni:
            return _dpbusd(zero, xa[i, _vec(g * G, BYTES)], ws)
        return _maddwd(_maddubs(xa[i, _vec(g * G, BYTES)], ws))

    @T.macro
    def quantize_row(x, xq, xa, xs, xc, i):
        # row i of x -> xq (and |xq| or the q4 corrections), dx per group
        for g in range(NG):
            m8 = scratch((LANES,))
            for v in T.vectorized(LANES):
                m8[v] = f32(0.0)
            for t in range(G // LANES):
                for v in T.vectorized(LANES):
                    m8[v] = T.max(m8[v], T.fabs(x[i, g * G + t * LANES + v]))
            amax = T.bind(hmax(m8))
            xs[i, g] = amax / f32(127.0)
            inv = T.bind(T.if_then_else(amax > f32(0.0), f32(127.0) / amax, f32(0.0)))
            if Q4:
                for c in range(G // 64):
                    for h in range(2):
                        for t in range(BYTES // LANES):
                            for v in T.vectorized(LANES):
                                xq[i, g * G + c * 64 + h * BYTES + t * LANES + v] = T.Cast(
                                    "int8",
                                    T.nearbyint(
                                        x[i, g * G + c * 64 + (t * LANES + v) * 2 + h] * inv
                                    ),
                                )
                s8 = scratch((LANES,), "int32")
                for v in T.vectorized(LANES):
                    s8[v] = 0
                for t in range(G // LANES):
                    for v in T.vectorized(LANES):
                        s8[v] = s8[v] + T.Cast("int32", xq[i, g * G + t * LANES + v])
                xc[i, g] = T.Cast(F32, hsum(s8) * -8)
            else:
                for t in range(G // LANES):
                    for v in T.vectorized(LANES):
                        xq[i, g * G + t * LANES + v] = T.Cast(
                            "int8", T.nearbyint(x[i, g * G + t * LANES + v] * inv)
                        )
                if OFFSET:
                    for t in range(G // LANES):
                        for v in T.vectorized(LANES):
                            xa[i, g * G + t * LANES + v] = T.Cast(
                                "uint8", T.Cast("int32", xq[i, g * G + t * LANES + v]) + 128
                            )
                else:
                    for t in range(G // LANES):
                        for v in T.vectorized(LANES):
                            xa[i, g * G + t * LANES + v] = T.Cast(
                                "int8", T.abs(xq[i, g * G + t * LANES + v])
                            )

    @T.macro
    def quantize_x(x, xq, xa, xs, xc, n):
        # Before the matmul's parallel loop. gemv (a few rows): serially on the calling
        # thread, which is cheaper than another parallel launch; gemm: parallel over rows.
        if MR > 1:
            for i in T.parallel(n):
                quantize_row(x, xq, xa, xs, xc, i)
        else:
            for i in range(n):
                quantize_row(x, xq, xa, xs, xc, i)

    @T.macro
    def fill_scales(sc, xs, sg, i0, j0, g0, gn, R, C, cs=1):
        # sg[r, c, g] = d * dx for the groups g0 .. g0+gn-1, 8 per vcvtph2ps + vmulps
        for r in T.unroll(R):
            for c in T.unroll(C):
                for b in range(gn // LANES):
                    for v in T.vectorized(LANES):
                        sg[r, c, g0 + b * LANES + v] = (
                            T.Cast(F32, sc[j0 + c * cs, g0 + b * LANES + v])
                            * xs[i0 + r, g0 + b * LANES + v]
                        )
                for g in range(gn // LANES * LANES, gn):
                    sg[r, c, g0 + g] = T.Cast(F32, sc[j0 + c * cs, g0 + g]) * xs[i0 + r, g0 + g]

    @T.macro
    def fill_wsums(q, wn, j0, g0, gn, C):
        # wn[c, g] = -128 * (sums of 4 adjacent q) of group g0 + g of column j0 + c (OFFSET)
        for c in T.unroll(C):
            for g in range(gn):
                wn[c, g, _vec(i64(0), LANES)] = zero - tirx.shift_left(
                    _dpbusd(zero, ones_u8, q[j0 + c, _vec((g0 + g) * G, BYTES)]), seven)

    @T.macro
    def micro(q, sc, xq, xa, xs, xc, out, acc, sg, i0, j0, g0, gn, R, C, PF, FILL, wn=None,
              cs=1):
        # out[i0:i0+R, j0 + c * cs] (c < C) += the groups g0 .. g0+gn-1 of k (one k block).
        # 1. sg[r, c, g] = d * dx (FILL > 0: made here; else the caller has made them);
        #    for q4 the groups' offset corrections d * dx * (-8 * sum xq) go into acc.
        if FILL > 0:
            fill_scales(sc, xs, sg, i0, j0, g0, gn, R, C, cs)
        for r in T.unroll(R):
            for c in T.unroll(C):
                for v in T.vectorized(LANES):
                    acc[r, c, v] = f32(0.0)
                if Q4:
                    for b in range(gn // LANES):
                        for v in T.vectorized(LANES):
                            acc[r, c, v] = acc[r, c, v] + (
                                sg[r, c, g0 + b * LANES + v] * xc[i0 + r, g0 + b * LANES + v]
                            )
                    for g in range(gn // LANES * LANES, gn):
                        acc[r, c, 0] = acc[r, c, 0] + sg[r, c, g0 + g] * xc[i0 + r, g0 + g]
        # 2. acc += float(exact dot of group g) * sg (a broadcast load), group by group;
        #    PF > 0: prefetch the weight stream PF bytes ahead (the last rows clamp it).
        pf0 = T.bind(T.Cast("int64", j0) * KQ + g0 * GQ + PF)
        for g in range(gn):
            if PF > 0:  # each column's stream (C of them, cs rows apart)
                for c in T.unroll(C):
                    T.evaluate(prefetch(q, 0, T.min(pf0 + (c * cs * KQ + g * GQ),
                                                    i64(N * KQ - 1))))
            for r in T.unroll(R):
                for c in T.unroll(C):
                    acc[r, c, _vec(i64(0), LANES)] = acc[r, c, _vec(i64(0), LANES)] + T.Cast(
                        "float32x8",
                        group_dot(q, xq, xa, i0 + r, j0 + c * cs, g0 + g, wn, c, g)
                    ) * T.Broadcast(sg[r, c, g0 + g], LANES)
        for r in T.unroll(R):
            for c in T.unroll(C):
                out[i0 + r, j0 + c * cs] = out[i0 + r, j0 + c * cs] + hsum(acc, r, c)

    @T.macro
    def init(bias, out, rows, i0, j0, j1):
        for i in range(i0, i0 + rows):
            for j in range(j0, j1):
                if has_bias:
                    out[i, j] = bias[j]
                else:
                    out[i, j] = f32(0.0)

    @T.macro
    def gemv_rows(q, sc, xq, xa, xs, xc, bias, out, acc, sg, i, jb, R):
        # rows i .. i+R-1 against the columns jb + c * NJB (c < NR: NR streams of w far
        # apart), all k blocks
        for c in range(NR):
            init(bias, out, R, i, jb + c * NJB, jb + c * NJB + 1)
        if SCALE_PF_TILES > 0:
            for c in T.unroll(NR):
                for ln in T.unroll(-(-NG // SCALES_PER_LINE)):
                    T.evaluate(prefetch(sc, T.min(jb + (SCALE_PF_TILES + c * NJB), i64(N - 1)),
                                        ln * SCALES_PER_LINE))
        # all scales of the rows first: read back from memory (vbroadcastss m32)
        fill_scales(sc, xs, sg, i, jb, 0, NG, R, NR, NJB)
        for kb in range(NKB):
            micro(q, sc, xq, xa, xs, xc, out, acc, sg, i, jb, kb * GB,
                  T.min(GB, NG - kb * GB), R, NR, PREFETCH_BYTES, 0, None, NJB)

    @T.macro
    def gemv_body(q, sc, xq, xa, xs, xc, bias, out, n):
        # One task per (column tile, tile of GEMV_ROWS rows): the rows use each unpacked
        # weight vector of the tile (the last tile takes the rows left). Rows are unrolled
        # inside the group loop, never looped over inside a task: LLVM would hoist the
        # unpacked weights of a whole k block out of such a loop onto the stack.
        tiles = T.bind((n + (GEMV_ROWS - 1)) // GEMV_ROWS)
        for t in T.parallel(NJB * tiles):
            jb = T.bind(t // tiles)
            i = T.bind(t % tiles * GEMV_ROWS)
            acc = scratch((GEMV_ROWS, NR, LANES))
            sg = scratch((GEMV_ROWS, NR, NG))
            left = T.bind(n - i)
            if left >= GEMV_ROWS:
                gemv_rows(q, sc, xq, xa, xs, xc, bias, out, acc, sg, i, jb, GEMV_ROWS)
            if GEMV_ROWS > 3:
                if left == 3:
                    gemv_rows(q, sc, xq, xa, xs, xc, bias, out, acc, sg, i, jb, 3)
            if GEMV_ROWS > 2:
                if left == 2:
                    gemv_rows(q, sc, xq, xa, xs, xc, bias, out, acc, sg, i, jb, 2)
            if GEMV_ROWS > 1:
                if left == 1:
                    gemv_rows(q, sc, xq, xa, xs, xc, bias, out, acc, sg, i, jb, 1)

    @T.macro
    def gemm_body(q, sc, xq, xa, xs, xc, bias, out, n):
        for p in T.parallel(NP):
            acc = scratch((MR, NR, LANES))
            sg = scratch((MR, NR, NG))
            wn = scratch((NR, GB, LANES), "int32")
            jb_end = T.bind(T.min(p * G_PANEL + G_PANEL, NJB))
            init(bias, out, n, 0, p * G_PANEL * NR, jb_end * NR)
            for kb in range(NKB):
                g0 = T.bind(kb * GB)
                gn = T.bind(T.min(GB, NG - g0))
                for io in range((n + (MB - 1)) // MB):
                    rows = T.bind(T.min(n - io * MB, i64(MB)))
                    full = T.bind(rows // MR * MR)
                    for jb in range(p * G_PANEL, jb_end):
                        if OFFSET:
                            fill_wsums(q, wn, jb * NR, g0, gn, NR)
                        for ib in range(rows // MR):
                            micro(q, sc, xq, xa, xs, xc, out, acc, sg, io * MB + ib * MR,
                                  jb * NR, g0, gn, MR, NR, 0, 1, wn)
                        for ii in range(full, rows):
                            micro(q, sc, xq, xa, xs, xc, out, acc, sg, io * MB + ii,
                                  jb * NR, g0, gn, 1, NR, 0, 1, wn)

    @T.macro
    def column_tail(q, sc, xq, xa, xs, xc, bias, out, n):
        for jt in T.parallel(N - N0):
            acc = scratch((1, 1, LANES))
            sg = scratch((1, 1, NG))
            wn = scratch((1, GB, LANES), "int32")
            init(bias, out, n, 0, N0 + jt, N0 + jt + 1)
            for kb in range(NKB):
                if OFFSET:
                    fill_wsums(q, wn, N0 + jt, kb * GB, T.min(GB, NG - kb * GB), 1)
                for i in range(n):
                    micro(q, sc, xq, xa, xs, xc, out, acc, sg, i, N0 + jt, kb * GB,
                          T.min(GB, NG - kb * GB), 1, 1, 0, 1, wn)

    @T.macro
    def body(x, q, sc, bias, out, n):
        xq = irb.alloc_buffer((n, i64(K)), "int8")
        xa = irb.alloc_buffer((n, i64(K if not Q4 else 1)), "uint8" if OFFSET else "int8")
        xs = irb.alloc_buffer((n, i64(NG)), F32)
        xc = irb.alloc_buffer((n, i64(NG if Q4 else 1)), F32)
        quantize_x(x, xq, xa, xs, xc, n)
        if MR == 1:
            gemv_body(q, sc, xq, xa, xs, xc, bias, out, n)
        else:
            gemm_body(q, sc, xq, xa, xs, xc, bias, out, n)
        if N0 < N:
            column_tail(q, sc, xq, xa, xs, xc, bias, out, n)

    if has_bias:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, q_h: T.handle, s_h: T.handle, b_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            q = T.match_buffer(q_h, (i64(N), i64(KQ)), QDT)
            sc = T.match_buffer(s_h, (i64(N), i64(NG)), "float16")
            bias = T.match_buffer(b_h, (i64(N),), F32)
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, q, sc, bias, out, n)

    else:

        @T.prim_func(private=True)
        def kernel(x_h: T.handle, q_h: T.handle, s_h: T.handle, o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            x = T.match_buffer(x_h, (n, i64(K)), F32)
            q = T.match_buffer(q_h, (i64(N), i64(KQ)), QDT)
            sc = T.match_buffer(s_h, (i64(N), i64(NG)), "float16")
            out = T.match_buffer(o_h, (n, i64(N)), F32)
            body(x, q, sc, None, out, n)

    return kernel
