"""Kernel stubs: one C++ function per kernel instance with a typed signature.

The step program (templates/model.cpp.j2) calls only stubs, so it is the same for every
backend; the launch table behind them is rendered per backend (templates/launch_*.j2):
on the CPU a stub packs DLTensors and calls the TVM kernel, on CUDA it computes the grid
and launches the device kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_CTYPES = {"float32": "float", "int32": "int32_t", "int64": "int64_t"}
_DLTYPES = {"float32": "cpu::f32()", "int32": "cpu::i32()"}


@dataclass(frozen=True)
class StubParam:
    name: str
    kind: str  # tensor | scalar
    ctype: str  # C element type (tensors) or scalar type
    dltype: str  # DLDataType expression for tensors
    shape: tuple[str, ...]  # C expressions; the symbolic row count is `n`
    output: bool

    @property
    def decl(self) -> str:
        if self.kind == "scalar":
            return f"{self.ctype} {self.name}"
        const = "" if self.output else "const "
        return f"{const}{self.ctype}* {self.name}"


@dataclass(frozen=True)
class KernelStub:
    name: str
    family: str
    params: tuple[StubParam, ...]
    symbolic_rows: bool  # takes `int64_t n`

    @property
    def declaration(self) -> str:
        parts = [p.decl for p in self.params]
        if self.symbolic_rows:
            parts.append("int64_t n")
        return f"void {self.name}({', '.join(parts)})"


def make_stub(spec: Any) -> KernelStub:
    params = []
    rows = False
    for arg in spec.signature():
        shape = tuple(str(d) for d in arg.shape)
        rows = rows or "n" in shape
        params.append(StubParam(
            name=arg.name, kind=arg.kind, ctype=_CTYPES[arg.dtype],
            dltype=_DLTYPES.get(arg.dtype, ""), shape=shape, output=arg.name == "out"))
    return KernelStub(spec.name(), spec.family, tuple(params), rows)
