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
    ({"weights": "q3g16"}, "weight format 'q3g16' is not 'auto' or one of"),
    ({"weight_overrides": (("lm_head", "int2"),)}, "weight format 'int2'"),
    ({"kv_dtype": "int2"}, "--kv-dtype 'int2' is not one of"),
    ({"kv_capacity": -1}, "--kv-capacity -1"),
    ({"prefill_chunk": 0}, "--prefill-chunk 0 must be at least 1"),
    ({"gdn_prefill": "wy"}, "--gdn-prefill must be one of auto, recurrent, chunked"),
    ({"cpu_gemv_streams": "4"}, "--cpu-gemv-streams must be one of auto, 1, 2"),
    ({"cpu_bf16_activations": "f16"}, "--cpu-bf16-activations must be one of auto, bf16, f32"),
    ({"spec": "eagle"}, "--spec must be one of none, ngram, mtp"),
    ({"max_draft_tokens": 3}, "--max-draft-tokens sizes speculative decoding: give --spec"),
    ({"spec": "ngram", "max_draft_tokens": 17}, r"--max-draft-tokens 17 must be in \[1, 16\]"),
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
    CompileOptions(MODEL, gdn_prefill="chunked").check_target(gpu)  # both kinds run it
    for target in (cpu, gpu):
        assert CompileOptions(MODEL).serve_limits(target, 4096).gdn_prefill == "recurrent"
        assert CompileOptions(MODEL, gdn_prefill="chunked").serve_limits(
            target, 4096).gdn_prefill == "chunked"
    auto = CompileOptions(MODEL)
    assert (auto.projections(cpu), auto.projections(gpu)) == ("tvm", "coop")
    CompileOptions(MODEL, spec="ngram").check_target(gpu)  # verified on either
    for target in (cpu, gpu):  # the MTP head's pass is generated for both kinds
        CompileOptions(MODEL, spec="mtp").check_target(target)
    spec = CompileOptions(MODEL, spec="ngram").serve_limits(cpu, 4096)
    assert (spec.spec, spec.max_draft_tokens, spec.logit_rows) == ("ngram", 4, 40)
    two = CompileOptions(MODEL, spec="ngram", max_draft_tokens=2, prefill_chunk=16)
    assert two.serve_limits(cpu, 4096).logit_rows == 16  # 8 x 3, capped by the step
    plain = CompileOptions(MODEL).serve_limits(cpu, 4096)
    assert (plain.spec, plain.max_draft_tokens, plain.logit_rows) == ("none", 0, 8)
    assert CompileOptions(MODEL).serve_limits(cpu, 40960).gemv_max_rows == 8
    assert CompileOptions(MODEL, weights="q4g64").serve_limits(cpu, 40960).gemv_max_rows == 8
    assert CompileOptions(MODEL).serve_limits(gpu, 40960).gemv_max_rows == 4


def _limits(opts: CompileOptions, positions: int) -> tuple[int, int, int]:
    lim = opts.serve_limits(load_target("cpu"), positions)
    return lim.max_context, lim.prefill_chunk, lim.max_concurrency


def test_cpu_gemv_streams_resolve_for_the_host(monkeypatch):
    """auto takes the host's choice (here from NINFER_CPU_GEMV_STREAMS) and says so; a
    given value is kept without a note; GPU targets keep their kernels (no choice made,
    a given value refused) and the plan's matmuls follow."""
    from ninfer import roofline

    cpu, h100 = load_target("cpu"), load_target("h100")
    monkeypatch.setenv(roofline.STREAMS_ENV, "1")
    opts, note = CompileOptions(MODEL).with_host_read(cpu)
    assert opts.cpu_gemv_streams == "1" and opts.gemv_streams(cpu) == 1
    assert note is not None and "1 weight stream a thread" in note and "=1" in note
    given, none = CompileOptions(MODEL, cpu_gemv_streams="2").with_host_read(cpu)
    assert given.cpu_gemv_streams == "2" and given.gemv_streams(cpu) == 0 and none is None
    gpu, none = CompileOptions(MODEL, target="h100").with_host_read(h100)
    assert gpu.cpu_gemv_streams == "auto" and gpu.gemv_streams(h100) == 0 and none is None
    with pytest.raises(OptionsError, match="applies to the cpu target, not h100"):
        CompileOptions(MODEL, target="h100", cpu_gemv_streams="1").check_target(h100)


def test_cpu_bf16_activations_apply_to_the_cpu_target():
    cpu, h100 = load_target("cpu"), load_target("h100")
    # auto: rounded where the host has vdpbf16ps to gain from it
    for dp in (False, True):
        assert CompileOptions(MODEL).x_bf16(cpu, dp) == dp
        assert not CompileOptions(MODEL).x_bf16(h100, dp)
        assert CompileOptions(MODEL, cpu_bf16_activations="bf16").x_bf16(cpu, dp)
        assert not CompileOptions(MODEL, cpu_bf16_activations="f32").x_bf16(cpu, dp)
    for value in ("bf16", "f32"):
        with pytest.raises(OptionsError, match="applies to the cpu target, not h100"):
            CompileOptions(MODEL, cpu_bf16_activations=value).check_target(h100)


def test_limits_left_out_fit_the_model_and_say_so():
    # a 40960-position model: the defaults as they are, and one note for the context
    assert _limits(CompileOptions(MODEL), 40960) == (4096, 512, 8)
    [note] = CompileOptions(MODEL).limit_notes(40960)
    assert "--max-context not given: 4096 tokens" in note and "(40960)" in note
    # a 2048-position checkpoint compiles without flags (it used to fail)
    assert _limits(CompileOptions(MODEL), 2048) == (2048, 512, 8)
    assert "2048 tokens" in CompileOptions(MODEL).limit_notes(2048)[0]
    # a small context caps the default chunk, a small chunk the default concurrency
    opts = CompileOptions(MODEL, max_context=256, prefill_chunk=4)
    assert _limits(opts, 1024) == (256, 4, 4)
    assert _limits(CompileOptions(MODEL, max_context=256), 1024) == (256, 256, 8)
    [note] = CompileOptions(MODEL, max_context=256).limit_notes(1024)
    assert note.startswith("--prefill-chunk not given: 256 rows per step")
    [note] = opts.limit_notes(1024)
    assert note.startswith("--max-concurrency not given: 4")
    # values given are never changed: a contradiction is refused by make_plan
    assert _limits(CompileOptions(MODEL, max_context=64, prefill_chunk=512), 1024) == (
        64, 512, 8)


def test_gdn_chunk_follows_the_room_a_step_leaves_a_prompt():
    """64 rows when a step holds them beside every other sequence's decode row, else the
    largest power of two that fits; below 8 rows the compile refuses with the numbers."""
    from ninfer.plan import PlanError, ServeLimits, gdn_chunk

    def chunk(prefill: int, conc: int, mode: str = "chunked") -> int:
        return gdn_chunk(ServeLimits(4096, prefill, max_concurrency=conc, gdn_prefill=mode))

    assert (chunk(512, 8), chunk(71, 8), chunk(70, 8), chunk(16, 8)) == (64, 64, 32, 8)
    assert chunk(512, 8, "recurrent") == 1
    with pytest.raises(PlanError, match="--prefill-chunk 14 leaves 7"):
        chunk(14, 8)

