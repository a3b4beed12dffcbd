"""Every launch a compiled CUDA model can make, described for the verifier.

The step program calls each kernel stub with a row count between 1 and a per-role
maximum (the step's row budget, i.e. the prefill chunk, for most roles; chunk x heads for
per-head norms; the sequences per step for the logits rows); every device kernel behind a
stub is verified over that whole range, using its real registers and shared memory from
nvcc (the sampler: one block per logits row). With cooperative prefill projections, each
projection shape gets its routes (occupancy.coop), verified the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ninfer.kernels.cuda.coop import coop_projections
from ninfer.kernels.cuda.module import CudaModule
from ninfer.kernels.spec import MoeRouterSpec
from ninfer.occupancy.coop import CoopRouter, route_projections
from ninfer.occupancy.resources import KernelResources, ResourceSource
from ninfer.occupancy.verifier import (
    LaunchSpec,
    LaunchVerificationError,
    RuntimeLimits,
    VerificationReport,
    Violation,
    verify,
)
from ninfer.plan import Plan
from ninfer.targets import Target


@dataclass(frozen=True)
class VerifiedModule:
    module: CudaModule
    resources: Mapping[str, KernelResources]  # per kernel symbol, as nvcc reported
    report: VerificationReport
    max_rows: dict[str, int]  # spec name -> largest row count the step program passes


@dataclass(frozen=True)
class VerifiedCuda:
    """The occupancy stage's output for a CUDA model: the verified kernel launches, and the
    cooperative projection routers by role (roles of one shape share a router). A failed
    proof is kept here, not raised, so that it can be written out first."""

    kernels: VerifiedModule
    coop: dict[str, CoopRouter] = field(default_factory=dict)
    coop_violations: tuple[Violation, ...] = ()

    @property
    def reports(self) -> list[VerificationReport]:
        """The model's launches, then each distinct router's routes."""
        routers = list({id(r): r for r in self.coop.values()}.values())
        return [self.kernels.report, *(r.report for r in routers)]

    @property
    def violations(self) -> tuple[Violation, ...]:
        return (*self.kernels.report.violations, *self.coop_violations)

    def raise_if_failed(self) -> None:
        if self.violations:
            raise LaunchVerificationError(self.violations)


def max_rows_per_spec(plan: Plan, num_heads: int) -> dict[str, int]:
    """The largest `n` the step program passes to each kernel instance."""
    chunk = plan.limits.prefill_chunk
    rows: dict[str, int] = {}
    for role, spec in plan.kernels.items():
        if role == "head_norm":
            need = chunk * num_heads  # called with tokens x heads rows
        elif role == "lm_head_gemv":  # one logits row per sequence (1 + drafts: speculation)
            need = min(plan.limits.logit_rows, plan.limits.gemv_max_rows)
        elif role in ("lm_head_gemm", "gather", "sampler"):
            need = plan.limits.logit_rows
        elif role == "moe_gather":  # every token row's top_k routed copies
            need = chunk * spec_top_k(plan)
        elif role.endswith("_gemv"):
            need = min(chunk, plan.limits.gemv_max_rows)
        else:
            need = chunk
        rows[spec.name()] = max(rows.get(spec.name(), 0), need)
    return rows


def spec_top_k(plan: Plan) -> int:
    router = plan.kernels["moe_router"]
    assert isinstance(router, MoeRouterSpec)
    return router.top_k


def model_launch_specs(module: CudaModule, max_rows: Mapping[str, int]) -> list[LaunchSpec]:
    # Launch shapes depend on the row count only: per-request values (positions, block
    # tables) are read from device memory by the kernels.
    return [LaunchSpec(launch.shape(), sizes=(1, max_rows[launch.spec_name]))
            for launch in module.launches]


def verify_model_launches(module: CudaModule, target: Target, plan: Plan, num_heads: int,
                          resources: ResourceSource) -> VerifiedModule:
    """The device code's resource usage for the target's arch (nvcc), then the proof that
    every launch fits."""
    used = resources(module.source, target.arch)
    rows = max_rows_per_spec(plan, num_heads)
    report = verify(target, model_launch_specs(module, rows), used,
                    RuntimeLimits(prefill_chunk=max(rows.values())))
    return VerifiedModule(module, used, report, rows)


def verify_cuda_model(module: CudaModule, target: Target, plan: Plan, num_heads: int,
                      resources: ResourceSource, coop: bool) -> VerifiedCuda:
    """The occupancy stage: prove the model's launches; with `coop`, route and prove the
    prefill projections the cooperative family can serve (only once the rest fits)."""
    kernels = verify_model_launches(module, target, plan, num_heads, resources)
    if not coop or not kernels.report.ok:
        return VerifiedCuda(kernels)
    shapes = coop_projections(plan.kernels)
    try:
        routers = route_projections(target, shapes, plan.limits.prefill_chunk, resources)
    except LaunchVerificationError as exc:
        return VerifiedCuda(kernels, coop_violations=exc.violations)
    return VerifiedCuda(kernels, {role: routers[shape] for role, shape in shapes.items()})
