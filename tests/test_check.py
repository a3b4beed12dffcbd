"""`ninfer-check`: a correct build passes every check (and a short soak); a build whose
artifact has one weight tensor changed (its checksums re-sealed, so the server loads it)
fails and names the first divergence; an int4 KV cache passes at its own tolerance and
fails at float32's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash

from conftest import MAX_CONTEXT, PREFILL_CHUNK, CompiledModel, compile_once
from ninfer.artifact_format import DTYPES, HEADER, read_manifest
from ninfer.runtime.check import (
    Run,
    against_reference,
    check,
    coarse_kl,
    compare_runs,
    main,
    parse_tolerance,
    verdict,
)
from ninfer.runtime.tolerance import Bound, bound

pytestmark = pytest.mark.e2e


def test_a_correct_build_passes(qwen3_model: CompiledModel):
    report = check(qwen3_model.out_dir, qwen3_model.checkpoint, tokens=16, threads=2,
                   soak=30, concurrency=3)
    names = [r.check for r in report.rows]
    assert report.ok and report.divergence is None, report.rows
    assert names[0] == "reference" and "concurrency 2" in names and len(names) >= 4
    assert names[-1] == "soak 30 x 3" and report.soak.completed + report.soak.disconnected == 30
    assert report.soak.kv_blocks_used == 0
    # the tiny Qwen3's build: f32 weights and KV cache, so float32's bound
    assert report.bound == bound(["f32"], "f32")


def _perturb(artifact: Path, name: str, scale: float) -> None:
    """Add noise of `scale` x the tensor's RMS to one f32 tensor and re-seal its checksum
    and the manifest's, as a wrong kernel or a corrupt-but-consistent file would leave it."""
    m = read_manifest(artifact)
    entry = next(t for t in m["tensors"] if t["name"] == name)
    assert entry["dtype"] == "f32"
    with open(artifact, "r+b") as fh:
        fh.seek(entry["offset"])
        w = np.frombuffer(fh.read(entry["nbytes"]), dtype=DTYPES["f32"]).copy()
        w += np.random.default_rng(0).standard_normal(w.shape).astype(np.float32) * (
            scale * float(np.sqrt((w ** 2).mean())))
        payload = w.tobytes()
        fh.seek(entry["offset"])
        fh.write(payload)
        entry["xxh64"] = f"{xxhash.xxh64(payload).intdigest():016x}"
        blob = json.dumps(m, sort_keys=True).encode()
        magic, version, reserved, length, _ = HEADER.unpack(
            (fh.seek(0), fh.read(HEADER.size))[1])
        assert len(blob) == length
        fh.seek(0)
        fh.write(HEADER.pack(magic, version, reserved, length, xxhash.xxh64(blob).intdigest()))
        fh.write(blob)


def test_a_changed_weight_fails_with_the_first_divergence(qwen3_model: CompiledModel,
                                                          tmp_path: Path, capsys):
    build = tmp_path / "build"
    build.mkdir()
    for f in ("ninfer-server", "model.ninfer"):
        shutil.copy2(qwen3_model.out_dir / f, build / f)
    names = [t["name"] for t in read_manifest(build / "model.ninfer")["tensors"]]
    down = next(n for n in names if n.startswith("layers.1.") and "down" in n)
    _perturb(build / "model.ninfer", down, 0.5)
    with pytest.raises(SystemExit) as exit_info:
        main([str(build), "--reference", str(qwen3_model.checkpoint), "--tokens", "16",
              "--threads", "2"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 1, out
    assert "FAIL" in out and "first divergence (reference): prompt" in out
    assert "server:    token" in out and "reference: token" in out


def test_int4_kv_passes_at_its_tolerance_and_fails_at_float32s(trained_checkpoint: Path,
                                                               tmp_path: Path):
    from ninfer.pipeline import CompileOptions

    out = tmp_path / "int4"
    compile_once(CompileOptions(model_dir=trained_checkpoint, target="cpu", out_dir=out,
                                model_id="qwen3-trained", max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, max_concurrency=2,
                                kv_dtype="int4", python_module=False))
    own = check(out, trained_checkpoint, tokens=16, threads=2)
    assert own.bound == bound(["f32"], "int4")
    assert own.ok, own.rows
    strict = check(out, trained_checkpoint, tokens=16, threads=2,
                   tolerance=parse_tolerance("f32"))
    assert not strict.ok
    assert strict.divergence is not None and strict.divergence.check == "reference"


@pytest.mark.unit
def test_verdicts_on_made_up_runs():
    vocab = 6
    ref = np.log(np.full((2, vocab), 1 / vocab))
    ref[:, 3] += 1.0
    ref -= np.log(np.exp(ref).sum(axis=1, keepdims=True))

    def listed(row: np.ndarray, *ids: int, shift: float = 0.0) -> dict[int, float]:
        return {t: float(row[t]) + shift for t in ids}

    same = Run([3, 3], [listed(ref[0], 3, 0), listed(ref[1], 3, 0)])
    assert coarse_kl(ref[0], same.tops[0]) == pytest.approx(0.0, abs=1e-12)
    detail, d = verdict([against_reference(same, ref, 0)], Bound(1e-6, 1.0))
    assert d is None and "top-1 agreement 1.000" in detail
    # a distribution off by 0.3 nats on its top token: a KL the f32 bound refuses
    off = Run([3, 3], [listed(ref[0], 3, 0), {3: float(ref[1, 3]) - 0.3, 0: float(ref[1, 0])}])
    assert coarse_kl(ref[1], off.tops[1]) > 1e-2
    _, d = verdict([against_reference(off, ref, 4)], Bound(1e-6, 0.0))
    assert d is not None and (d.prompt, d.position, d.got, d.want) == (4, 1, 3, 3)
    assert verdict([against_reference(off, ref, 4)], Bound(1.0, 0.0))[1] is None
    # not the argmax: fails an agreement bound of 1, passes one of 0.5
    other = Run([0, 3], [listed(ref[0], 0, 3), listed(ref[1], 3, 0)])
    _, d = verdict([against_reference(other, ref, 0)], Bound(1.0, 1.0))
    assert d is not None and (d.position, d.got, d.want) == (0, 0, 3)
    assert verdict([against_reference(other, ref, 0)], Bound(1.0, 0.5))[1] is None
    # against one request at a time: exact where promised, an early stop always fails
    assert compare_runs(same, same, 1e-3, True, "c", 0)[1] is None
    assert compare_runs(off, same, 1e-3, True, "c", 0)[1] is not None
    assert compare_runs(off, same, 1e-3, False, "c", 0)[1] is not None
    assert compare_runs(off, same, 0.5, False, "c", 0)[1] is None
    short = Run([3], same.tops[:1])
    assert compare_runs(short, same, 0.5, False, "c", 0)[1] is not None
    assert parse_tolerance("0.25") == Bound(0.25, 0.0)
    assert parse_tolerance("0.25,0.9") == Bound(0.25, 0.9)
    assert parse_tolerance("q4g64+kv:int4") == bound(["q4g64"], "int4")


@pytest.mark.parametrize("name", ["qwen3-tiny", "llama-tiny", "qwen2-tiny", "qwen35-tiny",
                                  "qwen3next-tiny", "qwen35vl-tiny"])
def test_float64_reference_is_transformers_in_float64(name):
    """The numpy reference (for machines without torch): the log-probabilities of
    transformers' model run in float64, for Qwen3 (q/k norms), Llama (bf16, tied, llama3
    rope scaling), Qwen2 (f16, tied, q/k/v biases) and the hybrids (Qwen3.5, Qwen3-Next
    MoE, the multimodal Qwen3.5's text model)."""
    import torch
    import transformers

    from conftest import checkpoint
    from ninfer.runtime.float64_reference import float64_reference

    ckpt, _ = checkpoint(name)
    ref = float64_reference(ckpt)
    cls = (transformers.Qwen3_5ForConditionalGeneration if name == "qwen35vl-tiny"
           else transformers.AutoModelForCausalLM)
    # the hybrids' Gated DeltaNet and MoE code in transformers computes in float32 whatever
    # the model's dtype (the MoE's grouped matmul refuses float64): the hybrids against its
    # float32 run, at float32's accuracy
    hybrid = name.startswith(("qwen35", "qwen3next"))
    hf = cls.from_pretrained(ckpt, dtype=torch.float32 if hybrid else torch.float64).eval()
    ids = np.random.default_rng(3).integers(0, 1000, 40).tolist()
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0, 9:-1], -1).numpy()
    got = ref.logprobs(ids, 10)
    assert got.shape == want.shape
    # transformers computes its rotary frequencies in float32 whatever the model's dtype:
    # ~1e-6 apart; a wrong norm, bias or scaling is orders of magnitude more
    assert np.abs(got - want).max() < (3e-4 if hybrid else 1e-5)


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen35-tiny"])
def test_check_with_the_float64_reference(name):
    from conftest import compiled

    model = compiled(name)
    report = check(model.out_dir, model.checkpoint, tokens=12, threads=2,
                   reference_impl="float64")
    assert report.ok, report.rows
    assert report.bound == bound(["f32"], "f32")


@pytest.mark.unit
def test_float64_reference_refuses_what_it_does_not_compute(tmp_path: Path):
    from ninfer.runtime.check import CheckError, make_reference

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckError, match="float64 reference covers LlamaForCausalLM"):
        make_reference(tmp_path, "float64")
    with pytest.raises(CheckError, match="one of auto, transformers, float64"):
        make_reference(tmp_path, "numpy")
    with pytest.raises(CheckError, match="give --soak N too"):  # not accepted and ignored
        check(tmp_path, tmp_path, concurrency=2)


def test_a_speculative_build_is_checked_with_drafts_off_too(qwen3_model: CompiledModel):
    """A build compiled with n-gram drafts is served with them (its reference row and
    concurrency through verify steps), then again with --spec none: the same bits on the
    CPU."""
    from conftest import TEST_MODELS
    from ninfer.pipeline import CompileOptions

    out = TEST_MODELS / "qwen3-tiny-check-spec-cpu"
    compile_once(CompileOptions(model_dir=qwen3_model.checkpoint, target="cpu", out_dir=out,
                                model_id="qwen3-tiny", max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, max_concurrency=4,
                                kv_dtype="f32", python_module=False, spec="ngram"))
    report = check(out, qwen3_model.checkpoint, tokens=16, threads=2)
    assert report.ok, report.rows
    assert [r.check for r in report.rows][-1] == "drafts off"
    assert "same bits" in report.rows[-1].detail
