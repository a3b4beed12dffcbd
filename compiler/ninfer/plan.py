"""Plan: serve limits, kernel instances per role, activation buffers and the memory budget.

A configuration that cannot fit fails here, with the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ninfer.frontend.graph import ModelGraph
from ninfer.kernels import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SiluMulSpec,
)
from ninfer.targets import Target


class PlanError(ValueError):
    """The requested serve limits do not fit the model on the target."""


@dataclass(frozen=True)
class ServeLimits:
    max_context: int
    max_prefill_chunk: int
    max_concurrency: int = 1
    gemv_max_rows: int = 4  # row counts up to this use the GEMV schedule, above it GEMM

    def validate(self, graph: ModelGraph) -> None:
        cfg = graph.config
        if self.max_context < 2:
            raise PlanError(f"--max-context {self.max_context} must be at least 2")
        if self.max_context > cfg.max_position_embeddings:
            raise PlanError(
                f"--max-context {self.max_context} exceeds the model's "
                f"max_position_embeddings {cfg.max_position_embeddings}; pass a smaller value")
        if not 1 <= self.max_prefill_chunk <= self.max_context:
            raise PlanError(f"--max-prefill-chunk {self.max_prefill_chunk} must be in "
                            f"[1, max context {self.max_context}]")
        if self.max_concurrency != 1:
            raise PlanError(f"--max-concurrency {self.max_concurrency}: this version serves "
                            "one sequence at a time; pass 1")


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int
    workspace_bytes: int
    budget_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.activation_bytes + self.workspace_bytes


@dataclass(frozen=True)
class Plan:
    limits: ServeLimits
    kernels: dict[str, Any]  # role -> kernel spec
    buffers: dict[str, int]  # activation buffer -> float32 elements per row
    memory: MemoryPlan

    def unique_kernels(self) -> list[Any]:
        seen: dict[str, Any] = {}
        for spec in self.kernels.values():
            seen.setdefault(spec.name(), spec)
        return list(seen.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "limits": asdict(self.limits),
            "kernels": {role: spec.name() for role, spec in self.kernels.items()},
            "buffers": self.buffers,
            "memory": {**asdict(self.memory), "total_bytes": self.memory.total_bytes},
        }


def make_plan(graph: ModelGraph, target: Target, limits: ServeLimits) -> Plan:
    limits.validate(graph)
    cfg = graph.config
    h, d, inter, v = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    q_dim, kv_dim = cfg.num_heads * d, cfg.num_kv_heads * d
    bias = graph.traits.qkv_bias

    kernels: dict[str, Any] = {
        "embed": EmbeddingSpec(v, h),
        "norm": RMSNormSpec(h, cfg.rms_norm_eps),
        "head_norm": RMSNormSpec(d, cfg.rms_norm_eps),
        "rope_q": RopeSpec(cfg.num_heads, d, limits.max_context),
        "rope_k": RopeSpec(cfg.num_kv_heads, d, limits.max_context),
        "attention": AttentionSpec(cfg.num_heads, cfg.num_kv_heads, d, limits.max_context),
        "silu_mul": SiluMulSpec(inter),
        "add": AddSpec(h),
        "lm_head": MatmulSpec(h, v, False, "gemv"),
    }
    for role, k, n, b in (("q", h, q_dim, bias), ("k", h, kv_dim, bias), ("v", h, kv_dim, bias),
                          ("o", q_dim, h, False), ("gate_up", h, 2 * inter, False),
                          ("down", inter, h, False)):
        kernels[f"{role}_gemv"] = MatmulSpec(k, n, b, "gemv")
        kernels[f"{role}_gemm"] = MatmulSpec(k, n, b, "gemm")
    if not graph.traits.qk_norm:
        del kernels["head_norm"]

    # The new keys/values are written by the projection kernels straight into the cache,
    # so each cache row must keep the 64-byte alignment LLVM-built kernels assume.
    if (kv_dim * 4) % 64:
        raise PlanError(f"num_key_value_heads x head_dim = {kv_dim} floats is not a multiple "
                        "of 16; this KV layout needs 64-byte aligned rows")
    # The last row of the hidden state feeds the logits directly; vectorized kernels
    # need its address aligned like every buffer base.
    if (h * 4) % 64:
        raise PlanError(f"hidden_size {h} is not a multiple of 16; rows of the hidden "
                        "state must stay 64-byte aligned")

    # Activation buffers, in floats per token row (sized for the largest prefill chunk).
    buffers = {"x": h, "res": h, "h": h, "q": q_dim, "qr": q_dim, "k": kv_dim, "kn": kv_dim,
               "att": q_dim, "o": h, "gu": 2 * inter, "act": inter}
    chunk = limits.max_prefill_chunk
    weights_bytes = sum(4 * _numel(w.shape) for w in graph.weights)
    weights_bytes += 2 * 4 * limits.max_context * (d // 2)  # rope tables
    kv_bytes = (2 * cfg.num_layers * limits.max_concurrency * limits.max_context * kv_dim * 4)
    activation_bytes = 4 * (chunk * sum(buffers.values()) + v)
    memory = MemoryPlan(weights_bytes, kv_bytes, activation_bytes,
                        workspace_bytes=64 << 20, budget_bytes=target.memory_bytes)
    if memory.total_bytes > memory.budget_bytes:
        gib = 1 << 30
        raise PlanError(
            f"the model does not fit {target.name}'s memory budget: weights "
            f"{weights_bytes / gib:.2f} GiB + KV cache {kv_bytes / gib:.2f} GiB "
            f"({limits.max_concurrency} x {limits.max_context} tokens) + activations "
            f"{activation_bytes / gib:.2f} GiB + workspace {memory.workspace_bytes / gib:.2f} "
            f"GiB = {memory.total_bytes / gib:.2f} GiB > {memory.budget_bytes / gib:.2f} GiB; "
            "lower --max-context or raise --memory-gib")
    return Plan(limits, kernels, buffers, memory)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
