"""CUDA schedule of causal attention: one thread block per (query row, head).

The schedule transforms te_defs.attention (scores -> rowmax -> probs -> rowsum -> acc ->
out) without changing its math. Threads form a (TX, TY) block: TX lanes split head_dim
into VD-wide vectors, TY rows of lanes take every TY-th key. Per block:

1. scores[j] for every key j < pos0 + n (keys past the row's position are skipped by the
   mask): each lane row takes U consecutive keys per step, loads them as one vector per
   lane and key (U loads in flight, U from the target's bandwidth per SM), multiplies by
   q, and sums each key across its TX lanes with warp shuffles; the scores live in dynamic
   shared memory (4 bytes per key: pos0 + n floats);
2. rowmax and rowsum: block-wide reductions over the scores (probs are recomputed where
   used: exp(scores - rowmax), 0 for masked keys);
3. acc: lane (tx, ty) accumulates probs[j] * v[j, tx*VD : tx*VD + VD] in registers over
   its keys j = ty (mod TY), U keys per unrolled step; the TY partial vectors meet in
   shared memory, and lane tx sums them and writes out = acc / rowsum.

Query head h reads kv head h // (heads / kv_heads). Nothing is written to global memory
except `out`; the only buffer sized by the context is the scores array, so max_ctx is
limited by the shared memory a block may opt into (checked here, with the numbers). The
scores array is padded to whole score-loop steps (see attention_key_pad).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .cuda_schedules import WARP, CudaParams, pow2_ceil, vector_width
from .spec import AttentionSpec

SCORE_BYTES = 4  # float32 score per key in dynamic shared memory
MAX_UNROLL = 8


def attention_layout(spec: AttentionSpec, params: CudaParams) -> tuple[int, int, int]:
    """(VD, TX, TY): vector width along head_dim, lanes per key, keys in flight per block."""
    vd = vector_width(spec.head_dim)
    tx = spec.head_dim // vd
    if tx > WARP:
        raise NotImplementedError(
            f"{spec.name()}: head_dim {spec.head_dim} needs {tx} lanes of {vd} floats per "
            f"key; the CUDA attention schedule supports at most {WARP} (head_dim <= "
            f"{WARP * vd})"
        )
    ty = params.attention_threads // tx
    if ty < 2:
        raise NotImplementedError(
            f"{spec.name()}: {params.attention_threads} attention threads leave fewer than two "
            f"lane rows of {tx} lanes; the schedule needs at least {2 * tx} threads per block"
        )
    return vd, tx, ty


def attention_unroll(spec: AttentionSpec, params: CudaParams) -> int:
    """Keys per lane row and step of the key loops: enough that one block keeps
    bytes_in_flight_per_sm of k (or v) loads outstanding (a power of two, at most 8)."""
    ty = attention_layout(spec, params)[2]
    per_step = ty * spec.head_dim * 4
    return min(MAX_UNROLL, pow2_ceil(-(-params.bytes_in_flight_per_sm // per_step)))


def attention_key_pad(spec: AttentionSpec, params: CudaParams) -> int:
    """Keys per step of the score loop (TY lane rows x U keys). The score loop runs whole
    steps and TVM's cross-thread reduction stores every key of the last step, masked or
    not (the store of a lowered allreduce drops the loop's predicate), so the scores array
    is sized to a whole number of steps: ceil(keys / pad) * pad floats."""
    return attention_layout(spec, params)[2] * attention_unroll(spec, params)


def attention_dynamic_smem(spec: AttentionSpec, params: CudaParams) -> str:
    """Dynamic shared memory (bytes) of one launch, a C expression over pos0 and n."""
    pad = attention_key_pad(spec, params)
    return f"((((pos0 + n) + {pad - 1}) / {pad}) * {pad * SCORE_BYTES})"


def attention_smem_bytes(spec: AttentionSpec, params: CudaParams) -> int:
    """Shared memory of one block at the largest context: scores + partial accumulators."""
    ty = attention_layout(spec, params)[2]
    pad = attention_key_pad(spec, params)
    keys = -(-spec.max_ctx // pad) * pad
    return keys * SCORE_BYTES + ty * spec.head_dim * 4 + 4 * WARP * 4


def schedule_attention(
    func: tirx.PrimFunc, spec: AttentionSpec, params: CudaParams
) -> tirx.PrimFunc:
    """Schedule te_defs.attention(spec) as described in the module docstring."""
    vd, tx_n, ty_n = attention_layout(spec, params)
    need = attention_smem_bytes(spec, params)
    if need > params.max_dynamic_smem:
        raise ValueError(
            f"{spec.name()}: attention over max_ctx {spec.max_ctx} needs {need} bytes of "
            f"shared memory per block, more than the {params.max_dynamic_smem} the {params.arch} "
            f"target allows; compile with a smaller max context"
        )
    sch = s_tir.Schedule(func)
    sch.compute_inline(sch.get_sblock("probs"))
    # Split both reductions before anything moves: acc over key rows ty, scores over lanes.
    acc = sch.get_sblock("acc")
    _, _, _, j = sch.get_loops(acc)
    _, jy = sch.split(j, [None, ty_n])
    acc_rf = sch.rfactor(jy, 0)
    scores = sch.get_sblock("scores")
    scores_rf = sch.rfactor(sch.get_loops(scores)[-1], 0)

    # One block per (row, head); lane tx owns out[tx*VD : tx*VD + VD].
    out = sch.get_sblock("out")
    i, h, dd = sch.get_loops(out)
    bx = sch.fuse(i, h)
    sch.bind(bx, "blockIdx.x")
    dx, _ = sch.split(dd, [tx_n, vd])
    sch.bind(dx, "threadIdx.x")
    sch.compute_at(acc, dx)
    for name in ("acc_rf", "rowsum", "rowmax", "scores"):
        sch.compute_at(sch.get_sblock(name), bx)

    # acc partials in registers, one vector per lane, then into shared memory
    unroll = attention_unroll(spec, params)
    jy, dd, jo = sch.get_loops(acc_rf)[1:]
    dx, dv = sch.split(dd, [tx_n, vd])
    sch.reorder(jy, dx, jo, dv)
    jo, ju = sch.split(jo, [None, unroll])
    sch.unroll(ju)
    sch.bind(jy, "threadIdx.y")
    sch.bind(dx, "threadIdx.x")
    sch.vectorize(dv)
    acc_shared = sch.cache_write(acc_rf, 0, "local")
    sch.reverse_compute_at(acc_shared, dx)
    sch.vectorize(sch.get_loops(acc_shared)[-1])
    sch.decompose_reduction(acc_rf, jo)

    # rowmax, rowsum: every thread of the block
    for name in ("rowsum", "rowmax"):
        block = sch.get_sblock(name)
        (j,) = sch.get_loops(block)[1:]
        jo, ty, tx = sch.split(j, [None, ty_n, tx_n])
        sch.reorder(ty, tx, jo)
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")

    # scores: lane row ty takes keys (jo * TY + ty) * U + ju; its TX lanes split head_dim.
    # The products of U keys are computed first (U independent vector loads per lane, an
    # unrolled loop), then each key is summed across lanes (a loop TVM cannot unroll:
    # LowerThreadAllreduce loses its buffer in unrolled copies).
    d, j = sch.get_loops(scores)[1:]
    jo, jy, ju = sch.split(j, [None, ty_n, unroll])
    dx, dv = sch.split(d, [tx_n, vd])
    sch.reorder(jy, jo, ju, dx, dv)
    sch.bind(jy, "threadIdx.y")
    sch.bind(dx, "threadIdx.x")
    sch.compute_at(scores_rf, jo, preserve_unit_loops=True)
    d, _, _, ju = sch.get_loops(scores_rf)[-4:]  # one loop per iter var: d, i, h, j
    dx, dv = sch.split(d, [tx_n, vd])
    sch.reorder(ju, dx, dv)
    sch.bind(dx, "threadIdx.x")
    sch.vectorize(dv)
    sch.unroll(ju)

    sch.set_scope(scores_rf, 0, "local")
    sch.set_scope(scores, 0, "shared.dyn")
    sch.set_scope(sch.get_sblock("rowmax"), 0, "shared")
    sch.set_scope(sch.get_sblock("rowsum"), 0, "shared")
    sch.set_scope(acc_shared, 0, "shared")
    sch.set_scope(acc, 0, "local")
    return sch.mod["main"]
