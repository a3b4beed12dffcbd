"""Template views of the CUDA launch table (templates/launch_cuda.cu.j2)."""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.kernels.cuda.module import CudaParam
from ninfer.occupancy.model_launches import VerifiedModule

_SCRATCH_CTYPES = {"float32": "float", "int32": "int32_t", "int64": "int64_t"}


@dataclass(frozen=True)
class LaunchView:
    spec: str
    symbol: str
    grid: tuple[str, ...]  # C, one per dimension
    block: tuple[int, ...]
    smem: str  # C
    threads: int
    max_smem: int
    budget: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class ScratchView:
    name: str
    ctype: str
    elements: str  # C
    max_elements: int


def _arg(param: CudaParam) -> str:
    if param.kind == "scratch":
        return f"scratch_{param.name}()"
    if param.ctype.endswith("*"):
        return f"({param.ctype})({param.value})"  # TVM kernels take non-const pointers
    return f"static_cast<{param.ctype}>({param.value})"


def launch_views(verified: VerifiedModule) -> tuple[list[LaunchView], list[ScratchView]]:
    """One view per device launch, with the bounds the verifier proved for it."""
    checks = {c.launch.kernel: c for c in verified.report.checks}
    views, scratch = [], {}
    for launch in verified.module.launches:
        check = checks[launch.kernel_symbol]
        rows = verified.max_rows[launch.spec_name]
        for alloc in launch.host_allocs:
            count = max(alloc.elements.evaluate({"n": n})  # need not be monotonic in n
                        for n in range(1, rows + 1))
            scratch[alloc.name] = ScratchView(alloc.name, _SCRATCH_CTYPES[alloc.dtype],
                                              alloc.elements.c(), count)
        views.append(LaunchView(
            spec=launch.spec_name, symbol=launch.kernel_symbol,
            grid=tuple(g.c() for g in launch.grid), block=tuple(launch.block),
            smem=launch.dynamic_smem.c(), threads=launch.threads,
            max_smem=check.max_dynamic_smem,
            budget=(check.resident_budget or 0) if check.launch.cooperative else 0,
            args=tuple(_arg(p) for p in launch.params)))
    return views, list(scratch.values())
