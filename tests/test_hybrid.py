"""Hybrid (Gated DeltaNet + gated attention, dense and MoE) models served end to end on
the CPU.

test_parity runs every tiny hybrid (Qwen3.5, its multimodal twin, Qwen3-Next) through the
shared checks against transformers (last logits, a decode step, 32 greedy tokens through
the server). Here the recurrent state's own risks, on the tiny Qwen3.5 (prefill chunk
16): a prompt spread over many chunks, four streams in one batch (each slot's state must
stay its own), n > 1 choices (which cannot share prompt blocks: the state is not in
them), and cancellations, after which every state slot is free and a new request in a
reused slot starts from a zero state. Preemption (recompute from the tokens) is in
test_preemption.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import (
    TEST_MODELS,
    CompiledModel,
    checkpoint,
    compile_once,
    read_response,
    send_completion,
)
from ninfer.bench.hf_reference import greedy_cached
from ninfer.runtime import Server

pytestmark = pytest.mark.e2e

LONG = 70  # tokens: 5 prefill chunks of 16


@pytest.fixture(scope="module")
def hybrid(qwen35_model):
    model = qwen35_model.hf_model()
    with Server(qwen35_model.out_dir, threads=2) as srv:
        yield model, srv


def _body(ids: list[int], **extra) -> dict:
    return {"prompt": ids, "max_tokens": 32, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **extra}


def _metric(srv: Server, name: str) -> float:
    text = srv.client.get("/metrics").text
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(21)
    return [rng.integers(0, 2000, n).tolist() for n in (5, 23, 40, LONG)]


def test_prompt_over_five_prefill_chunks_matches_transformers(hybrid):
    model, srv = hybrid
    ids = _prompts()[-1]
    r = srv.client.post("/v1/completions", json=_body(ids))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == greedy_cached(model, ids, 32)


def _together(srv: Server, bodies: list[dict]) -> list[dict]:
    """The bodies submitted while the server is stopped (the kernel queues the
    connections), so they are admitted into the same steps whatever the machine's speed."""
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGSTOP)
    try:
        sockets = [send_completion(srv, b) for b in bodies]
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    return [read_response(s) for s in sockets]


def test_four_streams_in_one_batch_equal_their_solo_runs_and_transformers(hybrid):
    """Mixed prefill and decode rows of four sequences in the same steps: each slot's
    conv and SSM state must be its own."""
    model, srv = hybrid
    prompts = _prompts()
    want = [greedy_cached(model, ids, 32) for ids in prompts]
    solo = [srv.client.post("/v1/completions", json=_body(ids)).json()["choices"][0]["token_ids"]
            for ids in prompts]
    assert solo == want
    for _ in range(2):  # and again, in slots that held other sequences' states
        together = _together(srv, [_body(ids) for ids in prompts])
        assert [r["choices"][0]["token_ids"] for r in together] == want


def test_moe_hybrid_streams_in_one_batch_equal_transformers(qwen3next_model):
    """The sparse MoE blocks (tiny Qwen3-Next, 8 experts, 2 per row): in a batch of four
    streams each expert runs over the rows routed to it from every sequence, a row count
    that changes with the batch; each stream's tokens must still be transformers'."""
    model = qwen3next_model.hf_model()
    prompts = _prompts()
    want = [greedy_cached(model, ids, 32) for ids in prompts]
    with Server(qwen3next_model.out_dir, threads=2) as srv:
        together = _together(srv, [_body(ids) for ids in prompts])
    assert [r["choices"][0]["token_ids"] for r in together] == want


def test_n_choices_each_prefill_their_own_prompt(hybrid):
    """n > 1 on a dense model shares the prompt's KV blocks between the choices; a hybrid's
    choices cannot (their recurrent state is not in the blocks), so each prefills the
    prompt in its own slot, here from the solo run's cached prefix and state checkpoint
    (each choice restores it into its own slot), and every greedy choice equals the solo
    run."""
    _, srv = hybrid
    ids = _prompts()[2]
    solo = srv.client.post("/v1/completions", json=_body(ids)).json()["choices"][0]["token_ids"]
    rows = "ninfer:iteration_tokens_total_sum"  # token rows the steps computed
    before = _metric(srv, rows)
    r = srv.client.post("/v1/completions", json=_body(ids, n=3))
    assert r.status_code == 200, r.text
    assert [c["token_ids"] for c in r.json()["choices"]] == [solo] * 3
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(ids) - 1) // 16 * 16  # the solo prompt's last checkpoint
    # each choice: the prompt after the cached prefix, then a decode row for each token
    # after its first
    assert _metric(srv, rows) - before == 3 * (len(ids) - cached + 31)


def test_state_slots_are_freed_by_cancellation_and_reused_from_zero(hybrid):
    model, srv = hybrid
    assert _metric(srv, "ninfer:state_slots_total") == 8  # the compiled concurrency
    prompts = _prompts()
    for ids in prompts:  # streams dropped after their first tokens
        s = send_completion(srv, _body(ids, max_tokens=150, stream=True))
        s.settimeout(300)
        got = b""
        while b"data:" not in got:  # a token was sampled: the sequence is running
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        s.close()
    deadline = time.monotonic() + 60  # the engine notices each hang-up within a step
    while _metric(srv, "ninfer:state_slots_used") or _metric(srv, "ninfer:kv_blocks_used"):
        assert time.monotonic() < deadline, srv.client.get("/metrics").text
        time.sleep(0.02)
    assert _metric(srv, "ninfer:requests_cancelled_total") >= len(prompts)
    # the freed slots held mid-sequence states: new sequences there start from zeros
    together = _together(srv, [_body(ids) for ids in prompts])
    assert [r["choices"][0]["token_ids"] for r in together] == [
        greedy_cached(model, ids, 32) for ids in prompts]


@pytest.fixture(scope="module")
def quantized_hybrids(qwen35_model):
    """The tiny Qwen3.5 with q8g32 weights and an int8 KV cache, and with q4g64 weights and
    an int4 one (the GDN state stays float32 in both)."""
    from conftest import TEST_MODELS
    from ninfer.pipeline import CompileOptions, compile_model

    out = {}
    for weights, kv in (("q8g32", "int8"), ("q4g64", "int4")):
        d = TEST_MODELS / f"qwen35-tiny-{weights}-kv{kv}-cpu"
        compile_model(CompileOptions(model_dir=qwen35_model.checkpoint, target="cpu",
                                     out_dir=d, model_id=f"qwen35-tiny-{weights}-{kv}",
                                     max_context=256, prefill_chunk=16, weights=weights,
                                     kv_dtype=kv))
        out[weights] = d
    return out


def test_quantized_hybrids_plan_their_formats_and_stay_near_f32(qwen35_model,
                                                                quantized_hybrids):
    """Every matmul of both layer kinds in the chosen format, the KV cache of the attention
    layers only; logits near the f32 build's. A random hybrid is chaotic (q8g32 weights
    alone move its last logits by 3-12% of the largest, the int8 activations as much
    again; q4g64 by ~100%: near-ties reshuffle), so the q8 bound is loose and catches a
    wrong layout, not drift; drift bounds on a trained model are test_quantized's."""
    from ninfer.runtime.engine import load_engine

    report = json.loads((quantized_hybrids["q8g32"] / "compile_report.json").read_text())
    plan = report["plan"]
    assert set(plan["weights"]) >= {"gdn_qkv", "gdn_z", "gdn_ba", "gdn_out", "q_gate", "q"}
    assert set(plan["weights"].values()) == {"q8g32"}
    assert plan["kv"]["dtype"] == "int8" and plan["memory"]["state_bytes"] == 16 * 3 * 4 * (
        3 * 256 + 4 * 32 * 32)  # slots (8 + 8 checkpoints) x GDN layers x f32 x (conv taps
    # x channels + state)
    ids = np.random.default_rng(3).integers(0, 2000, 60).tolist()
    f32 = load_engine(qwen35_model.out_dir, threads=2)
    q8 = load_engine(quantized_hybrids["q8g32"], threads=2)
    q4 = load_engine(quantized_hybrids["q4g64"], threads=2)
    agree, worst = 0, 0.0
    for n in range(15, 61, 5):
        want = np.asarray(f32.forward(ids[:n], 0))
        got = np.asarray(q8.forward(ids[:n], 0))
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        agree += int(got.argmax() == want.argmax())
        assert np.isfinite(np.asarray(q4.forward(ids[:n], 0))).all()
    assert worst < 0.3 and agree >= 6, (worst, agree)


def test_memory_plan_counts_the_state_and_only_attention_layers_hold_kv(qwen35_model):
    """The plan of the tiny Qwen3.5 (3 GDN layers, 1 attention layer): KV blocks for the
    attention layer only, the recurrent state of every slot counted, an over-full budget
    refused with the state in the numbers, a GPU target refused; the prefix cache's state
    checkpoints (one per sequence slot by default) counted with them."""
    from ninfer.frontend.checkpoint import open_checkpoint
    from ninfer.frontend.llama import build_graph
    from ninfer.plan import PlanError, ServeLimits, make_plan
    from ninfer.targets import load_target

    graph = build_graph(open_checkpoint(qwen35_model.checkpoint))
    limits = ServeLimits(max_context=256, prefill_chunk=16, max_concurrency=8, kv_dtype="f32")
    plan = make_plan(graph, load_target("cpu"), limits)
    kv_heads, d = graph.config.num_kv_heads, graph.config.head_dim
    assert plan.kv.bytes_per_block == 2 * 1 * 16 * kv_heads * d * 4  # k and v, 1 layer
    # 8 sequence slots and 8 checkpoints x 3 GDN layers x f32 x (conv taps x channels + state)
    assert plan.limits.state_checkpoints == 8 and plan.memory.state_slots == 16
    assert plan.memory.state_bytes == 16 * 3 * 4 * (3 * 256 + 4 * 32 * 32)
    assert plan.memory.total_bytes == (plan.memory.weights_bytes + plan.memory.kv_bytes
                                       + plan.memory.activation_bytes
                                       + plan.memory.workspace_bytes + plan.memory.state_bytes)
    one_sequence = (limits.blocks_per_seq + 1) * plan.kv.bytes_per_block
    tight = load_target("cpu").with_overrides(memory_gib=(
        plan.memory.total_bytes - plan.memory.kv_bytes + one_sequence // 2) / 2**30)
    with pytest.raises(PlanError, match=r"recurrent state 0\.\d MiB \(16 slots\) leave.*"
                                        r"lower --state-checkpoints \(8\)"):
        make_plan(graph, tight, limits)
    none = make_plan(graph, load_target("cpu"), replace(limits, state_checkpoints=0))
    assert none.memory.state_slots == 8 and none.kernels["gdn_recurrent"].max_seqs == 8
    # on CUDA one more slot: the padding rows' of replayed step graphs
    gpu = make_plan(graph, load_target("rtx4080s"), limits)
    assert gpu.memory.state_slots == 17
    assert gpu.memory.state_bytes == 17 * 3 * 4 * (3 * 256 + 4 * 32 * 32)
    assert gpu.kernels["gdn_recurrent"].max_seqs == gpu.kernels["gdn_conv"].max_seqs == 17
    # speculation: each sequence also keeps the states after a verify step's draft rows,
    # 1 + max_draft_tokens slots per sequence
    spec = ServeLimits(max_context=256, prefill_chunk=64, max_concurrency=8, kv_dtype="f32",
                       spec="ngram", max_draft_tokens=4)
    cpu = make_plan(graph, load_target("cpu"), spec)
    assert cpu.memory.state_slots == 8 * 5 + 8 == cpu.kernels["gdn_recurrent"].max_seqs
    assert cpu.memory.state_bytes == 48 * 3 * 4 * (3 * 256 + 4 * 32 * 32)
    assert make_plan(graph, load_target("rtx4080s"), spec).memory.state_slots == 49
    # a dense model has no state to checkpoint
    dense = build_graph(open_checkpoint(checkpoint("qwen3-tiny")[0]))
    assert make_plan(dense, load_target("cpu"), limits).limits.state_checkpoints == 0
    with pytest.raises(PlanError, match="no recurrent state"):
        make_plan(dense, load_target("cpu"), replace(limits, state_checkpoints=2))


def test_every_layer_sparse_qwen35_moe_matches_transformers(qwen35moe_model):
    """Qwen3.5-MoE: no dense MLP anywhere (the step program has none), 3 of 8 experts per
    row; last logits of a prefill over several chunks and of a decode step."""
    from ninfer.runtime.engine import load_engine

    model = qwen35moe_model.hf_model()
    engine = load_engine(qwen35moe_model.out_dir, threads=2)
    ids = _prompts()[-1]
    for n in (1, 17, len(ids)):
        with torch.no_grad():
            want = model(torch.tensor([ids[:n]])).logits[0, -1].numpy()
        got = np.asarray(engine.forward(ids[:n], 0))
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4, n
    with torch.no_grad():
        want = model(torch.tensor([[*ids, 7]])).logits[0, -1].numpy()
    got = np.asarray(engine.forward([7], len(ids)))  # one decode row after the prefill
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_fused_expert_tensors_load_as_the_per_expert_ones(qwen35moe_model, tmp_path):
    """transformers' in-memory layout (experts.gate_up_proj [E, 2I, H], experts.down_proj
    [E, H, I] per layer) gives the same stored weights as the per-expert tensors of the
    saved checkpoint."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from ninfer.frontend.checkpoint import open_checkpoint
    from ninfer.frontend.llama import build_graph

    src = qwen35moe_model.checkpoint
    tensors = load_file(src / "model.safetensors")
    fused: dict[str, np.ndarray] = {}
    for layer in range(4):
        m = f"model.layers.{layer}.mlp.experts."
        fused[m + "gate_up_proj"] = np.stack([np.concatenate(
            [tensors.pop(f"{m}{e}.gate_proj.weight"), tensors.pop(f"{m}{e}.up_proj.weight")])
            for e in range(8)])
        fused[m + "down_proj"] = np.stack([tensors.pop(f"{m}{e}.down_proj.weight")
                                           for e in range(8)])
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    save_file({**tensors, **fused}, str(tmp_path / "model.safetensors"))
    a, b = open_checkpoint(src), open_checkpoint(tmp_path)
    ga, gb = build_graph(a), build_graph(b)
    assert [w.name for w in ga.weights] == [w.name for w in gb.weights]
    assert any(w.transform.startswith("expert:") for w in gb.weights)
    for wa, wb in zip(ga.weights, gb.weights, strict=True):
        if ".experts." in wa.name:
            np.testing.assert_array_equal(ga.load_weight(a, wa), gb.load_weight(b, wb))


@pytest.mark.parametrize("fixture", ["qwen35_model", "qwen35vl_model"])
def test_mtp_tensors_are_stored_in_the_artifact_as_the_checkpoint_holds_them(
        fixture, request, tmp_path):
    """A checkpoint with Qwen3.5's multi-token-prediction head (mtp.fc over [embed; hidden],
    its two pre-norms, one decoder layer, the final norm): every mtp.* tensor is in the
    artifact under its own name, bit for bit (bf16 stays bf16, fp32 stays fp32), outside
    the memory plan (the step program does not read it), and the compile notes it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from ninfer.artifact_format import DTYPES, read_manifest
    from ninfer.frontend.model import read_model
    from ninfer.pipeline import CompileOptions, write_model_artifact
    from ninfer.plan import ServeLimits, make_plan
    from ninfer.targets import load_target

    model = request.getfixturevalue(fixture)
    src = model.checkpoint
    tensors = load_file(src / "model.safetensors")
    dtype = next(iter(tensors.values())).dtype
    h = 128
    gen = torch.Generator().manual_seed(5)
    mtp = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
           "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
           "mtp.layers.0.input_layernorm.weight": (h,),
           "mtp.layers.0.self_attn.q_proj.weight": (2 * 4 * 32, h),
           "mtp.layers.0.mlp.down_proj.weight": (h, 320)}
    added = {n: torch.randn(shape, generator=gen).to(dtype) for n, shape in mtp.items()}
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    save_file({**tensors, **added}, str(tmp_path / "model.safetensors"))
    opts = CompileOptions(model_dir=tmp_path, target="cpu", out_dir=tmp_path / "out",
                          max_context=256, prefill_chunk=16, kv_dtype="f32", build=False)
    artifact = write_model_artifact(opts, tmp_path / "model.ninfer")
    table = {t["name"]: t for t in read_manifest(artifact)["tensors"]}
    raw = artifact.read_bytes()
    for name, value in added.items():
        entry = table[name]
        assert tuple(entry["shape"]) == tuple(value.shape)
        stored = np.frombuffer(raw, DTYPES[entry["dtype"]], value.numel(), entry["offset"])
        if value.dtype == torch.bfloat16:
            assert entry["dtype"] == "bf16" or value.dim() == 1
            want = (value.view(torch.int16).numpy().view(np.uint16) if entry["dtype"] == "bf16"
                    else value.float().numpy())
        else:
            assert entry["dtype"] == "f32"
            want = value.numpy()
        np.testing.assert_array_equal(stored.reshape(value.shape), want)
    with_mtp, plain = read_model(tmp_path, None), read_model(src, None)
    assert [w.name for w in with_mtp.graph.weights if w.role == "mtp"] == sorted(added)
    limits = ServeLimits(max_context=256, prefill_chunk=16, kv_dtype="f32")
    cpu = load_target("cpu")
    assert (make_plan(with_mtp.graph, cpu, limits).memory.weights_bytes
            == make_plan(plain.graph, cpu, limits).memory.weights_bytes)
    assert any("7 mtp.* tensors) is stored in the artifact" in n for n in with_mtp.notes)


@pytest.fixture(scope="module")
def chunked(qwen35_model: CompiledModel):
    """The tiny Qwen3.5 compiled with --gdn-prefill chunked: 80-row steps beside 4 sequences
    give the 64-row chunk, to which the scheduler aligns prompt steps."""
    from ninfer.pipeline import CompileOptions

    out = TEST_MODELS / "qwen35-tiny-chunked-cpu"
    compile_once(CompileOptions(model_dir=qwen35_model.checkpoint, target="cpu", out_dir=out,
                                model_id="qwen35-tiny", max_context=256, prefill_chunk=80,
                                max_concurrency=4, kv_dtype="f32", gdn_prefill="chunked",
                                python_module=False))  # served only
    report = (out / "compile_report.json").read_text()
    assert re.search(r"gdn_recurrent_\w+_c64\b", report), "no 64-row chunked recurrence"
    with Server(out, threads=2) as srv:
        yield qwen35_model.hf_model(), srv


def test_chunked_gdn_prefill_matches_transformers_alone_and_in_a_batch(chunked):
    """Prompts of 150 and 70 tokens (chunk boundaries at 64 and 128 inside them) through the
    chunked (WY) form: 32 greedy tokens are transformers', and the four streams batched
    together, whose prompt steps are cut where the scheduler's alignment puts them, give
    the same tokens as each alone."""
    model, srv = chunked
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 2000, n).tolist() for n in (150, 70, 9, 33)]
    want = [greedy_cached(model, ids, 32) for ids in prompts]
    solo = [srv.client.post("/v1/completions", json=_body(ids)).json()["choices"][0]["token_ids"]
            for ids in prompts]
    assert solo == want
    together = _together(srv, [_body(ids) for ids in prompts])
    assert [r["choices"][0]["token_ids"] for r in together] == want

