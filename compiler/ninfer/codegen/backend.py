"""What codegen needs from the backend stages, per kind: the values its templates read.

CPU: the kernel object the build links. CUDA: the device code, and the launch table and
cooperative projection stubs with the bounds the occupancy stage proved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from ninfer.codegen.coop_launch import CoopStubView, coop_stubs
from ninfer.codegen.cuda_launch import LaunchView, ScratchView, launch_views
from ninfer.kernels.cuda.coop import render_coop_source
from ninfer.occupancy.model_launches import VerifiedCuda


@dataclass(frozen=True)
class CpuBackend:
    kernel_object: Path  # one LLVM object with every kernel (kernels.cpu)
    # the vector features it was compiled for (kernels.cpu.common.host_vector_features),
    # which the server checks the CPU it starts on for
    cpu_features: tuple[str, ...]

    kind: ClassVar[Literal["cpu"]] = "cpu"

    def template_values(self) -> dict[str, object]:
        return {"kernel_object": str(self.kernel_object), "cpu_features": self.cpu_features}


@dataclass(frozen=True)
class CudaBackend:
    device_source: str  # the TVM and hand-written kernels, one translation unit
    launches: tuple[LaunchView, ...]
    scratch: tuple[ScratchView, ...]
    nvcc: str  # the compiler CMake builds the device code with
    coop: Mapping[str, CoopStubView] = field(default_factory=dict)  # role -> stub
    coop_source: str = ""  # device code of the cooperative variants the stubs launch

    kind: ClassVar[Literal["cuda"]] = "cuda"

    def template_values(self) -> dict[str, object]:
        return {"device_source": self.device_source, "launches": self.launches,
                "scratch": self.scratch, "nvcc": self.nvcc, "coop": dict(self.coop),
                "coop_source": self.coop_source}


Backend = CpuBackend | CudaBackend


def cuda_backend(verified: VerifiedCuda, max_tokens: int, nvcc: str) -> CudaBackend:
    """The template values of a verified CUDA model (`max_tokens`: the prefill chunk)."""
    launches, scratch = launch_views(verified.kernels)
    roles, variants = coop_stubs(verified.coop, max_tokens)
    return CudaBackend(verified.kernels.module.source, tuple(launches), tuple(scratch), nvcc,
                       roles, render_coop_source(variants) if variants else "")
