"""Shared pieces of the CPU kernels: tile constants and vector-friendly math.

Kernels are written directly as TIR (TVMScript) with explicit parallel, unrolled and
vectorized loops; the helpers here build expressions that the LLVM backend turns into
straight-line SIMD code (no libm calls, no global scratch).
"""

from __future__ import annotations

import functools
from pathlib import Path

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import tirx as irb

from . import tvmscript

tvmscript.install()  # every CPU kernel builder imports this module

# float32 lanes of one AVX2 register. AVX-512 machines run the same code on ymm registers;
# a wider value here is the single switch for them.
VECTOR_LANES = 8

F32 = "float32"

# Row-wise kernels (elementwise, KV stores, gates) run a call's rows on the calling thread
# when they touch at most this many bytes (read and written): a parallel loop is a fork and
# a join of the thread pool, 0.3-0.9 us on the Zen 4 VM (more when its two cores sit far
# apart), which is more than a decode row of such a kernel costs (RESULTS session 32).
SERIAL_BYTES = 32 << 10


def serial_rows(row_bytes: int) -> int:
    """The most rows of `row_bytes` each that a row-wise kernel runs without a parallel
    loop (see SERIAL_BYTES; read when the kernel is built): for_rows' limit."""
    return SERIAL_BYTES // row_bytes


@T.macro
def for_rows(n, limit, row, bufs):
    """`row(bufs, i)` for i in 0..n-1: on the calling thread where n <= limit (see
    serial_rows), else in a parallel loop; `row` is the kernel's row macro and `bufs` the
    buffers it takes, a tuple. Both loops expand the same body, so a row's bits do not
    depend on which one ran it."""
    if n <= limit:
        for i in range(n):
            row(bufs, i)
    else:
        for i in T.parallel(n):
            row(bufs, i)


@functools.cache
def host_has(feature: str) -> bool:
    """Whether the CPU the kernels are compiled for (always this host: see build.cpu_target)
    has an LLVM target feature ("avx512f", "avxvnni", ...)."""
    import tvm
    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    return bool(codegen.target_has_features(feature, target))


@functools.cache
def host_reports(flag: str) -> bool:
    """Whether the kernel (Linux /proc/cpuinfo) lists `flag` ("avx512_bf16", ...) for this
    CPU: a hypervisor may hide a feature that the CPU model LLVM names (host_has) implies.
    True where there is no such file to ask."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), None)
    return flags is None or flag in flags


def host_has_avx512() -> bool:
    """AVX-512F: 512-bit vectors and 32 vector registers."""
    return host_has("avx512f")


def host_vector_lanes() -> int:
    """float32 lanes of a full vector register on this host: 16 with AVX-512, else 8."""
    return 16 if host_has_avx512() else VECTOR_LANES

LINE_FLOATS = 16  # float32 values per 64-byte cache line

_LOG2E = 1.4426950408889634
# ln(2) split in a part exact in float32 and a small remainder (Cody-Waite reduction).
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# exp() inputs are clamped to this range so that 2^k stays a normal float; below the low
# end the result is flushed to exactly 0.
_EXP_LO = -87.0
_EXP_HI = 88.0


def f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(x) in float32 from a degree-7 polynomial and an exponent bit shift.

    Relative error is a few ulp. Unlike `tirx.exp`, which LLVM scalarizes into `expf`
    calls, this vectorizes.
    """
    xv = tirx.Var("x", F32)
    xc = tirx.Var("xc", F32)
    k = tirx.Var("k", F32)
    r = tirx.Var("r", F32)
    # Taylor series of e^r on |r| <= ln(2)/2: the first omitted term is below 5e-9.
    p = f32(1.0 / 5040.0)
    for coef in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + f32(coef)
    bits = tirx.shift_left(tirx.Cast("int32", k) + tirx.const(127, "int32"), 23)
    body = tirx.Select(xv < f32(_EXP_LO), f32(0.0), p * tirx.reinterpret(F32, bits))
    body = tirx.Let(r, xc - k * f32(_LN2_HI) - k * f32(_LN2_LO), body)
    body = tirx.Let(k, tirx.floor(xc * f32(_LOG2E) + f32(0.5)), body)
    body = tirx.Let(xc, tirx.max(tirx.min(xv, f32(_EXP_HI)), f32(_EXP_LO)), body)
    return tirx.Let(xv, x, body)


def fast_log1p(u: tirx.PrimExpr) -> tirx.PrimExpr:
    """log(1 + u) for 0 <= u <= 1 (float32): 2 atanh(s), s = u / (2 + u) <= 1/3, by its odd
    series to s^13 (the first omitted term is below 1e-8 relative). Vectorizes (no libm)."""
    uv = tirx.Var("u", F32)
    s = tirx.Var("s", F32)
    s2 = tirx.Var("s2", F32)
    p = f32(1.0 / 13.0)
    for n in (11, 9, 7, 5, 3, 1):
        p = p * s2 + f32(1.0 / n)
    body = tirx.Let(s2, s * s, f32(2.0) * s * p)
    body = tirx.Let(s, uv / (f32(2.0) + uv), body)
    return tirx.Let(uv, u, body)


def hsum(buf: tirx.Buffer, *prefix: tirx.PrimExpr, lanes: int = VECTOR_LANES) -> tirx.PrimExpr:
    """Sum of buf[*prefix, 0:lanes] as a balanced tree (short dependency chains)."""
    indices = [(*prefix, v) for v in range(lanes)]
    terms = [buf[i] for i in indices]
    while len(terms) > 1:
        half = len(terms) // 2
        terms = [terms[i] + terms[i + half] for i in range(half)]
    return terms[0]


def hsum_vector(v: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    """Sum of the lanes of the vector v in `hsum`'s order (lanes i and i + lanes/2 first),
    as halving vector adds: LLVM turns a tree of scalar lane reads into a long chain of
    extracts and inserts."""
    while lanes > 1:
        half = lanes // 2
        lo = tirx.Shuffle([v], [tirx.IntImm("int32", i) for i in range(half)])
        hi = tirx.Shuffle([v], [tirx.IntImm("int32", i + half) for i in range(half)])
        v, lanes = lo + hi, half
    return v


def hmax(buf: tirx.Buffer, *prefix: tirx.PrimExpr, lanes: int = VECTOR_LANES) -> tirx.PrimExpr:
    """Maximum of buf[*prefix, 0:lanes] as a balanced tree."""
    indices = [(*prefix, v) for v in range(lanes)]
    terms = [buf[i] for i in indices]
    while len(terms) > 1:
        half = len(terms) // 2
        terms = [tirx.max(terms[i], terms[i + half]) for i in range(half)]
    return terms[0]


def bf16_bits(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 x rounded to bfloat16, nearest-even, as its uint16 bits (the numpy mirror:
    quantize.weight_formats). Quiet NaNs stay NaN; a signalling NaN with only low payload
    bits would round to infinity (arithmetic never makes one)."""
    u32 = "uint32"
    bits = tirx.reinterpret(u32, x)
    one = tirx.const(1, u32)
    sixteen = tirx.const(16, u32)
    rounded = (bits + tirx.const(0x7FFF, u32) + ((bits >> sixteen) & one)) >> sixteen
    return tirx.Cast("uint16", rounded)


def bf16_float(bits: tirx.PrimExpr) -> tirx.PrimExpr:
    """The float32 value of bfloat16 bits (uint16): bf16_bits' inverse, exact."""
    return tirx.reinterpret(F32, tirx.Cast("uint32", bits) << tirx.const(16, "uint32"))


def prefetch(buf: tirx.Buffer, *index: tirx.PrimExpr, locality: int = 3) -> tirx.PrimExpr:
    """Hint the cache line holding buf[index] into the caches (a no-op for correctness):
    `locality` 3 into L1 (the matmuls: L2 measured no faster for them, RESULTS 2026-12-02),
    2 into L2 (decode attention's runs ahead, RESULTS session 35). The index may run past the
    buffer's end: a prefetch never faults (x86 PREFETCHh, AArch64 PRFM), so the streams
    prefetch ahead unclamped. A clamp to the last element cost ~7 scalar instructions a
    prefetched line: the clamped q4g64 gemv read 15% slower in cache (RESULTS 2026-12-06).
    Past the end, LLVM may drop such a prefetch; that costs speed, never correctness."""
    i32 = "int32"
    return tirx.call_llvm_intrin(
        "void",
        "llvm.prefetch.p0",
        tirx.address_of(buf[index]),
        tirx.const(0, i32),
        tirx.const(locality, i32),
        tirx.const(1, i32),  # read, data
    )


def scratch(shape: tuple[int, ...], dtype: str = F32) -> tirx.Buffer:
    """A small per-iteration buffer on the stack, for use inside TVMScript kernels.

    TVM lowers "local"-scope buffers (and plain `x = ...` assignments, which TVMScript
    turns into one-element local buffers) into TVMBackendAllocWorkspace calls, one per
    iteration of a parallel loop. A "global" buffer marked `disable_lower_builtin` is
    emitted by LLVM as a fixed stack slot instead, which it promotes to registers when
    all indices are constant. Bind scalars with `T.bind(...)` for the same reason.
    """
    return irb.alloc_buffer(
        shape, dtype, scope="global", annotations={"disable_lower_builtin": True}
    )


def i64(value: int) -> tirx.IntImm:
    """Index constant in the kernels' single index dtype."""
    return tirx.IntImm("int64", value)
