"""The launch verifier: prove that every launch the runtime can make fits the target.

A `LaunchSpec` describes one launch site: a kernel's launch shape (ninfer.kernels.launch:
block size, grid and dynamic shared memory as typed expressions over the size `n`, whether
it is cooperative), the runtime size `n` stands for (tokens of a prefill chunk, batch size,
or verify rows = batch x (draft + 1)), and the sizes it serves.
`verify` walks every size and checks, against the target profile and the kernel's real
resource usage (from nvcc):

- threads per block <= max_threads_per_block; registers <= registers_per_thread_max;
- spilled bytes (stores + loads) <= the stated bound (0 by default);
- static + dynamic shared memory <= shared_memory_per_block_optin, recording where the
  runtime must raise the max-dynamic-shared-memory attribute (above the default limit);
- at least one CTA fits on an SM (the occupancy rules, `calc.occupancy`);
- for cooperative launches: grid <= the resident budget (CTAs/SM x SM count).

A size that fails is reported with the kernel, the size, the limit, the value and the
target; nothing is silently clamped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from ninfer.kernels.launch import LaunchShape
from ninfer.occupancy.calc import Occupancy, OccupancyError, occupancy, resident_budget
from ninfer.occupancy.resources import KernelResources
from ninfer.targets import Target

if TYPE_CHECKING:
    from rich.table import Table

Axis = Literal["tokens", "batch", "rows"]
MAX_GRID_X = 2**31 - 1


class LaunchVerificationError(ValueError):
    """Some launch does not fit the target; `violations` says which, where and why."""

    def __init__(self, violations: Iterable[Violation]) -> None:
        self.violations = tuple(violations)
        super().__init__("\n".join(str(v) for v in self.violations))


@dataclass(frozen=True)
class RuntimeLimits:
    """The sizes the compiled runtime may request, and the verifier's own bounds."""

    prefill_chunk: int
    max_concurrency: int = 1
    max_draft: int = 0
    max_spill_bytes: int = 0

    def sizes(self, axis: Axis) -> tuple[int, int]:
        """Inclusive range of an axis. `rows` covers every batch x (draft + 1)."""
        hi = {"tokens": self.prefill_chunk, "batch": self.max_concurrency,
              "rows": self.max_concurrency * (self.max_draft + 1)}[axis]
        return 1, hi


@dataclass(frozen=True)
class LaunchSpec:
    """One launch site: `shape` at sizes n along `axis`; `sizes` (inclusive) narrows the
    axis range, e.g. for a route."""

    shape: LaunchShape
    axis: Axis = "tokens"
    sizes: tuple[int, int] | None = None

    @property
    def kernel(self) -> str:
        return self.shape.kernel

    @property
    def threads(self) -> int:
        return self.shape.threads

    @property
    def cooperative(self) -> bool:
        return self.shape.cooperative

    def grid(self, size: int) -> int:
        return self.shape.grid.evaluate({"n": size})

    def dynamic_smem_at(self, size: int) -> int:
        return self.shape.dynamic_smem.evaluate({"n": size})


@dataclass(frozen=True)
class Violation:
    """One failed limit. `size` is the first failing size (None: fails at every size)."""

    target: str
    kernel: str
    limit: str
    value: int | None
    allowed: int | None
    axis: str = "tokens"
    size: int | None = None
    failing_sizes: int = 0
    note: str = ""

    def __str__(self) -> str:
        where = "" if self.size is None else f" at {self.axis}={self.size}"
        more = f" (and {self.failing_sizes - 1} larger sizes)" if self.failing_sizes > 1 else ""
        numbers = ("" if self.value is None else f" {self.value}" if self.allowed is None
                   else f" {self.value} exceeds {self.allowed}")
        note = f" ({self.note})" if self.note else ""
        return f"{self.target}: kernel {self.kernel}{where}{more}: {self.limit}{numbers}{note}"


@dataclass(frozen=True)
class LaunchCheck:
    """What the verifier established for one launch (one row of the --explain table).

    max_ok_size: the largest size s such that every size from the first one to s fits
    (first size - 1 when none does). ctas_per_sm / budget: the smallest over all sizes.
    threads, max_dynamic_smem and resident_budget are what the runtime re-checks before
    each launch (runtime_cpp/backend/cuda/cuda_backend.h `LaunchBounds`).
    """

    launch: LaunchSpec
    resources: KernelResources | None
    sizes: tuple[int, int]
    max_ok_size: int
    ctas_per_sm: int = 0
    limited_by: str = ""
    resident_budget: int | None = None
    max_grid: int = 0
    max_smem: int = 0  # static + dynamic
    max_dynamic_smem: int = 0
    needs_smem_optin: bool = False


@dataclass(frozen=True)
class VerificationReport:
    target: Target
    checks: tuple[LaunchCheck, ...]
    violations: tuple[Violation, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_failed(self) -> None:
        if self.violations:
            raise LaunchVerificationError(self.violations)


def verify(target: Target, launches: Iterable[LaunchSpec],
           resources: Mapping[str, KernelResources], limits: RuntimeLimits) -> VerificationReport:
    """Check every launch at every size it serves; collect (never stop at) violations."""
    if not target.is_cuda:
        raise ValueError(f"target {target.name} is not a CUDA target; launches are verified "
                         "against a GPU profile")
    checks: list[LaunchCheck] = []
    violations: list[Violation] = []
    for launch in launches:
        check, found = _verify_one(target, launch, resources.get(launch.kernel), limits)
        checks.append(check)
        violations.extend(found)
    return VerificationReport(target, tuple(checks), tuple(violations))


def _static_violations(target: Target, launch: LaunchSpec, res: KernelResources,
                       limits: RuntimeLimits) -> list[Violation]:
    def v(limit: str, value: int, allowed: int, note: str = "") -> Violation:
        return Violation(target.name, launch.kernel, limit, value, allowed, launch.axis,
                         note=note)

    found = []
    if not 1 <= launch.threads <= target.max_threads_per_block:
        found.append(v("threads per block", launch.threads, target.max_threads_per_block))
    if res.registers > target.registers_per_thread_max:
        found.append(v("registers per thread", res.registers, target.registers_per_thread_max))
    if res.spill_bytes > limits.max_spill_bytes:
        found.append(v("spilled bytes", res.spill_bytes, limits.max_spill_bytes,
                       f"{res.spill_store_bytes} stored + {res.spill_load_bytes} loaded "
                       "per thread; raise the register budget or shrink the tile"))
    return found


_Failure = tuple[str, int | None, int | None, str]


def _check_size(target: Target, launch: LaunchSpec, res: KernelResources, smem: int,
                grid: int, occ_cache: dict[int, Occupancy | OccupancyError],
                ) -> tuple[list[_Failure], Occupancy | None]:
    """The size-dependent limits at one size; the occupancy there (None if it cannot run)."""
    failed: list[_Failure] = []
    if grid < 1:
        failed.append(("empty grid", grid, None, "a launch needs at least 1 CTA"))
    elif grid > MAX_GRID_X:
        failed.append(("grid size", grid, MAX_GRID_X, "gridDim.x is at most 2^31-1"))
    if smem > target.shared_memory_per_block_optin:
        failed.append(("shared memory per block (opt-in limit)", smem,
                       target.shared_memory_per_block_optin,
                       f"{res.static_smem_bytes} static + {smem - res.static_smem_bytes} "
                       "dynamic bytes"))
        return failed, None
    if smem not in occ_cache:
        try:
            occ_cache[smem] = occupancy(target, launch.threads, res.registers, smem)
        except OccupancyError as exc:
            occ_cache[smem] = exc
    occ = occ_cache[smem]
    if isinstance(occ, OccupancyError):
        failed.append(("occupancy", None, None, str(occ)))
        return failed, None
    if launch.cooperative:
        budget = resident_budget(target, occ)
        if grid > budget:
            failed.append(("cooperative grid (CTAs) vs resident budget", grid, budget,
                           f"{occ.ctas_per_sm} CTA/SM, limited by {occ.limited_by}, x "
                           f"{target.sm_count} SMs"))
    return failed, occ


def _verify_one(target: Target, launch: LaunchSpec, res: KernelResources | None,
                limits: RuntimeLimits) -> tuple[LaunchCheck, list[Violation]]:
    lo, hi = launch.sizes or limits.sizes(launch.axis)
    if res is None:
        missing = Violation(target.name, launch.kernel, "resource usage", None, None,
                            launch.axis, note="the kernel was not compiled for "
                            f"{target.arch}; nothing can be proven about it")
        return LaunchCheck(launch, None, (lo, hi), lo - 1), [missing]
    static = _static_violations(target, launch, res, limits)
    if static:
        return LaunchCheck(launch, res, (lo, hi), lo - 1), static

    first_fail: dict[str, Violation] = {}
    fail_counts: dict[str, int] = {}
    occ_cache: dict[int, Occupancy | OccupancyError] = {}
    ctas, limited_by, budget, max_grid, max_smem, optin = 0, "", None, 0, 0, False
    first_bad: int | None = None
    for size in range(lo, hi + 1):
        smem = res.static_smem_bytes + launch.dynamic_smem_at(size)
        grid = launch.grid(size)
        max_grid, max_smem = max(max_grid, grid), max(max_smem, smem)
        optin = optin or smem > target.shared_memory_per_block
        failed, occ = _check_size(target, launch, res, smem, grid, occ_cache)
        if occ is not None:
            if not ctas or occ.ctas_per_sm < ctas:
                ctas, limited_by = occ.ctas_per_sm, occ.limited_by
            if launch.cooperative:
                size_budget = resident_budget(target, occ)
                budget = size_budget if budget is None else min(budget, size_budget)
        for limit, value, allowed, note in failed:
            fail_counts[limit] = fail_counts.get(limit, 0) + 1
            first_fail.setdefault(limit, Violation(target.name, launch.kernel, limit, value,
                                                   allowed, launch.axis, size, note=note))
        if failed and first_bad is None:
            first_bad = size
    found = [replace(v, failing_sizes=fail_counts[k]) for k, v in first_fail.items()]
    max_ok = hi if first_bad is None else first_bad - 1
    check = LaunchCheck(launch, res, (lo, hi), max_ok, ctas, limited_by, budget, max_grid,
                        max_smem, max(0, max_smem - res.static_smem_bytes), optin)
    return check, found


TABLE_COLUMNS = ("kernel", "threads", "regs", "smem", "CTAs/SM", "resident budget",
                 "sizes", "max size")


def table_rows(report: VerificationReport) -> list[tuple[str, ...]]:
    """One row per launch: the numbers behind every decision, as strings."""
    rows: list[tuple[str, ...]] = []
    for c in report.checks:
        res, launch = c.resources, c.launch
        regs = "?" if res is None else str(res.registers)
        smem = f"{c.max_smem}" + (" (opt-in)" if c.needs_smem_optin else "")
        occ = f"{c.ctas_per_sm} ({c.limited_by})" if c.ctas_per_sm else "-"
        budget = "-" if c.resident_budget is None else str(c.resident_budget)
        lo, hi = c.sizes
        rows.append((launch.kernel, str(launch.threads), regs, smem, occ, budget,
                     f"{launch.axis} {lo}..{hi}", str(c.max_ok_size)))
    return rows


def format_table(report: VerificationReport) -> str:
    """Plain-text table (fixed-width columns) followed by every violation.

    "max size" is the largest size up to which every size of the launch fits.
    """
    rows = [TABLE_COLUMNS, *table_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    lines = [f"target {report.target.name} ({report.target.arch}, "
             f"{report.target.sm_count} SMs)"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    lines += [f"VIOLATION {v}" for v in report.violations]
    return "\n".join(lines)


def rich_table(report: VerificationReport, title: str = "launch verification") -> Table:
    """The same table for a terminal (`--explain`); launches with violations in red."""
    from rich.table import Table

    t = report.target
    failing = {v.kernel for v in report.violations}
    table = Table(title=f"{title}: {t.name} ({t.arch}, {t.sm_count} SMs)")
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="left" if col in ("kernel", "sizes") else "right",
                         no_wrap=True)
    for row in table_rows(report):
        table.add_row(*row, style="red" if row[0] in failing else None)
    return table
