"""Codegen: Jinja2 templates -> the generated C++ tree of one compiled model."""

from ninfer.codegen.backend import Backend, CpuBackend, CudaBackend, cuda_backend
from ninfer.codegen.render import GeneratedTree, render_tree

__all__ = ["Backend", "CpuBackend", "CudaBackend", "GeneratedTree", "cuda_backend",
           "render_tree"]
