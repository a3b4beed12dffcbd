"""`compile_report.json`: what was compiled, how every launch was proven, stage times."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ninfer import __version__
from ninfer.occupancy.coop import CoopRouter
from ninfer.occupancy.verifier import VerificationReport, table_rows
from ninfer.plan import Plan
from ninfer.targets import Target

LAUNCH_COLUMNS = ("kernel", "threads", "registers", "smem", "ctas_per_sm", "resident_budget",
                  "sizes", "max_ok_size")


@dataclass(frozen=True)
class LaunchRow:
    """One row of the launch verification table (occupancy.verifier.table_rows), as text:
    e.g. smem "24832 (opt-in)", ctas_per_sm "1 (registers)", resident_budget "-"."""

    kernel: str
    threads: str
    registers: str
    smem: str
    ctas_per_sm: str
    resident_budget: str
    sizes: str  # "tokens 1..2048"
    max_ok_size: str

    def to_json(self) -> dict[str, str]:
        return dict(zip(LAUNCH_COLUMNS, self.cells(), strict=True))

    def cells(self) -> tuple[str, ...]:
        return (self.kernel, self.threads, self.registers, self.smem, self.ctas_per_sm,
                self.resident_budget, self.sizes, self.max_ok_size)


def launch_rows(reports: list[VerificationReport]) -> tuple[LaunchRow, ...]:
    return tuple(LaunchRow(*row) for report in reports for row in table_rows(report))


@dataclass(frozen=True)
class CoopRouteRow:
    """One derived route of a cooperative projection (occupancy.coop): token counts
    min_tokens..max_tokens of `role` (k x n_out) run `variant` (split 1: unsplit), whose
    largest grid there is max_grid CTAs against the verified resident budget (0: not
    cooperative, no budget applies)."""

    role: str
    k: int
    n_out: int
    min_tokens: int
    max_tokens: int
    split: int
    variant: str
    max_grid: int
    resident_budget: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def coop_route_rows(routers: Mapping[str, CoopRouter]) -> tuple[CoopRouteRow, ...]:
    """The routes of every routed role, in role order."""
    rows = []
    for role, router in routers.items():
        for r in router.routes:
            check = router.check(r)
            v = r.variant
            rows.append(CoopRouteRow(role, v.k, v.n_out, r.min_tokens, r.max_tokens, v.split,
                                     v.name(), check.max_grid,
                                     (check.resident_budget or 0) if v.cooperative else 0))
    return tuple(rows)


@dataclass(frozen=True)
class CompileReport:
    model_id: str
    architecture: str
    target: Target
    plan: Plan
    kernels: tuple[tuple[str, str], ...]  # (name, family) of each kernel instance
    generated: tuple[str, ...]  # generated files, relative to the output directory
    launches: tuple[LaunchRow, ...]  # CUDA: every launch the runtime can make
    stage_seconds: dict[str, float]
    notes: tuple[str, ...] = ()  # what the compile chose for options not given
    coop_routes: tuple[CoopRouteRow, ...] = ()  # CUDA: the prefill projections' routes

    def to_json(self) -> dict[str, Any]:
        return {
            "ninfer_version": __version__,
            "model_id": self.model_id,
            "architecture": self.architecture,
            "target": {"name": self.target.name, "hash": self.target.stable_hash()},
            "plan": self.plan.to_json(),
            "kernels": [{"name": name, "family": family} for name, family in self.kernels],
            "generated": list(self.generated),
            "launches": [row.to_json() for row in self.launches],
            "coop_routes": [row.to_json() for row in self.coop_routes],
            "stage_seconds": self.stage_seconds,
            "notes": list(self.notes),
        }
