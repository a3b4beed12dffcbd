"""The x86 integer dot-product instructions of the group-quantized matmul (qmatmul.py), as
TVM expressions: vpmaddubsw / vpmaddwd (AVX2), vpdpbusd on ymm (AVX-VNNI or AVX-512 VL) and
zmm (AVX-512 VNNI), vpsignb, the host tests that pick among them, and the vector helpers
the kernel builds its steps from. Every path computes the same exact integers where the
kernel's value ranges rule out vpmaddubsw's saturation (qmatmul.py, step 2)."""

from __future__ import annotations

from tvm import tirx

from .common import host_has, i64

LANES = 8  # int32 / float32 lanes of a ymm register
BYTES = 32  # int8 lanes of a ymm register
ZL = 16  # int32 / float32 lanes of a step's vectors (a zmm register)


def _llvm(dtype: str, name: str, *args: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.call_llvm_pure_intrin(dtype, name, *args)


def maddubs(u8: tirx.PrimExpr, s8: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpmaddubsw: 16 x int16 = u8[2i] * s8[2i] + u8[2i+1] * s8[2i+1] (saturating)."""
    return _llvm("int16x16", "llvm.x86.avx2.pmadd.ub.sw", u8, s8)


def maddwd(a: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpmaddwd with ones: 8 x int32 = a[2i] + a[2i+1]."""
    ones = tirx.Broadcast(tirx.const(1, "int16"), 16)
    return _llvm("int32x8", "llvm.x86.avx2.pmadd.wd", a, ones)


def dpbusd(acc: tirx.PrimExpr, u8: tirx.PrimExpr, s8: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpdpbusd (AVX-VNNI): 8 x int32 = acc + the sums of 4 adjacent u8 * s8 products, without
    an int16 step (so equal to maddwd(maddubs(u8, s8)) wherever that does not saturate,
    which the kernel's ranges rule out)."""
    # LLVM 20 and later type the byte operands <32 x i8> (before: <8 x i32>).
    return _llvm("int32x8", "llvm.x86.avx512.vpdpbusd.256", acc, u8, s8)


def dpbusd512(acc: tirx.PrimExpr, u8: tirx.PrimExpr, s8: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpdpbusd on zmm: 16 x int32 = acc + the sums of 4 adjacent u8 * s8 products."""
    return _llvm("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, u8, s8)


def psignb(a: tirx.PrimExpr, b: tirx.PrimExpr) -> tirx.PrimExpr:
    """vpsignb: a * sign(b) per int8 lane (0 where b == 0)."""
    return _llvm("int8x32", "llvm.x86.avx2.psign.b", a, b)


def use_vnni() -> bool:
    """The 256-bit group dots use vpdpbusd where the host has it (one instruction for
    vpmaddubsw + vpmaddwd; the integer results are the same)."""
    return host_has("avxvnni") or (host_has("avx512vnni") and host_has("avx512vl"))


def use_zmm() -> bool:
    """Steps are one 512-bit vpdpbusd per weight vector where the host has AVX-512 VNNI
    (else two 256-bit halves: the same integers)."""
    return host_has("avx512vnni") and host_has("avx512bw") and host_has("avx512vl")


def vec(base: tirx.PrimExpr, lanes: int) -> tirx.Ramp:
    return tirx.Ramp(base, i64(1), lanes)


def concat(lo: tirx.PrimExpr, hi: tirx.PrimExpr) -> tirx.PrimExpr:
    """Two 8-lane vectors as one of 16 lanes (lo in lanes 0-7)."""
    return tirx.Shuffle([lo, hi], [tirx.IntImm("int32", v) for v in range(2 * LANES)])


def bcast(value: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    return tirx.Broadcast(value, lanes)
