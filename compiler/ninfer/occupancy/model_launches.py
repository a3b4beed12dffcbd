"""Every launch a compiled CUDA model can make, described for the verifier.

The step program calls each kernel stub with a row count between 1 and a per-role
maximum (the step's row budget, i.e. the prefill chunk, for most roles; chunk x heads for
per-head norms; the sequences per step for the logits rows); every device kernel behind a
stub is verified over that whole range, using its real registers and shared memory from
nvcc.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ninfer.occupancy.resources import KernelResources, ResourceSource
from ninfer.occupancy.verifier import LaunchSpec, RuntimeLimits, VerificationReport, verify
from ninfer.targets import Target


@dataclass(frozen=True)
class VerifiedModule:
    module: Any  # ninfer.kernels.cuda.CudaModule
    resources: Mapping[str, KernelResources]  # per kernel symbol, as nvcc reported
    report: VerificationReport
    max_rows: dict[str, int]  # spec name -> largest row count the step program passes


def max_rows_per_spec(plan: Any, num_heads: int) -> dict[str, int]:
    """The largest `n` the step program passes to each kernel instance."""
    chunk, seqs = plan.limits.max_prefill_chunk, plan.limits.max_concurrency
    rows: dict[str, int] = {}
    for role, spec in plan.kernels.items():
        if role == "head_norm":
            need = chunk * num_heads  # called with tokens x heads rows
        elif role == "lm_head_gemv":
            need = min(seqs, plan.limits.gemv_max_rows)  # one logits row per sequence
        elif role in ("lm_head_gemm", "gather"):
            need = seqs
        elif role.endswith("_gemv"):
            need = min(chunk, plan.limits.gemv_max_rows)
        else:
            need = chunk
        rows[spec.name()] = max(rows.get(spec.name(), 0), need)
    return rows


def _size_fn(expr: str, max_context: int, evaluate: Callable[[str, dict[str, int]], int]
             ) -> Callable[[int], int]:
    # Launch shapes depend on the row count only: per-request values (positions, block
    # tables) are read from device memory by the kernels.
    return lambda n: evaluate(expr, {"n": n})


def model_launch_specs(module: Any, max_rows: dict[str, int], max_context: int
                       ) -> list[LaunchSpec]:
    from ninfer.kernels.cuda import evaluate

    specs = []
    for launch in module.launches:
        grid_fns = [_size_fn(g, max_context, evaluate) for g in launch.grid]
        threads = launch.block[0] * launch.block[1] * launch.block[2]

        def grid(n: int, fns: list[Callable[[int], int]] = grid_fns) -> int:
            total = 1
            for f in fns:
                total *= f(n)
            return total

        specs.append(LaunchSpec(
            kernel=launch.kernel_symbol, threads=threads, grid=grid,
            dynamic_smem=_size_fn(launch.dynamic_smem, max_context, evaluate),
            sizes=(1, max_rows[launch.spec_name])))
    return specs


def verify_model_launches(module: Any, target: Target, plan: Any, num_heads: int,
                          resources: ResourceSource) -> VerifiedModule:
    """The device code's resource usage for the target's arch (nvcc), then the proof that
    every launch fits."""
    used = resources(module.source, target.arch)
    rows = max_rows_per_spec(plan, num_heads)
    launches = model_launch_specs(module, rows, plan.limits.max_context)
    report = verify(target, launches, used, RuntimeLimits(max_prefill_chunk=max(rows.values())))
    return VerifiedModule(module, used, report, rows)
