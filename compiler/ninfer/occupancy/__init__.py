"""Occupancy stage: real resource usage (nvcc) -> CTAs/SM -> resident budgets -> proof.

`resources` compiles CUDA and parses what ptxas reports per kernel; `calc` applies the
CUDA occupancy rules with the target profile's numbers; `verifier` proves that every
launch the runtime can make fits, for every size it can request; `explain` prints it.
"""

from .calc import Occupancy, OccupancyError, occupancy, resident_budget
from .resources import (
    CompiledCuda,
    CudaCompileError,
    KernelResources,
    compile_cuda,
    parse_resource_usage,
)
from .verifier import (
    Grid,
    LaunchCheck,
    LaunchSpec,
    LaunchVerificationError,
    RuntimeLimits,
    VerificationReport,
    Violation,
    format_table,
    rich_table,
    verify,
)

__all__ = [
    "CompiledCuda",
    "CudaCompileError",
    "Grid",
    "KernelResources",
    "LaunchCheck",
    "LaunchSpec",
    "LaunchVerificationError",
    "Occupancy",
    "OccupancyError",
    "RuntimeLimits",
    "VerificationReport",
    "Violation",
    "compile_cuda",
    "format_table",
    "occupancy",
    "parse_resource_usage",
    "resident_budget",
    "rich_table",
    "verify",
]
