"""Kernel specs: one frozen dataclass per kernel family.

A spec is the complete description of one kernel instance. Its `name()` is deterministic
in its fields and is a valid C identifier, so it doubles as the exported symbol
(`__tvm_ffi_<name>`) and as the key in kernel tables. `signature()` is the exact argument
list the compiled kernel takes, in order; `"n"` in a shape is the symbolic number of token
rows (1 for decode, up to the prefill chunk for prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ninfer.quantize.kv_formats import (
    KV_DTYPES,
    check_head_dim,
    check_pool_layout,
    pool_parts,
    rotation_block,
)
from ninfer.quantize.weight_formats import WEIGHT_FORMATS, check_k, check_layout, part_layout

from .spec_common import Arg, _float_token, _require_positive, _tensor
from .spec_hybrid import (
    GdnConvSpec,
    GdnGateSpec,
    GdnNormSpec,
    GdnRecurrentSpec,
    MoeCombineSpec,
    MoeRouterSpec,
)

# Weight formats a matmul spec may name (layouts: quantize.weight_formats). The code is the name's
# suffix; it must stay a C identifier fragment and unique per format.
WEIGHT_DTYPES = WEIGHT_FORMATS
_DTYPE_CODES = {
    "float32": "f32",
    "f16": "f16",
    "bf16": "bf16",
    "q8g32": "q8g32",
    "q4g64": "q4g64",
    "q4g128": "q4g128",
}
assert set(_DTYPE_CODES) == set(WEIGHT_DTYPES)


def _require_wdtype(spec: object, wdtype: str) -> None:
    if wdtype not in WEIGHT_DTYPES:
        raise ValueError(
            f"{type(spec).__name__}: weight dtype {wdtype!r} has no kernels yet; "
            f"supported: {', '.join(WEIGHT_DTYPES)}"
        )


@dataclass(frozen=True)
class EmbeddingSpec:
    """out[i, :] = table[ids[i], :] (ids outside [0, vocab) are clamped into range)."""

    family: ClassVar[str] = "embedding"
    vocab: int
    hidden: int
    wdtype: str = "float32"

    def __post_init__(self) -> None:
        _require_positive(self, "vocab", "hidden")
        if self.wdtype != "float32":
            raise ValueError(
                f"EmbeddingSpec: weight dtype {self.wdtype!r} has no kernels yet; "
                "supported: float32"
            )

    def name(self) -> str:
        return f"embedding_v{self.vocab}_h{self.hidden}_{_DTYPE_CODES[self.wdtype]}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("ids", "int32", "n"),
            _tensor("table", self.wdtype, self.vocab, self.hidden),
            _tensor("out", "float32", "n", self.hidden),
        ]


@dataclass(frozen=True)
class RMSNormSpec:
    """out = x / sqrt(mean(x^2) + eps) * w over the last axis, in float32.

    Also used for per-head q/k norm: the caller passes rows = tokens * heads.
    """

    family: ClassVar[str] = "rmsnorm"
    hidden: int
    eps: float

    def __post_init__(self) -> None:
        _require_positive(self, "hidden")
        if not self.eps > 0:
            raise ValueError(f"RMSNormSpec.eps must be > 0, got {self.eps!r}")

    def name(self) -> str:
        return f"rmsnorm_h{self.hidden}_eps{_float_token(self.eps)}_f32"

    def signature(self) -> list[Arg]:
        return [
            _tensor("x", "float32", "n", self.hidden),
            _tensor("w", "float32", self.hidden),
            _tensor("out", "float32", "n", self.hidden),
        ]


@dataclass(frozen=True)
class MatmulSpec:
    """out = x @ w.T (+ bias); w is stored [n_out, k] as in Hugging Face checkpoints.

    `schedule` picks the loop structure: "gemv" for a handful of rows (decode),
    "gemm" for prefill chunks. Both are correct for any n >= 1, and give a row bitwise
    the same result. `wdtype` is the weight format (quantize.weight_formats): float32, f16, bf16, or
    group-quantized q8g32 / q4g64 / q4g128 (k a multiple of the group; the kernels then
    also round x to int8 per group, see quant.quantize_activations). `layout` is the
    weight's storage layout (quant.part_layout): "rows" ([n_out, k]) or, for float formats,
    "panels" (64-column panels, what the CPU kernels take), or for the quantized formats
    "lanes" (rows with each 512-byte block's bytes interleaved by group, what the CPU
    kernels take).
    """

    family: ClassVar[str] = "matmul"
    k: int
    n_out: int
    bias: bool = False
    schedule: Literal["gemv", "gemm"] = "gemv"
    wdtype: str = "float32"
    layout: Literal["rows", "panels", "lanes"] = "rows"
    # CPU gemv only: 1 reads the weights as one stream a thread with the hardware
    # prefetchers alone; 0 as the kernel's default streams, prefetched in software. The
    # arithmetic of every output is the same either way (bitwise equal results).
    streams: int = 0
    # bf16 weights in the panels layout (the CPU kernels): True multiplies them with x
    # rounded to bf16 (nearest even), k in pairs, as vdpbf16ps computes (llama.cpp's BF16
    # path rounds x the same way; kernels/cpu/matmul.py); False with float32 x.
    x_bf16: bool = False

    def __post_init__(self) -> None:
        _require_positive(self, "k", "n_out")
        if self.streams not in (0, 1) or (self.streams and self.schedule != "gemv"):
            raise ValueError(f"MatmulSpec.streams must be 0, or 1 with the gemv schedule; got "
                             f"{self.streams} ({self.schedule})")
        _require_wdtype(self, self.wdtype)
        check_k(self.wdtype, self.k)
        check_layout(self.wdtype, self.layout)
        if self.schedule not in ("gemv", "gemm"):
            raise ValueError(f"MatmulSpec.schedule must be 'gemv' or 'gemm', got {self.schedule!r}")
        if self.x_bf16 and (self.wdtype, self.layout) != ("bf16", "panels"):
            raise ValueError(f"MatmulSpec.x_bf16 is for bf16 weights in the panels layout; got "
                             f"{self.wdtype} in {self.layout}")

    def name(self) -> str:
        bias = "_bias" if self.bias else ""
        code = _DTYPE_CODES[self.wdtype]
        panels = {"rows": "", "panels": "_p64", "lanes": "_l16"}[self.layout]
        one = "_s1" if self.streams == 1 else ""
        xb = "_xbf16" if self.x_bf16 else ""
        return (f"matmul_k{self.k}_n{self.n_out}_{code}{panels}{xb}{bias}_{self.schedule}"
                f"{one}")

    def signature(self) -> list[Arg]:
        # The weight's parts in quantize.weight_formats.part_layout order: "w" for float formats,
        # "w_q", "w_scales" for group-quantized ones.
        args = [_tensor("x", "float32", "n", self.k)]
        for part, dtype, shape in part_layout(self.wdtype, self.n_out, self.k, self.layout):
            args.append(_tensor("w" if part == "w" else f"w_{part}", dtype, *shape))
        if self.bias:
            args.append(_tensor("bias", "float32", self.n_out))
        args.append(_tensor("out", "float32", "n", self.n_out))
        return args


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding, Hugging Face rotate_half (NeoX) convention, on the first R dims of
    each head (R = rotary, 0: the whole head; partial rotary as Qwen3.5's
    partial_rotary_factor), with h = R / 2:

    out[.., d] = x[.., d] * cos - x[.., d + h] * sin
    out[.., d + h] = x[.., d + h] * cos + x[.., d] * sin,  cos/sin = table[pos[i], d],
    out[.., d] = x[.., d] for R <= d < head_dim.
    Positions outside [0, max_pos) are clamped into range.
    """

    family: ClassVar[str] = "rope"
    heads: int
    head_dim: int
    max_pos: int
    rotary: int = 0

    def __post_init__(self) -> None:
        _require_positive(self, "heads", "head_dim", "max_pos")
        if self.head_dim % 2:
            raise ValueError(f"RopeSpec.head_dim must be even, got {self.head_dim}")
        if self.rotary and (self.rotary % 2 or not 0 < self.rotary <= self.head_dim):
            raise ValueError(f"RopeSpec.rotary must be 0 or an even number of dims up to "
                             f"head_dim {self.head_dim}, got {self.rotary}")

    @property
    def rot(self) -> int:
        """Rotated dims per head."""
        return self.rotary or self.head_dim

    def name(self) -> str:
        part = f"_r{self.rotary}" if self.rotary and self.rotary != self.head_dim else ""
        return f"rope_h{self.heads}_d{self.head_dim}{part}_p{self.max_pos}_f32"

    def signature(self) -> list[Arg]:
        half = self.rot // 2
        return [
            _tensor("x", "float32", "n", self.heads, self.head_dim),
            _tensor("pos", "int32", "n"),
            _tensor("cos", "float32", self.max_pos, half),
            _tensor("sin", "float32", self.max_pos, half),
            _tensor("out", "float32", "n", self.heads, self.head_dim),
        ]


@dataclass(frozen=True)
class SiluMulSpec:
    """out = silu(gu[:, :inter]) * gu[:, inter:] with silu(a) = a / (1 + exp(-a))."""

    family: ClassVar[str] = "silu_mul"
    inter: int

    def __post_init__(self) -> None:
        _require_positive(self, "inter")

    def name(self) -> str:
        return f"silu_mul_i{self.inter}_f32"

    def signature(self) -> list[Arg]:
        return [
            _tensor("gu", "float32", "n", 2 * self.inter),
            _tensor("out", "float32", "n", self.inter),
        ]


@dataclass(frozen=True)
class SigmoidGateSpec:
    """out = x * sigmoid(gate) (the output gate of Qwen3.5's full attention, applied to the
    attention output before o_proj)."""

    family: ClassVar[str] = "sigmoid_gate"
    width: int

    def __post_init__(self) -> None:
        _require_positive(self, "width")

    def name(self) -> str:
        return f"sigmoid_gate_w{self.width}_f32"

    def signature(self) -> list[Arg]:
        return [
            _tensor("x", "float32", "n", self.width),
            _tensor("gate", "float32", "n", self.width),
            _tensor("out", "float32", "n", self.width),
        ]


@dataclass(frozen=True)
class AddSpec:
    """out = a + b (residual add)."""

    family: ClassVar[str] = "add"
    hidden: int

    def __post_init__(self) -> None:
        _require_positive(self, "hidden")

    def name(self) -> str:
        return f"add_h{self.hidden}_f32"

    def signature(self) -> list[Arg]:
        return [
            _tensor("a", "float32", "n", self.hidden),
            _tensor("b", "float32", "n", self.hidden),
            _tensor("out", "float32", "n", self.hidden),
        ]


@dataclass(frozen=True)
class AttentionSpec:
    """Causal attention of n query rows, from any sequences, against a paged KV cache.

    Row i belongs to sequence slot s = seq[i] at position p = pos[i] and attends keys
    0..p of that sequence; key j lives at pool row block_tables[s, j // block_size] *
    block_size + j % block_size (the caller has already stored the rows' own keys and
    values there). Head h reads kv head h // (heads // kv_heads); scale = head_dim ** -0.5.
    Rows of one sequence may be given in any order, but the kernels are fastest when a
    sequence's rows are contiguous with consecutive positions (a prefill chunk).
    Positions are clamped to [0, max_ctx) and block ids to [0, kv_blocks).

    The pools are stored in `kv_dtype` (ninfer.quantize.kv_formats: its parts, e.g. int8 values and
    float16 scales, follow each pool in the signature). With `rotate` = P > 0 the keys are
    stored Hadamard-rotated in blocks of P and the kernel rotates the queries likewise.
    `layout` says where a pool row's heads are (kv_formats.KV_LAYOUTS: token-major "rows",
    "heads", head-major within each block, or "planes", head-major over the whole pool; the
    arrays' shape is the same).
    """

    family: ClassVar[str] = "attention"
    heads: int
    kv_heads: int
    head_dim: int
    max_ctx: int
    block_size: int
    max_seqs: int  # rows of the block table
    kv_blocks: int  # blocks in each pool
    kv_dtype: str = "f32"
    rotate: int = 0  # Hadamard block of the stored keys (0: not rotated)
    # how the pools' rows and heads are laid out (kv_formats.KV_LAYOUTS: "planes" on the
    # CPU, "rows" on CUDA)
    layout: str = "rows"

    def __post_init__(self) -> None:
        _require_positive(self, "heads", "kv_heads", "head_dim", "max_ctx", "block_size",
                          "max_seqs", "kv_blocks")
        check_pool_layout(self.layout, self.block_size)
        if self.heads % self.kv_heads:
            raise ValueError(
                f"AttentionSpec: heads ({self.heads}) must be a multiple of "
                f"kv_heads ({self.kv_heads})"
            )
        _check_kv(self, self.kv_dtype, self.head_dim, self.rotate)

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_ctx // self.block_size)

    def name(self) -> str:
        rot = f"_rot{self.rotate}" if self.rotate else ""
        hm = {"rows": "", "heads": "_hm", "planes": "_hp"}[self.layout]
        return (f"attention_h{self.heads}_kv{self.kv_heads}_d{self.head_dim}_c{self.max_ctx}"
                f"_b{self.block_size}_s{self.max_seqs}_k{self.kv_blocks}_{self.kv_dtype}{rot}"
                f"{hm}")

    def pool_args(self, pool: str) -> list[Arg]:
        """The arrays of pool `pool` ("k_pool" or "v_pool"), in argument order."""
        parts = pool_parts(self.kv_dtype, self.kv_blocks * self.block_size, self.kv_heads,
                           self.head_dim)
        return [_tensor(pool + suffix, dt, *shape) for suffix, dt, shape in parts]

    def signature(self) -> list[Arg]:
        return [
            _tensor("q", "float32", "n", self.heads, self.head_dim),
            *self.pool_args("k_pool"),
            *self.pool_args("v_pool"),
            _tensor("pos", "int32", "n"),
            _tensor("seq", "int32", "n"),
            _tensor("block_tables", "int32", self.max_seqs, self.blocks_per_seq),
            _tensor("out", "float32", "n", self.heads, self.head_dim),
        ]


@dataclass(frozen=True)
class KvStoreSpec:
    """pool[rows[i], :] = x[i, :]: stores the n new keys (or values) into pool rows.

    Rows outside [0, pool_rows) are skipped. `out` is the pool, updated in place. A pool
    in another `kv_dtype` than f32 is [pool_rows, kv_heads, ...] (ninfer.quantize.kv_formats, with
    head_dim given) and quantized formats also write `out_scales`; `rotate` = P > 0
    Hadamard-rotates each head vector in blocks of P before storing it (int4 keys).
    `layout` "heads" (with `block_size`) stores each block head-major, "planes" the whole
    pool head-major (kv_formats.KV_LAYOUTS), as AttentionSpec's layout reads it; an f32
    pool is then [pool_rows, kv_heads, head_dim] too.
    """

    family: ClassVar[str] = "kv_store"
    width: int  # kv_heads * head_dim
    pool_rows: int
    kv_dtype: str = "f32"
    head_dim: int = 0  # needed unless kv_dtype is f32
    rotate: int = 0
    # the pool's layout (kv_formats.KV_LAYOUTS) and, for "heads", its block size
    layout: str = "rows"
    block_size: int = 0

    def __post_init__(self) -> None:
        _require_positive(self, "width", "pool_rows")
        check_pool_layout(self.layout, self.block_size)
        if self.kv_dtype != "f32" or self.rotate or self.layout != "rows":
            _require_positive(self, "head_dim")
            if self.width % self.head_dim:
                raise ValueError(f"KvStoreSpec: width {self.width} is not a multiple of "
                                 f"head_dim {self.head_dim}")
        if self.layout == "heads" and self.pool_rows % self.block_size:
            raise ValueError(f"KvStoreSpec: pool_rows {self.pool_rows} is not a multiple of "
                             f"block_size {self.block_size}")
        _check_kv(self, self.kv_dtype, self.head_dim, self.rotate)

    @property
    def flat(self) -> bool:
        """An f32 pool of token-major rows, unrotated: stored as [pool_rows, width]."""
        return self.kv_dtype == "f32" and not self.rotate and self.layout == "rows"

    @property
    def kv_heads(self) -> int:
        """Heads per row (1 for an f32 pool given without head_dim: rows are flat)."""
        return self.width // self.head_dim if self.head_dim else 1

    def name(self) -> str:
        if self.flat:
            return f"kv_store_w{self.width}_r{self.pool_rows}_f32"
        rot = f"_rot{self.rotate}" if self.rotate else ""
        hm = {"rows": "", "heads": f"_hm{self.block_size}", "planes": "_hp"}[self.layout]
        return (f"kv_store_w{self.width}_r{self.pool_rows}_d{self.head_dim}_{self.kv_dtype}"
                f"{rot}{hm}")

    def signature(self) -> list[Arg]:
        head = [_tensor("x", "float32", "n", self.width), _tensor("rows", "int32", "n")]
        if self.flat:
            return [*head, _tensor("out", "float32", self.pool_rows, self.width)]
        parts = pool_parts(self.kv_dtype, self.pool_rows, self.kv_heads, self.head_dim)
        return [*head, *(_tensor("out" + sfx, dt, *shape) for sfx, dt, shape in parts)]


@dataclass(frozen=True)
class SamplerSpec:
    """One token per logits row, drawn on the device as the engine's host sampler would
    (runtime_cpp/engine/sampling.h; CUDA only, kernels/cuda/sampler.py).

    Row i reads fparams[i] = (temperature, top_p, min_p, repetition_penalty) and iparams[i]
    = (top_k, edit offset, edit count, mask row or -1, logprobs or -1, seed low/high, step
    counter low/high); its edits are edit_ids / edit_vals[offset .. offset + count) =
    (token, flags) / (bias, frequency x count, presence), flags 1 min_tokens mask, 2
    logit_bias, 4 repetition penalty, 8 output penalties; its allowed tokens the bits of
    masks[mask row] (bit t % 32 of word t / 32). out_ids[i] = (token or -1 when every
    token is masked, the top raw-logprob ids), out_logprobs[i] = (the token's raw logprob,
    the top ones); `top` columns of alternatives (-1 past the row's logprobs).
    """

    family: ClassVar[str] = "sampler"
    INTS: ClassVar[int] = 9
    FLOATS: ClassVar[int] = 4
    vocab: int
    max_rows: int  # logits rows per step
    max_edits: int  # edits of all rows of a step together
    top: int = 20  # top logprobs at most

    def __post_init__(self) -> None:
        _require_positive(self, "vocab", "max_rows", "max_edits", "top")
        if self.vocab >= 1 << 24:
            raise ValueError(f"SamplerSpec: vocab {self.vocab} must be below 2^24 (token ids "
                             "travel through float reductions exactly)")

    @property
    def words(self) -> int:
        return -(-self.vocab // 32)

    def name(self) -> str:
        return f"sampler_v{self.vocab}_r{self.max_rows}_e{self.max_edits}_t{self.top}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("logits", "float32", "n", self.vocab),
            _tensor("fparams", "float32", "n", self.FLOATS),
            _tensor("iparams", "int32", "n", self.INTS),
            _tensor("edit_ids", "int32", self.max_edits, 2),
            _tensor("edit_vals", "float32", self.max_edits, 3),
            _tensor("masks", "int32", self.max_rows, self.words),
            _tensor("out_ids", "int32", "n", self.top + 1),
            _tensor("out_logprobs", "float32", "n", self.top + 1),
        ]


def _check_kv(spec: object, kv_dtype: str, head_dim: int, rotate: int) -> None:
    name = type(spec).__name__
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"{name}: KV dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    check_head_dim(kv_dtype, head_dim)
    if rotate and rotate != rotation_block(head_dim):
        raise ValueError(f"{name}: rotate must be 0 or {rotation_block(head_dim)} (the "
                         f"Hadamard block of head_dim {head_dim}), got {rotate}")


KernelSpec = (
    EmbeddingSpec
    | RMSNormSpec
    | MatmulSpec
    | RopeSpec
    | SiluMulSpec
    | AddSpec
    | AttentionSpec
    | KvStoreSpec
    | SamplerSpec
    | GdnRecurrentSpec
    | GdnConvSpec
    | GdnGateSpec
    | GdnNormSpec
    | SigmoidGateSpec
    | MoeRouterSpec
    | MoeCombineSpec
)
