"""ninfer.kernels.cpu.tvmscript: the f_back walk that finds the TVMScript parser for each
macro expansion builds the same PrimFuncs as TVM's own `inspect.getouterframes` lookup."""

from __future__ import annotations

import pytest
import tvm_ffi

from ninfer.kernels import AttentionSpec, GdnRecurrentSpec, MatmulSpec, RMSNormSpec
from ninfer.kernels.cpu import cpu_primfunc, tvmscript

pytestmark = pytest.mark.unit

SPECS = [
    MatmulSpec(96, 37, True, "gemv", "q8g32", "rows"),  # macros inside macros
    MatmulSpec(200, 37, False, "gemm", "bf16", "panels"),
    GdnRecurrentSpec(2, 4, 16, 8, 3, chunk=8),
    AttentionSpec(heads=4, kv_heads=2, head_dim=32, max_ctx=64, block_size=16, max_seqs=2,
                  kv_blocks=9),
    RMSNormSpec(64, 1e-6),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name())
def test_fast_lookup_builds_the_same_primfunc(spec) -> None:  # type: ignore[no-untyped-def]
    fast = cpu_primfunc(spec)
    tvmscript.uninstall()
    try:
        library = cpu_primfunc(spec)
    finally:
        tvmscript.install()
    assert tvm_ffi.structural_equal(fast, library, map_free_vars=True), (
        tvm_ffi.get_first_structural_mismatch(fast, library, map_free_vars=True))


def test_the_comparison_sees_a_changed_constant() -> None:
    """The check above can fail: kernels one constant apart are not structurally equal."""
    a = cpu_primfunc(RMSNormSpec(64, 1e-6))
    b = cpu_primfunc(RMSNormSpec(64, 1e-5))
    assert not tvm_ffi.structural_equal(a, b, map_free_vars=True)
