"""Kernels: typed specs (what plan picks), their TE math and float64 reference, typed
launch shapes, and the two backends: `cpu/` (TIR -> one LLVM object) and `cuda/` (TVM
schedules and hand-written families -> one CUDA source)."""

from typing import Any

from .reference import reference
from .spec import (
    WEIGHT_DTYPES,
    AddSpec,
    Arg,
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

__all__ = [
    "WEIGHT_DTYPES",
    "AddSpec",
    "Arg",
    "AttentionSpec",
    "EmbeddingSpec",
    "GdnConvSpec",
    "GdnGateSpec",
    "GdnNormSpec",
    "GdnRecurrentSpec",
    "KernelSpec",
    "KvStoreSpec",
    "MatmulSpec",
    "MoeCombineSpec",
    "MoeRouterSpec",
    "RMSNormSpec",
    "RopeSpec",
    "SamplerSpec",
    "SigmoidGateSpec",
    "SiluMulSpec",
    "build_cpu_module",
    "build_cpu_object",
    "cpu_primfunc",
    "cpu_target",
    "reference",
]


def __getattr__(name: str) -> Any:
    # The CPU builders import TVM; load them on first use so that the specs, the
    # reference and everything built on them (plan, artifact) import without TVM.
    if name in ("build_cpu_module", "build_cpu_object", "cpu_primfunc", "cpu_target"):
        from . import cpu

        return getattr(cpu, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
