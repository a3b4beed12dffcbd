"""Step 1 of the group-quantized CPU matmul (qmatmul.py): its activations rounded to int8.

Before the matmul's parallel loop (gemv: serially on the calling thread, cheaper than
another parallel launch; gemm: parallel over rows) every row of x is cut into the weights'
groups of G and rounded to int8 with one float32 scale dx = max|x| / 127 per group (numpy
model: `quant.quantize_activations`), into workspace buffers, in the order the weights'
bytes are stored: q4 stores the int8 values of every 128-long chunk of k evens first, then
odds (a 64-long last chunk: 32 and 32), to line up with the low and high nibbles of 64
weight bytes; in the "lanes" layout (quantize.weight_formats.lanes_order) each whole block
of 16 groups (q4g128: 8) is ordered as its weights, group g in lane g of every step (and
lane g + 8 with 8 groups; q4: each step's evens, then odds). With them, what the dots
need: q4, per group, c_g = -8 x the sum of its rounded x (the nibbles' offset, float32);
q8 with VNNI, per lane, -128 x the sums of its 4 x (vpdpbusd's unsigned weights, int32;
per whole lanes block one vector of the groups' sums at the block's first step); q8
without VNNI, |xq| for vpsignb.

`QShape` holds the constants of one kernel that both files derive their loops from.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ninfer.quantize.weight_formats import LANES_BLOCK_BYTES, check_k, format_info

from ..spec import MatmulSpec
from .common import f32, hmax, hsum_vector, scratch
from .intdot import BYTES, LANES, ZL, bcast, dpbusd, maddubs, maddwd, use_vnni, use_zmm, vec

UNIT = 64  # weight bytes per 512-bit vector
# k values per block whose lane sums are added into out (multiple of every group size).
K_BLOCK = 1024


@dataclass(frozen=True)
class QShape:
    """One quantized matmul's sizes and the instruction paths of this host (qmatmul.py's
    steps: a step is one 512-bit vector of weight bytes, or G / 128 of them)."""

    k: int
    n_out: int
    group: int  # G
    q4: bool
    lanes: bool  # the "lanes" layout (q8g32, q4g64, q4g128)
    vnni: bool  # vpdpbusd (use_vnni)
    zmm: bool  # on 512-bit vectors (VNNI and use_zmm)

    @classmethod
    def of(cls, spec: MatmulSpec) -> QShape:
        info = format_info(spec.wdtype)
        if not info.quantized or info.bits not in (4, 8):
            raise ValueError(f"cpu_qmatmul: {spec.wdtype} is not a group-quantized format")
        check_k(spec.wdtype, spec.k)
        g, q4 = info.group, info.bits == 4
        if q4 and g % 64:
            raise ValueError(f"cpu_qmatmul: q4 groups must be multiples of 64, got {g}")
        if not q4 and g != BYTES:
            raise ValueError(f"cpu_qmatmul: q8 groups must be {BYTES} long, got {g}")
        lanes = spec.layout == "lanes"
        if spec.layout not in ("rows", "lanes") or (lanes and g not in ((64, 128) if q4
                                                                        else (BYTES,))):
            raise ValueError(f"cpu_qmatmul: no kernel for {spec.wdtype} in the "
                             f"{spec.layout!r} layout (rows; lanes for q8g32, q4g64, q4g128)")
        vnni = use_vnni()
        shape = cls(spec.k, spec.n_out, g, q4, lanes, vnni, vnni and use_zmm())
        assert not lanes or shape.spb % shape.bsteps == 0  # k blocks hold whole lanes blocks
        return shape

    @property
    def ng(self) -> int:  # groups per row
        return self.k // self.group

    @property
    def bg(self) -> int:  # groups per lanes block (16 of 32 bytes or 8 of 64)
        return LANES_BLOCK_BYTES * 8 // (self.group * (4 if self.q4 else 8))

    @property
    def nblk(self) -> int:  # whole lanes blocks a row (0 by rows)
        return self.ng // self.bg if self.lanes else 0

    @property
    def kq(self) -> int:  # bytes of q per row
        return self.k // 2 if self.q4 else self.k

    @property
    def ku(self) -> int:  # k per weight vector of UNIT bytes
        return 128 if self.q4 else 64

    @property
    def bsteps(self) -> int:  # steps per block of the lanes layout (8)
        return LANES_BLOCK_BYTES // UNIT

    @property
    def gps(self) -> int:  # groups per step (2 or 1)
        return max(1, self.ku // self.group)

    @property
    def ups(self) -> int:  # weight vectors per step
        return max(1, self.group // self.ku)

    @property
    def nsf(self) -> int:  # full steps per row
        return self.ng // self.gps

    @property
    def tail(self) -> int:  # 1: a last step of one group
        return self.ng % self.gps

    @property
    def spb(self) -> int:  # steps per full k block
        return K_BLOCK // self.group // self.gps

    @property
    def nkbf(self) -> int:  # full k blocks
        return self.nsf // self.spb

    @property
    def rem(self) -> int:  # full steps of the last, partial k block (with the tail step)
        return self.nsf % self.spb

    @property
    def absx(self) -> bool:  # q8 without VNNI: the vpsignb path, |x| kept
        return not self.q4 and not self.vnni


def x_quantizer(sh: QShape, parallel: bool):  # -> a TVMScript macro
    """The macro quantize_x(x, xq, xa, xcor, xs, n) of a kernel of shape `sh`: rows of x
    into xq, their dx per group into xs, the corrections into xcor (q4: [n, NG + ZL]
    float32; q8 with VNNI: [n, (NSF + TAIL) * ZL] int32) or |xq| into xa (q8 without
    VNNI); `parallel` over rows (the gemm) or serially (the gemv)."""
    K, G, Q4, vnni = sh.k, sh.group, sh.q4, sh.vnni
    NG, NBLK, BG, BSTEPS = sh.ng, sh.nblk, sh.bg, sh.bsteps
    NSF, TAIL, ABSX = sh.nsf, sh.tail, sh.absx
    zero8 = tirx.Broadcast(tirx.const(0, "int32"), LANES)
    ones_u8 = tirx.Broadcast(tirx.const(1, "uint8"), BYTES)

    def sum4(xv: tirx.PrimExpr) -> tirx.PrimExpr:
        """int32x8: sums of 4 adjacent int8 of a 32-byte x vector."""
        if vnni:
            return dpbusd(zero8, ones_u8, xv)
        return maddwd(maddubs(ones_u8, xv))

    def group_sums(xq, i, g):
        """int32x8 whose lanes sum to the sum of q4 group g's rounded x (in xq's order)."""
        if G == 64:  # half of a 128 chunk: its evens, then its odds
            base = g // 2 * 128 + g % 2 * BYTES
            return sum4(xq[i, vec(base, BYTES)]) + sum4(xq[i, vec(base + 64, BYTES)])
        total = sum4(xq[i, vec(g * G, BYTES)])
        for t in range(1, G // BYTES):
            total = total + sum4(xq[i, vec(g * G + t * BYTES, BYTES)])
        return total

    def lane_sums(xq, i, b, h):
        """int32x8: lane m is the sum of the rounded x in lane 8 h + m of whole lanes block
        b, all its steps (xq in the lanes order: each step's bytes 4 m.. of half h): group
        16 b + 8 h + m's sum (8 groups a block: half of group 8 b + m's)."""
        total = None
        for jj in range(BSTEPS):
            base = (b * BSTEPS + jj) * (128 if Q4 else UNIT) + h * BYTES
            part = sum4(xq[i, vec(base, BYTES)])
            if Q4:  # the step's evens, then its odds
                part = part + sum4(xq[i, vec(base + 64, BYTES)])
            total = part if total is None else total + part
        return total

    evens = [tirx.IntImm("int32", 2 * v) for v in range(LANES)]
    odds = [tirx.IntImm("int32", 2 * v + 1) for v in range(LANES)]
    evens4, odds4 = evens[:4], odds[:4]

    @T.macro
    def deinterleave(x, xq, inv, i, k0, p0, W):
        # q4: x[i, k0 : k0 + 16] rounded with its group's 127 / max|x|, evens to xq[i, p0:]
        # and odds to xq[i, p0 + W:] (vector loads and shuffles, not a strided gather)
        xv = T.bind(x[i, vec(k0, 2 * LANES)])
        m = T.bind(bcast(inv[k0 // G], LANES))
        xq[i, vec(p0, LANES)] = T.Cast("int8x8", T.nearbyint(tirx.Shuffle([xv], evens) * m))
        xq[i, vec(p0 + W, LANES)] = T.Cast("int8x8", T.nearbyint(tirx.Shuffle([xv], odds) * m))

    @T.macro
    def quantize_row(x, xq, xa, xcor, xs, i):
        # row i of x -> xq (q4: chunks of 128 as evens, odds), dx per group (xs),
        # the lanes' corrections (xcor) or |xq| (xa)
        inv = scratch((NG,))
        for g in range(NG):
            m8 = scratch((LANES,))
            for v in T.vectorized(LANES):
                m8[v] = f32(0.0)
            for t in range(G // LANES):
                for v in T.vectorized(LANES):
                    m8[v] = T.max(m8[v], T.fabs(x[i, g * G + t * LANES + v]))
            amax = T.bind(hmax(m8))
            xs[i, g] = amax / f32(127.0)
            inv[g] = T.if_then_else(amax > f32(0.0), f32(127.0) / amax, f32(0.0))
        if Q4:
            # lanes layout: group g = BG b + m of a whole block, k = G g + 64 h + 8 j +
            # (0..7) (h < G / 64, the group's lane m + BG h): its 4 evens at
            # 1024 b + 128 j + 4 (m + BG h), its 4 odds 64 after (as the weights' bytes,
            # quantize.weight_formats.lanes_order)
            for g in range(NBLK * BG):
                for h in T.unroll(G // 64):
                    for jj in range(BSTEPS):
                        xv4 = T.bind(x[i, vec(g * G + h * 64 + jj * 8, 8)])
                        m4 = T.bind(bcast(inv[g], 4))
                        p4 = T.bind(g // BG * (BG * G) + jj * 128 + (g % BG + BG * h) * 4)
                        xq[i, vec(p4, 4)] = T.Cast(
                            "int8x4", T.nearbyint(tirx.Shuffle([xv4], evens4) * m4))
                        xq[i, vec(p4 + 64, 4)] = T.Cast(
                            "int8x4", T.nearbyint(tirx.Shuffle([xv4], odds4) * m4))
            for c in range(NBLK * BSTEPS, K // 128):
                for t in T.unroll(64 // LANES):
                    deinterleave(x, xq, inv, i, c * 128 + t * 2 * LANES, c * 128 + t * LANES, 64)
            if K % 128 > 0:
                for t in T.unroll(BYTES // LANES):
                    deinterleave(x, xq, inv, i, K - 64 + t * 2 * LANES, K - 64 + t * LANES, BYTES)
        else:
            # lanes layout: group g = 16 b + l of a whole block, k = 32 g + 4 j + t, at
            # 512 b + 64 j + 4 l + t (as the weights: quantize.weight_formats.lanes_order)
            for g in range(NBLK * BG):
                for jj in range(G // 4):
                    for v in T.vectorized(4):
                        xq[i, g // BG * (BG * G) + jj * UNIT + g % BG * 4 + v] = T.Cast(
                            "int8", T.nearbyint(x[i, g * G + jj * 4 + v] * inv[g]))
            for g in range(NBLK * BG, NG):
                for t in range(G // LANES):
                    for v in T.vectorized(LANES):
                        xq[i, g * G + t * LANES + v] = T.Cast(
                            "int8", T.nearbyint(x[i, g * G + t * LANES + v] * inv[g]))
            if ABSX:
                for t in range(K // LANES):
                    for v in T.vectorized(LANES):
                        xa[i, t * LANES + v] = T.Cast("int8", T.abs(xq[i, t * LANES + v]))
        if Q4:
            # per group: the correction c_g of the nibbles' offset (step 2), an exact integer
            # as float32; ZL zeros after the last (a k block's last vector of them may run
            # past NG)
            for v in T.vectorized(ZL):
                xcor[i, NG + v] = f32(0.0)
            for b in range(NBLK):  # a whole lanes block: its groups' sums from the lanes
                if BG == 2 * LANES:
                    for h in T.unroll(2):
                        xcor[i, vec(b * BG + h * LANES, LANES)] = bcast(f32(-8.0), LANES) * (
                            T.Cast("float32x8", lane_sums(xq, i, b, h)))
                else:  # group m in lanes m and m + 8
                    xcor[i, vec(b * BG, LANES)] = bcast(f32(-8.0), LANES) * T.Cast(
                        "float32x8", lane_sums(xq, i, b, 0) + lane_sums(xq, i, b, 1))
            for g in range(NBLK * BG, NG - TAIL):
                xcor[i, g] = f32(-8.0) * hsum_vector(
                    T.Cast("float32x8", group_sums(xq, i, g)), LANES)
            if TAIL > 0:  # the last 64 of k: evens, then odds
                xcor[i, NG - 1] = f32(-8.0) * hsum_vector(T.Cast(
                    "float32x8", sum4(xq[i, vec(K - 64, BYTES)]) + sum4(xq[i, vec(
                        K - BYTES, BYTES)])), LANES)
        elif vnni:
            # q8, per whole lanes block: its groups' corrections of q + 128 (-128 x the
            # sums of their x), at the block's first step's place
            for b in range(NBLK):
                for h in T.unroll(2):
                    xcor[i, vec(b * BSTEPS * ZL + h * LANES, LANES)] = zero8 - tirx.shift_left(
                        lane_sums(xq, i, b, h), bcast(tirx.const(7, "int32"), LANES))
            # per step after them: the lanes' corrections of q + 128
            for s in range(NBLK * BSTEPS, NSF):
                for h in range(2):
                    xcor[i, vec(s * ZL + h * LANES, LANES)] = zero8 - tirx.shift_left(
                        sum4(xq[i, vec(s * UNIT + h * BYTES, BYTES)]),
                        bcast(tirx.const(7, "int32"), LANES))
            if TAIL > 0:
                xcor[i, vec(NSF * ZL, LANES)] = zero8 - tirx.shift_left(
                    sum4(xq[i, vec(K - BYTES, BYTES)]), bcast(tirx.const(7, "int32"), LANES))
                for v in T.vectorized(LANES):
                    xcor[i, NSF * ZL + LANES + v] = 0

    @T.macro
    def quantize_x(x, xq, xa, xcor, xs, n):
        # Before the matmul's parallel loop. gemv (a few rows): serially on the calling
        # thread, which is cheaper than another parallel launch; gemm: parallel over rows.
        if parallel:
            for i in T.parallel(n):
                quantize_row(x, xq, xa, xcor, xs, i)
        else:
            for i in range(n):
                quantize_row(x, xq, xa, xcor, xs, i)

    return quantize_x
