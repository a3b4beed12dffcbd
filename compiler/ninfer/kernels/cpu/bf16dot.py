"""vdpbf16ps (AVX512_BF16) in TVM-built kernels, by one rewrite of the module's LLVM IR.

The instruction adds two bfloat16 products per float32 lane: for each lane i,
acc[i] += a[2i+1] * b[2i+1], then acc[i] += a[2i] * b[2i], each an exact product added
with one rounding (nearest even), subnormal inputs and results flushed to zero. It doubles
the bf16 matmul's arithmetic rate over widening the weights to float32 for vfmadd
(benchmarks/bf16_dot_probe.c: 235 vs 118 GFLOP/s a core on Zen 4).

TVM 0.27's LLVM code generator cannot pass the intrinsic's <32 x bfloat> operands (its
bfloat16 legalization widens them to float32, and without it the build fails), so a kernel
calls placeholders, and `patch` replaces each call site in the compiled module's IR:
- `ninfer_dpbf16ps_512(<32 x float> acc, <32 x i16> even, <32 x i16> odd, <2 x i16> x)`
  (`dot`): the weights of 32 columns at k (even) and k + 1 (odd) are paired within each
  128-bit lane (vpunpcklwd / vpunpckhwd: no cross-lane shuffle in the inner loop), the pair
  of activations broadcast to every lane, and two `llvm.x86.avx512bf16.dpbf16ps.512` add
  them into the two halves of acc, whose columns are thus in PAIR_COLUMNS order (the
  kernel puts them back in order once, when it stores them);
- `ninfer_cvtneps2bf16_512(<16 x float>)` (`round_bf16`): an `fptrunc` to bfloat
  (vcvtneps2bf16), one instruction for the six integer operations of common.bf16_bits.
The rewritten IR is loaded back as the module, so the object, the in-process functions and
the tests all run the instructions. Each call site is rewritten in place: a wrapper
function defined in the IR would not be inlined there.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

PLACEHOLDER = "ninfer_dpbf16ps_512"
ROUND_PLACEHOLDER = "ninfer_cvtneps2bf16_512"
LANES = 16  # float32 lanes of the instruction's 512-bit form
_INTRINSIC = "llvm.x86.avx512bf16.dpbf16ps.512"


def dot(acc: tirx.PrimExpr, even: tirx.PrimExpr, odd: tirx.PrimExpr, x: tirx.PrimExpr
        ) -> tirx.PrimExpr:
    """Two vdpbf16ps over 32 columns: acc is float32 x32, even and odd uint16 x32 (the
    bfloat16 bits of 32 columns' weights at k and k + 1), x uint16 x2 (the activations at k
    and k + 1). The weights are paired within each 128-bit lane (vpunpcklwd / vpunpckhwd,
    no cross-lane shuffle), so the columns come out in the order PAIR_COLUMNS: lane l of
    the result is acc[l] + odd[PAIR_COLUMNS[l]] x[1] + even[PAIR_COLUMNS[l]] x[0], the two
    products added in that order."""
    return tirx.call_extern(f"float32x{2 * LANES}", PLACEHOLDER, acc, even, odd, x)


def round_bf16(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 x16 rounded to bfloat16 (nearest even; vcvtneps2bf16), as uint16 x16 bits:
    common.bf16_bits but for subnormals, which the instruction flushes to zero as
    vdpbf16ps would flush them anyway."""
    return tirx.call_extern(f"uint16x{LANES}", ROUND_PLACEHOLDER, x)


def _split_operands(text: str) -> list[str]:
    """The comma-separated operands of an IR call, commas inside <>, (), [] and {} kept."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


_CALL = re.compile(r"^(\s*)(%[-\w.$]+) = (?:tail |notail )?call (?:fastcc )?<32 x float> "
                   rf"@{PLACEHOLDER}\((.*)\)(?: #\d+)?((?:, ![\w.]+ !\d+)*)\s*$")
_ROUND = re.compile(r"^(\s*)(%[-\w.$]+) = (?:tail |notail )?call (?:fastcc )?<16 x i16> "
                    rf"@{ROUND_PLACEHOLDER}\(<16 x float> ([^,()]+)\)(?: #\d+)?"
                    r"((?:, ![\w.]+ !\d+)*)\s*$")
_OPERAND_TYPES = ("<32 x float> ", "<32 x i16> ", "<32 x i16> ", "<2 x i16> ")


def pair_column(lane: Any) -> Any:
    """Column of result lane `lane` (0..31; an int or a TIR index): the low half pairs the
    first four columns of each 128-bit lane of the weights (8 columns), the high half the
    last four."""
    return 8 * (lane % LANES // 4) + 4 * (lane // LANES) + lane % 4


PAIR_COLUMNS = [pair_column(lane) for lane in range(2 * LANES)]


def _pairs(half: int) -> str:
    # bf16 lane 2i of half `half` takes even[c] (operand 0), lane 2i + 1 odd[c] (32 + c)
    cols = PAIR_COLUMNS[half * LANES:(half + 1) * LANES]
    return ", ".join(f"i32 {c + (2 * LANES if j % 2 else 0)}"
                     for c in cols for j in range(2))


_HALF = [", ".join(f"i32 {h * LANES + i}" for i in range(LANES)) for h in range(2)]
_CONCAT = ", ".join(f"i32 {i}" for i in range(2 * LANES))


def rewrite_ir(ll: str) -> tuple[str, int]:
    """The IR text with every placeholder call made the intrinsic; and how many there were.
    Anything else that names the placeholder is an error (it would not link)."""
    lines: list[str] = []
    sites = 0
    for line in ll.splitlines():
        if line.startswith("declare") and f"@{ROUND_PLACEHOLDER}(" in line:
            continue  # fptrunc below needs no declaration
        m = _ROUND.match(line)
        if m is not None:
            indent, result, operand, meta = m.groups()
            t = f"%bf16round{sites}"
            sites += 1
            lines += [f"{indent}{t} = fptrunc <16 x float> {operand} to <16 x bfloat>",
                      f"{indent}{result} = bitcast <16 x bfloat> {t} to <16 x i16>{meta}"]
            continue
        if line.startswith("declare") and f"@{PLACEHOLDER}(" in line:
            lines.append(f"declare <16 x float> @{_INTRINSIC}(<16 x float>, <32 x bfloat>, "
                         "<32 x bfloat>)")
            continue
        m = _CALL.match(line)
        if m is None:
            if PLACEHOLDER in line or ROUND_PLACEHOLDER in line:
                raise RuntimeError(f"bf16dot: a use of {PLACEHOLDER} that is not a call: "
                                   f"{line.strip()}")
            lines.append(line)
            continue
        indent, result, operands, meta = m.groups()
        ops = _split_operands(operands)
        if len(ops) != 4 or any(not o.startswith(t) for o, t in zip(ops, _OPERAND_TYPES)):
            raise RuntimeError(f"bf16dot: unexpected operands in {line.strip()}")
        acc, even, odd, x = (o[len(t):] for o, t in zip(ops, _OPERAND_TYPES))
        t = f"%bf16dot{sites}"
        sites += 1
        lines += [
            f"{indent}{t}.x = bitcast <2 x i16> {x} to i32",
            f"{indent}{t}.xv = insertelement <16 x i32> poison, i32 {t}.x, i64 0",
            f"{indent}{t}.xs = shufflevector <16 x i32> {t}.xv, <16 x i32> poison, "
            "<16 x i32> zeroinitializer",
            f"{indent}{t}.xb = bitcast <16 x i32> {t}.xs to <32 x bfloat>",
        ]
        for h in range(2):
            lines += [
                f"{indent}{t}.w{h} = shufflevector <32 x i16> {even}, <32 x i16> {odd}, "
                f"<32 x i32> <{_pairs(h)}>",
                f"{indent}{t}.wb{h} = bitcast <32 x i16> {t}.w{h} to <32 x bfloat>",
                f"{indent}{t}.a{h} = shufflevector <32 x float> {acc}, <32 x float> poison, "
                f"<16 x i32> <{_HALF[h]}>",
                f"{indent}{t}.r{h} = call <16 x float> @{_INTRINSIC}(<16 x float> {t}.a{h}, "
                f"<32 x bfloat> {t}.wb{h}, <32 x bfloat> {t}.xb)",
            ]
        lines.append(f"{indent}{result} = shufflevector <16 x float> {t}.r0, <16 x float> "
                     f"{t}.r1, <32 x i32> <{_CONCAT}>{meta}")
    return "\n".join(lines) + "\n", sites


def patch(ex: tvm.runtime.Executable) -> tvm.runtime.Executable:
    """`ex` with its placeholder calls made vdpbf16ps (`ex` itself when it has none)."""
    ll = ex.mod.inspect_source("ll")
    if PLACEHOLDER not in ll and ROUND_PLACEHOLDER not in ll:
        return ex
    if list(ex.mod.imports):
        raise RuntimeError("bf16dot: the CPU module has imported modules; only a single LLVM "
                           "module can be rewritten")
    text, sites = rewrite_ir(ll)
    if sites == 0:
        raise RuntimeError(f"bf16dot: {PLACEHOLDER} or {ROUND_PLACEHOLDER} is declared but "
                           "never called")
    with tempfile.TemporaryDirectory(prefix="ninfer-bf16dot-") as tmp:
        path = Path(tmp) / "kernels.ll"
        path.write_text(text)
        mod = tvm.runtime.load_module(str(path))
    return tvm.runtime.Executable(mod)
