"""Preemption and recompute on real compiled models (the tiny Qwen3 and the tiny hybrid
Qwen3.5, CPU backend).

The KV pool holds one request at full length (128 tokens in 8 blocks of 16), and four
requests that each grow to 118 tokens run at once: the pool runs dry while they decode,
so the scheduler must preempt the youngest, free its blocks and later recompute it from
its prompt and the tokens it had generated. Each request must still get exactly the
tokens it gets alone, with the compact f16 and int8 KV formats (whose stored values a
recompute writes again).

The four requests reach the server while it is stopped (SIGSTOP; the kernel queues the
connections), so they are all submitted within a millisecond of each other while any one
of them needs over a hundred steps: they overlap whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import read_response, send_completion
from ninfer.runtime import Server

pytestmark = pytest.mark.e2e

CONTEXT = 128
PROMPT_LENGTHS = (9, 12, 14, 17)
MAX_TOKENS = 101  # 17 + 101 - 1 = 117 positions: 8 blocks, the whole pool


@pytest.fixture(scope="module", params=[("qwen3_model", "f16"), ("qwen3_model", "int8"),
                                        ("qwen35_model", "f32")],
                ids=["qwen3-f16", "qwen3-int8", "qwen35-hybrid-f32"])
def small_pool_model(request: pytest.FixtureRequest) -> Path:
    """The tiny Qwen3 with compact KV formats, and the tiny hybrid Qwen3.5, whose
    preempted sequences must also rebuild their recurrent state from their tokens."""
    from conftest import TEST_MODELS
    from ninfer.pipeline import CompileOptions, compile_model

    fixture, kv = request.param
    model = request.getfixturevalue(fixture)
    out = TEST_MODELS / f"{model.name}-kv{kv}-pool128-cpu"
    compile_model(CompileOptions(model_dir=model.checkpoint, target="cpu", out_dir=out,
                                 model_id=model.name, max_context=CONTEXT,
                                 prefill_chunk=16, max_concurrency=4,
                                 kv_capacity=CONTEXT, kv_dtype=kv, python_module=False))
    return out


def _body(ids: list[int]) -> dict:
    return {"prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}


def test_preempted_requests_recompute_to_their_solo_tokens(small_pool_model: Path,
                                                           tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 2000, n).tolist() for n in PROMPT_LENGTHS]
    args = ("--max-concurrency", "4", "--request-log", str(log))
    with Server(small_pool_model, threads=2, extra_args=args) as srv:
        solo = []
        for ids in prompts:
            r = srv.client.post("/v1/completions", json=_body(ids))
            assert r.status_code == 200, r.text
            solo.append(r.json()["choices"][0]["token_ids"])
        assert all(len(t) == MAX_TOKENS for t in solo)
        assert srv.proc is not None
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            sockets = [send_completion(srv, _body(ids)) for ids in prompts]
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        together = [read_response(s)["choices"][0]["token_ids"] for s in sockets]
        # A reply is sent before the engine loop frees the request's blocks and publishes
        # the gauges: wait for the pool to drain (bounded only against a hang).
        deadline = time.monotonic() + 30
        while _gauge(metrics := srv.client.get("/metrics").text, "ninfer:kv_blocks_used"):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.01)

    assert together == solo
    done = [json.loads(line) for line in log.read_text().splitlines()]
    done = [e for e in done if e["event"] == "done"]
    assert len(done) == 2 * len(prompts)
    assert [e["preemptions"] for e in done[:len(prompts)]] == [0] * len(prompts)  # solo runs
    preempted = sum(e["preemptions"] for e in done[len(prompts):])
    assert preempted > 0, "four requests that each fill the pool never preempted each other"
    assert _gauge(metrics, "ninfer:num_preemptions_total") == preempted


def _gauge(metrics: str, name: str) -> float:
    return float(next(x for x in metrics.splitlines() if x.startswith(name + " ")).split()[-1])
