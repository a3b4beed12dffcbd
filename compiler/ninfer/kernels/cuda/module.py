"""What the CUDA kernel stage hands on: one translation unit and its launches (no TVM).

Sizes are typed expressions over the spec's symbolic sizes (`n`), ninfer.kernels.launch:
the occupancy stage evaluates them for every size it proves, codegen prints them as C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..launch import Expr, LaunchShape, Mul

ParamKind = Literal["tensor", "scratch", "size", "scalar", "expr"]


@dataclass(frozen=True)
class CudaParam:
    """One kernel parameter: the spec argument, scratch buffer or size named `name`, or
    for kind "expr" the value `expr` computed over the sizes."""

    name: str
    kind: ParamKind
    ctype: str
    expr: Expr | None = None

    @property
    def value(self) -> str:
        """What the host passes, as C."""
        return self.expr.c() if self.expr is not None else self.name


@dataclass(frozen=True)
class HostAlloc:
    """A global scratch buffer of `elements` values of `dtype`."""

    name: str
    dtype: str
    elements: Expr


@dataclass(frozen=True)
class CudaLaunch:
    """One kernel launch of a spec. `grid` and `dynamic_smem` (bytes) are int64 expressions
    over the sizes; `block` is constant. Dynamic shared memory above 48 KiB needs
    cudaFuncAttributeMaxDynamicSharedMemorySize raised before the launch."""

    spec_name: str
    kernel_symbol: str
    params: list[CudaParam]
    grid: tuple[Expr, Expr, Expr]
    block: tuple[int, int, int]
    dynamic_smem: Expr  # bytes
    host_allocs: list[HostAlloc]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def shape(self) -> LaunchShape:
        """The launch for the verifier: total CTAs = the product of the grid dimensions."""
        return LaunchShape(self.kernel_symbol, self.threads, Mul(self.grid), self.dynamic_smem)


@dataclass(frozen=True)
class CudaModule:
    """One CUDA translation unit holding every kernel (extern "C" __global__, CUDA headers
    only) and the launches, grouped by spec in input order."""

    source: str
    launches: list[CudaLaunch]
    arch: str
