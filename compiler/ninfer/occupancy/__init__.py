"""Occupancy stage: real resource usage (nvcc) -> CTAs/SM -> resident budgets -> proof.

`resources` compiles CUDA and parses what ptxas reports per kernel; `calc` applies the
CUDA occupancy rules with the target profile's numbers; `verifier` proves that every
launch fits, for every size it can request; `coop` routes the cooperative projection
family per token count; `model_launches` runs all of it over a compiled model;
`explain` prints it.
"""

from .calc import Occupancy, OccupancyError, occupancy, resident_budget
from .resources import (
    CompiledCuda,
    CudaCompileError,
    KernelResources,
    ResourceSource,
    compile_cuda,
    nvcc_resources,
    parse_resource_usage,
)
from .verifier import (
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
    "KernelResources",
    "LaunchCheck",
    "LaunchSpec",
    "LaunchVerificationError",
    "Occupancy",
    "OccupancyError",
    "ResourceSource",
    "RuntimeLimits",
    "VerificationReport",
    "Violation",
    "compile_cuda",
    "format_table",
    "nvcc_resources",
    "occupancy",
    "parse_resource_usage",
    "resident_budget",
    "rich_table",
    "verify",
]
