"""CPU matmul out = x @ dequant(w).T (+ bias) for group-quantized weights (q8gG, q4gG).

The weight layout is `quantize.weight_formats`'s: per row, groups of G weights along k with one
float16 scale d; q8 stores int8 q, q4 stores two offset-binary nibbles per byte (low
nibble = even k). Dequantizing to float32 for FMAs costs a widening, a conversion and an
FMA per 8 weights (plus the nibble unpack). Instead, as in llama.cpp, the activations are
quantized too and each group is an exact integer dot product, 64 multiply-adds per
instruction:

1. Before the parallel loop, every row of x is rounded to int8 per group with one float32
   scale per group, in the weights' byte order, with the corrections the dots need
   (qactivations.py, which also holds QShape, the sizes both files derive their loops
   from).
2. k is walked in *steps* of one 512-bit vector of weight bytes: q8: two groups (64 k);
   q4g64: two groups (128 k); q4 with G >= 128: one group (G / 128 vectors). A step's
   exact integer dot is an int32x16 whose lanes sum to it, lane l holding the products of
   weight bytes 4l..4l+3 (lanes 0-7: the first group of a two-group step). With
   AVX-512 VNNI, vpdpbusd (u8 x s8, sums of 4 into int32 lanes) on zmm:
   - q4: vpdpbusd(vpdpbusd(0, b & 15, x_even), b >> 4, x_odd), where the nibbles are
     q + 8, so that the lanes hold dot + 8 * (sums of their x). The offset is taken back
     per group: c_g = -8 * (the sum of the group's x), made with x, enters the k block's
     accumulator as d_g dx_g c_g (step 3). (Per-lane corrections loaded as the dots' start
     cost a fourth vector load a step: the q4g64 engine decoded 5-8% slower, RESULTS
     session 31.)
   - q8: vpdpbusd(c, q ^ 0x80, x): q ^ 0x80 = q + 128 as an unsigned byte, and
     c = -128 * (sums of 4 x) per lane, made with x. (The per-group scheme of q4 made the
     q8g32 engine decode 12-14% slower, unexplained, RESULTS session 31.)
   Elsewhere the same lanes come from two 256-bit halves (vpdpbusd on ymm where the host
   has AVX-VNNI, else vpmaddubsw + vpmaddwd; q8: vpmaddubsw(|x|, vpsignb(q, x)), at most
   2 * 127 * 128 per int16: no saturation). Every path computes the same exact integers,
   so the same bits on any x86-64 host with AVX2. A last step of one group (an odd number
   of groups) has zero upper lanes.
3. Per k block of K_BLOCK: acc (16 float lanes) starts at 0; per step,
   acc += float(dot) * s, s the lanes' d * dx
   (float32(d) * dx, made 8 groups per vcvtph2ps + vmulps into sg; a two-group step's
   pair of them becomes 16 lanes by one 8-byte load and a vpermps); the lanes of acc (q4:
   plus the block's corrections, lane l of vector t holding d_g dx_g c_g of group
   g = 16 t + l, 16 groups a vector, added vector by vector) are added into out (halving
   vector adds), block after block.
4. q8g32, q4g64 and q4g128 in the "lanes" layout (quantize.weight_formats.lanes_order; the
   cpu plan's for all three, plan.CPU_LANES_FORMATS): within each whole block of 512 bytes
   (8 steps; 16 groups, q4g128 8) a row's bytes, and xq likewise (q4: each step's evens,
   then odds), are ordered so that lane l of every step's vector holds group l (q4g128:
   group l % 8, in two lanes). A block's vpdpbusd then add, step by step for every (row,
   column) of the tile, into int32x16 sums whose lane l is that group's exact dot (q4g128:
   half of it; 1, 2 or 4 independent sums, block_chains, added at the end; q8 started from
   the groups' -128 * (sums of their x), one vector a block at the block's first step's
   place in xcor; q4 from 0, its offsets taken back with the k block's corrections as in
   step 3), converted once and multiplied by the groups' d * dx (sg, already in group
   order; q4g128: its 8 twice, one vinsertf64x4): one conversion and one product a block
   instead of one per step with its scale's load (and vpermps) (q8g32 gemm 224 -> 372-400
   GFLOP/s, RESULTS session 33; q4g64 one-row gemv from L2 33 -> 44 GB/s a thread once
   TIR's CSE no longer spilled the block's offsets, kernels/cpu/build.py, session 34;
   q4g128 36 -> 44, its decode +13%, session 36). Groups after the last whole block take
   the steps above.

Schedules. gemv: one task per (NR weight rows N/NR apart, up to GEMV_ROWS x rows), row
tiles innermost, so that a thread's contiguous range of tasks reads NR long streams of w
(RESULTS 2026-12-02: how many streams read fastest depends on the machine); the task's
rows use each unpacked weight vector (the last task takes the 1-3 rows left); each stream
is prefetched as the steps read it, one line a step, PREFETCH_BYTES ahead into L2 and
PREFETCH_L1_BYTES ahead into L1 (rows are short, e.g. 2 KB for q4 at k = 4096, and the
hardware prefetchers alone lose time at every row start), and the scale rows
SCALE_PF_TILES column tiles ahead; the rows' sg are made first, for all of k. With
spec.streams == 1 a task is one weight row (one stream a thread) and the weights are left
to the hardware prefetchers (the read pattern of hosts where that reads faster, chosen at
compile time by ninfer.roofline.host_gemv_streams), except that a q8 task prefetches the
first line of each k block of its row before the block's loads: LLVM may schedule a row's
second line first, and the Zen 4 VM's prefetcher then lost the stream (q8g32 decode +3-5%
with the prefetch, q4 no change; RESULTS session 31). gemm:
MR x NR tiles, k blocks, row blocks of MB (the x block of MB rows and its corrections
stays in L1), parallel over column panels; sg per tile and k block. The N % NR last
columns run one at a time, as gemm tiles of one column. All perform exactly the
operations above in the same order for every (row, column), so a row's result is
bitwise the same in either schedule and whatever the other rows are (batch invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import tirx as irb

from ..spec import MatmulSpec
from .common import F32, f32, hsum_vector, i64, prefetch, scratch
from .intdot import (
    BYTES,
    LANES,
    ZL,
    bcast,
    concat,
    dpbusd,
    dpbusd512,
    maddubs,
    maddwd,
    psignb,
    use_vnni,
    use_zmm,
    vec,
)
from .qactivations import UNIT, QShape, x_quantizer

# gemv: each task prefetches the weight array this many bytes ahead of what it reads
# (2-8 KB measured alike; none: ~20% slower on q4 at k = 4096) into L2 (prefetcht1), and
# PREFETCH_L1_BYTES ahead into L1 (prefetcht0), one line of each stream a step, beside
# the step's loads. In a C copy of the q4g64 loop one prefetcht0 4 KB ahead read 0.90x of
# a plain read, the two levels 0.96x; in the engine, against the kernel's former 16
# prefetcht0 4 KB ahead at each block's start, q4g64 decoded +9%, q8g32 +8% (RESULTS
# session 38). 0: one level (prefetcht0 PREFETCH_BYTES ahead, one line a step).
PREFETCH_BYTES = 4096
PREFETCH_L1_BYTES = 512
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
# gemv with spec.streams == 1: one stream a thread, no software prefetch of the weights
# (the hosts where a plain read beats prefetched streams, see ninfer.roofline)
GEMV_TILES_ONE = QTiles(mr=1, nr=1, mb=1, panels=0)
GEMV_ROWS = 4  # gemv: rows of x per task (1..4; the last task of a call takes the rest)
# gemm on zmm: 12 accumulators of 16 lanes (4 x 2, 6 x 2, 6 x 3 and 8 x 2 measured within
# noise; 32 rows of x per block, 2 KB each per k block of q4 with its corrections, ran
# ~10% slower than 16: they no longer fit L1). Without AVX-512 a 16-lane vector is two
# ymm registers of 16, hence the smaller tile (not measured: this VM has AVX-512).
GEMM_TILES = QTiles(mr=4, nr=3, mb=16, panels=16)
GEMM_TILES_YMM = QTiles(mr=2, nr=2, mb=16, panels=16)


def qmatmul(spec: MatmulSpec) -> tirx.PrimFunc:
    if spec.schedule == "gemv":
        tiles = GEMV_TILES_ONE if spec.streams == 1 else GEMV_TILES
    else:
        tiles = GEMM_TILES if use_vnni() and use_zmm() else GEMM_TILES_YMM
    return _qmatmul(spec, tiles)


def _qmatmul(spec: MatmulSpec, tl: QTiles) -> tirx.PrimFunc:
    sh = QShape.of(spec)
    K, N, has_bias = spec.k, spec.n_out, spec.bias
    Q4, NG, KQ = sh.q4, sh.ng, sh.kq
    QDT = "uint8" if Q4 else "int8"
    # q8g32 / q4g64 / q4g128 in the "lanes" layout: each whole block of BG groups (BSTEPS
    # steps) has group l in lane l (BG = 8: and l + 8) of every step's vector; its steps'
    # integer dots are summed per lane and converted and scaled once (the groups after the
    # last whole block: per step)
    LANES16, BSTEPS, BG = sh.lanes, sh.bsteps, sh.bg
    GPS, UPS, NSF, TAIL = sh.gps, sh.ups, sh.nsf, sh.tail
    SPB, NKBF, REM = sh.spb, sh.nkbf, sh.rem
    MR, NR, MB = tl.mr, tl.nr, tl.mb
    NJB = N // NR
    N0 = NJB * NR
    G_PANEL = max(1, min(64, -(-NJB // tl.panels))) if tl.panels else 1
    NP = -(-NJB // G_PANEL)

    vnni, zmm, ABSX = sh.vnni, sh.zmm, sh.absx
    zero8 = tirx.Broadcast(tirx.const(0, "int32"), LANES)
    zero16 = tirx.Broadcast(tirx.const(0, "int32"), ZL)
    zero8f = tirx.Broadcast(f32(0.0), LANES)
    quantize_x = x_quantizer(sh, parallel=MR > 1)

    def nibbles(wb: tirx.PrimExpr, lanes: int) -> tuple[tirx.PrimExpr, tirx.PrimExpr]:
        return (wb & tirx.Broadcast(tirx.const(15, "uint8"), lanes),
                wb >> tirx.Broadcast(tirx.const(4, "uint8"), lanes))

    def flip(wb: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
        """q ^ 0x80: q + 128 as an unsigned byte."""
        return tirx.bitwise_xor(wb, tirx.Broadcast(tirx.const(-128, "int8"), lanes))

    def x_offsets(s, u, h, tail):
        """(weight byte, x even / x offset, x odd offset) of 32-byte half h of vector u
        of step s (q8: the odd offset is unused)."""
        if Q4:
            base = (s * UPS + u) * 128
            if tail:
                return s * UPS * UNIT, base, base + BYTES
            return (s * UPS + u) * UNIT + h * BYTES, base + h * BYTES, base + 64 + h * BYTES
        return s * UNIT + h * BYTES, s * UNIT + h * BYTES, 0

    def half_dot(q, xq, xa, xcor, i, j, s, u, h, tail):
        """int32x8: lanes 8h..8h+7 of vector u of step s (q4: with the nibbles' offset)."""
        wo, xe, xo = x_offsets(s, u, h, tail)
        wb = q[j, vec(wo, BYTES)]
        if Q4:
            lo, hi = nibbles(wb, BYTES)
            if vnni:
                return dpbusd(dpbusd(zero8, lo, xq[i, vec(xe, BYTES)]), hi,
                               xq[i, vec(xo, BYTES)])
            return maddwd(maddubs(lo, xq[i, vec(xe, BYTES)])
                           + maddubs(hi, xq[i, vec(xo, BYTES)]))
        if vnni:  # from the lanes' corrections
            start = xcor[i, vec(s * ZL + (0 if tail else h * LANES), LANES)]
            return dpbusd(start, flip(wb, BYTES), xq[i, vec(xe, BYTES)])
        return maddwd(maddubs(xa[i, vec(xe, BYTES)], psignb(wb, xq[i, vec(xe, BYTES)])))

    def step_dot(q, xq, xa, xcor, i, j, s, tail):
        """int32x16 whose lanes sum to the exact integer dot of step s (row i, column j);
        q4: plus 8 times the sum of its x (taken back per group)."""
        if tail:
            return concat(half_dot(q, xq, xa, xcor, i, j, s, 0, 0, True), zero8)
        if zmm:  # (zmm implies VNNI)
            acc = zero16 if Q4 else xcor[i, vec(s * ZL, ZL)]
            for u in range(UPS):
                if Q4:
                    base = (s * UPS + u) * 128
                    lo, hi = nibbles(q[j, vec((s * UPS + u) * UNIT, UNIT)], UNIT)
                    acc = dpbusd512(dpbusd512(acc, lo, xq[i, vec(base, UNIT)]), hi,
                                     xq[i, vec(base + 64, UNIT)])
                else:
                    acc = dpbusd512(acc, flip(q[j, vec(s * UNIT, UNIT)], UNIT),
                                     xq[i, vec(s * UNIT, UNIT)])
            return acc
        acc = None
        for u in range(UPS):
            v = concat(*(half_dot(q, xq, xa, xcor, i, j, s, u, h, False) for h in range(2)))
            acc = v if acc is None else acc + v
        return acc

    def sub_step(s, t, part):
        """(step, nibbles) of the lanes block starting at step s that chain `part` takes in
        its t-th update: q4, step s + t, the low (0) or high (1) nibbles; q8, steps s + 2t
        and s + 2t + 1."""
        return (s + t, part) if Q4 else (s + 2 * t + part, 0)

    def column(j0, c, gemv):
        """Column c of a tile starting at j0: gemv, the streams NJB apart; gemm, adjacent."""
        return j0 + c * NJB if gemv else j0 + c

    def lane_dot(q, xq, xa, iacc, r, c, k, i, j, s, t, which):
        """int32x16: chain k of iacc[r, c] plus the exact integer dots, lane by lane, of
        sub_step(s, t, which) of a lanes block (row i, column j); q4: of the step's low
        (part 0) or high (part 1) nibbles (with their offset of 8, taken back with the k
        block's corrections)."""
        st, part = sub_step(s, t, which)
        if zmm:
            prev = iacc[r, c, k, vec(i64(0), ZL)]
            if Q4:
                nib = nibbles(q[j, vec(st * UNIT, UNIT)], UNIT)[part]
                return dpbusd512(prev, nib, xq[i, vec(st * 128 + part * 64, UNIT)])
            return dpbusd512(prev, flip(q[j, vec(st * UNIT, UNIT)], UNIT),
                             xq[i, vec(st * UNIT, UNIT)])
        halves = []
        for h in range(2):
            prev = iacc[r, c, k, vec(i64(h * LANES), LANES)]
            off = st * UNIT + h * BYTES
            wb = q[j, vec(off, BYTES)]
            if Q4:
                nib = nibbles(wb, BYTES)[part]
                xv = xq[i, vec(st * 128 + part * 64 + h * BYTES, BYTES)]
                halves.append(dpbusd(prev, nib, xv) if vnni else prev + maddwd(maddubs(nib, xv)))
            elif vnni:
                halves.append(dpbusd(prev, flip(wb, BYTES), xq[i, vec(off, BYTES)]))
            else:
                halves.append(prev + maddwd(maddubs(xa[i, vec(off, BYTES)],
                                                    psignb(wb, xq[i, vec(off, BYTES)]))))
        return concat(*halves)

    def block_scale(sg, r, c, s):
        """float32x16: the d * dx of a lanes block's lanes (first step s): its 16 groups',
        or its 8 groups' twice (LLVM: one vinsertf64x4 of the 8 it holds in a register)."""
        if BG == ZL:
            return sg[r, c, vec(s * GPS, ZL)]
        return concat(sg[r, c, vec(s * GPS, BG)], sg[r, c, vec(s * GPS, BG)])

    def pair_scale(sg, r, c, s, tail):
        """float32x16: a step's d * dx from the per-group sg[r, c, g] (gemv)."""
        if GPS == 1:
            return bcast(sg[r, c, s], ZL)
        if tail:
            return concat(bcast(sg[r, c, s * 2], LANES), zero8f)
        # one 8-byte load and one vpermps
        pair = sg[r, c, vec(s * 2, 2)]
        return tirx.Shuffle([pair] * LANES, [tirx.IntImm("int32", v // LANES) for v in range(ZL)])

    @T.macro
    def fill_scales(sc, xs, sg, i0, j0, g0, gn, R, C, cs):
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

    def scaled(q, xq, xa, xcor, acc, sg, i0, j0, s0, s, tail, r, c, gemv):
        """acc[r, c] + float(dot of step s0 + s) * its d * dx (gemv: the columns NJB apart;
        gemm: adjacent)."""
        dot = T.Cast("float32x16", step_dot(q, xq, xa, xcor, i0 + r, column(j0, c, gemv),
                                            s0 + s, tail))
        return acc[r, c, vec(i64(0), ZL)] + dot * pair_scale(sg, r, c, s0 + s, tail)

    def step_macro(tail: bool, gemv: bool):
        @T.macro
        def step(q, xq, xa, xcor, acc, sg, i0, j0, s0, s, R, C):
            for r in T.unroll(R):
                for c in T.unroll(C):
                    acc[r, c, vec(i64(0), ZL)] = scaled(q, xq, xa, xcor, acc, sg,
                                                         i0, j0, s0, s, tail, r, c, gemv)
        return step

    def block_chains(R: int, C: int) -> int:
        """Independent integer sums a lanes block's dots take per (row, column) of an R x C
        tile: 4 for one (row, column), 2 for a gemv's few (a chain of dependent vpdpbusd
        is 5 cycles a link), 1 for the gemm's tile (its registers). Exact integers: the same
        results either way."""
        return 4 if R * C == 1 else 2 if R * C <= 4 else 1

    def chain_of(t, which, chains):
        """The chain that update (t, which) of a lanes block adds into (sub_step)."""
        if chains == 4:
            return which + 2 * (t % 2)
        return which if chains == 2 else 0

    def chain_start(xcor, i, s, h):
        """A chain's start: the q8 block's corrections (VNNI; h: a ymm half, None: zmm)."""
        if Q4 or not vnni:
            return zero16 if h is None else zero8
        return xcor[i, vec(s * ZL, ZL)] if h is None else xcor[i, vec(s * ZL + h * LANES, LANES)]

    # gemv: the weight streams' software prefetch (spec.streams == 1: none, the hardware's)
    PF = PREFETCH_BYTES if spec.streams != 1 else 0
    PF_L1 = PREFETCH_L1_BYTES if PF > 0 else 0

    @T.macro
    def stream_prefetch(q, base, c, off):
        # the line `off` bytes past `base` in column c's stream (gemv: NJB rows apart),
        # PF bytes ahead into L2 and PF_L1 into L1 (past the last row's end too: a
        # prefetch never faults)
        if PF_L1 > 0:
            T.evaluate(prefetch(q, 0, base + (c * NJB * KQ + off + PF_L1)))
            T.evaluate(prefetch(q, 0, base + (c * NJB * KQ + off + PF), locality=2))
        else:
            T.evaluate(prefetch(q, 0, base + (c * NJB * KQ + off + PF)))

    def block_macro(gemv: bool):
        @T.macro
        def block_step(q, xq, xa, xcor, acc, sg, i0, j0, s, R, C, pfb):
            # the lanes block whose first step is s: its exact integer dots summed per lane
            # in iacc step by step for every (row, column) of the tile (two sums: q4 its
            # low and high nibbles', q8 its even and odd steps', in one chain or two,
            # block_chains), then one conversion and one product with its groups' d * dx
            # (block_scale) a (row, column)
            iacc = scratch((R, C, 4, ZL), "int32")
            for r in T.unroll(R):
                for c in T.unroll(C):
                    if zmm:
                        iacc[r, c, 0, vec(i64(0), ZL)] = chain_start(xcor, i0 + r, s, None)
                    else:
                        iacc[r, c, 0, vec(i64(0), LANES)] = chain_start(xcor, i0 + r, s, 0)
                        iacc[r, c, 0, vec(i64(LANES), LANES)] = chain_start(xcor, i0 + r, s, 1)
                    for k in T.unroll(1, 4):
                        iacc[r, c, k, vec(i64(0), ZL)] = zero16
            for t in T.unroll(BSTEPS if Q4 else BSTEPS // 2):
                if gemv and PF > 0:  # the step's lines of each stream, 1 (q8: 2) a step
                    for u in T.unroll(1 if Q4 else 2):
                        for c in T.unroll(C):
                            stream_prefetch(q, pfb, c, (t * (1 if Q4 else 2) + u) * UNIT)
                for r in T.unroll(R):
                    for c in T.unroll(C):
                        iacc[r, c, chain_of(t, 0, block_chains(R, C)), vec(i64(0), ZL)] = (
                            lane_dot(q, xq, xa, iacc, r, c, chain_of(t, 0, block_chains(R, C)),
                                     i0 + r, column(j0, c, gemv), s, t, 0))
                for r in T.unroll(R):
                    for c in T.unroll(C):
                        iacc[r, c, chain_of(t, 1, block_chains(R, C)), vec(i64(0), ZL)] = (
                            lane_dot(q, xq, xa, iacc, r, c, chain_of(t, 1, block_chains(R, C)),
                                     i0 + r, column(j0, c, gemv), s, t, 1))
            for r in T.unroll(R):
                for c in T.unroll(C):
                    acc[r, c, vec(i64(0), ZL)] = acc[r, c, vec(i64(0), ZL)] + T.Cast(
                        "float32x16", (iacc[r, c, 0, vec(i64(0), ZL)]
                                       + iacc[r, c, 1, vec(i64(0), ZL)])
                        + (iacc[r, c, 2, vec(i64(0), ZL)] + iacc[r, c, 3, vec(i64(0), ZL)])
                    ) * block_scale(sg, r, c, s)
        return block_step

    block_gemv, block_gemm = block_macro(True), block_macro(False)
    step_gemv, tail_gemv = step_macro(False, True), step_macro(True, True)
    step_gemm, tail_gemm = step_macro(False, False), step_macro(True, False)

    lane16 = tirx.Ramp(tirx.const(0, "int32"), tirx.const(1, "int32"), ZL)
    zero16f = tirx.Broadcast(f32(0.0), ZL)

    def block_corrections(xcor, sg, i, r, c, g0, gn):
        """float32x16: the groups g0 .. g0+gn-1's d_g dx_g c_g, ZL groups a vector, added
        vector by vector (lanes past the block's last group: 0)."""
        total = zero16f  # gn == 0: a k block the schedule generates but never runs
        for t in range(-(-gn // ZL)):
            v = sg[r, c, vec(g0 + t * ZL, ZL)] * xcor[i, vec(g0 + t * ZL, ZL)]
            if gn - t * ZL < ZL:
                v = tirx.Select(lane16 < tirx.Broadcast(tirx.const(gn - t * ZL, "int32"), ZL),
                                v, zero16f)
            total = v if t == 0 else total + v
        return total

    def blocked_steps(sn: int) -> int:
        """Steps of a k block's sn that its whole lanes blocks take (0 by rows)."""
        return sn // BSTEPS * BSTEPS if LANES16 else 0

    def micro_macro(gemv: bool):
        step, tail_step = (step_gemv, tail_gemv) if gemv else (step_gemm, tail_gemm)
        block_step = block_gemv if gemv else block_gemm
        PFG = PF if gemv else 0
        cs = NJB if gemv else 1

        @T.macro
        def micro(q, xq, xa, xcor, out, acc, sg, i0, j0, s0, sn, tail, R, C):
            # out[i0:i0+R, j0 + c * cs] (c < C) += the steps s0 .. s0+sn-1 (+ the tail
            # step) of k, one k block, scales from sg; gemv: the weight streams prefetched
            # as the steps read them (stream_prefetch).
            for r in T.unroll(R):
                for c in T.unroll(C):
                    for v in T.vectorized(ZL):
                        acc[r, c, v] = f32(0.0)
            pf0 = T.bind(T.Cast("int64", j0) * KQ + s0 * UPS * UNIT)
            if gemv and PFG == 0 and not Q4:  # q8, one stream: the block's first line first
                for c in T.unroll(C):
                    T.evaluate(prefetch(q, j0 + c * cs, s0 * UPS * UNIT))
            if LANES16:  # whole lanes blocks first (s0 is a block's start)
                for b in range(sn // BSTEPS):
                    block_step(q, xq, xa, xcor, acc, sg, i0, j0, s0 + b * BSTEPS, R, C,
                               pf0 + b * BSTEPS * UNIT)
            for s in range(blocked_steps(sn), sn):
                if PFG > 0:  # each column's stream (C of them, cs rows apart)
                    for u in T.unroll(UPS):
                        for c in T.unroll(C):
                            stream_prefetch(q, pf0, c, (s * UPS + u) * UNIT)
                step(q, xq, xa, xcor, acc, sg, i0, j0, s0, s, R, C)
            if tail > 0:
                tail_step(q, xq, xa, xcor, acc, sg, i0, j0, s0, sn, R, C)
            for r in T.unroll(R):
                for c in T.unroll(C):
                    if Q4:  # with the block's corrections
                        out[i0 + r, j0 + c * cs] = out[i0 + r, j0 + c * cs] + hsum_vector(
                            acc[r, c, vec(i64(0), ZL)] + block_corrections(
                                xcor, sg, i0 + r, r, c, s0 * GPS, sn * GPS + tail), ZL)
                    else:
                        out[i0 + r, j0 + c * cs] = out[i0 + r, j0 + c * cs] + hsum_vector(
                            acc[r, c, vec(i64(0), ZL)], ZL)
        return micro

    micro_gemv, micro_gemm = micro_macro(True), micro_macro(False)

    @T.macro
    def init(bias, out, rows, i0, j0, j1):
        for i in range(i0, i0 + rows):
            for j in range(j0, j1):
                if has_bias:
                    out[i, j] = bias[j]
                else:
                    out[i, j] = f32(0.0)

    @T.macro
    def gemv_rows(q, sc, xq, xa, xcor, xs, bias, out, acc, sg, i, jb, R):
        # rows i .. i+R-1 against the columns jb + c * NJB (c < NR: NR streams of w far
        # apart), all k blocks
        for c in range(NR):
            init(bias, out, R, i, jb + c * NJB, jb + c * NJB + 1)
        if SCALE_PF_TILES > 0:
            for c in T.unroll(NR):
                for ln in T.unroll(-(-NG // SCALES_PER_LINE)):
                    T.evaluate(prefetch(sc, jb + (SCALE_PF_TILES + c * NJB),
                                        ln * SCALES_PER_LINE))
        # all scales of the rows first: read back from memory (vbroadcastss m32)
        fill_scales(sc, xs, sg, i, jb, 0, NG, R, NR, NJB)
        for kb in range(NKBF):
            micro_gemv(q, xq, xa, xcor, out, acc, sg, i, jb, kb * SPB, SPB, 0, R,
                       NR)
        if REM + TAIL > 0:
            micro_gemv(q, xq, xa, xcor, out, acc, sg, i, jb, NKBF * SPB, REM, TAIL,
                       R, NR)

    @T.macro
    def gemv_body(q, sc, xq, xa, xcor, xs, bias, out, n):
        # One task per (column tile, tile of GEMV_ROWS rows): the rows use each unpacked
        # weight vector of the tile (the last tile takes the rows left). Rows are unrolled
        # inside the step loop, never looped over inside a task: LLVM would hoist the
        # unpacked weights of a whole k block out of such a loop onto the stack.
        tiles = T.bind((n + (GEMV_ROWS - 1)) // GEMV_ROWS)
        for t in T.parallel(NJB * tiles):
            jb = T.bind(t // tiles)
            i = T.bind(t % tiles * GEMV_ROWS)
            acc = scratch((GEMV_ROWS, NR, ZL))
            sg = scratch((GEMV_ROWS, NR, NG + ZL))
            left = T.bind(n - i)
            if left >= GEMV_ROWS:
                gemv_rows(q, sc, xq, xa, xcor, xs, bias, out, acc, sg, i, jb, GEMV_ROWS)
            if GEMV_ROWS > 3:
                if left == 3:
                    gemv_rows(q, sc, xq, xa, xcor, xs, bias, out, acc, sg, i, jb, 3)
            if GEMV_ROWS > 2:
                if left == 2:
                    gemv_rows(q, sc, xq, xa, xcor, xs, bias, out, acc, sg, i, jb, 2)
            if GEMV_ROWS > 1:
                if left == 1:
                    gemv_rows(q, sc, xq, xa, xcor, xs, bias, out, acc, sg, i, jb, 1)

    @T.macro
    def block(q, sc, xq, xa, xcor, xs, out, acc, sg, rows, r0, j0, s0, sn, tail, C):
        # rows r0 .. r0+rows-1 against the columns j0 .. j0+C-1, one k block
        for ib in range(rows // MR):
            fill_scales(sc, xs, sg, r0 + ib * MR, j0, s0 * GPS, sn * GPS + tail, MR, C, 1)
            micro_gemm(q, xq, xa, xcor, out, acc, sg, r0 + ib * MR, j0, s0, sn, tail, MR, C)
        for ii in range(rows // MR * MR, rows):
            fill_scales(sc, xs, sg, r0 + ii, j0, s0 * GPS, sn * GPS + tail, 1, C, 1)
            micro_gemm(q, xq, xa, xcor, out, acc, sg, r0 + ii, j0, s0, sn, tail, 1, C)

    @T.macro
    def gemm_body(q, sc, xq, xa, xcor, xs, bias, out, n):
        for p in T.parallel(NP):
            acc = scratch((MR, NR, ZL))
            sg = scratch((MR, NR, NG + ZL))
            jb_end = T.bind(T.min(p * G_PANEL + G_PANEL, NJB))
            init(bias, out, n, 0, p * G_PANEL * NR, jb_end * NR)
            for kb in range(NKBF + (1 if REM + TAIL > 0 else 0)):
                for io in range((n + (MB - 1)) // MB):
                    rows = T.bind(T.min(n - io * MB, i64(MB)))
                    for jb in range(p * G_PANEL, jb_end):
                        if kb < NKBF:
                            block(q, sc, xq, xa, xcor, xs, out, acc, sg, rows, io * MB,
                                  jb * NR, kb * SPB, SPB, 0, NR)
                        else:
                            block(q, sc, xq, xa, xcor, xs, out, acc, sg, rows, io * MB,
                                  jb * NR, NKBF * SPB, REM, TAIL, NR)

    @T.macro
    def column_tail(q, sc, xq, xa, xcor, xs, bias, out, n):
        for jt in T.parallel(N - N0):
            acc = scratch((MR, 1, ZL))
            sg = scratch((MR, 1, NG + ZL))
            init(bias, out, n, 0, N0 + jt, N0 + jt + 1)
            for kb in range(NKBF):
                block(q, sc, xq, xa, xcor, xs, out, acc, sg, n, 0, N0 + jt, kb * SPB, SPB,
                      0, 1)
            if REM + TAIL > 0:
                block(q, sc, xq, xa, xcor, xs, out, acc, sg, n, 0, N0 + jt, NKBF * SPB, REM,
                      TAIL, 1)

    @T.macro
    def body(x, q, sc, bias, out, n):
        xq = irb.alloc_buffer((n, i64(K)), "int8")
        xa = irb.alloc_buffer((n, i64(K if ABSX else 1)), "int8")
        # q4: the groups' corrections (+ ZL zeros); q8 with VNNI: the steps' lanes'
        xcor = (irb.alloc_buffer((n, i64(NG + ZL)), F32) if Q4 else
                irb.alloc_buffer((n, i64((NSF + TAIL) * ZL if vnni else 1)), "int32"))
        xs = irb.alloc_buffer((n, i64(NG)), F32)
        quantize_x(x, xq, xa, xcor, xs, n)
        if MR == 1:
            gemv_body(q, sc, xq, xa, xcor, xs, bias, out, n)
        else:
            gemm_body(q, sc, xq, xa, xcor, xs, bias, out, n)
        if N0 < N:
            column_tail(q, sc, xq, xa, xcor, xs, bias, out, n)

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
