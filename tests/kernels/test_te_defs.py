"""CPU proof of the math behind the CUDA kernels.

1. Every unscheduled TE PrimFunc (`ninfer.kernels.te_defs`) is built for LLVM and compared
   with the float64 reference on the cases of the CPU kernel harness
   (tests/kernels/test_cpu_kernels.py: same cases, same inputs, same bound).
2. The CUDA-scheduled PrimFuncs, with thread bindings turned into serial loops and
   on-chip buffers moved to global memory (`serial_equivalent`), are run the same way for
   two targets whose schedule parameters differ: this runs the kernels' actual loop nests,
   index math and masks on the CPU.

To add a case, add it to CASES in test_cpu_kernels.py; both checks pick it up. 16-bit
float weights (f16, bf16), which the TE matmul widens as it reads them, have their own
cases (HALF_SPECS). Families without a TE definition (paged attention, KV store:
hand-written CUDA) are left out here; tests/kernels/test_cuda_emulation.py runs their CUDA
source on the CPU instead.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import tvm
from test_cpu_kernels import CASES, TOL, Case, make_inputs, run_kernel
from tvm import tirx

from ninfer.kernels import KernelSpec, MatmulSpec, reference
from ninfer.kernels.cuda import cuda_primfunc, serial_equivalent
from ninfer.kernels.te_defs import TE_FAMILIES, te_primfunc
from ninfer.quantize import weight_formats as quant
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

def _rows(case: Case) -> Case:
    """The case in the layout the TE definitions and CUDA kernels take (CASES are the CPU
    kernels': float matmul weights in panels)."""
    if isinstance(case.spec, MatmulSpec):
        return dataclasses.replace(case, spec=dataclasses.replace(case.spec, layout="rows"))
    return case


TE_CASES = [_rows(case) for case in CASES if case.spec.family in TE_FAMILIES]
SPECS: dict[str, KernelSpec] = {case.spec.name(): case.spec for case in TE_CASES}
SCHEDULE_TARGETS = ("rtx4080s", "h100")  # different thread counts, gemv rows and gemm tiles


def _build(funcs: dict[str, tirx.PrimFunc]) -> tvm.runtime.Executable:
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    return tvm.compile(mod, target="llvm")


def _check(ex: tvm.runtime.Executable, case: Case) -> None:
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    inputs = make_inputs(case, rng)
    out = run_kernel(ex, case, inputs)
    ref = reference(case.spec, *inputs)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


@pytest.fixture(scope="module")
def te_kernels() -> tvm.runtime.Executable:
    return _build({name: te_primfunc(spec) for name, spec in SPECS.items()})


@pytest.fixture(scope="module", params=SCHEDULE_TARGETS)
def scheduled_kernels(request: pytest.FixtureRequest) -> tvm.runtime.Executable:
    target = load_target(request.param)
    return _build(
        {name: serial_equivalent(cuda_primfunc(spec, target)) for name, spec in SPECS.items()}
    )


@pytest.mark.parametrize("case", TE_CASES, ids=lambda c: c.id)
def test_te_math_matches_reference(te_kernels: tvm.runtime.Executable, case: Case) -> None:
    _check(te_kernels, case)


@pytest.mark.parametrize("case", TE_CASES, ids=lambda c: c.id)
def test_cuda_schedule_math_matches_reference(
    scheduled_kernels: tvm.runtime.Executable, case: Case
) -> None:
    _check(scheduled_kernels, case)


# 16-bit float weights (CUDA reads f16 and bf16 through the TE matmul): odd sizes, a bias,
# and rows of very different magnitude; the reference uses the exactly widened weights.
HALF_SPECS = [MatmulSpec(200, 37, False, schedule, fmt) for fmt in ("f16", "bf16")
              for schedule in ("gemv", "gemm")] + [MatmulSpec(264, 74, True, "gemm", "bf16")]


@pytest.mark.parametrize("stage", ["te", *SCHEDULE_TARGETS])
def test_half_weights_match_reference(stage: str) -> None:
    funcs = {s.name(): te_primfunc(s) if stage == "te" else
             serial_equivalent(cuda_primfunc(s, load_target(stage))) for s in HALF_SPECS}
    ex = _build(funcs)
    for spec in HALF_SPECS:
        rng = np.random.default_rng(zlib.crc32(spec.name().encode()))
        scale = np.exp(rng.uniform(-3, 3, size=(spec.n_out, 1)))
        w = (rng.standard_normal((spec.n_out, spec.k)) * scale).astype(np.float32)
        args = [rng.standard_normal((5, spec.k)).astype(np.float32),
                quant.pack(w, spec.wdtype)["w"]]
        if spec.bias:
            args.append(rng.standard_normal(spec.n_out).astype(np.float32))
        out = tvm.runtime.tensor(np.full((5, spec.n_out), np.nan, np.float32))
        ex[spec.name()](*(tvm.runtime.tensor(a) for a in args), out)
        ref = reference(spec, *args)
        err = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
        assert err <= TOL, f"{spec.name()} ({stage}): relative error {err:.3g} > {TOL:g}"


@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_te_signature_is_the_spec_signature(spec: KernelSpec) -> None:
    func = te_primfunc(spec)
    assert func.attrs["global_symbol"] == spec.name()
    assert len(func.params) == len(spec.signature())
    n = None
    for param, arg in zip(func.params, spec.signature()):
        assert param.name == arg.name
        if arg.kind == "scalar":
            assert isinstance(param.ty, tvm.ir.PrimType) and str(param.ty.dtype) == arg.dtype
            continue
        assert isinstance(param.ty, tirx.BufferType) and str(param.ty.dtype) == arg.dtype
        assert len(param.ty.shape) == len(arg.shape)
        for dim, want in zip(param.ty.shape, arg.shape):
            assert str(dim.ty.dtype) == "int64"
            if want == "n":
                assert isinstance(dim, tirx.Var) and (n is None or dim.same_as(n))
                n = dim
            else:
                assert int(dim) == want


@pytest.mark.parametrize(
    "spec", [case.spec for case in TE_CASES[:1]] + [TE_CASES[-1].spec], ids=lambda s: s.name()
)
def test_serial_equivalent_removes_gpu_constructs(spec: KernelSpec) -> None:
    func = cuda_primfunc(spec, load_target("rtx4080s"))
    assert "thread_binding" in func.script()
    serial = serial_equivalent(func).script()
    assert "thread_binding" not in serial
    assert 'scope="shared' not in serial and 'scope="local"' not in serial
