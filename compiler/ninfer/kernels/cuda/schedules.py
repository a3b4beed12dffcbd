"""CUDA schedule parameters per target, and the schedules of the non-attention families.

`cuda_params(target)` is the one place where GPU profile fields turn into schedule
parameters; every schedule here (and in attention.py) reads only `CudaParams`.
Decisions that also depend on a spec (rows per gemv block, threads per norm row) are small
functions of `CudaParams` and the spec's sizes, so they differ between targets exactly
where the derived parameters do.

Every schedule transforms the unscheduled PrimFunc from te_defs.py with s_tir schedule
primitives (split, fuse, bind, rfactor, cache_read, compute_at, ...), which change loop
structure, memory scopes and thread mapping but not the math.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir import dlight

from ninfer.targets import Target

from ..spec import MatmulSpec, RMSNormSpec, RopeSpec

WARP = 32  # threads per warp on every supported compute capability
VECTOR = 4  # float32 lanes of one 16-byte load or store
UNROLL = 256  # pragma_auto_unroll_max_step of fixed-extent inner loops
GEMV_MAX_ROWS = 8  # output rows (one warp each) of the largest gemv block
PREFERRED_THREADS = 256  # block size of simple kernels, unless occupancy needs more
# Registers a GDN recurrence thread is budgeted: up to kernels.cuda.gdn.MAX_STATE_REGS
# state floats plus its addresses and partial sums (nvcc's real count is verified)
RECURRENT_REGISTERS = 128
GEMM_MICRO_K = (32, 16, 8)  # k per gemm shared-memory stage, largest that fits first
@dataclass(frozen=True)
class GemmTiles:
    """Tile shape of the gemm schedule (dlight Matmul.Config, tensor cores off).

    A block computes a (block_x * micro_x) tokens x (block_y * micro_y) features tile,
    staging micro_k columns of both operands in shared memory per step.
    """

    block_x: int
    block_y: int
    micro_x: int
    micro_y: int
    micro_k: int

    @property
    def smem_bytes(self) -> int:
        rows = self.block_x * self.micro_x + self.block_y * self.micro_y
        return rows * (self.micro_k + VECTOR) * 4  # + padding from storage_align


@dataclass(frozen=True)
class CudaParams:
    """Every number the CUDA schedules use for one target (see cuda_params)."""

    arch: str
    elementwise_threads: int  # block size of elementwise kernels
    norm_max_threads: int  # most threads on one rmsnorm row
    gemv_max_rows: int  # most output rows per gemv block
    gemv_min_blocks: int  # gemv blocks needed to keep every SM busy with small tails
    gemm: GemmTiles
    attention_threads: int  # block size of attention (one block per query row and head)
    recurrent_threads: int  # most threads of a Gated DeltaNet recurrence block
    bytes_in_flight_per_sm: int  # loads one SM must keep in flight to draw its bandwidth share
    max_dynamic_smem: int  # bytes of shared memory one block may opt into


def pow2_floor(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def pow2_ceil(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def cuda_params(target: Target) -> CudaParams:
    """Derive all schedule parameters from the target profile (the only place that reads it).

    - Simple kernels use PREFERRED_THREADS, raised if the per-SM CTA limit would otherwise
      cap occupancy (max_warps_per_sm * 32 / max_ctas_per_sm threads per block).
    - gemv: one warp per output row; a block takes several rows only while the grid still
      has 4 blocks per SM (sm_count), so the last wave is a small fraction of the work.
    - gemm: micro_k is the largest stage whose shared memory, times the CTAs a full SM
      holds, fits in shared_memory_per_sm.
    - GDN recurrence: the most threads (power of two) whose RECURRENT_REGISTERS each fit
      one SM's register file with one block resident (its state lives in registers).
    - attention: half of an SM's resident threads (power of two, within
      max_threads_per_block), since decode launches only heads x rows blocks; its key
      loops are unrolled until one block has bytes_in_flight_per_sm of loads outstanding
      (bandwidth_gbs / sm_count x memory_latency_ns).
    """
    if not target.is_cuda:
        raise ValueError(f"target {target.name!r} is not a CUDA target")
    resident = target.max_warps_per_sm * WARP
    occupancy_block = pow2_ceil(-(-resident // target.max_ctas_per_sm))
    simple = min(target.max_threads_per_block, max(PREFERRED_THREADS, occupancy_block))
    gemm_threads = min(128, target.max_threads_per_block)
    block_x = 8
    tiles = [GemmTiles(block_x, gemm_threads // block_x, 4, 4, k) for k in GEMM_MICRO_K]
    ctas_per_sm = max(1, resident // gemm_threads)
    gemm = next(
        (t for t in tiles if t.smem_bytes * ctas_per_sm <= target.shared_memory_per_sm),
        tiles[-1],
    )
    return CudaParams(
        arch=target.arch,
        elementwise_threads=simple,
        norm_max_threads=simple,
        gemv_max_rows=min(GEMV_MAX_ROWS, target.max_threads_per_block // WARP),
        gemv_min_blocks=4 * target.sm_count,
        gemm=gemm,
        attention_threads=pow2_floor(min(target.max_threads_per_block, resident // 2)),
        recurrent_threads=pow2_floor(min(target.max_threads_per_block,
                                         target.registers_per_sm // RECURRENT_REGISTERS)),
        bytes_in_flight_per_sm=int(
            target.bandwidth_gbs * target.memory_latency_ns / target.sm_count),
        max_dynamic_smem=target.shared_memory_per_block_optin,
    )


def gemv_rows(params: CudaParams, n_out: int) -> int:
    """Output rows per gemv block: the most (up to gemv_max_rows, dividing n_out) that still
    leave gemv_min_blocks blocks."""
    rows = params.gemv_max_rows
    while rows > 1 and (n_out % rows or n_out // rows < params.gemv_min_blocks):
        rows //= 2
    return rows


def norm_threads(params: CudaParams, hidden: int) -> int:
    """Threads per rmsnorm row: one vector per thread up to norm_max_threads, at least a warp."""
    wanted = pow2_ceil(-(-hidden // vector_width(hidden)))
    return max(WARP, min(params.norm_max_threads, wanted))


def vector_width(extent: int) -> int:
    """Widest vector (up to VECTOR lanes) that divides a contiguous extent."""
    return math.gcd(extent, VECTOR)


def _unroll(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> None:
    sch.annotate(loop, "pragma_auto_unroll_max_step", UNROLL)
    sch.annotate(loop, "pragma_unroll_explicit", 1)


def schedule_elementwise(func: tirx.PrimFunc, params: CudaParams) -> tirx.PrimFunc:
    """One thread per VECTOR outputs over the flattened output, for single-stage kernels."""
    sch = s_tir.Schedule(func)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    loops = sch.get_loops(block)
    vec = vector_width(int(sch.get(loops[-1]).extent))
    bx, tx, v = sch.split(sch.fuse(*loops), [None, params.elementwise_threads, vec])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    return sch.mod["main"]


def schedule_rope(func: tirx.PrimFunc, spec: RopeSpec, params: CudaParams) -> tirx.PrimFunc:
    """Like schedule_elementwise, with head_dim split into its two halves first: the sign of
    the rotated partner then depends on a scalar loop, not on a vector lane (TVM's CUDA
    codegen mis-declares vectorized bool selects as ushort4)."""
    half = spec.head_dim // 2
    vec = vector_width(half)
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("out")
    i, h, d = sch.get_loops(block)
    side, lo = sch.split(d, [2, half])
    lo, v = sch.split(lo, [None, vec])
    bx, tx = sch.split(sch.fuse(i, h, side, lo), [None, params.elementwise_threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    return sch.mod["main"]


def schedule_rmsnorm(func: tirx.PrimFunc, spec: RMSNormSpec, params: CudaParams) -> tirx.PrimFunc:
    """One block per row: a block-wide sum of squares into shared memory, then the scale."""
    vec = vector_width(spec.hidden)
    threads = norm_threads(params, spec.hidden)
    sch = s_tir.Schedule(func)
    out, sumsq = sch.get_sblock("out"), sch.get_sblock("sumsq")
    # per-thread partial sums over strided vectors (rfactor), then one block-wide sum
    i, k = sch.get_loops(sumsq)
    ko, kt, kv = sch.split(k, [None, threads, vec])
    sch.reorder(kt, ko, kv)
    partial = sch.rfactor(kt, 0)
    i, kt, ko, kv = sch.get_loops(partial)
    sch.bind(i, "blockIdx.x")
    sch.bind(kt, "threadIdx.x")
    x_local = sch.cache_read(partial, 0, "local", consumer_blocks=[partial])
    sch.compute_at(x_local, ko, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(x_local)[-1])
    sch.reverse_compute_at(sumsq, i)
    sch.bind(sch.get_loops(sumsq)[-1], "threadIdx.x")
    sch.reverse_compute_at(out, i)
    _, tx, cv = sch.split(sch.get_loops(out)[-1], [None, threads, vec])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(cv)
    sch.decompose_reduction(partial, ko)
    sch.set_scope(partial, 0, "local")
    sch.set_scope(sumsq, 0, "shared")
    return sch.mod["main"]


def schedule_gemv(func: tirx.PrimFunc, spec: MatmulSpec, params: CudaParams) -> tirx.PrimFunc:
    """One warp per output element: lanes stride over k with vector loads, warp-shuffle sum.

    Grid: (n_out / rows, n); block: (32 lanes, rows). The optional bias add is fused
    into the write-back.
    """
    rows = gemv_rows(params, spec.n_out)
    vec = vector_width(spec.k)
    sch = s_tir.Schedule(func)
    product = sch.get_sblock("matmul" if spec.bias else "out")
    i, j, k = sch.get_loops(product)
    jo, jr = sch.split(j, [None, rows])
    ko, kl, kv = sch.split(k, [None, WARP, vec])
    sch.reorder(i, jo, jr, kl, ko, kv)
    partial = sch.rfactor(kl, 0)
    i, jo, jr, kl, ko, kv = sch.get_loops(partial)
    sch.bind(jo, "blockIdx.x")
    sch.bind(i, "blockIdx.y")
    sch.bind(jr, "threadIdx.y")
    sch.bind(kl, "threadIdx.x")
    _unroll(sch, ko)
    for operand in (1, 0):  # w then x, each one vector per lane and step
        cached = sch.cache_read(partial, operand, "local", consumer_blocks=[partial])
        sch.compute_at(cached, ko, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(cached)[-1])
    sch.reverse_compute_at(product, jr)
    sch.bind(sch.get_loops(product)[-1], "threadIdx.x")
    sch.decompose_reduction(partial, ko)
    sch.set_scope(partial, 0, "local")
    if spec.bias:
        sch.reverse_compute_at(sch.get_sblock("out"), jr)
        sch.set_scope(product, 0, "local")
    return sch.mod["main"]


class _TiledMatmul(dlight.gpu.Matmul):
    """dlight's Matmul rule with the tile shape from CudaParams instead of its constants."""

    def __init__(self, tiles: GemmTiles) -> None:
        super().__init__()
        self.tiles = tiles

    def get_configs(self, target: object) -> dlight.gpu.Matmul.Config:
        t = self.tiles
        return dlight.gpu.Matmul.Config(
            block_size_x=t.block_x,
            block_size_y=t.block_y,
            micro_size_x=t.micro_x,
            micro_size_y=t.micro_y,
            micro_size_k=t.micro_k,
            vector_size=VECTOR,
            unroll=UNROLL,
            use_shared=True,
            storage_align=True,
            inner_x=False,
        )


def schedule_gemm(
    func: tirx.PrimFunc, spec: MatmulSpec, params: CudaParams, target: object
) -> tirx.PrimFunc:
    """dlight gpu.Matmul (SIMT tiles through shared memory); tensorization stays off because
    `sch.tensorize` crashes this TVM build (see TVM_NOTES)."""
    func = func.with_attr("dlight.do_not_tensorize", True)
    sch = _TiledMatmul(params.gemm).apply(func, target, False)
    if sch is None:
        raise NotImplementedError(f"{spec.name()}: dlight Matmul did not accept the kernel")
    return sch.mod["main"]
