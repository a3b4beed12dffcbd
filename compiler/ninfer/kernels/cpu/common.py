"""Shared pieces of the CPU kernels: tile constants and vector-friendly math.

Kernels are written directly as TIR (TVMScript) with explicit parallel, unrolled and
vectorized loops; the helpers here build expressions that the LLVM backend turns into
straight-line SIMD code (no libm calls, no global scratch).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import tirx as irb

from . import tvmscript

if TYPE_CHECKING:
    import tvm

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


# /proc/cpuinfo's flag -> LLVM's target feature, for the vector instruction sets the
# kernels may use. LLVM names the host's CPU model (llvm_get_system_cpu), and the model
# implies a feature set; a hypervisor can report a model whose set differs from what the
# guest gets: the Intel VM of RESULTS session 23 reports model 167 ("rocketlake", no
# AVX512_BF16 / FP16) on a CPU that has both, and a guest may have a feature hidden that
# its model implies. host_target() corrects the model's set by these flags both ways.
CPUINFO_FEATURES = {
    "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512bw": "avx512bw",
    "avx512vl": "avx512vl", "avx512dq": "avx512dq", "avx512cd": "avx512cd",
    "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "avx512vbmi": "avx512vbmi", "avx512_vbmi2": "avx512vbmi2",
    "avx512_bitalg": "avx512bitalg", "avx512_vpopcntdq": "avx512vpopcntdq",
    "avx512ifma": "avx512ifma", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq",
}


@functools.cache
def host_flags() -> frozenset[str] | None:
    """The CPU flags Linux lists for this machine (/proc/cpuinfo), None where there is no
    such file to ask."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), None)
    return None if flags is None else frozenset(flags)


def host_target_config() -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """The LLVM target of this machine as (key, value) pairs: the CPU model LLVM names and,
    as "mattr", each CPUINFO_FEATURES feature that the model's set gets wrong against the
    flags Linux lists ("+avx512bf16" where the model lacks a listed one, "-x" where it
    implies an unlisted one). The string "native" would fall back to a generic CPU."""
    import tvm
    from tvm.target import codegen

    mcpu = codegen.llvm_get_system_cpu()
    flags = host_flags()
    if flags is None:
        return (("kind", "llvm"), ("mcpu", mcpu))
    implied = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    mattr = sorted((f"+{feat}" if flag in flags else f"-{feat}")
                   for flag, feat in CPUINFO_FEATURES.items()
                   if (flag in flags) != (feat in implied))
    config: tuple[tuple[str, str | tuple[str, ...]], ...] = (("kind", "llvm"), ("mcpu", mcpu))
    return config + ((("mattr", tuple(mattr)),) if mattr else ())


def host_target() -> tvm.target.Target:
    """LLVM target for this machine's CPU (host_target_config)."""
    import tvm

    return tvm.target.Target({k: list(v) if isinstance(v, tuple) else v
                              for k, v in host_target_config()})


def host_vector_features() -> tuple[str, ...]:
    """The CPUINFO_FEATURES features of host_target(), sorted: what a kernel object built
    for it may use, and what a server linking it checks the CPU it starts on for
    (runtime_cpp/backend/cpu/cpu_features.h)."""
    from tvm.target import codegen

    target = host_target()
    return tuple(sorted(f for f in CPUINFO_FEATURES.values()
                        if codegen.target_has_features(f, target)))


@functools.cache
def host_has(feature: str) -> bool:
    """Whether the CPU the kernels are compiled for (always this host: host_target) has an
    LLVM target feature ("avx512f", "avxvnni", ...)."""
    from tvm.target import codegen

    return bool(codegen.target_has_features(feature, host_target()))


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
