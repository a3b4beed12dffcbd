"""Hand-written CUDA kernels of paged attention and KV-cache stores.

Both families are rendered from templates/cuda/paged_attention.cu.j2 (one translation
unit for all of a model's instances) instead of being scheduled with TVM: the paged
attention's key loop is bounded by a position read from device memory, and the store
scatters rows through an index, neither of which the TE/dlight path expresses well.
`build_cuda_source` (lower.py) appends the rendered source to the TVM kernels and
describes the launches the same way; every number below comes from `CudaParams`.

Attention (AttentionSpec), one thread block per (row i, query head h), grid n * heads:

- Why per query head and not per kv head: decode (n = 1) would otherwise launch only
  kv_heads blocks (8 on Qwen3-0.6B for 132 SMs), and a block per kv head holds the
  accumulators of the whole GQA group in registers (group x head_dim / 32 per lane), so
  its register use would grow with the group. The `group` blocks that read the same kv
  head run at the same time, so their repeated key/value loads are served from L2.
- Block: params.attention_threads threads = WARPS warps. Warp w takes the keys j with
  j % WARPS == w, `unroll` of them per step (their key and value rows are loaded before
  any is used, so WARPS x unroll rows are in flight per block, enough for
  params.bytes_in_flight_per_sm, at most MAX_LOADED_FLOATS floats per lane). Lane t holds
  head_dim / 32 floats of q, of each key and value row and of the accumulator, as
  VW-wide vectors at d = (c * 32 + t) * VW (coalesced rows); q . k is summed over the
  warp with __shfl_xor_sync.
- Each warp keeps an online softmax (running max m, sum l, accumulator in registers);
  the warps' (m, l, acc) meet in a static shared array (WARPS x (head_dim + 2) floats)
  and are merged with the block-wide max: out = sum_w acc_w e^(m_w - M) / sum_w l_w
  e^(m_w - M). A warp without keys has m = -inf and l = acc = 0 and contributes exactly
  0; M is finite because warp 0 always has key 0.
- The loop bound pos[i] + 1 is read from memory, nothing else per request is a kernel
  argument and no shared memory depends on the context, so one CUDA graph serves every
  position. Positions clamp to [0, max_ctx), slots to [0, max_seqs), block ids to
  [0, kv_blocks); pool offsets are 64-bit.

Split keys (flash-decoding): decode has few rows, so n * heads blocks leave most SMs idle
(16 blocks for one Qwen3-0.6B row on 132 SMs), each reading a whole context. Where the
target needs more blocks than one row gives (params.gemv_min_blocks, 4 per SM), the keys
of each (row, head) are cut into `splits` equal ranges, one block each (grid.y), and
every block writes its unnormalized (acc, m, l) to scratch; a second kernel merges the
splits exactly as the warps are merged. splits(n) = ceil(S * heads / (n * heads)): S
(attention_splits) for one row, falling to 1 once n * heads blocks fill the target, and
never more than leaves each split MIN_KEY_STEPS warp steps of keys at max_ctx. splits
depends on n only (a C expression in the launch), and each block derives its key range
from pos[i] in device memory, so graphs stay valid. A split whose range is empty (a
short context) writes m = -inf, l = 0 and adds nothing; split 0 always has key 0.

KV formats: f32, f16 and bf16 pools (CUDA_KV_FORMATS); 16-bit elements are loaded VW at a
time as one 2 x VW-byte access and widened to float, and the store rounds as
ninfer.quantize.kv_formats.encode does.

KV store (KvStoreSpec): one thread per VW floats (VW = 4 when width % 4 == 0, else 2 or
1) over the n x width inputs, params.elementwise_threads per block; rows outside
[0, pool_rows) are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import jinja2

from ninfer.paths import TEMPLATES_DIR

from ..launch import ONE, Expr, N, ceil_div
from ..spec import AttentionSpec, KernelSpec, KvStoreSpec
from .schedules import VECTOR, WARP, CudaParams, pow2_ceil, pow2_floor

TEMPLATE = "cuda/paged_attention.cu.j2"
HAND_WRITTEN = (AttentionSpec, KvStoreSpec)  # families rendered here, not scheduled by TVM
MAX_UNROLL = 8  # keys per warp and step
# Key + value floats one lane holds per step. With 1024 threads a thread has 64 registers;
# q, the accumulator, scores and addresses need the rest (checked by nvcc: no spills).
MAX_LOADED_FLOATS = 16
MAX_VALUES_PER_LANE = 8  # head_dim / 32: q, acc and per-key registers grow with it
MIN_KEY_STEPS = 2  # warp steps (WARPS x unroll keys each) a split gets at max_ctx, at least
_VEC_TYPES = {1: "float", 2: "float2", 4: "float4"}
# KV formats the CUDA kernels read and write: template struct and element type of a pool
# (16-bit formats travel as their bits).
CUDA_KV_FORMATS = {"f32": ("F32", "float"), "f16": ("F16", "uint16_t"),
                   "bf16": ("BF16", "uint16_t")}


def is_hand_written(spec: KernelSpec) -> bool:
    return isinstance(spec, HAND_WRITTEN)


def kernel_symbol(spec: KernelSpec) -> str:
    return f"{spec.name()}_kernel"


@dataclass(frozen=True)
class AttentionLayout:
    threads: int
    warps: int
    per_lane: int  # head_dim / 32 floats of every row per lane
    vw: int  # floats per vector load
    unroll: int  # keys per warp and step


def attention_layout(spec: AttentionSpec, params: CudaParams) -> AttentionLayout:
    d = spec.head_dim
    if d % WARP or not WARP <= d <= WARP * MAX_VALUES_PER_LANE:
        raise NotImplementedError(
            f"{spec.name()}: head_dim {d} is not supported by the CUDA attention kernel: "
            f"it needs a multiple of {WARP} between {WARP} and {WARP * MAX_VALUES_PER_LANE} "
            f"({WARP} lanes x at most {MAX_VALUES_PER_LANE} floats each)"
        )
    threads = params.attention_threads
    if threads % WARP or threads < WARP:
        raise NotImplementedError(
            f"{spec.name()}: {threads} attention threads per block is not a whole number "
            f"of {WARP}-thread warps"
        )
    warps = threads // WARP
    per_lane = d // WARP
    step_bytes = warps * 2 * d * 4  # one key and one value row per warp
    wanted = pow2_ceil(-(-params.bytes_in_flight_per_sm // step_bytes))
    fits = pow2_floor(max(1, MAX_LOADED_FLOATS // (2 * per_lane)))
    unroll = max(1, min(MAX_UNROLL, wanted, fits))
    return AttentionLayout(threads, warps, per_lane, math.gcd(per_lane, VECTOR), unroll)


def attention_splits(spec: AttentionSpec, params: CudaParams) -> int:
    """Key splits for one row: enough blocks to fill the target (params.gemv_min_blocks),
    each split keeping at least MIN_KEY_STEPS warp steps of keys at max_ctx; 1 = no split."""
    lay = attention_layout(spec, params)
    cap = max(1, spec.max_ctx // (MIN_KEY_STEPS * lay.warps * lay.unroll))
    return max(1, min(cap, -(-params.gemv_min_blocks // spec.heads)))


def splits_expr(spec: AttentionSpec, params: CudaParams) -> Expr:
    """splits(n): attention_splits for n = 1, down to 1 as n grows."""
    return ceil_div(spec.heads * attention_splits(spec, params), N * spec.heads)


def combine_threads(spec: AttentionSpec) -> int:
    return spec.head_dim  # a multiple of 32 up to 256 (attention_layout checks)


def combine_symbol(spec: AttentionSpec) -> str:
    return f"{spec.name()}_combine_kernel"


def kv_store_vector(spec: KvStoreSpec) -> int:
    return math.gcd(spec.width, VECTOR)


def launch_shape(spec: KernelSpec, params: CudaParams) -> tuple[tuple[Expr, Expr, Expr], int]:
    """(grid over n, threads per block) of a hand-written kernel."""
    if isinstance(spec, AttentionSpec):
        return (N * spec.heads, ONE, ONE), attention_layout(spec, params).threads
    if isinstance(spec, KvStoreSpec):
        threads = params.elementwise_threads
        per_row = spec.width // kv_store_vector(spec)
        return (ceil_div(N * per_row, threads), ONE, ONE), threads
    raise NotImplementedError(f"no hand-written CUDA kernel for family {spec.family!r}")


def _attention_values(spec: AttentionSpec, params: CudaParams) -> dict[str, object]:
    lay = attention_layout(spec, params)
    return {
        "name": spec.name(), "symbol": kernel_symbol(spec), "heads": spec.heads,
        "kv_heads": spec.kv_heads, "head_dim": spec.head_dim, "group": spec.group,
        "max_ctx": spec.max_ctx, "block_size": spec.block_size, "max_seqs": spec.max_seqs,
        "kv_blocks": spec.kv_blocks, "table_cols": spec.blocks_per_seq,
        "scale": repr(float(spec.head_dim**-0.5)), "threads": lay.threads,
        "warps": lay.warps, "per_lane": lay.per_lane, "vw": lay.vw,
        "vec": _VEC_TYPES[lay.vw], "unroll": lay.unroll,
        "kv_format": CUDA_KV_FORMATS[spec.kv_dtype][0],
        "kv_ctype": CUDA_KV_FORMATS[spec.kv_dtype][1],
        "split": attention_splits(spec, params) > 1, "combine_symbol": combine_symbol(spec),
        "combine_threads": combine_threads(spec),
    }


def _kv_store_values(spec: KvStoreSpec, params: CudaParams) -> dict[str, object]:
    vw = kv_store_vector(spec)
    return {
        "name": spec.name(), "symbol": kernel_symbol(spec), "width": spec.width,
        "pool_rows": spec.pool_rows, "vw": vw, "vec": _VEC_TYPES[vw],
        "kv_format": CUDA_KV_FORMATS[spec.kv_dtype][0],
        "kv_ctype": CUDA_KV_FORMATS[spec.kv_dtype][1],
        "threads": launch_shape(spec, params)[1],
    }


def render_source(specs: Iterable[KernelSpec], params: CudaParams) -> str:
    """One CUDA translation unit (extern "C" kernels, CUDA headers only) for the
    hand-written specs among `specs`, each once; "" when there are none."""
    unique = list({s.name(): s for s in specs if is_hand_written(s)}.values())
    if not unique:
        return ""
    for s in unique:
        if isinstance(s, (AttentionSpec, KvStoreSpec)) and (
                s.kv_dtype not in CUDA_KV_FORMATS or s.rotate):
            raise NotImplementedError(
                f"{s.name()}: the CUDA KV-cache kernels read and write "
                f"{', '.join(CUDA_KV_FORMATS)} pools only (the other KV formats run on the CPU)")
        if isinstance(s, (AttentionSpec, KvStoreSpec)) and s.layout != "rows":
            raise NotImplementedError(
                f"{s.name()}: the CUDA KV-cache kernels take token-major pools (layout "
                f"'rows'), not {s.layout!r}")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(TEMPLATE).render(
        attention=[_attention_values(s, params) for s in unique if isinstance(s, AttentionSpec)],
        kv_store=[_kv_store_values(s, params) for s in unique if isinstance(s, KvStoreSpec)],
    )
