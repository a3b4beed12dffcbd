"""CPU proof of the math behind the CUDA kernels.

1. Every unscheduled TE PrimFunc (`ninfer.kernels.te_defs`) is built for LLVM and compared
   with the float64 reference on the cases of the CPU kernel harness
   (tests/kernels/test_cpu_kernels.py: same cases, same inputs, same bound).
2. The CUDA-scheduled PrimFuncs, with thread bindings turned into serial loops and
   on-chip buffers moved to global memory (`serial_equivalent`), are run the same way for
   two targets whose schedule parameters differ: this runs the kernels' actual loop nests,
   index math and masks on the CPU.

To add a case, add it to CASES in test_cpu_kernels.py; both checks pick it up. Families
without a TE definition (paged attention, KV store: hand-written CUDA) are left out here;
tests/kernels/test_cuda_emulation.py runs their CUDA source on the CPU instead.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import tvm
from test_cpu_kernels import CASES, TOL, Case, make_inputs, run_kernel
from tvm import tirx

from ninfer.kernels import KernelSpec, reference
from ninfer.kernels.cuda import cuda_primfunc, serial_equivalent
from ninfer.kernels.te_defs import TE_FAMILIES, te_primfunc
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

TE_CASES = [case for case in CASES if case.spec.family in TE_FAMILIES]
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
