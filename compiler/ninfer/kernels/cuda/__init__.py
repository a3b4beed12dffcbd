"""CUDA kernels: spec -> TE PrimFunc -> per-target schedule -> one standalone CUDA source.

`lower` runs TVM's pipeline up to the device code and describes every launch (`module`:
the CudaModule it hands on, no TVM); `schedules` derives the schedule parameters from the
target profile; `attention`, `qmatmul` and `coop` are the hand-written families, rendered
from templates/cuda/.
"""

from typing import Any

from .module import CudaLaunch, CudaModule, CudaParam, HostAlloc

_LOWER = ("build_cuda_source", "cuda_primfunc", "cuda_target", "lower_to_cuda",
          "serial_equivalent")

__all__ = ["CudaLaunch", "CudaModule", "CudaParam", "HostAlloc", *_LOWER]


def __getattr__(name: str) -> Any:
    # lower.py imports TVM; the launch descriptions and the coop family do not.
    if name in _LOWER:
        from . import lower

        return getattr(lower, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
