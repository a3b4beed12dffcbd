"""CPU kernels of a sparse MoE block (Qwen3-Next, Qwen3.5-MoE): the router's top-k
(MoeRouterSpec) and the combination of the routed and shared experts' outputs
(MoeCombineSpec). The experts themselves are matmuls over the rows routed to each.

Router, per row (parallel over rows): p = exp(logit - max) / sum (in expert order), then
top_k passes each taking the largest remaining p (strictly larger wins, so a tie goes to
the lower expert id), renormalised by the sum of the chosen p when the spec says.

Combine, per row: the shared gate's dot product in hidden order, then per hidden element
sum_k w[k] * y[pos[k]] in k order plus sigmoid(gate) * shared: a fixed order whatever the
other rows of the step, so the block is batch invariant.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ..spec import MoeCombineSpec, MoeRouterSpec
from .common import F32, VECTOR_LANES, f32, fast_exp, i64, scratch


def moe_router(spec: MoeRouterSpec) -> tirx.PrimFunc:
    E, K, NORM = spec.experts, spec.top_k, spec.normalize

    @T.prim_func(private=True)
    def kernel(l_h: T.handle, id_h: T.handle, w_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        logits = T.match_buffer(l_h, (n, i64(E)), F32)
        out_ids = T.match_buffer(id_h, (n, i64(K)), "int32")
        out_w = T.match_buffer(w_h, (n, i64(K)), F32)
        for i in T.parallel(n):
            p = scratch((E,))
            acc = scratch((2,))  # max, then the sum
            best = scratch((1,), "int32")
            acc[0] = logits[i, 0]
            for e in range(1, E):
                acc[0] = T.max(acc[0], logits[i, e])
            acc[1] = f32(0.0)
            for e in range(E):
                p[e] = fast_exp(logits[i, e] - acc[0])
                acc[1] = acc[1] + p[e]
            for e in range(E):
                p[e] = p[e] / acc[1]
            acc[1] = f32(0.0)
            for k in range(K):
                best[0] = 0
                for e in range(1, E):
                    if p[e] > p[best[0]]:
                        best[0] = T.Cast("int32", e)
                out_ids[i, k] = best[0]
                out_w[i, k] = p[best[0]]
                acc[1] = acc[1] + p[best[0]]
                p[best[0]] = f32(-1.0)  # taken
            if NORM:
                for k in range(K):
                    out_w[i, k] = out_w[i, k] / acc[1]

    return kernel


def moe_combine(spec: MoeCombineSpec) -> tirx.PrimFunc:
    H, K, R = spec.hidden, spec.top_k, spec.rows
    VW = VECTOR_LANES if H % VECTOR_LANES == 0 else 1
    NV = H // VW

    @T.prim_func(private=True)
    def kernel(y_h: T.handle, p_h: T.handle, w_h: T.handle, x_h: T.handle, g_h: T.handle,
               s_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        y = T.match_buffer(y_h, (i64(R), i64(H)), F32)
        pos = T.match_buffer(p_h, (n, i64(K)), "int32")
        w = T.match_buffer(w_h, (n, i64(K)), F32)
        x = T.match_buffer(x_h, (n, i64(H)), F32)
        gate = T.match_buffer(g_h, (i64(H),), F32)
        shared = T.match_buffer(s_h, (n, i64(H)), F32)
        out = T.match_buffer(o_h, (n, i64(H)), F32)
        for t in T.parallel(n):
            dot = scratch((1,))
            dot[0] = f32(0.0)
            for d in range(H):
                dot[0] = dot[0] + x[t, d] * gate[d]
            sg = T.bind(f32(1.0) / (f32(1.0) + fast_exp(f32(0.0) - dot[0])))
            for c in range(NV):
                for v in T.vectorized(VW):
                    out[t, c * VW + v] = f32(0.0)
            for k in range(K):
                r = T.bind(T.max(T.min(T.Cast("int64", pos[t, k]), i64(R - 1)), i64(0)))
                for c in range(NV):
                    for v in T.vectorized(VW):
                        out[t, c * VW + v] = out[t, c * VW + v] + w[t, k] * y[r, c * VW + v]
            for c in range(NV):
                for v in T.vectorized(VW):
                    out[t, c * VW + v] = out[t, c * VW + v] + sg * shared[t, c * VW + v]

    return kernel
