"""GPU targets build without a GPU: kernels compiled by nvcc for each target's arch,
every launch verified against that target's occupancy, ninfer-server linked.

Nothing here runs CUDA code, with or without a GPU present (the server runs only up to
its artifact and device checks, with the GPUs hidden); the tests marked `gpu`
(tests/test_gpu.py) do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

from conftest import MAX_CONTEXT, PREFILL_CHUNK, TEST_MODELS, compile_once
from ninfer.targets import available_targets, load_target

pytestmark = pytest.mark.cuda_build

GPU_TARGETS = [t for t in available_targets() if load_target(t).is_cuda]


# The server is built (nvcc, link) for one target per CUDA arch the project ships (Ada,
# Hopper, Blackwell consumer); the others of each arch get the same code with their own
# baked numbers, whose launches are verified below without linking again.
LINKED_TARGETS = ["rtx4080s", "h100", "rtx5090"]


def _compiled(qwen3_model, name: str) -> tuple[str, SimpleNamespace]:
    """qwen3-tiny for CUDA target `name`: kernels, launch proofs, sources and artifact,
    and the linked server for LINKED_TARGETS (made once per options: conftest)."""
    from ninfer.pipeline import CompileOptions

    out = TEST_MODELS / f"qwen3-tiny-{name}"
    compile_once(CompileOptions(
        model_dir=qwen3_model.checkpoint, target=name, out_dir=out,
        model_id="qwen3-tiny", max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK,
        python_module=False, build=name in LINKED_TARGETS))
    return name, SimpleNamespace(out_dir=out, server=out / "ninfer-server",
                                 report_path=out / "compile_report.json")


@pytest.fixture(scope="module", params=GPU_TARGETS)
def gpu_verified(request, qwen3_model):
    return _compiled(qwen3_model, request.param)


@pytest.fixture(scope="module", params=LINKED_TARGETS)
def gpu_build(request, qwen3_model):
    return _compiled(qwen3_model, request.param)


def test_every_launch_verified(gpu_verified):
    name, result = gpu_verified
    target = load_target(name)
    report = json.loads(result.report_path.read_text())
    assert report["target"]["name"] == name
    launches = report["launches"]
    kinds = {row["kernel"].split("_")[0] for row in launches}
    assert {"matmul", "attention", "rmsnorm", "rope", "embedding", "add", "silu"} <= kinds
    for row in launches:
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row  # every size the runtime can ask fits
        assert int(row["threads"]) <= target.max_threads_per_block
        assert int(row["registers"]) <= target.registers_per_thread_max
    assert (result.out_dir / "src" / "launch.cu").exists()
    assert result.server.exists() == (name in LINKED_TARGETS)


def test_cuda_model_samples_on_device(gpu_build):
    """The engine samples a CUDA model on the device: the sampler kernel is launched
    (and verified) after the LM head, and the engine's path (launch + sample) copies no
    vocabulary-sized row to the host; only step(), kept for Model::forward, returns logits."""
    _, result = gpu_build
    report = json.loads(result.report_path.read_text())
    assert any(row["kernel"].startswith("sampler_") for row in report["launches"])
    model_cpp = (result.out_dir / "src" / "model.cpp").read_text()
    assert "bool samples_on_device() const override { return true; }" in model_cpp
    start = model_cpp.index("  void launch(const StepBatch& b) override {")
    device_path = model_cpp[start:model_cpp.index("  size_t graphs_captured() const")]
    assert "void sample(const SampleRow* rows, SampledToken* out) override" in device_path
    assert "kVocab" not in device_path and "logits_, sizeof" not in device_path
    assert device_path.count("backend::to_host(") == 2  # the tokens and their logprobs


# One target per CUDA arch the project ships (Ada, Hopper, Blackwell consumer).
SAMPLER_TARGETS = ["rtx4080s", "h200", "rtx5090"]


@pytest.mark.parametrize("name", SAMPLER_TARGETS)
def test_sampler_kernel_compiles_and_its_launch_verifies(name, tmp_path):
    """The device sampler for a 151,936-token vocabulary (Qwen) and 16 rows, built by nvcc
    for the target's arch: no spills, and one block per row fits for every row count."""
    from ninfer.kernels import SamplerSpec
    from ninfer.kernels.cuda.lower import build_cuda_source
    from ninfer.occupancy import LaunchSpec, RuntimeLimits, nvcc_resources, verify

    target = load_target(name)
    spec = SamplerSpec(vocab=151936, max_rows=16, max_edits=16 * 5120)
    module = build_cuda_source([spec], target)
    used = nvcc_resources(tmp_path)(module.source, target.arch)
    (launch,) = module.launches
    assert used[launch.kernel_symbol].spill_bytes == 0
    report = verify(target, [LaunchSpec(launch.shape(), sizes=(1, spec.max_rows))], used,
                    RuntimeLimits(prefill_chunk=spec.max_rows))
    assert report.ok, report.violations
    (check,) = report.checks
    assert check.max_ok_size == spec.max_rows and check.ctas_per_sm >= 1
    assert launch.threads == check.launch.threads <= target.max_threads_per_block


def test_device_code_is_built_for_the_target_arch(gpu_build):
    name, result = gpu_build
    arch = load_target(name).arch
    data = result.server.read_bytes()
    assert re.search(rb"\.target\s+" + arch.encode() + rb"\b", data), (
        f"no PTX for {arch} embedded in {result.server}")


def test_cuda_runtime_is_linked_statically(gpu_build):
    _, result = gpu_build
    out = subprocess.run(["ldd", str(result.server)], capture_output=True, text=True).stdout
    assert "libcudart" not in out and "tvm" not in out and "python" not in out


def test_server_refuses_an_artifact_for_another_target(gpu_build, qwen3_model):
    """The artifact guard runs before any device is touched, so it is testable here."""
    name, result = gpu_build
    r = subprocess.run([str(result.server), "--port", "0", "--artifact",
                        str(qwen3_model.out_dir / "model.ninfer")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"compiled for target 'cpu' but this server was built for '{name}'" in r.stderr


def test_server_without_a_gpu_fails_cleanly(gpu_build):
    """No usable GPU: a clean error, not a crash. The GPUs are hidden from the server
    (CUDA_VISIBLE_DEVICES=-1: no device index is valid), so this holds on a machine
    without a GPU or driver (cudaErrorInsufficientDriver) and on one with a GPU, even one
    this target's server would accept (cudaErrorNoDevice), instead of serving there."""
    _, result = gpu_build
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}
    r = subprocess.run([str(result.server), "--port", "0"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("ninfer-server: error: ")
    assert "cuda" in r.stderr.lower()


def test_coop_prefill_projections_are_routed_and_verified(qwen3_model):
    """--prefill-projections coop: every bias-free projection's prefill rows go through
    the cooperative family, with per-target routes whose grids fit the resident budget."""
    from ninfer.pipeline import CompileOptions, compile_model

    target = load_target("rtx4080s")
    out = TEST_MODELS / "qwen3-tiny-rtx4080s-coop"
    result = compile_model(CompileOptions(
        model_dir=qwen3_model.checkpoint, target="rtx4080s", out_dir=out,
        model_id="qwen3-tiny", max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK,
        python_module=False,
        prefill_projections="coop"))
    rows = [r for r in result.report.to_json()["launches"] if r["kernel"].startswith("coop_")]
    assert rows, "no cooperative launches in the report"
    for row in rows:
        budget = int(row["resident_budget"])
        assert budget == int(row["ctas_per_sm"].split()[0]) * target.sm_count
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi
    model_cpp = (out / "src" / "model.cpp").read_text()
    for shape in ("k128_n128", "k128_n64", "k128_n640", "k320_n128"):
        assert f"coop_proj_{shape}(" in model_cpp
    assert "cudaLaunchCooperativeKernel" in (out / "src" / "launch.cu").read_text()
    assert result.server.exists()


def test_16bit_weights_and_kv_build_for_cuda(qwen3_model):
    """--weights bf16 (lm_head f16) and --kv-dtype f16 on a GPU target: the TE matmul
    reads 16-bit weights and widens them, so every projection and the LM head run on them,
    the cooperative family (f32 weights only) is left out; attention and the KV store
    take the f16 pool; every launch verifies and the server links."""
    from ninfer.pipeline import CompileOptions, compile_model

    out = TEST_MODELS / "qwen3-tiny-h200-bf16"
    result = compile_model(CompileOptions(
        model_dir=qwen3_model.checkpoint, target="h200", out_dir=out, model_id="qwen3-tiny",
        max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, python_module=False, weights="bf16",
        weight_overrides=(("lm_head", "f16"),), kv_dtype="f16"))
    report = result.report.to_json()
    assert set(report["plan"]["weights"].values()) == {"bf16", "f16"}
    assert report["plan"]["kv"]["dtype"] == "f16"
    launched = {row["kernel"] for row in report["launches"]}
    assert any(k.startswith("attention_") and k.endswith("_f16_kernel") for k in launched)
    assert any(k.startswith("kv_store_") and "_f16_" in k for k in launched)
    kernels = {row["kernel"] for row in report["launches"]}
    matmuls = {k for k in kernels if k.startswith("matmul_")}
    assert matmuls and all("_bf16_" in k or "_f16_" in k for k in matmuls), matmuls
    assert any("_f16_" in k for k in matmuls) and not any(k.startswith("coop_") for k in kernels)
    for row in report["launches"]:
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row
    assert result.server.exists()


def test_quantized_weights_build_for_cuda(qwen3_model):
    """--weights q4g64 (lm_head q8g32) on a GPU target: the projections and the LM head
    run the hand-written group-quantized kernels (gemv for decode rows, the tiled gemm for
    prefill), read in the artifact's layout; every launch verifies and the server links."""
    from ninfer.pipeline import CompileOptions, compile_model

    out = TEST_MODELS / "qwen3-tiny-rtx4080s-q4g64"
    result = compile_model(CompileOptions(
        model_dir=qwen3_model.checkpoint, target="rtx4080s", out_dir=out, model_id="qwen3-tiny",
        max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, python_module=False, weights="q4g64",
        weight_overrides=(("lm_head", "q8g32"),)))
    report = result.report.to_json()
    matmuls = {row["kernel"] for row in report["launches"] if row["kernel"].startswith("matmul_")}
    assert {k.rsplit("_", 2)[-2] for k in matmuls} == {"gemv", "gemm"}
    assert all("_q4g64_" in k or "_q8g32_" in k for k in matmuls), matmuls
    assert any("_q8g32_gemv" in k for k in matmuls)
    source = (out / "src" / "launch.cu").read_text()
    assert "ninfer_q::Eight<4>" in source and "ninfer_q::Eight<8>" in source
    for row in report["launches"]:
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row
    assert result.server.exists()


def test_verifier_failure_leaves_its_dump(tmp_path):
    """--dump writes each stage's output as soon as that stage finishes: a launch that does
    not fit stops the compile in the kernels stage, after the proof that failed
    (launches.json, with the violation) is written and before anything later is."""
    from ninfer.occupancy.verifier import LaunchVerificationError
    from ninfer.paths import TARGETS_DIR
    from ninfer.pipeline import CompileOptions, compile_model
    from test_frontend import BASE, make_ckpt

    # The rtx4080s profile with a per-thread register cap that the attention kernel
    # (about 70 registers) exceeds; nothing else changes, so the device code is the same.
    profile = (TARGETS_DIR / "rtx4080s.toml").read_text()
    tight = tmp_path / "tight4080s.toml"
    tight.write_text(profile.replace('name = "rtx4080s"', 'name = "tight4080s"')
                     .replace("registers_per_thread_max = 255", "registers_per_thread_max = 40"))
    ckpt = make_ckpt(tmp_path / "ckpt", {**BASE, "head_dim": 32})
    dump = tmp_path / "dump"
    with pytest.raises(LaunchVerificationError, match=r"registers per thread \d+ exceeds 40"):
        compile_model(CompileOptions(model_dir=ckpt, target=str(tight), out_dir=tmp_path / "out",
                                     max_context=128, prefill_chunk=32, dump_dir=dump))
    assert sorted(p.name for p in dump.iterdir()) == ["graph.json", "kernels.json",
                                                       "launches.json", "plan.json"]
    proof = json.loads((dump / "launches.json").read_text())
    assert proof["violations"] and all("tight4080s: kernel" in v for v in proof["violations"])
    failing = [row for row in proof["launches"] if row["max_ok_size"] == "0"]
    assert failing and all(int(row["registers"]) > 40 for row in failing)
    kernels = json.loads((dump / "kernels.json").read_text())
    assert {k["name"] for k in kernels["kernels"]} == {la["spec"] for la in kernels["launches"]}
    assert json.loads((dump / "plan.json").read_text())["limits"]["prefill_chunk"] == 32
