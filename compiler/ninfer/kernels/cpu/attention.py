"""CPU causal attention over a paged KV cache, one pass with online softmax.

Rows may come from several sequences (AttentionSpec): row i attends keys 0..pos[i] of
slot seq[i], key j at pool row block_tables[seq[i], j // BS] * BS + j % BS (its heads
where spec.layout puts them: kv.pool_index).

A work item is R query vectors that read the same kv head g: S of g's query heads (S is
the largest divisor of the GQA group up to 4) for M rows. Rows are taken MQ = 16 / S at
a time on AVX-512 hosts (zmm vectors of VW = 16 lanes, 32 registers; elsewhere 8 / S,
VW = 8) while enough are left (prefill) and one at a time for the rest (decode rows), so
that no work is spent on padding rows; items run in parallel, spread over rows, kv heads
and head subgroups. A multi-row tile shares its key loads only when its rows are one
sequence at consecutive positions (a prefill chunk); any other tile (rows of different
sequences in one step) runs its rows one at a time. Every key/value load is shared by
the R queries of an item. Keys are visited in blocks of KEY_BLOCK:

1. scores s[r, j] = (q[r] * scale) . k[j]: head_dim / VW vector FMAs per query and key,
   then a horizontal sum (halving vector adds); keys past a row's causal limit get -1e30
   (exactly 0 after exp).
   Keys are visited a run at a time (U = min(KEY_BLOCK, block size) keys of one block:
   one block-table lookup a run, contiguous in the "heads" and "planes" layouts), and with
   each key the lines of the key K_AHEAD keys on and of the value V_AHEAD keys on are
   prefetched into L2 (the item's first ones before the loop), and those of the key
   NEAR_RUNS runs on into L1: one decode row's item walks a few short runs and was
   latency-bound with the block-ahead L1 prefetch it had before, and L2 alone left the
   loads waiting on L2 (RESULTS sessions 35, 38).
   The pools are best stored in the "planes" layout (spec.layout, kv_formats.KV_LAYOUTS),
   where a kv head's keys are contiguous across consecutive blocks too ("heads": within a
   block; from memory "planes" read 1.11x as fast at 2048 keys, 1.17x at 8192, RESULTS
   session 36);
   token-major rows put a head's keys kv_heads * head_dim values apart, which the hardware
   prefetchers follow badly and which all fall into a few L1 sets (a decode step's
   attention from memory took ~1.5x as long, RESULTS session 31);
2. online softmax: m' = max(m, max_j s), corr = exp(m - m'), p = exp(s - m'),
   l = l * corr + sum(p), acc *= corr;
3. acc[r, :] += sum_j p[r, j] * v[j, :], a few head_dim vectors at a time held in
   registers for all R queries.

The pools may be stored in any KV-cache format (spec.kv_dtype, ninfer.quantize.kv_formats): keys
and values are widened to float32 as they are loaded (kv.load: vcvtph2ps, a shift,
or an integer widening and one scale per group of 32), so steps 1-3 are the same for
every format. Keys stored Hadamard-rotated (int4) meet queries rotated the same way
right after scaling (the rotation's 1/sqrt(P) is folded into the scale).

All state (scaled queries, scores, accumulators) lives in small per-item stack buffers:
no global scratch, nothing sized by the context length. Key and value loads are clamped
to the item's last position, so no key past it is read; positions, slots and block ids
are clamped into their tables, so no index leaves the pool.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ninfer.quantize.kv_formats import KV_GROUP, kv_format

from ..spec import AttentionSpec
from .common import (
    F32,
    f32,
    fast_exp,
    hmax,
    host_has_avx512,
    host_vector_lanes,
    hsum_vector,
    i64,
    prefetch,
    scratch,
)
from .kv import hadamard, line_elems, load, pool_index, storage_width

KEY_BLOCK = 32  # keys per online-softmax step (multiple of the lanes)
MAX_SUBGROUP = 4  # query heads sharing one work item
NEG = -1.0e30  # score of a masked key; fast_exp flushes exp(NEG - m) to 0
# Prefetch distances in keys (multiples of a run: see attend), into L2 (locality 2): at
# one decode row the item's walk is latency-bound, and from memory these read 1.26-1.70x the
# old one-block-ahead L1 prefetch (benchmarks/ab_attention.py, RESULTS session 35)
K_AHEAD = 32  # keys ahead of the scored one whose key lines are prefetched
V_AHEAD = 16  # keys ahead of the scored one whose value lines are prefetched
LOCALITY = 2
# The key and value lines of the key NEAR_RUNS runs (U keys each) ahead also go into L1
# (NEAR_LOCALITY; 0 runs: none): at block size 16, one run ahead read 1.13x as fast from
# memory at 8192 keys, 1.19x at 2048, 1.6-2.3x at 160 as L2 alone on the Intel VM
# (ab_attention.py, session 38; keys 32 ahead with values 16 read slower)
NEAR_RUNS = 1
NEAR_LOCALITY = 3


def attention_lanes() -> int:
    """float32 lanes of the kernel's vectors: 16 on AVX-512 hosts (zmm, 32 registers),
    else 8. Rows stay bitwise independent of the batch within a build either way."""
    return host_vector_lanes()


def _registers() -> int:
    return 32 if host_has_avx512() else 16


def max_queries() -> int:
    """Query vectors per work item: R score accumulators plus the loads fit the registers
    (8 of 16, 16 of 32)."""
    return _registers() // 2


def _subgroup(group: int) -> int:
    """Largest divisor of `group` not above MAX_SUBGROUP."""
    return max(d for d in range(1, min(group, MAX_SUBGROUP) + 1) if group % d == 0)


def _pv_chunk(rows: int, dv: int) -> int:
    """head_dim vectors per step of the p @ v loop: rows * chunk accumulators stay in
    registers (at most 3/4 of them), and the chunk divides the head's vector count."""
    budget = _registers() * 3 // 4
    return max(d for d in range(1, max(1, budget // rows) + 1) if dv % d == 0)


def attention(spec: AttentionSpec) -> tirx.PrimFunc:
    VW = attention_lanes()
    H, KVH, D, C = spec.heads, spec.kv_heads, spec.head_dim, spec.max_ctx
    BS, NSEQ, NBLK, MB = spec.block_size, spec.max_seqs, spec.kv_blocks, spec.blocks_per_seq
    if D % VW:
        raise NotImplementedError(
            f"{spec.name()}: the CPU attention kernel needs head_dim to be a multiple of "
            f"{VW}, got {D}"
        )
    G = spec.group
    S = _subgroup(G)  # query heads per work item
    NS = G // S  # work items per (row, kv head)
    NI = KVH * NS  # work items per row (tile)
    MQ = max_queries() // S  # query rows per work item in the multi-row pass
    DV = D // VW
    B = KEY_BLOCK
    U = min(B, BS)  # keys of a run: one kv head's keys of one block, or KEY_BLOCK of them
    NU = B // U
    if B % U or BS % U:
        raise NotImplementedError(
            f"{spec.name()}: the CPU attention kernel walks runs of min({B}, block size) "
            f"keys and needs the block size to divide or be a multiple of {B}, got {BS}")
    BV = B // VW
    KVD = spec.kv_dtype
    DS = storage_width(KVD, D)  # stored elements per head vector
    LE = line_elems(KVD)
    LINES = -(-DS // LE)  # cache lines per key row
    SCALED = len(spec.pool_args("k_pool")) > 1
    ROT = spec.rotate > 0
    rotate = hadamard(D, spec.rotate) if ROT else None
    # rotated keys: H k is stored with H normalized; the queries get the same rotation,
    # its 1/sqrt(P) folded into the softmax scale
    scale = D**-0.5 * (spec.rotate**-0.5 if ROT else 1.0)

    def phys(bt, s, j):
        """Run of key j of slot s: (block, slot in the block), the block clamped into the
        pool."""
        block = T.max(T.min(T.Cast("int64", bt[s, j // BS]), i64(NBLK - 1)), i64(0))
        return block, j % BS

    def at(run, g):
        """(row, head) indices of the pools' arrays for kv head g of a key's run."""
        return pool_index(spec.layout, KVH, BS, NBLK * BS, run[0], run[1], g)

    def run_of(bt, s, j):
        """(block, first slot) of the run of U keys holding key j of slot s."""
        block, slot = phys(bt, s, j)
        return block, slot // U * U

    def fetch(buf, g, block, slot, line, locality=LOCALITY):
        """Prefetch line `line` of kv head g's vector in (block, slot) into L2 (locality
        2) or L1 (3)."""
        return prefetch(buf, *at((block, slot), g), line * LE, locality=locality)

    @T.macro
    def attend(q, kc, ks, vc, vs, out, pos, seq, bt, i0, g, h0, M):
        # Rows i0..i0+M-1 x heads h0..h0+S-1 (all reading kv head g) = R query vectors,
        # r = row * S + head.
        R = T.meta_var(M * S)
        DC = T.meta_var(_pv_chunk(R, DV))
        qs = scratch((R, D))
        acc = scratch((R, D))
        sc = scratch((R, B))
        dot = scratch((R, VW))
        vec = scratch((R, VW))
        pv = scratch((R, DC * VW))
        m = scratch((R,))
        mnew = scratch((R,))
        lsum = scratch((R,))
        corr = scratch((R,))
        # The rows are one sequence at consecutive positions (or M == 1): the item reads
        # slot s's keys 0..last, and row r's own limit is its position.
        s = T.bind(T.max(T.min(T.Cast("int64", seq[i0]), i64(NSEQ - 1)), i64(0)))
        last = T.bind(T.max(T.min(T.Cast("int64", pos[i0 + (M - 1)]), i64(C - 1)), i64(0)))
        first = T.bind(last - (M - 1))
        for r in range(R):
            m[r] = f32(NEG)
            lsum[r] = f32(0.0)
            for dv in range(DV):
                for v in T.vectorized(VW):
                    qs[r, dv * VW + v] = q[i0 + r // S, h0 + r % S, dv * VW + v] * f32(scale)
                    acc[r, dv * VW + v] = f32(0.0)
            if ROT:
                rotate(qs, r)
        # the first keys and values, which the loop's prefetches do not cover
        for jp in range(K_AHEAD // U):
            kp0 = T.bind(T.min(jp * U, last))
            bp0 = T.bind(run_of(bt, s, kp0)[0])
            sp0 = T.bind(run_of(bt, s, kp0)[1])
            for jj in range(U):
                for line in T.unroll(LINES):
                    T.evaluate(fetch(kc, g, bp0, sp0 + jj, line))
                    if jp * U < V_AHEAD:
                        T.evaluate(fetch(vc, g, bp0, sp0 + jj, line))
        for jb in range((last + B) // B):
            # 1. scores of this key block, one run of U keys (contiguous in the "heads"
            # and "planes" layouts) at a time: the run's block is looked up once
            for u in range(NU):
                kb = T.bind(T.min(jb * B + u * U, last))  # the run's first key, or last
                blk = T.bind(phys(bt, s, kb)[0])
                slot0 = T.bind(kb % BS)
                lim = T.bind(last - kb)  # keys of the run past it read key `last`
                # the runs K_AHEAD (keys) and V_AHEAD (values) keys on, a key's lines
                # with each key (a burst of a run's 64 prefetches stalls the loads)
                kp = T.bind(T.min(jb * B + u * U + K_AHEAD, last))
                bp = T.bind(run_of(bt, s, kp)[0])
                sp = T.bind(run_of(bt, s, kp)[1])
                vp = T.bind(T.min(jb * B + u * U + V_AHEAD, last))
                bv = T.bind(run_of(bt, s, vp)[0])
                sv = T.bind(run_of(bt, s, vp)[1])
                if NEAR_RUNS > 0:  # and the run NEAR_RUNS on, keys and values, into L1
                    kn = T.bind(T.min(jb * B + (u + NEAR_RUNS) * U, last))
                    bn = T.bind(run_of(bt, s, kn)[0])
                    sn = T.bind(run_of(bt, s, kn)[1])
                for jj in range(U):
                    for line in T.unroll(LINES):
                        T.evaluate(fetch(kc, g, bp, sp + jj, line))
                        T.evaluate(fetch(vc, g, bv, sv + jj, line))
                        if NEAR_RUNS > 0:
                            T.evaluate(fetch(kc, g, bn, sn + jj, line, NEAR_LOCALITY))
                            T.evaluate(fetch(vc, g, bn, sn + jj, line, NEAR_LOCALITY))
                    jc = T.bind(at((blk, slot0 + T.min(jj, lim)), g)[0])
                    gc = T.bind(at((blk, slot0 + T.min(jj, lim)), g)[1])
                    for r in T.unroll(R):
                        for v in T.vectorized(VW):
                            dot[r, v] = f32(0.0)
                    for dv in T.unroll(DV):
                        for r in T.unroll(R):
                            for v in T.vectorized(VW):
                                dot[r, v] = dot[r, v] + qs[r, dv * VW + v] * load(
                                    KVD, kc, ks, jc, gc, dv, v, VW)
                    for r in T.unroll(R):
                        sc[r, u * U + jj] = T.Select(
                            jb * B + u * U + jj <= first + r // S,
                            hsum_vector(dot[r, T.ramp(i64(0), 1, VW)], VW), f32(NEG))
            # 2. online softmax update
            for r in range(R):
                for v in T.vectorized(VW):
                    vec[r, v] = sc[r, v]
                for bv in range(1, BV):
                    for v in T.vectorized(VW):
                        vec[r, v] = T.max(vec[r, v], sc[r, bv * VW + v])
                mnew[r] = T.max(m[r], hmax(vec, r, lanes=VW))
                for v in T.vectorized(VW):
                    dot[r, v] = f32(0.0)
                for bv in range(BV):
                    for v in T.vectorized(VW):
                        sc[r, bv * VW + v] = fast_exp(sc[r, bv * VW + v] - mnew[r])
                        dot[r, v] = dot[r, v] + sc[r, bv * VW + v]
                corr[r] = fast_exp(m[r] - mnew[r])
                m[r] = mnew[r]
                lsum[r] = lsum[r] * corr[r] + hsum_vector(dot[r, T.ramp(i64(0), 1, VW)], VW)
            # 3. acc = acc * corr + p @ v, DC head_dim vectors at a time in registers
            for dc in range(DV // DC):
                for r in T.unroll(R):
                    for d in T.unroll(DC):
                        for v in T.vectorized(VW):
                            pv[r, d * VW + v] = acc[r, (dc * DC + d) * VW + v] * corr[r]
                for u in range(NU):
                    kb = T.bind(T.min(jb * B + u * U, last))
                    blk = T.bind(phys(bt, s, kb)[0])
                    slot0 = T.bind(kb % BS)
                    lim = T.bind(last - kb)
                    for jj in range(U):
                        jc = T.bind(at((blk, slot0 + T.min(jj, lim)), g)[0])
                        gc = T.bind(at((blk, slot0 + T.min(jj, lim)), g)[1])
                        for r in T.unroll(R):
                            for d in T.unroll(DC):
                                for v in T.vectorized(VW):
                                    pv[r, d * VW + v] = pv[r, d * VW + v] + sc[
                                        r, u * U + jj] * load(KVD, vc, vs, jc, gc,
                                                              dc * DC + d, v, VW)
                for r in T.unroll(R):
                    for d in T.unroll(DC):
                        for v in T.vectorized(VW):
                            acc[r, (dc * DC + d) * VW + v] = pv[r, d * VW + v]
        for r in range(R):
            corr[r] = f32(1.0) / lsum[r]
            for dv in range(DV):
                for v in T.vectorized(VW):
                    out[i0 + r // S, h0 + r % S, dv * VW + v] = acc[r, dv * VW + v] * corr[r]

    @T.macro
    def run(q, kc, ks, vc, vs, pos, seq, bt, out, n):
        # Multi-row tiles. Later rows see more keys, and the thread pool hands each thread
        # a contiguous range of items, so tiles are taken in zigzag order (first, last,
        # second, second to last, ...) to give every thread a similar amount of work. Each
        # loop runs only where it has items: a parallel loop of none still forks and joins
        # the thread pool (a decode step, whose rows are all left over, paid one per layer).
        if n >= MQ:
            for item in T.parallel(n // MQ * NI):
                u = T.bind(item // NI)
                tile = T.bind(T.Select(u % 2 == 0, u // 2, n // MQ - 1 - u // 2))
                i0 = T.bind(tile * MQ)
                g = T.bind(item % NI // NS)
                h0 = T.bind(item % NI // NS * G + item % NS * S)
                same = scratch((1,), "int32")
                same[0] = 1
                for r in range(1, MQ):
                    if seq[i0 + r] != seq[i0] or pos[i0 + r] != pos[i0] + r:
                        same[0] = 0
                if same[0] == 1:
                    attend(q, kc, ks, vc, vs, out, pos, seq, bt, i0, g, h0, MQ)
                else:
                    for r in range(MQ):
                        attend(q, kc, ks, vc, vs, out, pos, seq, bt, i0 + r, g, h0, 1)
        # Leftover rows (all rows when decoding), one per item.
        if n % MQ > 0:
            for item in T.parallel(n % MQ * NI):
                attend(q, kc, ks, vc, vs, out, pos, seq, bt, n // MQ * MQ + item // NI,
                       item % NI // NS, item % NI // NS * G + item % NS * S, 1)

    pool = (i64(NBLK * BS), i64(KVH), i64(DS))
    spool = (i64(NBLK * BS), i64(KVH), i64(max(1, D // KV_GROUP)))
    store = kv_format(KVD).storage

    if SCALED:

        @T.prim_func(private=True)
        def scaled(q_h: T.handle, k_h: T.handle, ks_h: T.handle, v_h: T.handle,
                   vs_h: T.handle, pos_h: T.handle, seq_h: T.handle, bt_h: T.handle,
                   o_h: T.handle):
            T.func_attr({"tirx.noalias": True})
            n = T.int64()
            q = T.match_buffer(q_h, (n, i64(H), i64(D)), F32)
            kc = T.match_buffer(k_h, pool, store)
            ks = T.match_buffer(ks_h, spool, "float16")
            vc = T.match_buffer(v_h, pool, store)
            vs = T.match_buffer(vs_h, spool, "float16")
            pos = T.match_buffer(pos_h, (n,), "int32")
            seq = T.match_buffer(seq_h, (n,), "int32")
            bt = T.match_buffer(bt_h, (i64(NSEQ), i64(MB)), "int32")
            out = T.match_buffer(o_h, (n, i64(H), i64(D)), F32)
            run(q, kc, ks, vc, vs, pos, seq, bt, out, n)

        return scaled

    @T.prim_func(private=True)
    def kernel(q_h: T.handle, k_h: T.handle, v_h: T.handle, pos_h: T.handle,
               seq_h: T.handle, bt_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        q = T.match_buffer(q_h, (n, i64(H), i64(D)), F32)
        kc = T.match_buffer(k_h, pool, store)
        vc = T.match_buffer(v_h, pool, store)
        pos = T.match_buffer(pos_h, (n,), "int32")
        seq = T.match_buffer(seq_h, (n,), "int32")
        bt = T.match_buffer(bt_h, (i64(NSEQ), i64(MB)), "int32")
        out = T.match_buffer(o_h, (n, i64(H), i64(D)), F32)
        run(q, kc, kc, vc, vc, pos, seq, bt, out, n)

    return kernel
