"""CPU Gated DeltaNet kernels over per-sequence state slots (the linear-attention layers of
Qwen3.5 / Qwen3-Next): the causal conv1d (GdnConvSpec) and the recurrence
(GdnRecurrentSpec), its decode form.

A row at position 0 starts a sequence: its slot's carried inputs and state are zeros.

Conv: parallel over channel vectors, rows in order; row t's output is
SiLU(sum_j w[c, j] * in[t - (K - 1) + j]) over its slot's K - 1 carried inputs and x[t], then
the carried inputs shift by one (oldest dropped, x[t] appended).

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
from .common import F32, VECTOR_LANES, f32, fast_exp, fast_log1p, i64, scratch

VW = VECTOR_LANES
EPS_L2 = 1e-6


def gdn_recurrent(spec: GdnRecurrentSpec) -> tirx.PrimFunc:
    HK, HV, DK, DV, NSEQ = spec.k_heads, spec.v_heads, spec.k_dim, spec.v_dim, spec.max_seqs
    if DV % VW:
        raise NotImplementedError(f"{spec.name()}: the CPU GDN kernel needs v_dim to be a "
                                  f"multiple of {VW}, got {DV}")
    R = HV // HK
    NV = DV // VW
    C = spec.channels
    KO, VO = HK * DK, 2 * HK * DK  # where k and v start in a qkv row
    SCALE = DK ** -0.5

    @T.prim_func(private=True)
    def kernel(qkv_h: T.handle, gb_h: T.handle, p_h: T.handle, s_h: T.handle,
               st_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        qkv = T.match_buffer(qkv_h, (n, i64(C)), F32)
        gb = T.match_buffer(gb_h, (n, i64(2 * HV)), F32)
        pos = T.match_buffer(p_h, (n,), "int32")
        slot = T.match_buffer(s_h, (n,), "int32")
        state = T.match_buffer(st_h, (i64(NSEQ), i64(HV), i64(DK), i64(DV)), F32)
        out = T.match_buffer(o_h, (n, i64(HV), i64(DV)), F32)
        for h in T.parallel(HV):
            qn = scratch((DK,))
            kn = scratch((DK,))
            mem = scratch((DV,))
            delta = scratch((DV,))
            ss = scratch((2,))
            for t in range(n):
                s = T.bind(T.max(T.min(T.Cast("int64", slot[t]), i64(NSEQ - 1)), i64(0)))
                if pos[t] == 0:  # a new sequence
                    for d in range(DK):
                        for x in T.vectorized(DV):
                            state[s, h, d, x] = f32(0.0)
                ss[0] = f32(0.0)
                ss[1] = f32(0.0)
                q0 = T.bind(h // R * DK)
                k0 = T.bind(KO + h // R * DK)
                v0 = T.bind(VO + h * DV)
                for d in range(DK):
                    ss[0] = ss[0] + qkv[t, q0 + d] * qkv[t, q0 + d]
                    ss[1] = ss[1] + qkv[t, k0 + d] * qkv[t, k0 + d]
                iq = T.bind(f32(SCALE) / T.sqrt(ss[0] + f32(EPS_L2)))
                ik = T.bind(f32(1.0) / T.sqrt(ss[1] + f32(EPS_L2)))
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

    @T.prim_func(private=True)
    def kernel(x_h: T.handle, w_h: T.handle, p_h: T.handle, s_h: T.handle, st_h: T.handle,
               o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (n, i64(C)), F32)
        w = T.match_buffer(w_h, (i64(C), i64(K)), F32)
        pos = T.match_buffer(p_h, (n,), "int32")
        slot = T.match_buffer(s_h, (n,), "int32")
        state = T.match_buffer(st_h, (i64(NSEQ), i64(K - 1), i64(C)), F32)
        out = T.match_buffer(o_h, (n, i64(C)), F32)
        for cv in T.parallel(TASKS):
            for t in range(n):
                s = T.bind(T.max(T.min(T.Cast("int64", slot[t]), i64(NSEQ - 1)), i64(0)))
                if cv < NVC:
                    row(x, w, pos, state, out, s, t, cv * VW, VW)
                else:
                    for c in range(NVC * VW, C):
                        row(x, w, pos, state, out, s, t, c, 1)

    return kernel


def gdn_gate(spec: GdnGateSpec) -> tirx.PrimFunc:
    H = spec.v_heads

    @T.prim_func(private=True)
    def kernel(ba_h: T.handle, al_h: T.handle, dt_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        ba = T.match_buffer(ba_h, (n, i64(2 * H)), F32)
        A_log = T.match_buffer(al_h, (i64(H),), F32)
        dt_bias = T.match_buffer(dt_h, (i64(H),), F32)
        out = T.match_buffer(o_h, (n, i64(2 * H)), F32)
        for i in T.parallel(n):
            for h in range(H):
                y = T.bind(ba[i, H + h] + dt_bias[h])
                sp = T.bind(T.max(y, f32(0.0)) + fast_log1p(fast_exp(f32(0.0) - T.fabs(y))))
                out[i, h] = f32(0.0) - fast_exp(A_log[h]) * sp
                out[i, H + h] = f32(1.0) / (f32(1.0) + fast_exp(f32(0.0) - ba[i, h]))

    return kernel


def gdn_norm(spec: GdnNormSpec) -> tirx.PrimFunc:
    H, D, EPS = spec.v_heads, spec.v_dim, spec.eps

    @T.prim_func(private=True)
    def kernel(o_h: T.handle, z_h: T.handle, w_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        o = T.match_buffer(o_h, (n, i64(H * D)), F32)
        z = T.match_buffer(z_h, (n, i64(H * D)), F32)
        w = T.match_buffer(w_h, (i64(D),), F32)
        out = T.match_buffer(out_h, (n, i64(H * D)), F32)
        for t in T.parallel(n * H):
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

    return kernel
