"""Reference harness for the CPU kernel library.

Every case compiles `case.spec` (all cases share one TVM build per module), feeds it
inputs drawn fresh from a seeded rng and compares `out` with the float64 numpy reference
(`ninfer.kernels.reference`) as ||out - ref|| / ||ref|| <= TOL.

To add a case, append `Case(spec, n)` to CASES (`pos0=` for attention); the rng, the
inputs (from `spec.signature()`), the build and the comparison are shared. A new kernel
family additionally needs its reference in reference.py and, when its integer inputs
must lie in a range, a line in `_int_input`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")  # exercise the parallel loops

# Import ninfer from the source tree (the dev venv does not install the package).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compiler"))

import numpy as np
import pytest
import tvm

from ninfer.kernels import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SiluMulSpec,
    build_cpu_module,
    build_cpu_object,
    reference,
)

pytestmark = pytest.mark.unit

# float32 kernels against a float64 reference: a few ulp per element, accumulated over
# reductions of up to a few thousand terms.
TOL = 1e-5


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    n: int  # token rows
    pos0: int = 0  # attention only: absolute position of row 0

    @property
    def id(self) -> str:
        return f"{self.spec.name()}-n{self.n}" + (f"-p{self.pos0}" if self.pos0 else "")


CASES = [
    Case(EmbeddingSpec(vocab=1000, hidden=72), 1),
    Case(EmbeddingSpec(vocab=1000, hidden=72), 33),
    Case(EmbeddingSpec(vocab=151, hidden=256), 7),
    Case(RMSNormSpec(hidden=72, eps=1e-6), 1),
    Case(RMSNormSpec(hidden=72, eps=1e-6), 33),
    Case(RMSNormSpec(hidden=1024, eps=1e-5), 7),
    Case(RMSNormSpec(hidden=128, eps=1e-6), 7 * 16),  # per-head q/k norm: rows = tokens*heads
    Case(MatmulSpec(k=200, n_out=72), 1),
    Case(MatmulSpec(k=200, n_out=72, bias=True), 7),
    Case(MatmulSpec(k=1024, n_out=3072), 1),
    Case(MatmulSpec(k=203, n_out=74, bias=True), 3),  # k and n_out tails
    Case(MatmulSpec(k=1024, n_out=96, schedule="gemm"), 1),
    Case(MatmulSpec(k=200, n_out=72, bias=True, schedule="gemm"), 7),
    Case(MatmulSpec(k=200, n_out=72, bias=True, schedule="gemm"), 33),
    Case(MatmulSpec(k=2100, n_out=520, schedule="gemm"), 70),  # 3 k blocks, 3 row blocks
    Case(MatmulSpec(k=5, n_out=2, bias=True), 3),  # smaller than one vector / one tile
    Case(MatmulSpec(k=5, n_out=2, bias=True, schedule="gemm"), 5),
    Case(MatmulSpec(k=203, n_out=74, schedule="gemm"), 33),
    Case(RopeSpec(heads=4, head_dim=64, max_pos=512), 1),
    Case(RopeSpec(heads=4, head_dim=64, max_pos=512), 33),
    Case(RopeSpec(heads=3, head_dim=128, max_pos=64), 7),
    Case(RopeSpec(heads=2, head_dim=36, max_pos=64), 7),  # half = 18: vector + scalar tail
    Case(SiluMulSpec(inter=72), 1),
    Case(SiluMulSpec(inter=1000), 33),
    Case(SiluMulSpec(inter=77), 7),
    Case(AddSpec(hidden=72), 1),
    Case(AddSpec(hidden=1027), 33),
    # attention: GQA ratios 1, 2, 4; head_dim 32/64/128; decode and prefill; pos0 = 0 and > 0
    Case(AttentionSpec(heads=4, kv_heads=4, head_dim=64, max_ctx=256), 1),
    Case(AttentionSpec(heads=4, kv_heads=4, head_dim=64, max_ctx=256), 1, pos0=100),
    Case(AttentionSpec(heads=4, kv_heads=4, head_dim=64, max_ctx=256), 33),
    Case(AttentionSpec(heads=8, kv_heads=4, head_dim=32, max_ctx=256), 7, pos0=61),
    Case(AttentionSpec(heads=8, kv_heads=4, head_dim=32, max_ctx=256), 1, pos0=200),
    Case(AttentionSpec(heads=8, kv_heads=2, head_dim=128, max_ctx=512), 1, pos0=300),
    Case(AttentionSpec(heads=8, kv_heads=2, head_dim=128, max_ctx=512), 33, pos0=7),
    Case(AttentionSpec(heads=16, kv_heads=2, head_dim=64, max_ctx=128), 7, pos0=31),  # ratio 8
    Case(AttentionSpec(heads=6, kv_heads=1, head_dim=64, max_ctx=128), 33),  # ratio 6
]


@pytest.fixture(scope="module")
def kernels() -> tvm.runtime.Executable:
    return build_cpu_module(case.spec for case in CASES)


def _int_input(spec: KernelSpec, name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    high = {"ids": getattr(spec, "vocab", 0), "pos": getattr(spec, "max_pos", 0)}[name]
    return rng.integers(0, high, size=n, dtype=np.int32)


def make_inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray | int]:
    """Random inputs for every argument of `case.spec` except `out`, in signature order."""
    inputs: list[np.ndarray | int] = []
    for arg in case.spec.signature()[:-1]:
        if arg.kind == "scalar":
            inputs.append(case.pos0)
            continue
        shape = tuple(case.n if d == "n" else d for d in arg.shape)
        if arg.dtype == "int32":
            inputs.append(_int_input(case.spec, arg.name, case.n, rng))
            continue
        x = rng.standard_normal(shape).astype(arg.dtype)
        if arg.name in ("k_cache", "v_cache"):
            x[case.pos0 + case.n :] = np.nan  # rows the kernel must never read
        inputs.append(x)
    return inputs


def run_kernel(ex: tvm.runtime.Executable, case: Case, inputs: list) -> np.ndarray:
    out_arg = case.spec.signature()[-1]
    out_shape = tuple(case.n if d == "n" else d for d in out_arg.shape)
    args = [tvm.runtime.tensor(a) if isinstance(a, np.ndarray) else a for a in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype=out_arg.dtype))
    ex[case.spec.name()](*args, out)
    return out.numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_reference(kernels: tvm.runtime.Executable, case: Case) -> None:
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    inputs = make_inputs(case, rng)
    out = run_kernel(kernels, case, inputs)
    ref = reference(case.spec, *inputs)
    assert out.shape == ref.shape
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


def test_spec_names_are_c_identifiers() -> None:
    assert MatmulSpec(k=1024, n_out=3072, bias=True).name() == "matmul_k1024_n3072_f32_bias_gemv"
    assert RMSNormSpec(hidden=72, eps=1e-6).name() == "rmsnorm_h72_eps1em06_f32"
    assert RMSNormSpec(hidden=72, eps=2.5e-7).name() == "rmsnorm_h72_eps2p5em07_f32"
    specs = {case.spec for case in CASES}
    names = {spec.name() for spec in specs}
    assert len(names) == len(specs)
    assert all(name.isidentifier() for name in names)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AttentionSpec(heads=6, kv_heads=4, head_dim=64, max_ctx=64),
        lambda: MatmulSpec(k=64, n_out=64, schedule="tiled"),
        lambda: MatmulSpec(k=64, n_out=64, wdtype="int4"),
        lambda: RopeSpec(heads=2, head_dim=63, max_pos=8),
        lambda: RMSNormSpec(hidden=0, eps=1e-6),
    ],
)
def test_invalid_specs_are_rejected(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_attention_rejects_context_overflow(kernels: tvm.runtime.Executable) -> None:
    case = Case(AttentionSpec(heads=4, kv_heads=4, head_dim=64, max_ctx=256), 33, pos0=230)
    inputs = make_inputs(case, np.random.default_rng(0))
    with pytest.raises(Exception, match="exceeds max_ctx"):
        run_kernel(kernels, case, inputs)


# Undefined symbols an object from build_cpu_object may reference. Seen so far: the TVM-FFI
# error hook (the host links tvm_ffi or a shim) and memset (LLVM's rewrite of the zero fill
# in bias-less matmuls with large n_out); memcpy likewise for copy loops. The __TVMBackend*
# hooks are weak function-pointer variables the host fills in, so they do not show up as
# "U"; a libm name such as expf showing up here would mean a kernel lost its vectorized math.
ALLOWED_UNDEFINED = {
    "TVMFFIErrorSetRaisedFromCStrParts",
    "memcpy",
    "memset",
}

ONE_PER_FAMILY = [
    EmbeddingSpec(vocab=1000, hidden=72),
    RMSNormSpec(hidden=72, eps=1e-6),
    MatmulSpec(k=200, n_out=72, bias=True),
    MatmulSpec(k=200, n_out=72, schedule="gemm"),
    RopeSpec(heads=4, head_dim=64, max_pos=512),
    SiluMulSpec(inter=72),
    AddSpec(hidden=72),
    AttentionSpec(heads=8, kv_heads=2, head_dim=64, max_ctx=256),
]


def test_object_exports_every_kernel(tmp_path: Path) -> None:
    obj = build_cpu_object(ONE_PER_FAMILY, tmp_path / "kernels.o")
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in symbols.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TtWwDdBbRrVv":
            defined.add(parts[2])
    for spec in ONE_PER_FAMILY:
        assert f"__tvm_ffi_{spec.name()}" in defined, f"{spec.name()} not exported"
    assert undefined <= ALLOWED_UNDEFINED, f"unexpected undefined: {undefined - ALLOWED_UNDEFINED}"
