"""Kernel specs of the hybrid models' own layers (Qwen3.5 / Qwen3-Next): the Gated DeltaNet
recurrence, conv, gates and output norm, and the sparse MoE block's router and combine.
Same conventions as kernels.spec (which re-exports them): a deterministic `name()`, the
exact `signature()`, `"n"` the symbolic token rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .spec_common import Arg, _float_token, _require_positive, _tensor

# A segment shorter than this runs row by row even when chunked (the chunked form's three
# passes over the state cost about what two rows' passes do).
GDN_CHUNK_MIN_ROWS = 4
# The chunk of the chunked form (HYBRID_NOTES: the WY form is defined on 64-token chunks).
GDN_CHUNK = 64


@dataclass(frozen=True)
class GdnRecurrentSpec:
    """Gated DeltaNet recurrence (kernels.gdn_reference.delta_rule_recurrent), rows in order:
    row i updates the state of slot[i] (one per sequence, [max_seqs, Hv, dk, dv] float32,
    read and written in place) and reads it out; a row at position 0 starts its sequence
    from a zero state (so admission and recompute need no reset). save[i] >= 0: the state
    after row i is also copied into slot save[i] (speculative decoding keeps each draft
    row's state so that the accepted one can become current), which no row of the call
    updates; a segment of the chunked form ends at such a row. `qkv` is the conv's
    output [q | k | v] (q, k raw: L2-normalised here, q also by dk^-1/2), `gb` the gates
    [g | beta] (GdnGateSpec); value head h reads key head h // (v_heads / k_heads).

    `chunk` > 1: the rows of one sequence at consecutive positions are cut into segments at
    absolute positions that are multiples of `chunk`, and a segment of at least
    GDN_CHUNK_MIN_ROWS rows runs in the chunked (WY) form of the same rule
    (gdn_reference.delta_rule_chunked), the rest row by row. The cut depends on the
    positions alone, so a prompt whose steps end on multiples of `chunk` (the scheduler's
    prefill alignment, ModelInfo::prefill_align) gets the same bits however it is split."""

    family: ClassVar[str] = "gdn_recurrent"
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    max_seqs: int
    chunk: int = 1

    def __post_init__(self) -> None:
        _require_positive(self, "k_heads", "v_heads", "k_dim", "v_dim", "max_seqs", "chunk")
        if self.v_heads % self.k_heads:
            raise ValueError(f"GdnRecurrentSpec: v_heads {self.v_heads} is not a multiple of "
                             f"k_heads {self.k_heads}")
        if self.chunk > 1 and (self.chunk & (self.chunk - 1) or self.chunk < 8):
            raise ValueError(f"GdnRecurrentSpec: chunk {self.chunk} must be 1 (row by row) or "
                             "a power of two of at least 8")

    def name(self) -> str:
        return (f"gdn_recurrent_hk{self.k_heads}_hv{self.v_heads}_dk{self.k_dim}"
                f"_dv{self.v_dim}_s{self.max_seqs}"
                + (f"_c{self.chunk}" if self.chunk > 1 else ""))

    @property
    def channels(self) -> int:
        """Width of the [q | k | v] rows."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def signature(self) -> list[Arg]:
        return [
            _tensor("qkv", "float32", "n", self.channels),
            _tensor("gb", "float32", "n", 2 * self.v_heads),
            _tensor("pos", "int32", "n"),
            _tensor("slot", "int32", "n"),
            _tensor("save", "int32", "n"),
            _tensor("state", "float32", self.max_seqs, self.v_heads, self.k_dim, self.v_dim),
            _tensor("out", "float32", "n", self.v_heads, self.v_dim),
        ]


@dataclass(frozen=True)
class GdnConvSpec:
    """SiLU(depthwise causal conv1d) of the GDN layer's [q | k | v] projections
    (kernels.gdn_reference.causal_conv1d), rows in order: row i's taps read the last
    kernel - 1 inputs of slot[i]'s sequence (conv_state [max_seqs, kernel - 1, channels],
    oldest first, updated in place), so a prefill chunk and decode rows take the same path;
    a row at position 0 reads zeros for them (a new sequence). save[i] >= 0: the carried
    inputs after row i are also copied into slot save[i], which no row of the call updates."""

    family: ClassVar[str] = "gdn_conv"
    channels: int
    kernel: int
    max_seqs: int

    def __post_init__(self) -> None:
        _require_positive(self, "channels", "kernel", "max_seqs")
        if self.kernel < 2:
            raise ValueError(f"GdnConvSpec: kernel must be at least 2, got {self.kernel}")

    def name(self) -> str:
        return f"gdn_conv_c{self.channels}_k{self.kernel}_s{self.max_seqs}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("x", "float32", "n", self.channels),
            _tensor("weight", "float32", self.channels, self.kernel),
            _tensor("pos", "int32", "n"),
            _tensor("slot", "int32", "n"),
            _tensor("save", "int32", "n"),
            _tensor("conv_state", "float32", self.max_seqs, self.kernel - 1, self.channels),
            _tensor("out", "float32", "n", self.channels),
        ]


@dataclass(frozen=True)
class GdnGateSpec:
    """The GDN layer's per-head gates from its b and a projections (ba = [b | a], [n, 2 Hv]):
    out = [g | beta] with g = -exp(A_log) * softplus(a + dt_bias) (the state's log-decay)
    and beta = sigmoid(b) (kernels.gdn_reference.gating)."""

    family: ClassVar[str] = "gdn_gate"
    v_heads: int

    def __post_init__(self) -> None:
        _require_positive(self, "v_heads")

    def name(self) -> str:
        return f"gdn_gate_hv{self.v_heads}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("ba", "float32", "n", 2 * self.v_heads),
            _tensor("A_log", "float32", self.v_heads),
            _tensor("dt_bias", "float32", self.v_heads),
            _tensor("out", "float32", "n", 2 * self.v_heads),
        ]


@dataclass(frozen=True)
class GdnNormSpec:
    """The GDN layer's output norm: per value head, o / rms(o) * weight * SiLU(z), the
    weight plain (not 1 + w) (kernels.gdn_reference.gated_rmsnorm)."""

    family: ClassVar[str] = "gdn_norm"
    v_heads: int
    v_dim: int
    eps: float = 1e-6

    def __post_init__(self) -> None:
        _require_positive(self, "v_heads", "v_dim")
        if not self.eps > 0:
            raise ValueError(f"GdnNormSpec.eps must be positive, got {self.eps!r}")

    def name(self) -> str:
        return f"gdn_norm_hv{self.v_heads}_dv{self.v_dim}_eps{_float_token(self.eps)}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("o", "float32", "n", self.v_heads * self.v_dim),
            _tensor("z", "float32", "n", self.v_heads * self.v_dim),
            _tensor("weight", "float32", self.v_dim),
            _tensor("out", "float32", "n", self.v_heads * self.v_dim),
        ]


@dataclass(frozen=True)
class MoeRouterSpec:
    """Top-k routing of a sparse MoE block (Qwen3-Next, Qwen3.5-MoE): p = softmax(logits)
    over the experts in float32; the top_k largest in descending order (a tie goes to the
    lower expert id), their p renormalised to sum 1 when `normalize` (norm_topk_prob).
    out_ids [n, top_k] int32, out_weights [n, top_k]."""

    family: ClassVar[str] = "moe_router"
    experts: int
    top_k: int
    normalize: bool = True

    def __post_init__(self) -> None:
        _require_positive(self, "experts", "top_k")
        if self.top_k > self.experts:
            raise ValueError(f"MoeRouterSpec: top_k {self.top_k} exceeds the {self.experts} "
                             "experts")

    def name(self) -> str:
        return f"moe_router_e{self.experts}_k{self.top_k}{'_norm' if self.normalize else ''}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("logits", "float32", "n", self.experts),
            _tensor("out_ids", "int32", "n", self.top_k),
            _tensor("out_weights", "float32", "n", self.top_k),
        ]


@dataclass(frozen=True)
class MoeCombineSpec:
    """The output of a sparse MoE block per token row t:
    out[t] = sum_k w[t, k] * y[pos[t, k]] (k in order) + sigmoid(x[t] . gate) * shared[t],
    y holding the routed experts' outputs (`rows` of them, in the order the experts ran),
    `shared` the shared expert's, `gate` the shared expert's gate weight [hidden] and x the
    block's input (the post-attention norm)."""

    family: ClassVar[str] = "moe_combine"
    hidden: int
    top_k: int
    rows: int  # rows of y: the most token rows of a step x top_k

    def __post_init__(self) -> None:
        _require_positive(self, "hidden", "top_k", "rows")

    def name(self) -> str:
        return f"moe_combine_h{self.hidden}_k{self.top_k}_r{self.rows}"

    def signature(self) -> list[Arg]:
        return [
            _tensor("y", "float32", self.rows, self.hidden),
            _tensor("pos", "int32", "n", self.top_k),
            _tensor("w", "float32", "n", self.top_k),
            _tensor("x", "float32", "n", self.hidden),
            _tensor("gate", "float32", self.hidden),
            _tensor("shared", "float32", "n", self.hidden),
            _tensor("out", "float32", "n", self.hidden),
        ]
