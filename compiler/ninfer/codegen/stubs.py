"""Kernel stubs: one C++ function per kernel instance with a typed signature.

The step program (templates/model.cpp.j2) calls only stubs, so it is the same for every
backend; the launch table behind them is rendered per backend (templates/launch_*.j2):
on the CPU a stub packs DLTensors and calls the TVM kernel, on CUDA it computes the grid
and launches the device kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.artifact_format import ARTIFACT_DTYPES
from ninfer.kernels.spec import AttentionSpec, KernelSpec, MatmulSpec

# 16-bit floats travel as their bit patterns (uint16_t); kernels read them by DLDataType.
_CTYPES = {"float32": "float", "int32": "int32_t", "int64": "int64_t", "float16": "uint16_t",
           "bfloat16": "uint16_t", "uint16": "uint16_t", "int8": "int8_t", "uint8": "uint8_t"}
_DLTYPES = {"float32": "cpu::f32()", "int32": "cpu::i32()", "float16": "cpu::f16()",
            "bfloat16": "cpu::bf16()", "uint16": "cpu::u16()", "int8": "cpu::i8()",
            "uint8": "cpu::u8()"}



# Arguments a kernel reads and writes in place (the GDN kernels' per-slot states).
IN_PLACE_ARGS = ("state", "conv_state")
CPU_MAX_ARGS = 12  # KernelArgs::kMaxArgs in runtime_cpp/backend/cpu/cpu_backend.h


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


@dataclass(frozen=True)
class WeightPart:
    """One stored part of a matmul weight (f32: the matrix; quantized: values, scales)."""

    member: str  # C++ member in the step program, e.g. "q" or "q_scales"
    arg: str  # kernel argument name, e.g. "w" or "w_scales"
    ctype: str
    tensor_suffix: str  # artifact tensor = weight name + suffix ("" for one part)
    dtype: str  # artifact dtype
    shape: tuple[int, ...]


def weight_parts(role: str, spec: KernelSpec) -> list[WeightPart]:
    """The stored parts of a matmul spec's weight, in kernel-argument order: every
    argument between `x` and `bias`/`out`."""
    if not isinstance(spec, MatmulSpec):
        raise TypeError(f"{role}: {spec.name()} is not a matmul")
    args = [a for a in spec.signature() if a.name not in ("x", "bias", "out")]
    single = len(args) == 1
    parts = []
    for a in args:
        part = a.name[2:] if a.name.startswith("w_") else a.name
        parts.append(WeightPart(
            member=role if single else f"{role}_{part}", arg=a.name, ctype=_CTYPES[a.dtype],
            tensor_suffix="" if single else f".{part}", dtype=ARTIFACT_DTYPES[a.dtype],
            shape=tuple(int(d) for d in a.shape)))
    return parts


@dataclass(frozen=True)
class KvPart:
    """One array of a KV pool (ninfer.quantize.kv_formats): the values, or their scales."""

    suffix: str  # member k_pool<suffix>_ / v_pool<suffix>_, kernel argument k_pool<suffix>
    ctype: str
    row_bytes: int  # bytes per pool row (one token of one layer)


def kv_parts(attention: KernelSpec) -> list[KvPart]:
    """The arrays of each KV pool of an attention spec, in kernel-argument order."""
    if not isinstance(attention, AttentionSpec):
        raise TypeError(f"{attention.name()} is not an attention kernel")
    parts = []
    for a in attention.pool_args("k_pool"):
        row_elems = 1
        for d in a.shape[1:]:
            row_elems *= int(d)
        parts.append(KvPart(a.name[len("k_pool"):], _CTYPES[a.dtype],
                            row_elems * _ITEMSIZE[a.dtype]))
    return parts


_ITEMSIZE = {"float32": 4, "float16": 2, "uint16": 2, "int8": 1, "uint8": 1}


def make_stub(spec: KernelSpec) -> KernelStub:
    params = []
    rows = False
    for arg in spec.signature():
        shape = tuple(str(d) for d in arg.shape)
        rows = rows or "n" in shape
        params.append(StubParam(
            name=arg.name, kind=arg.kind, ctype=_CTYPES[arg.dtype],
            dltype=_DLTYPES.get(arg.dtype, ""), shape=shape,
            output=(arg.name == "out" or arg.name.startswith("out_")
                    or arg.name in IN_PLACE_ARGS)))
    if len(params) + rows > CPU_MAX_ARGS:
        raise ValueError(f"{spec.name()} takes {len(params) + rows} arguments; the CPU "
                         "launcher (runtime_cpp/backend/cpu/cpu_backend.h KernelArgs) holds "
                         f"{CPU_MAX_ARGS}")
    return KernelStub(spec.name(), spec.family, tuple(params), rows)
