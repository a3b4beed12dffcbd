"""GPU targets build without a GPU: kernels compiled by nvcc for each target's arch,
every launch verified against that target's occupancy, ninfer-server linked.

Nothing here runs CUDA code, with or without a GPU present (the server runs only up to
its artifact and device checks, with the GPUs hidden); the tests marked `gpu`
(tests/test_gpu.py) do.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
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


def test_cuda_server_needs_only_glibc_up_to_its_floor(gpu_build):
    """A CUDA server too: glibc's libraries only (cudart is static and loads the driver at
    run time), no symbol above the floor."""
    from conftest import glibc_needs

    _, result = gpu_build
    needed, _ = glibc_needs(result.server)
    assert "libcuda.so.1" not in needed


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
    reads 16-bit weights and widens them, so every projection and the LM head run on them;
    the prefill projections run the cooperative family's bf16 variants (the w tile widened
    as it is staged) on verified routes; attention and the KV store take the f16 pool;
    every launch verifies and the server links."""
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
    assert any("_f16_" in k for k in matmuls)
    coop = {k for k in kernels if k.startswith("coop_")}
    assert coop and all(k.endswith("_bf16") for k in coop), coop
    routes = report["coop_routes"]
    assert {r["role"] for r in routes} == {"q", "k", "v", "o", "gate_up", "down"}
    assert all(r["variant"].endswith("_bf16") for r in routes)
    launch_cu = (out / "src" / "launch.cu").read_text()
    assert "coop_proj_k128_n128_bf16(const float* x, const uint16_t* w" in launch_cu
    assert "ninfer_coop::widen16<true>" in launch_cu
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


# ---- hybrid models (Gated DeltaNet + gated attention, dense and MoE) ----

GDN_ROLES = ("gdn_qkv", "gdn_z", "gdn_ba", "gdn_out", "q_gate")
QWEN35_27B = Path(__file__).parent.parent / "benchmarks" / "configs" / "qwen3.5-27b.json"


# The hybrids' servers are linked for sm_89 (Qwen3.5, here) and sm_90 (Qwen3-Next, below);
# the dense model's links cover sm_120a's toolchain, and every target's device code is
# compiled by nvcc for its proof.
HYBRID_LINKED = ["rtx4080s"]


@pytest.fixture(scope="module", params=GPU_TARGETS)
def hybrid_verified(request, qwen35_model):
    """qwen35-tiny (f32 weights: every projection cooperative at prefill) for each GPU
    target: kernels, proofs and sources; the server linked for HYBRID_LINKED."""
    from ninfer.pipeline import CompileOptions

    name = request.param
    out = TEST_MODELS / f"qwen35-tiny-{name}"
    compile_once(CompileOptions(
        model_dir=qwen35_model.checkpoint, target=name, out_dir=out, model_id="qwen35-tiny",
        max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, max_concurrency=4,
        python_module=False, build=name in HYBRID_LINKED))
    return name, out


def test_hybrid_compiles_verifies_and_links_for_every_gpu_target(hybrid_verified):
    """The Gated DeltaNet kernels (conv, gates, recurrence, output norm) and the gated
    attention's sigmoid gate are compiled for the target's arch and every launch fits at
    every row count; the GDN input projections (the gating projection [b|a] among them)
    and the gated query run through the cooperative family on derived, verified routes;
    the state pool has the padding rows' spare slot."""
    name, out = hybrid_verified
    target = load_target(name)
    report = json.loads((out / "compile_report.json").read_text())
    kernels = [row["kernel"] for row in report["launches"]]
    for family in ("gdn_conv_", "gdn_gate_", "gdn_recurrent_", "gdn_norm_", "sigmoid_gate_"):
        assert any(k.startswith(family) for k in kernels), family
    for row in report["launches"]:
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row
        assert int(row["threads"]) <= target.max_threads_per_block
    routes = report["coop_routes"]
    assert set(GDN_ROLES) <= {r["role"] for r in routes}
    for r in routes:
        assert r["max_grid"] <= r["resident_budget"] or r["split"] == 1, r
    for role in GDN_ROLES:  # every prefill size is routed, without gaps
        mine = sorted((r["min_tokens"], r["max_tokens"]) for r in routes if r["role"] == role)
        assert mine[0][0] == 1 and mine[-1][1] == PREFILL_CHUNK
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(mine))
    memory = report["plan"]["memory"]
    assert memory["state_slots"] == 4 + 4 + 1  # sequences, prefix-cache checkpoints, padding
    model_cpp = (out / "src" / "model.cpp").read_text()
    assert "constexpr int kStateSlots = 9;" in model_cpp
    assert "constexpr int kStateCheckpoints = 4;" in model_cpp
    # padding rows run in the spare state slot, saving nothing
    assert "stage_state_[i] = !real ? kStateSlots - 1 :" in model_cpp
    assert "stage_save_[i] = real && b.save_slots ? b.save_slots[i] : -1;" in model_cpp
    assert "coop_proj_k128_n8(" in model_cpp  # [b|a]: 2 x 4 value heads
    if name in HYBRID_LINKED:
        assert (out / "ninfer-server").exists()


def test_chunked_gdn_prefill_compiles_and_verifies_for_cuda(qwen35_model, tmp_path):
    """--gdn-prefill chunked on the RTX 4080 SUPER: the recurrence is the 64-row chunked
    kernel with its dynamic shared memory, verified at every row count of a step, and the
    server's scheduler aligns prompt steps to the chunk (sources only: the hybrid's server
    links in the test above)."""
    from ninfer.kernels.cuda.gdn import chunked_layout
    from ninfer.kernels.cuda.schedules import cuda_params
    from ninfer.kernels.spec import GdnRecurrentSpec
    from ninfer.pipeline import CompileOptions, compile_model

    result = compile_model(CompileOptions(
        model_dir=qwen35_model.checkpoint, target="rtx4080s", out_dir=tmp_path / "out",
        model_id="qwen35-tiny", max_context=MAX_CONTEXT, prefill_chunk=80, max_concurrency=4,
        python_module=False, build=False, gdn_prefill="chunked"))
    rows = {row["kernel"]: row for row in result.report.to_json()["launches"]}
    (name,) = [k for k in rows if re.fullmatch(r"gdn_recurrent_\w+_c64_kernel", k)]
    row = rows[name]
    # conftest's qwen35-tiny; 4 sequence slots, 4 prefix-cache checkpoints, 1 padding slot
    spec = GdnRecurrentSpec(2, 4, 32, 32, 9, chunk=64)
    assert name == f"{spec.name()}_kernel"
    tile, _, smem = chunked_layout(spec, cuda_params(load_target("rtx4080s")))
    assert row["smem"].split()[0] == str(smem) and tile == 32
    assert row["sizes"] == "tokens 1..80" and int(row["max_ok_size"]) == 80
    assert "/*prefill_align=*/64" in (tmp_path / "out" / "src" / "model.cpp").read_text()


def test_moe_hybrid_builds_for_cuda(qwen3next_model):
    """Qwen3-Next (8 experts, top-2, a shared expert; f16 weights) for h100: the router
    and combine kernels are launched and verified up to the routed rows of a chunk
    (chunk x top_k for the gather), the server links, and its steps run eagerly (the
    expert grouping reads the routing on the host, which a CUDA graph cannot capture)."""
    from ninfer.pipeline import CompileOptions, compile_model

    out = TEST_MODELS / "qwen3next-tiny-h100"
    result = compile_model(CompileOptions(
        model_dir=qwen3next_model.checkpoint, target="h100", out_dir=out,
        model_id="qwen3next-tiny", max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK,
        python_module=False, kv_dtype="f32"))
    rows = {row["kernel"]: row for row in result.report.to_json()["launches"]}
    assert any(k.startswith("moe_router_e8_k2_norm") for k in rows)
    assert any(k.startswith("moe_combine_") for k in rows)
    gather = next(r for k, r in rows.items() if k.startswith(f"embedding_v{PREFILL_CHUNK}_"))
    assert gather["sizes"] == f"tokens 1..{PREFILL_CHUNK * 2}"
    for row in rows.values():
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row
    model_cpp = (out / "src" / "model.cpp").read_text()
    assert "const bool graphs = false;" in model_cpp
    assert "graphs_.run((uint64_t(n) << 16)" not in model_cpp
    assert result.server.exists()


def test_mtp_drafts_build_for_cuda():
    """The Qwen3.5 hybrid with its MTP head, --spec mtp for h200: the head's fc halves, its
    attention layer (a KV pool layer of its own) and the LM head run on the step's
    kernels, whose launches are verified up to the step's rows; the server links, its
    steps stay graph replays (the head's input, every row's final-normed hidden state, is
    written inside them) and the draft passes run eagerly after them."""
    from conftest import checkpoint
    from ninfer.pipeline import CompileOptions, compile_model

    ckpt, _ = checkpoint("qwen35mtp-tiny")
    out = TEST_MODELS / "qwen35mtp-tiny-h200"
    result = compile_model(CompileOptions(
        model_dir=ckpt, target="h200", out_dir=out, model_id="qwen35mtp-tiny",
        max_context=MAX_CONTEXT, prefill_chunk=PREFILL_CHUNK, max_concurrency=4,
        python_module=False, kv_dtype="f32", spec="mtp", max_draft_tokens=3))
    launches = result.report.to_json()["launches"]
    for row in launches:
        _, hi = map(int, row["sizes"].split()[1].split(".."))
        assert int(row["max_ok_size"]) == hi, row
    model_cpp = (out / "src" / "model.cpp").read_text()
    assert "void draft(const DraftBatch& d, int32_t* drafts) override" in model_cpp
    assert "mtp_fc_hidden_.mtp_fc" in model_cpp and "mtp_fc_embed_.mtp_fc" in model_cpp
    assert "graphs_.run((uint64_t(n) << 16)" in model_cpp
    assert "(x, final_norm_, mtp_hid_, n)" in model_cpp
    manifest = json.loads((out / "compile_report.json").read_text())
    assert manifest["plan"]["limits"]["spec"] == "mtp"
    assert result.server.exists()


def _gdn_routes(name: str, roles: tuple[str, ...], max_tokens: int):
    from ninfer.kernels.cuda.coop import coop_family
    from ninfer.occupancy.coop import compile_coop_family, route_coop
    from ninfer.occupancy.explain import CUDA_CACHE, projection_shapes
    from ninfer.occupancy.resources import nvcc_resources

    target = load_target(name)
    shapes = projection_shapes(QWEN35_27B)
    out = {}
    for role in roles:
        k, n_out, wdtype = shapes[role]
        family = coop_family(k, n_out, wdtype=wdtype)
        resources = compile_coop_family(family, target.arch, nvcc_resources(CUDA_CACHE))
        out[role] = (route_coop(target, family, resources, max_tokens), resources)
    return target, out


def test_gdn_projection_routes_fit_an_80_sm_card_at_every_chunk():
    """Qwen3.5-27B's Gated DeltaNet projections on the RTX 4080 SUPER (80 SMs), up to a
    4096-token prefill chunk: at every token count the routed variant's grid is at most
    80 x the CTAs/SM its real registers and shared memory allow (occupancy recomputed
    here from nvcc's numbers, not taken from the router). The gating projection [b|a]
    (5120 -> 96) runs split8 only while 8 x ceil(n / 64) CTAs are resident, then steps
    down; a budget written for 128 SMs would launch split8 past that and fail."""
    from ninfer.occupancy import occupancy

    max_tokens = 4096
    target, routed = _gdn_routes("rtx4080s", ("gdn_qkv", "gdn_z", "gdn_ba", "gdn_out"),
                                 max_tokens)
    assert target.sm_count == 80
    for role, (router, resources) in routed.items():
        for tokens in range(1, max_tokens + 1):
            v = router.variant_for(tokens)
            if not v.cooperative:
                continue
            res = resources[v.name()]
            smem = res.static_smem_bytes + v.launch_shape().dynamic_smem.evaluate({"n": tokens})
            per_sm = occupancy(target, v.threads, res.registers, smem).ctas_per_sm
            assert v.grid(tokens) <= 80 * per_sm, (role, tokens, v.name())
    ba = routed["gdn_ba"][0]
    assert ba.variant_for(1).split == 8 and ba.variant_for(max_tokens).split < 8


def test_gdn_gating_routes_differ_between_4080_super_and_4090():
    """Same kernels (sm_89), different SM counts: the 4090 (128 SMs) keeps split8 for
    the gating projection to a larger chunk than the 4080 SUPER (80 SMs)."""
    def split8_limit(name: str) -> int:
        _, routed = _gdn_routes(name, ("gdn_ba",), 4096)
        router = routed["gdn_ba"][0]
        return max(r.max_tokens for r in router.routes if r.variant.split == 8)

    small, big = split8_limit("rtx4080s"), split8_limit("rtx4090")
    assert small < big
    assert small * 128 // 80 // 64 == big // 64  # the budget scales with the SM count


def test_readme_gdn_route_table_is_what_the_compiler_derives():
    """The README's route table of Qwen3.5-27B's Gated DeltaNet projections is the
    explain tool's output now (nvcc's numbers for every target)."""
    from ninfer.occupancy.explain import ExplainArgs, explain_markdown

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme.split("<!-- gdn-routes:begin -->\n")[1].split("\n<!-- gdn-routes:end -->")[0]
    derived = explain_markdown(ExplainArgs(
        tuple(GPU_TARGETS), max_tokens=4096, config=QWEN35_27B, markdown=True,
        roles=("gdn_qkv", "gdn_z", "gdn_ba", "gdn_out")))
    assert table == derived, "README GDN route table is stale; rerun its command"


@pytest.mark.parametrize("name", SAMPLER_TARGETS)
def test_gdn_and_moe_kernels_at_released_shapes_compile_and_verify(name, tmp_path):
    """The hybrid kernels at Qwen3.5-27B's Gated DeltaNet shapes (16 key / 48 value heads
    of 128, conv over 10240 channels) and a Qwen3.5-MoE-sized router (512 experts, top 10)
    and combine, for 8 sequences + the spare slot, the recurrence in both forms (the chunked
    one in dynamic shared memory): nvcc for the target's arch, no spills, every row count up
    to a 4096-token chunk fits."""
    from ninfer.kernels.cuda.lower import build_cuda_source
    from ninfer.kernels.spec import (
        GdnConvSpec,
        GdnGateSpec,
        GdnNormSpec,
        GdnRecurrentSpec,
        MoeCombineSpec,
        MoeRouterSpec,
    )
    from ninfer.occupancy import LaunchSpec, RuntimeLimits, nvcc_resources, verify

    target = load_target(name)
    specs = [GdnConvSpec(10240, 4, 9), GdnGateSpec(48), GdnRecurrentSpec(16, 48, 128, 128, 9),
             GdnRecurrentSpec(16, 48, 128, 128, 9, chunk=64),  # --gdn-prefill chunked
             GdnNormSpec(48, 128), MoeRouterSpec(512, 10), MoeCombineSpec(2048, 10, 40960)]
    module = build_cuda_source(specs, target)
    used = nvcc_resources(tmp_path)(module.source, target.arch)
    assert len(module.launches) == len(specs)
    for launch in module.launches:
        assert used[launch.kernel_symbol].spill_bytes == 0, launch.kernel_symbol
    report = verify(target, [LaunchSpec(la.shape(), sizes=(1, 4096)) for la in module.launches],
                    used, RuntimeLimits(prefill_chunk=4096))
    assert report.ok, report.violations
    assert all(c.max_ok_size == 4096 for c in report.checks)
