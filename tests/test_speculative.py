"""Speculative decoding end to end on the CPU backend (issue 16, n-gram drafts).

One compile of the tiny Qwen3 with `--spec ngram --max-draft-tokens 4` serves both sides:
the server started with `--spec none` decodes plainly, the default serves what was
compiled. Greedy outputs must be the same token for token at every batch size from 1 to
the compiled concurrency, with prompts that invite n-gram matches (copying), and the
acceptance shows in `timings` and in vLLM's `spec_decode_*` metrics. The engine's own
cases (oracle and random drafts, preemption, cancellation inside a verify step, a soak)
run against the fake model in tests/native/test_speculate.cpp.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import MAX_CONTEXT, PREFILL_CHUNK, TEST_MODELS, CompiledModel, compile_once
from ninfer.bench.common import parse_metrics

CONCURRENCY = 4
DRAFTS = 4


@pytest.fixture(scope="module")
def spec_model(qwen3_model: CompiledModel) -> CompiledModel:
    from ninfer.pipeline import CompileOptions

    out = TEST_MODELS / "qwen3-tiny-spec-cpu"
    compile_once(CompileOptions(model_dir=qwen3_model.checkpoint, target="cpu", out_dir=out,
                                model_id="qwen3-tiny", max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, max_concurrency=CONCURRENCY,
                                kv_dtype="f32", spec="ngram", max_draft_tokens=DRAFTS,
                                python_module=False))
    return CompiledModel("qwen3-tiny-spec", qwen3_model.checkpoint, out,
                         qwen3_model.eos_token_ids)


def _prompts(model: CompiledModel) -> list[str]:
    """Texts that repeat themselves, as code edits and summaries of given text do."""
    tok = model.hf_tokenizer()
    words = [tok.decode([i]).strip() for i in range(40, 400, 7)]
    words = [w for w in words if w.isalpha()][:24]
    out = []
    for i in range(2 * CONCURRENCY):
        chunk = " ".join(words[i:i + 6 + i % 5])
        out.append(f"{chunk}. {chunk}. {chunk}." + (" Again:" if i % 2 else ""))
    return out


def _complete(srv: Any, prompt: str, **extra: Any) -> dict[str, Any]:
    r = srv.client.post("/v1/completions", json={
        "model": "qwen3-tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0,
        "return_token_ids": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _batch(srv: Any, prompts: list[str], n: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda p: _complete(srv, p), prompts))


def test_greedy_outputs_are_the_same_with_and_without_drafts(spec_model):
    from ninfer.runtime import Server

    prompts = _prompts(spec_model)
    with Server(spec_model.out_dir, threads=2, extra_args=("--spec", "none")) as srv:
        plain = [_complete(srv, p) for p in prompts]
        assert "draft_n" not in plain[0]["timings"]  # no speculation, no draft counts
    drafted = accepted = 0
    with Server(spec_model.out_dir, threads=2) as srv:
        for n in range(1, CONCURRENCY + 1):
            got = _batch(srv, prompts, n)
            for p, a, b in zip(prompts, plain, got, strict=True):
                assert b["choices"][0]["token_ids"] == a["choices"][0]["token_ids"], (n, p)
                assert b["choices"][0]["text"] == a["choices"][0]["text"]
                t = b["timings"]
                assert 0 <= t["draft_accepted_n"] <= t["draft_n"]
                drafted += t["draft_n"]
                accepted += t["draft_accepted_n"]
        metrics = parse_metrics(srv.client.get("/metrics").text)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert metrics.value("ninfer:spec_decode_num_draft_tokens_total") == drafted
    assert metrics.value("ninfer:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [metrics.value("ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                             position=str(i)) for i in range(DRAFTS)]
    # a proposal accepts at position 0 at most once
    assert sum(per_pos) == accepted
    assert per_pos[0] <= metrics.value("ninfer:spec_decode_num_drafts_total")
    assert metrics.value("ninfer:kv_blocks_used") == 0


def test_seeded_sampled_requests_give_the_tokens_of_plain_decoding(spec_model):
    """A draft proposed with certainty is decided by the position's own draw (rejection
    sampling against a point mass; its distribution is checked in test_speculate.cpp), so
    a seeded request samples the same tokens with drafts as without, alone or batched."""
    from ninfer.runtime import Server

    prompts = _prompts(spec_model)[:CONCURRENCY]
    body = {"temperature": 0.8, "top_p": 0.9, "top_k": 30, "frequency_penalty": 0.2,
            "ignore_eos": True}

    def run(srv: Any, n: int) -> list[list[int]]:
        with ThreadPoolExecutor(n) as pool:
            out = list(pool.map(lambda ip: _complete(srv, ip[1], seed=ip[0], **body),
                                enumerate(prompts)))
        return [r["choices"][0]["token_ids"] for r in out]

    with Server(spec_model.out_dir, threads=2, extra_args=("--spec", "none")) as srv:
        plain = run(srv, 1)
    with Server(spec_model.out_dir, threads=2) as srv:
        for n in (1, CONCURRENCY):
            assert run(srv, n) == plain, n
    assert all(len(t) == 40 for t in plain)


@pytest.mark.parametrize(("args", "message"), [
    (("--draft-tokens", "5"), "--draft-tokens 5 exceeds the compiled maximum 4; recompile with "
                              "--max-draft-tokens 5"),
    (("--spec", "mtp"), "--spec mtp: the model was compiled for --spec ngram"),
    (("--spec", "none", "--draft-tokens", "2"), "--draft-tokens needs speculative decoding: "
                                                 "--spec none turned it off"),
    (("--ngram-min", "5", "--ngram-max", "3"), "--ngram-min 5 exceeds --ngram-max 3"),
])
def test_speculation_flags_are_checked(spec_model, args, message):
    r = subprocess.run([str(spec_model.server), "--port", "0", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_model_compiled_without_speculation_refuses_it(qwen3_model):
    r = subprocess.run([str(qwen3_model.server), "--port", "0", "--spec", "ngram"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert ("--spec ngram: the model was compiled without speculative decoding; recompile "
            "with ninfer-compile --spec ngram") in r.stderr


def test_the_compile_sizes_the_step_for_drafts(spec_model):
    src = (Path(spec_model.out_dir) / "src" / "model.cpp").read_text()
    # 4 sequences x (1 + 4 drafts) = 20 logits rows, capped by the 16-row step
    assert "constexpr int kMaxLogitRows = 16;" in src
    assert '"ngram", /*max_draft_tokens=*/4' in src


def test_soak_with_drafts_answers_everything_and_leaks_nothing(spec_model, tmp_path):
    """The crash shape of the report, on the CPU: concurrent streams decoding with drafts,
    mixed lengths, a quarter of the clients hanging up mid-stream; every answer checked,
    the server drains, no KV block left, RSS flat (ninfer-bench soak). The long run is for
    a lent GPU."""
    import json

    from click.testing import CliRunner

    from ninfer.bench.cli import main as bench_main

    out = tmp_path / "soak.json"
    r = CliRunner().invoke(bench_main, [
        "soak", str(spec_model.out_dir), "--requests", "40", "--concurrency", str(CONCURRENCY),
        "--disconnect-rate", "0.25", "--max-tokens-range", "1,40",
        "--prompt-len-range", "1,100", "--seed", "5", "--threads", "2",
        "--vocab-size", "12", "--server-arg=--ngram-min", "--server-arg=1",  # many matches
        "--json", str(out)])
    res = json.loads(out.read_text()) if out.exists() else {}
    assert r.exit_code == 0, r.output
    assert res["failed"] == 0 and res["failures"] == []
    assert res["drained"] and res["kv_blocks_used"] == 0
    assert res["completed"] + res["disconnected"] == 40
    assert res["rss_flat"] is True
    assert res["draft_tokens"] > 0 and 0 < res["accepted_tokens"] <= res["draft_tokens"]
