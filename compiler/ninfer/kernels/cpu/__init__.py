"""CPU kernels: each family as a scheduled TIR PrimFunc, built by LLVM into one object.

`build` assembles and compiles them; `common` holds the vector helpers; one module per
family (`elementwise`, `matmul`, `qmatmul`, `kv`, `attention`). Importing this imports TVM.
"""

from .build import build_cpu_module, build_cpu_object, cpu_primfunc, cpu_target

__all__ = ["build_cpu_module", "build_cpu_object", "cpu_primfunc", "cpu_target"]
