"""Hand-written CUDA kernels of the hybrid models' own layers: the Gated DeltaNet conv,
gates, recurrence and output norm, and the sparse MoE router and combine.

Rendered from templates/cuda/gdn.cu.j2 into the model's translation unit (lower.py), like
paged attention: the conv and the recurrence walk their rows in order through per-slot
state read and written in place (rows of one sequence see each other's updates), which
the TE/dlight path does not express. Each computes what its CPU kernel and float64
reference compute (kernels/cpu/gdn.py, kernels/cpu/moe.py, kernels/reference.py); every
number below comes from the spec and `CudaParams`.

- Conv (GdnConvSpec): one thread per channel, grid ceil(channels / threads) (constant in
  n). A thread keeps its K - 1 carried inputs in registers while consecutive rows share a
  slot and writes them back when the slot changes; a row at position 0 starts from zeros.
- Gates (GdnGateSpec): one thread per (row, value head).
- Recurrence (GdnRecurrentSpec): one block per (value head, state slot) (grid v_heads x
  max_seqs, constant in n): block (h, y) walks the rows in order and runs those of slot y
  (so a decode step of several sequences runs them in parallel, and a prefill chunk's rows
  stay in order in one block), TX x KG threads: thread (g, j) holds column j of the head's
  state S [dk, dv] for the key rows i = g * KPT .. g * KPT + KPT - 1 in registers (TX: dv
  rounded up to a warp, KG key groups, KPT = ceil(dk / KG) <= MAX_STATE_REGS; at most
  CudaParams.recurrent_threads, from the target's register file). Per row, in order: q and
  k of the key head into shared memory and their inverse L2 norms (warp 0); S *= exp(g);
  mem = S^T k (the KG partial sums meet in shared memory, summed in group order); delta =
  (v - mem) * beta; S += k delta^T; out = S^T q. The state is read at the block's first
  row and written back after its last.
- Chunked recurrence (GdnRecurrentSpec.chunk > 1, --gdn-prefill chunked): the state's
  columns are independent in both forms of the rule, so one block per (value head, column
  tile of CT columns, state slot) (grid v_heads x dv / CT, max_seqs: several blocks per head
  even for one sequence) holds its tile S[:, c0 .. c0 + CT) in dynamic shared memory. It cuts
  its slot's rows into segments exactly as the CPU kernel does (consecutive positions, cut
  at absolute multiples of the chunk; kernels/cpu/gdn.py); a segment of at least
  GDN_CHUNK_MIN_ROWS rows runs the WY form, shorter ones (decode rows) row by row on the
  tile. Per segment of L rows: the rows' L2-normalised q and k (a warp per row), v's tile
  columns and the cumulative log-decay G (thread 0, in row order) into shared memory;
  Y = b (V - e^G (K S)); A = b_i e^(G_i - G_j) k_i . k_j (j < i); D = (I + A)^-1 Y by
  forward substitution (a thread per column, no barrier); P = e^(G_i - G_j) q_i . k_j
  (j <= i) over A; out = e^G (Q S) + P D; S' = e^(G_L-1) S + (e^(G_L-1 - G) K)^T D. CT is
  the widest of 32, 16, 8 whose shared memory (chunked_smem_bytes) fits the target's
  opt-in limit per block (verified like every launch); none fitting refuses the compile
  with the numbers.
- Output norm (GdnNormSpec): one warp per (row, value head), the elementwise block size.
- Router (MoeRouterSpec): one warp per row, the elementwise block size: softmax max and
  sum, then top_k passes of a warp-wide (logit, id) argmax over the experts not yet picked
  (the lower id on ties), weights exp(l - max) / sum, renormalised when the spec says.
  Lane c of the warp owns experts e = c (mod 32), so at most 32 x 32 experts (a bit mask
  per lane).
- Combine (MoeCombineSpec): one block per row: x . gate (warp sums, then warps in order),
  then per channel the top_k routed rows in order plus sigmoid(x . gate) x shared.

Slots clamp into [0, max_seqs) and routed positions into [0, rows). Only the chunked
recurrence uses dynamic shared memory; every sum has a fixed order, so results are
deterministic for a given batch.
"""

from __future__ import annotations

from collections.abc import Iterable

import jinja2

from ninfer.paths import TEMPLATES_DIR

from ..launch import ONE, Const, Expr, N, ceil_div
from ..spec import (
    GdnConvSpec,
    GdnGateSpec,
    GdnNormSpec,
    GdnRecurrentSpec,
    KernelSpec,
    MoeCombineSpec,
    MoeRouterSpec,
)
from ..spec_hybrid import GDN_CHUNK_MIN_ROWS
from .schedules import WARP, CudaParams, pow2_ceil

TEMPLATE = "cuda/gdn.cu.j2"
HAND_WRITTEN = (GdnConvSpec, GdnGateSpec, GdnRecurrentSpec, GdnNormSpec, MoeRouterSpec,
                MoeCombineSpec)
MAX_STATE_REGS = 64  # state floats per recurrence thread (schedules.RECURRENT_REGISTERS)
MAX_EXPERTS = WARP * 32  # the router's per-lane bit mask of picked experts
CHUNK_TILES = (32, 16, 8)  # state columns per chunked-recurrence block, widest first


def is_hand_written(spec: KernelSpec) -> bool:
    return isinstance(spec, HAND_WRITTEN)


def kernel_symbol(spec: KernelSpec) -> str:
    return f"{spec.name()}_kernel"


def recurrent_layout(spec: GdnRecurrentSpec, params: CudaParams) -> tuple[int, int, int]:
    """(TX, KG, KPT): threads per state column block, key groups, key rows per thread,
    within params.recurrent_threads."""
    most = params.recurrent_threads
    tx = -(-spec.v_dim // WARP) * WARP
    if tx > most:
        raise NotImplementedError(f"{spec.name()}: v_dim {spec.v_dim} exceeds the {most} "
                                  "threads of one recurrence block on this target")
    kg = 1
    while kg * 2 * tx <= most and kg * 2 <= spec.k_dim:
        kg *= 2
    kpt = -(-spec.k_dim // kg)
    kg = -(-spec.k_dim // kpt)  # no group without key rows
    if kpt > MAX_STATE_REGS:
        raise NotImplementedError(f"{spec.name()}: {kpt} state floats per thread (k_dim "
                                  f"{spec.k_dim} over {kg} groups) exceeds {MAX_STATE_REGS}")
    return tx, kg, kpt


def chunked_smem_bytes(spec: GdnRecurrentSpec, tile: int, threads: int) -> int:
    """Dynamic shared memory of a chunked-recurrence block holding `tile` state columns:
    q and k rows of a chunk (row stride k_dim + 1, so a warp reading one column of many
    rows hits distinct banks), the state tile, A (then P), Y (then D), the partial sums
    of the row-by-row form, G, e^G, beta, the state-update weights, two norms."""
    ch, dk = spec.chunk, spec.k_dim
    floats = (2 * ch * (dk + 1) + dk * tile + ch * ch + ch * tile + threads + 4 * ch + 2)
    return 4 * floats


def chunked_layout(spec: GdnRecurrentSpec, params: CudaParams) -> tuple[int, int, int]:
    """(CT, threads, dynamic shared memory bytes) of the chunked recurrence on a target:
    the widest column tile of CHUNK_TILES (no wider than v_dim's power of two, at least
    8) whose shared memory fits the opt-in limit per block."""
    threads = params.elementwise_threads
    tiles = [t for t in CHUNK_TILES if t <= max(8, pow2_ceil(spec.v_dim))]
    for tile in tiles:
        smem = chunked_smem_bytes(spec, tile, threads)
        if smem <= params.max_dynamic_smem:
            return tile, threads, smem
    need = chunked_smem_bytes(spec, tiles[-1], threads)
    raise NotImplementedError(
        f"{spec.name()}: a chunk of {spec.chunk} rows with k_dim {spec.k_dim} needs {need} "
        f"bytes of shared memory per block, over the {params.max_dynamic_smem} this target "
        "allows; compile with --gdn-prefill recurrent")


def dynamic_smem(spec: KernelSpec, params: CudaParams) -> int:
    """Bytes of dynamic shared memory a launch of `spec` takes (the chunked recurrence's)."""
    if isinstance(spec, GdnRecurrentSpec) and spec.chunk > 1:
        return chunked_layout(spec, params)[2]
    return 0


def _threads(params: CudaParams, work: int) -> int:
    """A block for `work` items: the elementwise block size, smaller for small work."""
    return max(WARP, min(params.elementwise_threads, pow2_ceil(work)))


def launch_shape(spec: KernelSpec, params: CudaParams) -> tuple[tuple[Expr, Expr, Expr], int]:
    """(grid over n, threads per block)."""
    if isinstance(spec, GdnConvSpec):
        threads = _threads(params, spec.channels)
        return (Const(-(-spec.channels // threads)), ONE, ONE), threads
    if isinstance(spec, GdnGateSpec):
        threads = _threads(params, spec.v_heads)
        return (ceil_div(N * spec.v_heads, threads), ONE, ONE), threads
    if isinstance(spec, GdnRecurrentSpec) and spec.chunk > 1:
        tile, threads, _ = chunked_layout(spec, params)
        return (Const(spec.v_heads * -(-spec.v_dim // tile)), Const(spec.max_seqs), ONE), threads
    if isinstance(spec, GdnRecurrentSpec):
        tx, kg, _ = recurrent_layout(spec, params)
        return (Const(spec.v_heads), Const(spec.max_seqs), ONE), tx * kg
    warps = params.elementwise_threads // WARP  # norm: (row, head) pairs; router: rows
    if isinstance(spec, GdnNormSpec):
        return (ceil_div(N * spec.v_heads, warps), ONE, ONE), warps * WARP
    if isinstance(spec, MoeRouterSpec):
        if spec.experts > MAX_EXPERTS:
            raise NotImplementedError(f"{spec.name()}: the CUDA router takes at most "
                                      f"{MAX_EXPERTS} experts")
        return (ceil_div(N, warps), ONE, ONE), warps * WARP
    if isinstance(spec, MoeCombineSpec):
        return (N, ONE, ONE), _threads(params, spec.hidden)
    raise NotImplementedError(f"no hand-written CUDA kernel for family {spec.family!r}")


def _values(spec: KernelSpec, params: CudaParams) -> dict[str, object]:
    _, threads = launch_shape(spec, params)
    values: dict[str, object] = {"kind": spec.family, "symbol": kernel_symbol(spec),
                                 "threads": threads, "warps": threads // WARP}
    if isinstance(spec, GdnConvSpec):
        values |= {"channels": spec.channels, "kernel": spec.kernel, "max_seqs": spec.max_seqs}
    elif isinstance(spec, GdnGateSpec):
        values |= {"v_heads": spec.v_heads}
    elif isinstance(spec, GdnRecurrentSpec):
        values |= {"k_heads": spec.k_heads, "v_heads": spec.v_heads, "k_dim": spec.k_dim,
                   "v_dim": spec.v_dim, "max_seqs": spec.max_seqs, "channels": spec.channels,
                   "scale": repr(float(spec.k_dim**-0.5))}
        if spec.chunk > 1:
            tile, _, smem = chunked_layout(spec, params)
            values |= {"kind": "gdn_recurrent_chunked", "chunk": spec.chunk, "tile": tile,
                       "tiles": -(-spec.v_dim // tile), "smem": smem,
                       "min_rows": GDN_CHUNK_MIN_ROWS}
        else:
            tx, kg, kpt = recurrent_layout(spec, params)
            values |= {"tx": tx, "kg": kg, "kpt": kpt}
    elif isinstance(spec, GdnNormSpec):
        values |= {"v_heads": spec.v_heads, "v_dim": spec.v_dim, "eps": repr(float(spec.eps))}
    elif isinstance(spec, MoeRouterSpec):
        values |= {"experts": spec.experts, "top_k": spec.top_k,
                   "normalize": spec.normalize}
    elif isinstance(spec, MoeCombineSpec):
        values |= {"hidden": spec.hidden, "top_k": spec.top_k, "rows": spec.rows}
    return values


def render_source(specs: Iterable[KernelSpec], params: CudaParams) -> str:
    """The hybrid kernels among `specs`, each once; "" when there are none."""
    unique = [s for s in {s.name(): s for s in specs}.values() if is_hand_written(s)]
    if not unique:
        return ""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(TEMPLATE).render(kernels=[_values(s, params) for s in unique])
