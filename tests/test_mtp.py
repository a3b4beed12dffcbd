"""MTP speculative decoding on the CPU backend (issue 16): a tiny Qwen3.5 whose checkpoint
holds a multi-token-prediction head (`mtp.*`, as the released Qwen3.5 / Qwen3-Next
checkpoints do), compiled with `--spec mtp --max-draft-tokens 3`.

The head's drafts through the compiled program equal the float64 reference's
(kernels.gdn_reference.mtp_drafts) for two sequences in one step, and again one step
later, when the head reads the keys/values its earlier pass left and its chained rows of
that pass were overwritten; the server gives the same greedy tokens with drafts on and
off at every batch size, and counts what it drafted.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from conftest import (
    MAX_CONTEXT,
    PREFILL_CHUNK,
    TEST_MODELS,
    CompiledModel,
    checkpoint,
    clean_soak,
    compile_once,
)
from ninfer.runtime.client import parse_metrics

CONCURRENCY = 4
DRAFTS = 3


@pytest.fixture(scope="module")
def mtp_model() -> CompiledModel:
    from ninfer.pipeline import CompileOptions

    ckpt, eos = checkpoint("qwen35mtp-tiny")
    out = TEST_MODELS / "qwen35mtp-tiny-spec-cpu"
    compile_once(CompileOptions(model_dir=ckpt, target="cpu", out_dir=out,
                                model_id="qwen35mtp-tiny", max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, max_concurrency=CONCURRENCY,
                                kv_dtype="f32", spec="mtp", max_draft_tokens=DRAFTS))
    return CompiledModel("qwen35mtp-tiny", ckpt, out, eos)


def _reference(model: CompiledModel) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    cfg = json.loads((model.checkpoint / "config.json").read_text())
    cfg = {**cfg, **cfg.get("text_config", {})}
    weights = {k.removeprefix("model."): v
               for k, v in load_file(model.checkpoint / "model.safetensors").items()}
    return cfg, weights


def test_drafts_are_the_float64_heads_and_the_head_keeps_its_keys(mtp_model):
    from ninfer.kernels import gdn_reference as gdn
    from ninfer.runtime.engine import load_engine

    cfg, weights = _reference(mtp_model)
    eng = load_engine(mtp_model.out_dir, threads=2)
    info = eng.info()
    assert (info["spec"], info["max_draft_tokens"]) == ("mtp", DRAFTS)
    conc, bps = info["max_concurrency"], info["blocks_per_seq"]
    tables = [0] * (conc * bps)
    for s in range(2):  # slots 0 and 1, blocks of their own
        for j in range(bps):
            tables[s * bps + j] = 1 + s * bps + j
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, cfg["vocab_size"], n).tolist() for n in (9, 6)]
    counts = [3, 2]

    # step 1: both prompts in one step; each row's next token is the prompt's next, the
    # sampled one for its last row
    a, b = (len(p) for p in prompts)  # one step of PREFILL_CHUNK rows holds both
    tokens = prompts[0] + prompts[1]
    positions = [*range(a), *range(b)]
    slots = [0] * a + [1] * b
    last = [a - 1, a + b - 1]
    logits = eng.step(tokens, positions, slots, tables, last)
    firsts = [int(np.argmax(row)) for row in logits]
    nxt = [*prompts[0][1:], firsts[0], *prompts[1][1:], firsts[1]]
    drafts = eng.draft(nxt, last, counts, tables)
    for ids, first, got, k in zip(prompts, firsts, drafts, counts, strict=True):
        want_first, want = gdn.mtp_drafts(cfg, weights, np.array(ids), k)
        assert (first, got) == (want_first, want)

    # step 2: each sequence's first token; the head's rows now pair it with the next
    logits = eng.step(firsts, [a, b], [0, 1], tables, [0, 1])
    seconds = [int(np.argmax(row)) for row in logits]
    drafts = eng.draft(seconds, [0, 1], [3, 3], tables)
    for ids, first, second, got in zip(prompts, firsts, seconds, drafts, strict=True):
        want_second, want = gdn.mtp_drafts(cfg, weights, np.array([*ids, first]), 3)
        assert (second, got) == (want_second, want)

    # a row without a next token cannot draft
    with pytest.raises(Exception, match="which has no next token"):
        eng.draft([-1, seconds[1]], [0], [1], tables)


def test_draft_needs_the_blocks_of_its_chain(mtp_model):
    from ninfer.runtime.engine import load_engine

    eng = load_engine(mtp_model.out_dir, threads=2)
    info = eng.info()
    bs = info["max_context"] // info["blocks_per_seq"]
    tables = [0] * (info["max_concurrency"] * info["blocks_per_seq"])
    tables[0] = 1  # one block: positions 0 .. bs - 1
    ids = list(range(3, 3 + bs))
    eng.step(ids, list(range(bs)), [0] * bs, tables, [bs - 1])
    with pytest.raises(Exception, match=f"no block holds chain position {bs}"):
        eng.draft([*ids[1:], 5], [bs - 1], [2], tables)


def _complete(srv: Any, prompt: str, **extra: Any) -> dict[str, Any]:
    r = srv.client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": 40, "temperature": 0, "return_token_ids": True,
        **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_outputs_are_the_same_with_and_without_mtp_drafts(mtp_model):
    from ninfer.runtime import Server

    tok = mtp_model.hf_tokenizer()
    words = [tok.decode([i]).strip() for i in range(40, 400, 7)]
    words = [w for w in words if w.isalpha()][:24]
    prompts = [" ".join(words[i:i + 4 + 3 * i]) for i in range(2 * CONCURRENCY)]
    with Server(mtp_model.out_dir, threads=2, extra_args=("--spec", "none")) as srv:
        plain = [_complete(srv, p) for p in prompts]
    drafted = 0
    with Server(mtp_model.out_dir, threads=2) as srv:
        for n in range(1, CONCURRENCY + 1):
            with ThreadPoolExecutor(n) as pool:
                got = list(pool.map(lambda p: _complete(srv, p), prompts))
            for p, a, b in zip(prompts, plain, got, strict=True):
                assert b["choices"][0]["token_ids"] == a["choices"][0]["token_ids"], (n, p)
                assert 0 <= b["timings"]["draft_accepted_n"] <= b["timings"]["draft_n"]
                drafted += b["timings"]["draft_n"]
        metrics = parse_metrics(srv.client.get("/metrics").text)
        assert metrics.value("ninfer:kv_cache_usage_perc") == 0  # no block left behind
    assert drafted > 0
    assert metrics.value("ninfer:spec_decode_num_draft_tokens_total") == drafted


def test_soak_with_mtp_drafts_answers_everything_and_leaks_nothing(mtp_model, tmp_path):
    """Concurrent streams with MTP drafts, prompts of 1-100 tokens (several prefill
    chunks, each filling the head's keys/values), a quarter of the clients hanging up
    mid-stream: every answer checked, the server drains, no KV block left (the chains'
    lookahead blocks included), RSS flat (ninfer-bench soak)."""
    res = clean_soak(mtp_model.out_dir, tmp_path, 40, "--concurrency", str(CONCURRENCY),
                     "--disconnect-rate", "0.25", "--max-tokens-range", "1,40",
                     "--prompt-len-range", "1,100", "--seed", "6", "--threads", "2")
    assert res["draft_tokens"] > 0 and res["accepted_tokens"] <= res["draft_tokens"]


def test_ngram_flags_are_refused_with_mtp_drafts(mtp_model):
    import subprocess

    r = subprocess.run([str(mtp_model.server), "--port", "0", "--ngram-min", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--ngram-min/--ngram-max size the prompt lookup of --spec ngram; this model " \
           "drafts with --spec mtp" in " ".join(r.stderr.split())


def test_artifact_alone_is_the_compiles(mtp_model, tmp_path):
    """write_model_artifact (stage 6 alone: how scripts/gpu_check.sh rewrites the artifacts
    on a GPU machine) writes an MTP build's artifact byte for byte, its head included (it
    read the checkpoint without its head, and the plan refused it), and its build digest
    names the kernels this host's compile chose (one gemv stream on some hosts: it did
    not, until session 30)."""
    from ninfer.pipeline import CompileOptions, write_model_artifact

    opts = CompileOptions(model_dir=mtp_model.checkpoint, target="cpu", out_dir=tmp_path,
                          model_id="qwen35mtp-tiny", max_context=MAX_CONTEXT,
                          prefill_chunk=PREFILL_CHUNK, max_concurrency=CONCURRENCY,
                          kv_dtype="f32", spec="mtp", max_draft_tokens=DRAFTS)
    artifact = write_model_artifact(opts, tmp_path / "model.ninfer")
    assert artifact.read_bytes() == (mtp_model.out_dir / "model.ninfer").read_bytes()
