"""Plan: serve limits, kernel instances per role, activation buffers and the memory budget.

A configuration that cannot fit fails here, with the numbers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np

from ninfer.frontend.config import ModelConfig
from ninfer.frontend.graph import ModelGraph, WeightSpec
from ninfer.frontend.hybrid import HybridTraits
from ninfer.kernels.spec import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    GdnConvSpec,
    GdnGateSpec,
    GdnNormSpec,
    GdnRecurrentSpec,
    KernelSpec,
    KvStoreSpec,
    MatmulSpec,
    MoeCombineSpec,
    MoeRouterSpec,
    RMSNormSpec,
    RopeSpec,
    SamplerSpec,
    SigmoidGateSpec,
    SiluMulSpec,
)
from ninfer.kernels.spec_hybrid import GDN_CHUNK
from ninfer.quantize.kv_formats import (
    KV_DTYPES,
    check_head_dim,
    kv_format,
    pool_bytes_per_row,
    rotation_block,
)
from ninfer.targets import Target


class PlanError(ValueError):
    """The requested serve limits do not fit the model on the target."""


# The KV pools' layout on the cpu target (kv_formats.KV_LAYOUTS; CUDA: "rows"): one plane
# a kv head, so that a CPU attention thread walking one kv head reads a stream ("heads",
# head-major per block, breaks it every block: up to 1.17x as slow from memory, RESULTS
# session 36).
CPU_KV_LAYOUT = "planes"
# The formats whose matmul weights the cpu target stores in the "lanes" layout
# (quantize.weight_formats.LANES_FORMATS): the kernels convert and scale a block's integer
# dots once per 512 weight bytes instead of once per 64 (RESULTS 2026-12-07, sessions
# 33-34); () keeps every format by rows (the A/B benchmarks' switch). q4g64 joined once
# the kernels were built without TIR's CSE (kernels/cpu/build.py): its one-row gemv from
# L2 then read 44 GB/s a thread against 33 by rows, its gemm +8.6%, its decode on a par or
# better; q4g128 (8-group blocks) in session 36: gemv from L2 36 -> 44 GB/s, decode +13%.
CPU_LANES_FORMATS: tuple[str, ...] = ("q8g32", "q4g64", "q4g128")

MATMUL_ROLES = ("q", "k", "v", "o", "gate_up", "down", "lm_head",
                # hybrid models: the attention's output gate, the Gated DeltaNet projections
                "q_gate", "gdn_qkv", "gdn_z", "gdn_ba", "gdn_out",
                # sparse MoE blocks
                "router", "expert_gate_up", "expert_down", "shared_gate_up", "shared_down",
                # the MTP draft head's fc (--spec mtp), as two [H, H] halves
                "mtp_fc")
# Device sampler (CUDA): logit edits per sequence beyond its distinct context tokens (the
# penalties' tokens): logit_bias entries and min_tokens' stop ids.
SAMPLER_EXTRA_EDITS = 1024
SAMPLER_TOP_LOGPROBS = 20  # Engine::kMaxLogprobs
# --state-checkpoints auto: per sequence slot (each running conversation's latest prompt;
# a 27B-class hybrid's state is tens of MiB per slot, so more is the user's call)
DEFAULT_CHECKPOINTS_PER_SLOT = 1
# CLI name of a weight format -> MatmulSpec.wdtype
FORMAT_WDTYPES = {"f32": "float32", "f16": "f16", "bf16": "bf16", "q8g32": "q8g32",
                  "q4g64": "q4g64", "q4g128": "q4g128"}


@dataclass(frozen=True)
class WeightFormats:
    """Storage format of the matmul weights: one default, per-role overrides (e.g. keep
    lm_head at 8 bits). Embeddings and norms stay f32."""

    default: str = "f32"
    overrides: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for role, fmt in ((None, self.default), *self.overrides):
            if fmt not in FORMAT_WDTYPES:
                raise PlanError(f"weight format {fmt!r} is not one of "
                                f"{', '.join(FORMAT_WDTYPES)}")
            if role is not None and role not in MATMUL_ROLES:
                raise PlanError(f"weight format override for {role!r}: roles are "
                                f"{', '.join(MATMUL_ROLES)}")

    def of(self, role: str) -> str:
        return dict(self.overrides).get(role, self.default)

    def wdtype(self, role: str) -> str:
        return FORMAT_WDTYPES[self.of(role)]


@dataclass(frozen=True)
class ServeLimits:
    max_context: int  # tokens per sequence
    prefill_chunk: int  # rows per step: decode rows of every sequence + prompt chunks
    max_concurrency: int = 1  # sequences per step (slots of the block table)
    gemv_max_rows: int = 4  # row counts up to this use the GEMV schedule, above it GEMM
    kv_block_size: int = 16  # tokens per KV block
    kv_capacity: int = 0  # tokens in the KV pool; 0 = auto (every slot at full context)
    kv_dtype: str = "f16"  # storage format of the KV cache (ninfer.quantize.kv_formats)
    # a hybrid's Gated DeltaNet prefill: "recurrent" (row by row) or "chunked" (gdn_chunk)
    gdn_prefill: Literal["recurrent", "chunked"] = "recurrent"
    # speculative decoding: each decoding sequence may bring up to max_draft_tokens drafts,
    # so a step returns up to 1 + max_draft_tokens logits rows per sequence
    spec: Literal["none", "ngram", "mtp"] = "none"
    max_draft_tokens: int = 0
    # prefix caching of a hybrid: slots holding the recurrent state after a cached prefix
    # (a hit needs one); -1 = auto (DEFAULT_CHECKPOINTS_PER_SLOT x max_concurrency for a
    # hybrid, 0 otherwise), resolved by make_plan
    state_checkpoints: int = -1

    @property
    def logit_rows(self) -> int:
        """Most rows whose logits one step returns: one per sequence, 1 + drafts with
        speculation (never more than the step's rows)."""
        return min(self.prefill_chunk, self.max_concurrency * (1 + self.max_draft_tokens))

    def validate(self, graph: ModelGraph) -> None:
        cfg = graph.config
        if self.max_context < 2:
            raise PlanError(f"--max-context {self.max_context} must be at least 2")
        if self.max_context > cfg.max_position_embeddings:
            raise PlanError(
                f"--max-context {self.max_context} exceeds the model's "
                f"max_position_embeddings {cfg.max_position_embeddings}; pass a smaller value")
        if not 1 <= self.prefill_chunk <= self.max_context:
            raise PlanError(f"--prefill-chunk {self.prefill_chunk} must be in "
                            f"[1, --max-context {self.max_context}]: a step never holds more "
                            "rows than one request's context; lower it or raise the context")
        if not 1 <= self.max_concurrency <= self.prefill_chunk:
            raise PlanError(f"--max-concurrency {self.max_concurrency} must be in [1, "
                            f"--prefill-chunk {self.prefill_chunk}]: every running request "
                            "decodes one row per step; lower it or raise the prefill chunk")
        if self.kv_block_size not in (8, 16, 32, 64):
            raise PlanError(f"--kv-block-size {self.kv_block_size} must be 8, 16, 32 or 64")
        if self.kv_dtype not in KV_DTYPES:
            raise PlanError(f"--kv-dtype {self.kv_dtype!r} is not one of "
                            f"{', '.join(KV_DTYPES)}")
        try:
            check_head_dim(self.kv_dtype, cfg.head_dim)
        except ValueError as e:
            raise PlanError(str(e)) from None
        if (self.spec == "none") != (self.max_draft_tokens == 0):
            raise PlanError(f"--spec {self.spec} with {self.max_draft_tokens} draft tokens: "
                            "speculation needs at least one draft, and drafts need --spec")
        if self.kv_capacity and self.kv_capacity < self.max_context:
            raise PlanError(f"--kv-capacity {self.kv_capacity} tokens cannot hold one sequence "
                            f"of --max-context {self.max_context}; raise it or lower the "
                            "context")

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_context // self.kv_block_size)


def gdn_chunk(limits: ServeLimits) -> int:
    """The chunk of the Gated DeltaNet recurrence (GdnRecurrentSpec.chunk): 1 (row by row)
    unless --gdn-prefill chunked, then GDN_CHUNK or the largest power of two a step can
    give the oldest prompt beside every other sequence's decode row (the scheduler aligns
    prompt steps to it)."""
    if limits.gdn_prefill == "recurrent":
        return 1
    room = limits.prefill_chunk - limits.max_concurrency + 1
    chunk = min(GDN_CHUNK, 1 << (room.bit_length() - 1))
    if chunk < 8:
        raise PlanError(f"--gdn-prefill chunked needs 8 prompt rows in a step beside "
                        f"{limits.max_concurrency - 1} decode rows; --prefill-chunk "
                        f"{limits.prefill_chunk} leaves {room}: raise it or use recurrent")
    return chunk


@dataclass(frozen=True)
class KvPlan:
    """The paged KV pool: `blocks` of `block_size` tokens (block 0 reserved for padding)."""

    block_size: int
    blocks: int
    bytes_per_block: int  # all layers, keys and values
    dtype: str = "f32"
    # (kv dtype, bytes per token, tokens the memory left after weights, activations and
    # workspace would hold in that format): what --kv-capacity auto can reach per format
    memory_tokens: tuple[tuple[str, int, int], ...] = ()

    @property
    def tokens(self) -> int:
        return (self.blocks - 1) * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int
    workspace_bytes: int
    budget_bytes: int
    # hybrid models: the recurrent state of every sequence slot (conv and SSM state of
    # each Gated DeltaNet layer, float32), in state_slots slots (1 + max_draft_tokens per
    # sequence, the prefix cache's checkpoints, plus the padding rows' slot on CUDA)
    state_bytes: int = 0
    state_slots: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.activation_bytes
                + self.workspace_bytes + self.state_bytes)


@dataclass(frozen=True)
class Plan:
    limits: ServeLimits
    kernels: dict[str, KernelSpec]  # role -> kernel instance
    buffers: dict[str, int]  # activation buffer -> float32 elements per row
    memory: MemoryPlan
    kv: KvPlan
    weights: WeightFormats = WeightFormats()

    def build_digest(self, config: ModelConfig, target: Target, model_id: str) -> str:
        """What the generated program is made of (this plan, the model's config, the
        target profile, the id and ninfer's version), hashed: the server refuses an artifact
        of another digest, and the Python module of the build is named after it."""
        from ninfer import __version__

        blob = json.dumps({"plan": self.to_json(), "config": asdict(config),  # extra too
                           "target": target.stable_hash(), "model_id": model_id,
                           "version": __version__}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def unique_kernels(self) -> list[KernelSpec]:
        seen: dict[str, KernelSpec] = {}
        for spec in self.kernels.values():
            seen.setdefault(spec.name(), spec)
        return list(seen.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "limits": asdict(self.limits),
            "kernels": {role: spec.name() for role, spec in self.kernels.items()},
            "buffers": self.buffers,
            "memory": {**asdict(self.memory), "total_bytes": self.memory.total_bytes},
            "kv": {**asdict(self.kv), "tokens": self.kv.tokens,
                   "bytes_per_token": self.kv.bytes_per_token,
                   "memory_tokens": {f: {"bytes_per_token": b, "tokens": t}
                                     for f, b, t in self.kv.memory_tokens}},
            "weights": {role: self.weights.of(role) for role in self.matmul_roles},
        }

    @property
    def matmul_roles(self) -> tuple[str, ...]:
        """The matmul roles this model has (MATMUL_ROLES order)."""
        return tuple(r for r in MATMUL_ROLES if f"{r}_gemv" in self.kernels)


def matmul_role(w: WeightSpec) -> str | None:
    """The matmul role a weight feeds ("q", ..., "lm_head"), None for the others."""
    if w.role == "linear":
        return w.name.rsplit(".", 1)[1]
    return "lm_head" if w.role == "lm_head" else None


def weight_format(w: WeightSpec, formats: WeightFormats) -> str:
    role = matmul_role(w)
    return formats.of(role) if role else "f32"


def matmul_layout(target: Target, wdtype: str) -> Literal["rows", "panels", "lanes"]:
    """Storage layout of a matmul weight (quantize.weight_formats): for the CPU, float
    weights in 64-column panels (what kernels/cpu/matmul.py takes) and the formats of
    CPU_LANES_FORMATS with each 512-byte block interleaved by group ("lanes", what
    kernels/cpu/qmatmul.py takes for them); the rest by rows."""
    from ninfer.quantize.weight_formats import format_info

    if target.is_cuda:
        return "rows"
    if format_info(wdtype).quantized:
        return "lanes" if wdtype in CPU_LANES_FORMATS else "rows"
    return "panels"


def matmul_spec(target: Target, k: int, n_out: int, bias: bool,
                schedule: Literal["gemv", "gemm"], wdtype: str, gemv_streams: int = 0,
                x_bf16: bool = True) -> MatmulSpec:
    """One matmul as make_plan makes it for `target` (the benchmarks build theirs here too):
    the weight layout the target's kernels take, the cpu gemv's weight streams, and x
    rounded to bf16 for the cpu target's bf16 weights where x_bf16 says so (CUDA targets
    keep x float32)."""
    streams = gemv_streams if schedule == "gemv" and not target.is_cuda else 0
    return MatmulSpec(k, n_out, bias, schedule, wdtype, matmul_layout(target, wdtype), streams,
                      x_bf16 and not target.is_cuda and wdtype == "bf16")


def weight_layout(w: WeightSpec, plan: Plan) -> str:
    """The layout `plan`'s kernels take `w` in ("rows" for weights that feed no matmul)."""
    role = matmul_role(w)
    if role is None:
        return "rows"
    spec = plan.kernels[f"{role}_gemv"]
    assert isinstance(spec, MatmulSpec)
    return spec.layout


def weight_bytes(w: WeightSpec, formats: WeightFormats, target: Target) -> int:
    """Bytes a weight takes in the artifact and in memory in its format and layout."""
    role = matmul_role(w)
    if role is None:
        return 4 * _numel(w.shape)
    from ninfer.quantize.weight_formats import part_layout

    n_out, k = w.shape
    wdtype = formats.wdtype(role)
    return sum(np.dtype(dt).itemsize * _numel(sh)
               for _, dt, sh in part_layout(wdtype, n_out, k, matmul_layout(target, wdtype)))


def qkv_fusable(target: Target, formats: WeightFormats, q_dim: int, kv_dim: int,
                hybrid: bool) -> bool:
    """Whether a one-row decode step takes q, k and v in one gemv (the plan's "qkv_gemv",
    over the three matrices where the artifact holds them back to back: pending_tensors
    writes each part of the three in a row, and the model checks at load that they are):
    the cpu target's dense models, q, k and v in one format, and in the panels layout whole
    panels each. One call instead of three: a gemv call's fixed cost (the thread pool's fork
    and join, x quantized, the streams' start) weighs most on the small k and v matrices.
    The kernel computes every column as the three gemvs do (same bits; test)."""
    from ninfer.quantize.weight_formats import PANEL

    if target.is_cuda or hybrid:
        return False
    fmt = formats.wdtype("q")
    if formats.wdtype("k") != fmt or formats.wdtype("v") != fmt:
        return False
    return matmul_layout(target, fmt) != "panels" or (q_dim % PANEL == 0 and kv_dim % PANEL == 0)


def make_plan(graph: ModelGraph, target: Target, limits: ServeLimits,
              weights: WeightFormats | None = None, gemv_streams: int = 0,
              x_bf16: bool = True) -> Plan:
    """gemv_streams: the cpu target's decode gemvs, 1 = one weight stream a thread with
    hardware prefetch only (MatmulSpec.streams), 0 = the kernels' default. x_bf16: the cpu
    target's bf16 weights multiply x rounded to bf16 (MatmulSpec.x_bf16; CUDA targets keep
    x float32 whatever it says). Kernel choices, not serve limits, but the build digest
    (and with it the artifact's) names every kernel: compile and artifact writer plan alike
    (pipeline._plan)."""
    weights = weights or WeightFormats()
    limits.validate(graph)
    cfg = graph.config
    h, d, inter, v = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    q_dim, kv_dim = cfg.num_heads * d, cfg.num_kv_heads * d
    bias = graph.traits.qkv_bias

    hybrid = graph.traits if isinstance(graph.traits, HybridTraits) else None
    if limits.state_checkpoints < 0:
        limits = replace(limits, state_checkpoints=DEFAULT_CHECKPOINTS_PER_SLOT
                         * limits.max_concurrency if hybrid else 0)
    elif limits.state_checkpoints and not hybrid:
        raise PlanError(f"--state-checkpoints {limits.state_checkpoints}: this model has no "
                        "recurrent state (its prefix cache needs only KV blocks); leave it out")
    if limits.gdn_prefill == "chunked" and not hybrid:
        raise PlanError("--gdn-prefill chunked: this model has no Gated DeltaNet layers "
                        "(only the hybrid Qwen3.5 / Qwen3-Next families do)")
    attn_layers = len(hybrid.attention_layers) if hybrid else cfg.num_layers
    mtp = limits.spec == "mtp"
    if mtp and not any(w.name == "mtp.norm" for w in graph.weights):
        raise PlanError("--spec mtp: the graph has no compiled MTP head (read the model with "
                        "its head: frontend.read_model(..., mtp=True))")
    attn_layers += 1 if mtp else 0  # the MTP layer keeps its own keys and values
    rotary = graph.rope_dims

    # Activation buffers, in floats per token row (sized for the largest step).
    buffers = {"x": h, "res": h, "h": h, "q": q_dim, "qr": q_dim, "k": kv_dim, "kn": kv_dim,
               "kr": kv_dim, "v": kv_dim, "att": q_dim, "o": h, "gu": 2 * inter,
               "act": inter}
    chunk, conc = limits.prefill_chunk, limits.max_concurrency
    state_bytes = 0
    # Recurrent-state slots: 1 + max_draft_tokens per sequence (the current state and,
    # with speculation, the states after a verify step's rows until one is accepted), plus
    # on CUDA the slot of the padding rows of a replayed step graph (a padding row is at
    # position 0, which would otherwise reset the state of the slot it names).
    # Then the prefix cache's checkpoint slots (limits.state_checkpoints).
    state_slots = (conc * (1 + limits.max_draft_tokens) + limits.state_checkpoints
                   + (1 if target.is_cuda else 0))
    if hybrid:
        buffers |= {"qgate": q_dim, "gdn_in": hybrid.conv_dim, "gdn_mixed": hybrid.conv_dim,
                    "gdn_z": hybrid.value_width, "gdn_ba": 2 * hybrid.v_heads,
                    "gdn_gb": 2 * hybrid.v_heads, "gdn_o": hybrid.value_width,
                    "gdn_y": hybrid.value_width}
        if hybrid.sparse_layers:  # the routed rows of a step: up to top_k per token row
            K = hybrid.top_k
            buffers |= {"moe_logits": hybrid.experts, "moe_w": K, "ex_in": K * h,
                        "ex_gu": K * 2 * hybrid.moe_inter, "ex_act": K * hybrid.moe_inter,
                        "ex_out": K * h, "sh_gu": 2 * hybrid.shared_inter,
                        "sh_act": hybrid.shared_inter}
        if mtp:  # the main step's final-normed hidden rows; the head's two fc inputs
            buffers |= {"mtp_hid": h, "mtp_a": h, "mtp_b": h}
        state_bytes = 4 * state_slots * len(hybrid.linear_layers) * (
            (hybrid.conv_kernel - 1) * hybrid.conv_dim
            + hybrid.v_heads * hybrid.k_dim * hybrid.v_dim)
    # the MTP head's tensors are in the artifact but not loaded (no speculative decoding yet)
    weights_bytes = sum(weight_bytes(w, weights, target) for w in graph.weights
                        if w.role != "mtp")
    weights_bytes += 2 * 4 * limits.max_context * (rotary // 2)  # rope tables
    activation_bytes = 4 * (chunk * sum(buffers.values()) + limits.logit_rows * (h + v))
    rows = limits.logit_rows  # sampled rows: one per sequence, 1 + drafts with speculation
    sampler = (SamplerSpec(v, rows, rows * min(v, limits.max_context + SAMPLER_EXTRA_EDITS),
                           SAMPLER_TOP_LOGPROBS) if target.is_cuda else None)
    if sampler:  # the scratch rows, the edits, the masks
        activation_bytes += 4 * rows * v + 20 * sampler.max_edits + 4 * rows * sampler.words
    workspace_bytes = 64 << 20
    bs = limits.kv_block_size
    kvd = limits.kv_dtype
    block_bytes = 2 * attn_layers * bs * pool_bytes_per_row(kvd, cfg.num_kv_heads, d)
    left = (target.memory_bytes - weights_bytes - activation_bytes - workspace_bytes
            - state_bytes)
    if limits.kv_capacity:
        blocks = -(-limits.kv_capacity // bs) + 1
    else:  # auto: every slot at full context, or what the memory left holds
        blocks = min(conc * limits.blocks_per_seq, max(0, left) // block_bytes - 1) + 1
    need = limits.blocks_per_seq + 1  # one sequence at full context + the reserved block
    if blocks < need or blocks * block_bytes > left:
        kv_need = max(blocks, need) * block_bytes
        raise PlanError(
            f"the model does not fit {target.name}'s memory budget of "
            f"{_size(target.memory_bytes)}: weights {_size(weights_bytes)} + activations "
            f"{_size(activation_bytes)} + workspace {_size(workspace_bytes)}"
            + (f" + recurrent state {_size(state_bytes)} ({state_slots} slots)"
               if state_bytes else "")
            + " leave "
            f"{_size(max(0, left))} for the KV cache, which needs {_size(kv_need)} for "
            f"{max(blocks, need) - 1} blocks of {bs} tokens ({block_bytes} B each in {kvd}; "
            f"at least one sequence of {limits.max_context} tokens); lower --max-context or "
            "--kv-capacity, pick a smaller --kv-dtype"
            + (f", lower --state-checkpoints ({limits.state_checkpoints})"
               if state_bytes and limits.state_checkpoints else "")
            + ", or raise --memory-gib")
    per_token = {f: 2 * attn_layers * pool_bytes_per_row(f, cfg.num_kv_heads, d)
                 for f in KV_DTYPES if _suits(f, d)}
    kv = KvPlan(bs, blocks, block_bytes, kvd,
                tuple((f, b, max(0, left) // (b * bs) * bs) for f, b in per_token.items()))
    memory = MemoryPlan(weights_bytes, blocks * block_bytes, activation_bytes,
                        workspace_bytes=workspace_bytes, budget_bytes=target.memory_bytes,
                        state_bytes=state_bytes, state_slots=state_slots if hybrid else 0)

    def _matmul(k: int, n: int, b: bool, schedule: Literal["gemv", "gemm"], role: str
                ) -> MatmulSpec:
        return matmul_spec(target, k, n, b, schedule, weights.wdtype(role), gemv_streams,
                           x_bf16)

    # int4 keys are stored Hadamard-rotated (ninfer.quantize.kv_formats); the CPU kernels
    # take the pools in CPU_KV_LAYOUT (kv_formats.KV_LAYOUTS), the CUDA ones token-major
    rot = rotation_block(d) if kv_format(kvd).rotate_keys else 0
    layout = "rows" if target.is_cuda else CPU_KV_LAYOUT
    pool_bs = bs if layout == "heads" else 0  # (only "heads" depends on the block size)
    kernels: dict[str, KernelSpec] = {
        "embed": EmbeddingSpec(v, h),
        "norm": RMSNormSpec(h, cfg.rms_norm_eps),
        "head_norm": RMSNormSpec(d, cfg.rms_norm_eps),
        "rope_q": RopeSpec(cfg.num_heads, d, limits.max_context, rotary % d),
        "rope_k": RopeSpec(cfg.num_kv_heads, d, limits.max_context, rotary % d),
        "kv_store_k": KvStoreSpec(kv_dim, blocks * bs, kvd, d, rot, layout, pool_bs),
        "kv_store_v": KvStoreSpec(kv_dim, blocks * bs, kvd, d, 0, layout, pool_bs),
        "attention": AttentionSpec(cfg.num_heads, cfg.num_kv_heads, d, limits.max_context, bs,
                                   conc, blocks, kvd, rot, layout),
        "silu_mul": SiluMulSpec(inter),
        "add": AddSpec(h),
        "gather": EmbeddingSpec(chunk, h),  # rows whose logits are wanted
        "lm_head_gemv": _matmul(h, v, False, "gemv", "lm_head"),
    }
    if sampler:  # CUDA samples on the device, after the LM head (kernels/cuda/sampler.py)
        kernels["sampler"] = sampler
    if limits.logit_rows > limits.gemv_max_rows:
        kernels["lm_head_gemm"] = _matmul(h, v, False, "gemm", "lm_head")
    for role, k, n, b in (("q", h, q_dim, bias), ("k", h, kv_dim, bias), ("v", h, kv_dim, bias),
                          ("o", q_dim, h, False), ("gate_up", h, 2 * inter, False),
                          ("down", inter, h, False)):
        kernels[f"{role}_gemv"] = _matmul(k, n, b, "gemv", role)
        kernels[f"{role}_gemm"] = _matmul(k, n, b, "gemm", role)
    if not graph.traits.qk_norm:
        del kernels["head_norm"]
    # (its output: the gu buffer's rows, unused until the MLP)
    if (qkv_fusable(target, weights, q_dim, kv_dim, hybrid is not None)
            and q_dim + 2 * kv_dim <= buffers["gu"] * limits.prefill_chunk):
        kernels["qkv_gemv"] = _matmul(h, q_dim + 2 * kv_dim, bias, "gemv", "q")
    if hybrid:
        t = hybrid
        kernels |= {
            "attn_gate": SigmoidGateSpec(q_dim),
            "gdn_conv": GdnConvSpec(t.conv_dim, t.conv_kernel, state_slots),
            "gdn_gate": GdnGateSpec(t.v_heads),
            "gdn_recurrent": GdnRecurrentSpec(t.k_heads, t.v_heads, t.k_dim, t.v_dim,
                                              state_slots, gdn_chunk(limits)),
            "gdn_norm": GdnNormSpec(t.v_heads, t.v_dim, cfg.rms_norm_eps),
        }
        shapes = [("q_gate", h, q_dim), ("gdn_qkv", h, t.conv_dim), ("gdn_z", h, t.value_width),
                  ("gdn_ba", h, 2 * t.v_heads), ("gdn_out", t.value_width, h)]
        if t.sparse_layers:
            kernels |= {
                "moe_router": MoeRouterSpec(t.experts, t.top_k, t.norm_topk),
                "moe_combine": MoeCombineSpec(h, t.top_k, chunk * t.top_k),
                "moe_gather": EmbeddingSpec(chunk, h),  # the rows routed to the experts
                "expert_silu": SiluMulSpec(t.moe_inter),
                "shared_silu": SiluMulSpec(t.shared_inter),
            }
            shapes += [("router", h, t.experts), ("expert_gate_up", h, 2 * t.moe_inter),
                       ("expert_down", t.moe_inter, h),
                       ("shared_gate_up", h, 2 * t.shared_inter),
                       ("shared_down", t.shared_inter, h)]
        if not t.dense_mlp:
            for role in ("gate_up", "down"):
                del kernels[f"{role}_gemv"], kernels[f"{role}_gemm"]
            del kernels["silu_mul"]
        if mtp:
            shapes.append(("mtp_fc", h, h))
        for role, k, n in shapes:
            kernels[f"{role}_gemv"] = _matmul(k, n, False, "gemv", role)
            kernels[f"{role}_gemm"] = _matmul(k, n, False, "gemm", role)

    # Vectorized kernels assume every row of a buffer or of the KV pool starts 64-byte
    # aligned like the buffer base.
    if kvd == "f32" and (kv_dim * 4) % 64:
        raise PlanError(f"num_key_value_heads x head_dim = {kv_dim} floats is not a multiple "
                        "of 16; this KV layout needs 64-byte aligned rows")
    if (h * 4) % 64:
        raise PlanError(f"hidden_size {h} is not a multiple of 16; rows of the hidden "
                        "state must stay 64-byte aligned")
    return Plan(limits, kernels, buffers, memory, kv, weights)


def _suits(kv_dtype: str, head_dim: int) -> bool:
    try:
        check_head_dim(kv_dtype, head_dim)
    except ValueError:
        return False
    return True


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
