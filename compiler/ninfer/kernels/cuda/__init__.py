"""CUDA kernels: spec -> TE PrimFunc -> per-target schedule -> one standalone CUDA source.

`lower` runs TVM's pipeline up to the device code and describes every launch;
`schedules` derives the schedule parameters from the target profile; `attention`,
`qmatmul` and `coop` are the hand-written families, rendered from templates/cuda/.
"""

from .lower import (
    CudaLaunch,
    CudaModule,
    CudaParam,
    HostAlloc,
    build_cuda_source,
    cuda_primfunc,
    cuda_target,
    evaluate,
    lower_to_cuda,
    serial_equivalent,
)

__all__ = [
    "CudaLaunch",
    "CudaModule",
    "CudaParam",
    "HostAlloc",
    "build_cuda_source",
    "cuda_primfunc",
    "cuda_target",
    "evaluate",
    "lower_to_cuda",
    "serial_equivalent",
]
