"""Kernel library: typed specs, CPU kernels compiled with TVM, and a float64 reference."""

from .cpu import build_cpu_module, build_cpu_object, cpu_primfunc, cpu_target
from .reference import reference
from .spec import (
    WEIGHT_DTYPES,
    AddSpec,
    Arg,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SiluMulSpec,
)

__all__ = [
    "WEIGHT_DTYPES",
    "AddSpec",
    "Arg",
    "AttentionSpec",
    "EmbeddingSpec",
    "KernelSpec",
    "MatmulSpec",
    "RMSNormSpec",
    "RopeSpec",
    "SiluMulSpec",
    "build_cpu_module",
    "build_cpu_object",
    "cpu_primfunc",
    "cpu_target",
    "reference",
]
