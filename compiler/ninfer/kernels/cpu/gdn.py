"""CPU Gated DeltaNet kernels over per-sequence state slots (the linear-attention layers of
Qwen3.5 / Qwen3-Next): the causal conv1d (GdnConvSpec) and the recurrence
(GdnRecurrentSpec), its decode form.

A row at position 0 starts a sequence: its slot's carried inputs and state are zeros.

Conv: parallel over channel vectors, rows in order; row t's output is
SiLU(sum_j w[c, j] * in[t - (K - 1) + j]) over its slot's K - 1 carried inputs and x[t], then
the carried inputs shift by one (oldest dropped, x[t] appended).

Both copy the state after row t into slot save[t] when that is >= 0 (the states of a
verify step's draft rows); in the chunked recurrence such a row is a segment of its own.

Gates (GdnGateSpec): softplus(y) = max(y, 0) + log1p(exp(-|y|)) with `common.fast_exp` and
`common.fast_log1p`; sigmoid(b) = 1 / (1 + exp(-b)). Output norm (GdnNormSpec): per value
head o / sqrt(mean(o^2) + eps) * weight * SiLU(z).

Recurrence: parallel over value heads; within a head the rows run in order, so rows of one sequence
(a prefill chunk run token by token, or one decode row) see each other's updates, whatever
sequences the step mixes. Per row t and head h, with its slot's state S [dk, dv] (in place):

    q, k, v from the row's [q | k | v] (the conv's output), g, beta from its [g | beta]
    qn, kn = q, k of key head h // r over their L2 norms (1 / sqrt(sum + 1e-6)), qn * dk^-1/2
    S *= exp(g); mem = S^T kn          (one pass over S)
    delta = (v - mem) * beta
    S += kn delta^T; out = S^T qn      (a second pass)

vectorized along dv. exp is `common.fast_exp` (no libm call); slots are clamped into the
pool. The float64 reference is `reference.gdn_recurrent` (gdn_reference.delta_rule_recurrent
row by row).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..spec import GdnConvSpec, GdnGateSpec, GdnNormSpec, GdnRecurrentSpec
from ..spec_hybrid import GDN_CHUNK_MIN_ROWS
from .common import (
    F32,
    VECTOR_LANES,
    f32,
    fast_exp,
    fast_log1p,
    for_rows,
    i64,
    scratch,
    serial_rows,
)

VW = VECTOR_LANES
EPS_L2 = 1e-6
RB = 4  # rows of a register tile in the chunked form's products with the state
MAX_CHUNK_SCRATCH = 512 << 10  # bytes of stack the chunked form may use per head


def gdn_recurrent(spec: GdnRecurrentSpec) -> tirx.PrimFunc:
    HK, HV, DK, DV, NSEQ = spec.k_heads, spec.v_heads, spec.k_dim, spec.v_dim, spec.max_seqs
    if DV % VW:
        raise NotImplementedError(f"{spec.name()}: the CPU GDN kernel needs v_dim to be a "
                                  f"multiple of {VW}, got {DV}")
    CH = spec.chunk
    if CH > 1 and DK % RB:
        raise NotImplementedError(f"{spec.name()}: the chunked form needs k_dim to be a "
                                  f"multiple of {RB}, got {DK}")
    if CH > 1 and 4 * (3 * CH * DK + 2 * CH * DV + 2 * CH * CH) > MAX_CHUNK_SCRATCH:
        raise NotImplementedError(f"{spec.name()}: a chunk of {CH} rows needs more than "
                                  f"{MAX_CHUNK_SCRATCH >> 10} KiB of stack per head; compile "
                                  "with a smaller chunk")
    R = HV // HK
    NV = DV // VW
    JW = 2 * VW if DV % (2 * VW) == 0 else VW  # output columns per register tile
    NJ = DV // JW
    NCV = CH // VW  # vectors of a row of chunk columns
    C = spec.channels
    KO, VO = HK * DK, 2 * HK * DK  # where k and v start in a qkv row
    SCALE = DK ** -0.5
    CMIN = GDN_CHUNK_MIN_ROWS

    def clamp_slot(slot, t):
        return T.max(T.min(T.Cast("int64", slot[t]), i64(NSEQ - 1)), i64(0))

    @T.macro
    def l2_scales(qkv, t, q0, k0, ss):
        # ss[0], ss[1] = the scales of row t's q (with dk^-1/2) and k to unit L2 norm
        ss[0] = f32(0.0)
        ss[1] = f32(0.0)
        for d in range(DK):
            ss[0] = ss[0] + qkv[t, q0 + d] * qkv[t, q0 + d]
            ss[1] = ss[1] + qkv[t, k0 + d] * qkv[t, k0 + d]
        ss[0] = f32(SCALE) / T.sqrt(ss[0] + f32(EPS_L2))
        ss[1] = f32(1.0) / T.sqrt(ss[1] + f32(EPS_L2))

    @T.macro
    def one_row(qkv, gb, pos, slot, state, out, h, t, qn, kn, mem, delta, ss):
        s = T.bind(clamp_slot(slot, t))
        if pos[t] == 0:  # a new sequence
            for d in range(DK):
                for x in T.vectorized(DV):
                    state[s, h, d, x] = f32(0.0)
        q0 = T.bind(h // R * DK)
        k0 = T.bind(KO + h // R * DK)
        v0 = T.bind(VO + h * DV)
        l2_scales(qkv, t, q0, k0, ss)
        iq = T.bind(ss[0])
        ik = T.bind(ss[1])
        for d in range(DK):
            qn[d] = qkv[t, q0 + d] * iq
            kn[d] = qkv[t, k0 + d] * ik
        decay = T.bind(fast_exp(gb[t, h]))
        for j in range(NV):
            for x in T.vectorized(VW):
                mem[j * VW + x] = f32(0.0)
        for d in range(DK):
            for j in range(NV):
                for x in T.vectorized(VW):
                    state[s, h, d, j * VW + x] = state[s, h, d, j * VW + x] * decay
                    mem[j * VW + x] = mem[j * VW + x] + state[s, h, d, j * VW + x] * kn[d]
        for j in range(NV):
            for x in T.vectorized(VW):
                delta[j * VW + x] = ((qkv[t, v0 + j * VW + x] - mem[j * VW + x])
                                     * gb[t, HV + h])
                mem[j * VW + x] = f32(0.0)
        for d in range(DK):
            for j in range(NV):
                for x in T.vectorized(VW):
                    state[s, h, d, j * VW + x] = (state[s, h, d, j * VW + x]
                                                  + kn[d] * delta[j * VW + x])
                    mem[j * VW + x] = mem[j * VW + x] + state[s, h, d, j * VW + x] * qn[d]
        for j in range(NV):
            for x in T.vectorized(VW):
                out[t, h, j * VW + x] = mem[j * VW + x]

    @T.macro
    def rows_times_state(state, s, h, A, ib, jb, tile):
        # tile = rows ib * RB .. ib * RB + RB - 1 of A times columns jb * JW .. of the
        # state: RB x JW accumulators in registers, each state row loaded once
        for r in T.unroll(RB):
            for x in T.vectorized(JW):
                tile[r, x] = f32(0.0)
        for d in range(DK):
            for r in T.unroll(RB):
                for x in T.vectorized(JW):
                    tile[r, x] = tile[r, x] + A[(ib * RB + r) * DK + d] * state[s, h, d,
                                                                                jb * JW + x]

    @T.macro
    def chunk_rows(qkv, gb, pos, slot, state, out, h, t0, L, Qc, Kc, KT, Dc, Ac, Pc, Gc, eG,
                   Bt, acc, tile, ss):
        # Rows t0 .. t0 + L - 1: one sequence at consecutive positions, L <= CH. With the
        # cumulative log-decay G (from the segment's start), beta b and S the state before
        # the segment:
        #   Y = b * (V - e^G * (K S))                            (Dc, [CH, DV])
        #   A[i, j] = b_i e^(G_i - G_j) k_i . k_j  (j < i);  D = (I + A)^-1 Y
        #   out = e^G * (Q S) + (Q K^T * e^(G_i - G_j), j <= i) D
        #   S' = e^(G_L-1) S + (e^(G_L-1 - G) * K)^T D
        # Rows L..CH-1 of the tiles are zeros (b = 0), so they add nothing.
        s = T.bind(clamp_slot(slot, t0))
        if pos[t0] == 0:  # a new sequence (only a segment's first row can be at 0)
            for d in range(DK):
                for x in T.vectorized(DV):
                    state[s, h, d, x] = f32(0.0)
        q0 = T.bind(h // R * DK)
        k0 = T.bind(KO + h // R * DK)
        v0 = T.bind(VO + h * DV)
        ss[2] = f32(0.0)  # running sum of g
        for i in range(i64(CH)):
            if i < L:
                t = T.bind(t0 + i)
                l2_scales(qkv, t, q0, k0, ss)
                iq = T.bind(ss[0])
                ik = T.bind(ss[1])
                for d in range(DK):
                    Qc[i * DK + d] = qkv[t, q0 + d] * iq
                    Kc[i * DK + d] = qkv[t, k0 + d] * ik
                    KT[d * CH + i] = Kc[i * DK + d]
                for x in T.vectorized(DV):
                    Dc[i * DV + x] = qkv[t, v0 + x]
                ss[2] = ss[2] + gb[t, h]
                Gc[i] = ss[2]
                eG[i] = fast_exp(ss[2])
                Bt[i] = gb[t, HV + h]
            else:
                for d in range(DK):
                    Qc[i * DK + d] = f32(0.0)
                    Kc[i * DK + d] = f32(0.0)
                    KT[d * CH + i] = f32(0.0)
                for x in T.vectorized(DV):
                    Dc[i * DV + x] = f32(0.0)
                Gc[i] = ss[2]
                eG[i] = f32(0.0)
                Bt[i] = f32(0.0)
        # 1. Y = b * (V - e^G * (K S)), into Dc
        for ib in range((L + RB - 1) // RB):
            for jb in range(NJ):
                rows_times_state(state, s, h, Kc, ib, jb, tile)
                for r in T.unroll(RB):
                    for x in T.vectorized(JW):
                        Dc[(ib * RB + r) * DV + jb * JW + x] = Bt[ib * RB + r] * (
                            Dc[(ib * RB + r) * DV + jb * JW + x]
                            - eG[ib * RB + r] * tile[r, x])
        # 2. A (strictly lower) and P = Q K^T with the decay (lower, diagonal included),
        # a whole row of CH key columns of K^T in registers
        for i in range(L):
            for jv in T.unroll(NCV):
                for x in T.vectorized(VW):
                    acc[jv, x] = f32(0.0)
                    acc[NCV + jv, x] = f32(0.0)
            for d in range(DK):
                for jv in T.unroll(NCV):
                    for x in T.vectorized(VW):
                        acc[jv, x] = acc[jv, x] + Kc[i * DK + d] * KT[d * CH + jv * VW + x]
                        acc[NCV + jv, x] = (acc[NCV + jv, x]
                                            + Qc[i * DK + d] * KT[d * CH + jv * VW + x])
            for jv in T.unroll(NCV):
                for x in T.vectorized(VW):
                    Ac[i * CH + jv * VW + x] = T.Select(
                        T.Cast("int64", jv * VW + x) < i,
                        Bt[i] * fast_exp(T.min(Gc[i] - Gc[jv * VW + x], f32(0.0))) * acc[jv, x],
                        f32(0.0))
                    Pc[i * CH + jv * VW + x] = T.Select(
                        T.Cast("int64", jv * VW + x) <= i,
                        fast_exp(T.min(Gc[i] - Gc[jv * VW + x], f32(0.0))) * acc[NCV + jv, x],
                        f32(0.0))
        # 3. D = (I + A)^-1 Y by forward substitution, in place, JW columns at a time
        for jb in range(NJ):
            for i in range(1, L):
                for x in T.vectorized(JW):
                    tile[0, x] = Dc[i * DV + jb * JW + x]
                for j in range(i):
                    for x in T.vectorized(JW):
                        tile[0, x] = tile[0, x] - Ac[i * CH + j] * Dc[j * DV + jb * JW + x]
                for x in T.vectorized(JW):
                    Dc[i * DV + jb * JW + x] = tile[0, x]
        # 4. out = e^G * (Q S) + P D, RB rows x JW columns at a time (P is 0 above the
        # diagonal, so a tile's rows all run to its last row's diagonal)
        for ib in range((L + RB - 1) // RB):
            for jb in range(NJ):
                rows_times_state(state, s, h, Qc, ib, jb, tile)
                for r in T.unroll(RB):
                    for x in T.vectorized(JW):
                        tile[r, x] = tile[r, x] * eG[ib * RB + r]
                for j in range(T.min(ib * RB + RB, L)):
                    for r in T.unroll(RB):
                        for x in T.vectorized(JW):
                            tile[r, x] = tile[r, x] + Pc[(ib * RB + r) * CH + j] * Dc[
                                j * DV + jb * JW + x]
                for r in T.unroll(RB):
                    if ib * RB + r < L:
                        for x in T.vectorized(JW):
                            out[t0 + ib * RB + r, h, jb * JW + x] = tile[r, x]
        # 5. the state: the keys scaled by their decay to the segment's end
        last = T.bind(Gc[L - 1])
        for d in range(DK):
            for i in range(L):
                KT[d * CH + i] = KT[d * CH + i] * fast_exp(last - Gc[i])
        for db in range(DK // RB):
            for jb in range(NJ):
                for r in T.unroll(RB):
                    for x in T.vectorized(JW):
                        tile[r, x] = state[s, h, db * RB + r, jb * JW + x] * eG[L - 1]
                for i in range(L):
                    for r in T.unroll(RB):
                        for x in T.vectorized(JW):
                            tile[r, x] = (tile[r, x] + KT[(db * RB + r) * CH + i]
                                          * Dc[i * DV + jb * JW + x])
                for r in T.unroll(RB):
                    for x in T.vectorized(JW):
                        state[s, h, db * RB + r, jb * JW + x] = tile[r, x]

    @T.macro
    def save_state(slot, save, state, h, t):
        # a copy of the state after row t into slot save[t] (when >= 0)
        if save[t] >= 0:
            s = T.bind(clamp_slot(slot, t))
            sv = T.bind(clamp_slot(save, t))
            for d in range(DK):
                for x in T.vectorized(DV):
                    state[sv, h, d, x] = state[s, h, d, x]

    @T.prim_func(private=True)
    def kernel(qkv_h: T.handle, gb_h: T.handle, p_h: T.handle, s_h: T.handle,
               sv_h: T.handle, st_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        qkv = T.match_buffer(qkv_h, (n, i64(C)), F32)
        gb = T.match_buffer(gb_h, (n, i64(2 * HV)), F32)
        pos = T.match_buffer(p_h, (n,), "int32")
        slot = T.match_buffer(s_h, (n,), "int32")
        save = T.match_buffer(sv_h, (n,), "int32")
        state = T.match_buffer(st_h, (i64(NSEQ), i64(HV), i64(DK), i64(DV)), F32)
        out = T.match_buffer(o_h, (n, i64(HV), i64(DV)), F32)
        for h in T.parallel(HV):
            qn = scratch((DK,))
            kn = scratch((DK,))
            mem = scratch((DV,))
            delta = scratch((DV,))
            ss = scratch((3,))
            if CH == 1:
                for t in range(n):
                    one_row(qkv, gb, pos, slot, state, out, h, t, qn, kn, mem, delta, ss)
                    save_state(slot, save, state, h, t)
            else:
                Qc = scratch((CH * DK,))
                Kc = scratch((CH * DK,))
                KT = scratch((DK * CH,))
                Dc = scratch((CH * DV,))
                Ac = scratch((CH * CH,))
                Pc = scratch((CH * CH,))
                Gc = scratch((CH,))
                eG = scratch((CH,))
                Bt = scratch((CH,))
                acc = scratch((2 * NCV, VW))
                tile = scratch((RB, JW))
                seg = scratch((2,), "int64")  # the segment's first row, its length
                seg[0] = i64(0)
                while seg[0] < n:
                    t0 = T.bind(seg[0])
                    seg[1] = i64(1)
                    # the segment runs while the rows stay one sequence at consecutive
                    # positions, up to the next multiple of CH; a row whose state is saved
                    # is a segment of its own
                    while (seg[1] < i64(CH) and t0 + seg[1] < n and save[t0] < 0
                           and save[T.min(t0 + seg[1], n - 1)] < 0
                           and slot[T.min(t0 + seg[1], n - 1)] == slot[t0]
                           and pos[T.min(t0 + seg[1], n - 1)] == pos[t0] + T.Cast("int32",
                                                                                  seg[1])
                           and pos[T.min(t0 + seg[1], n - 1)] % CH != 0):
                        seg[1] = seg[1] + i64(1)
                    L = T.bind(seg[1])
                    if L >= CMIN:
                        chunk_rows(qkv, gb, pos, slot, state, out, h, t0, L, Qc, Kc, KT, Dc,
                                   Ac, Pc, Gc, eG, Bt, acc, tile, ss)
                    else:
                        for t in range(t0, t0 + L):
                            one_row(qkv, gb, pos, slot, state, out, h, t, qn, kn, mem, delta,
                                    ss)
                    save_state(slot, save, state, h, t0)  # a saved row: alone
                    seg[0] = t0 + L

    return kernel


def gdn_conv(spec: GdnConvSpec) -> tirx.PrimFunc:
    C, K, NSEQ = spec.channels, spec.kernel, spec.max_seqs
    NVC = C // VW  # whole channel vectors; the C % VW last channels run one at a time
    TASKS = NVC + (1 if C % VW else 0)

    @T.macro
    def row(x, w, pos, state, out, s, t, c0, L):
        acc = scratch((VW,))
        if pos[t] == 0:  # a new sequence: nothing before it
            for j in range(K - 1):
                for v in T.vectorized(L):
                    state[s, j, c0 + v] = f32(0.0)
        for v in T.vectorized(L):
            acc[v] = w[c0 + v, K - 1] * x[t, c0 + v]
        for j in range(K - 1):
            for v in T.vectorized(L):
                acc[v] = acc[v] + w[c0 + v, j] * state[s, j, c0 + v]
        for v in T.vectorized(L):
            out[t, c0 + v] = acc[v] / (f32(1.0) + fast_exp(f32(0.0) - acc[v]))
        for j in range(K - 2):
            for v in T.vectorized(L):
                state[s, j, c0 + v] = state[s, j + 1, c0 + v]
        for v in T.vectorized(L):
            state[s, K - 2, c0 + v] = x[t, c0 + v]

    @T.macro
    def save_row(state, s, sv, c0, L):
        for j in range(K - 1):
            for v in T.vectorized(L):
                state[sv, j, c0 + v] = state[s, j, c0 + v]

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, w_h: T.handle, p_h: T.handle, s_h: T.handle, sv_h: T.handle,
               st_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(C)), F32)
        w = T.match_buffer(w_h, (i64(C), i64(K)), F32)
        pos = T.match_buffer(p_h, (n,), "int32")
        slot = T.match_buffer(s_h, (n,), "int32")
        save = T.match_buffer(sv_h, (n,), "int32")
        state = T.match_buffer(st_h, (i64(NSEQ), i64(K - 1), i64(C)), F32)
        out = T.match_buffer(o_h, (n, i64(C)), F32)
        for cv in T.parallel(TASKS):
            for t in range(n):
                s = T.bind(T.max(T.min(T.Cast("int64", slot[t]), i64(NSEQ - 1)), i64(0)))
                sv = T.bind(T.min(T.Cast("int64", save[t]), i64(NSEQ - 1)))
                if cv < NVC:
                    row(x, w, pos, state, out, s, t, cv * VW, VW)
                    if sv >= 0:
                        save_row(state, s, sv, cv * VW, VW)
                else:
                    for c in range(NVC * VW, C):
                        row(x, w, pos, state, out, s, t, c, 1)
                        if sv >= 0:
                            save_row(state, s, sv, c, 1)

    return kernel


def gdn_gate(spec: GdnGateSpec) -> tirx.PrimFunc:
    H = spec.v_heads
    SERIAL = serial_rows(16 * H)

    @T.macro
    def row(bufs, i):
        ba, A_log, dt_bias, out = bufs
        for h in range(H):
            y = T.bind(ba[i, H + h] + dt_bias[h])
            sp = T.bind(T.max(y, f32(0.0)) + fast_log1p(fast_exp(f32(0.0) - T.fabs(y))))
            out[i, h] = f32(0.0) - fast_exp(A_log[h]) * sp
            out[i, H + h] = f32(1.0) / (f32(1.0) + fast_exp(f32(0.0) - ba[i, h]))

    @T.prim_func(private=True)
    def kernel(ba_h: T.handle, al_h: T.handle, dt_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        ba = T.match_buffer(ba_h, (n, i64(2 * H)), F32)
        A_log = T.match_buffer(al_h, (i64(H),), F32)
        dt_bias = T.match_buffer(dt_h, (i64(H),), F32)
        out = T.match_buffer(o_h, (n, i64(2 * H)), F32)
        for_rows(n, SERIAL, row, (ba, A_log, dt_bias, out))

    return kernel


def gdn_norm(spec: GdnNormSpec) -> tirx.PrimFunc:
    H, D, EPS = spec.v_heads, spec.v_dim, spec.eps
    SERIAL = serial_rows(12 * D)  # (row, head) pairs

    @T.macro
    def head(bufs, t):
        o, z, w, out = bufs
        i = T.bind(t // H)
        c0 = T.bind(t % H * D)
        ss = scratch((1,))
        ss[0] = f32(0.0)
        for d in range(D):
            ss[0] = ss[0] + o[i, c0 + d] * o[i, c0 + d]
        r = T.bind(f32(1.0) / T.sqrt(ss[0] / f32(D) + f32(EPS)))
        for d in T.vectorized(D):
            out[i, c0 + d] = o[i, c0 + d] * r * w[d] * (
                z[i, c0 + d] / (f32(1.0) + fast_exp(f32(0.0) - z[i, c0 + d])))

    @T.prim_func(private=True)
    def kernel(o_h: T.handle, z_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        o = T.match_buffer(o_h, (n, i64(H * D)), F32)
        z = T.match_buffer(z_h, (n, i64(H * D)), F32)
        w = T.match_buffer(w_h, (i64(D),), F32)
        out = T.match_buffer(out_h, (n, i64(H * D)), F32)
        for_rows(n * H, SERIAL, head, (o, z, w, out))

    return kernel
