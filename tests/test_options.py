"""CompileOptions check themselves when made; target-dependent checks name the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.options import CompileOptions, OptionsError
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

MODEL = Path("model")


@pytest.mark.parametrize(("options", "message"), [
    ({"prefill_projections": "fast"}, "--prefill-projections must be 'auto', 'tvm' or 'coop'"),
    ({"weights": "q3g16"}, "weight format 'q3g16' is not one of"),
    ({"weight_overrides": (("lm_head", "int2"),)}, "weight format 'int2'"),
    ({"kv_dtype": "int2"}, "--kv-dtype 'int2' is not one of"),
    ({"kv_capacity": -1}, "--kv-capacity -1"),
])
def test_invalid_options_are_refused_when_made(options, message):
    with pytest.raises(OptionsError, match=message):
        CompileOptions(MODEL, **options)


def test_target_checks_and_resolved_values():
    cpu, gpu = load_target("cpu"), load_target("rtx4080s")
    with pytest.raises(OptionsError, match="coop needs a CUDA target"):
        CompileOptions(MODEL, prefill_projections="coop").check_target(cpu)
    with pytest.raises(OptionsError, match="rtx4080s with one of those"):
        CompileOptions(MODEL, kv_dtype="int8").check_target(gpu)
    auto = CompileOptions(MODEL)
    assert (auto.projections(cpu), auto.projections(gpu)) == ("tvm", "coop")
    limits = CompileOptions(MODEL, max_context=64, max_prefill_chunk=512).serve_limits(cpu)
    assert (limits.max_prefill_chunk, limits.gemv_max_rows) == (64, 8)  # chunk <= context
    assert CompileOptions(MODEL, weights="q8g32").serve_limits(cpu).gemv_max_rows == 4
    assert CompileOptions(MODEL).serve_limits(gpu).gemv_max_rows == 4
