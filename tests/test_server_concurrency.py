"""Continuous batching on a real compiled model (the tiny Qwen3 on the CPU backend).

Requests that arrive together are batched into the same steps (checked from the request
log: their running intervals overlap) and each gets exactly the tokens it gets alone;
/metrics counts exactly the tokens served. The HTTP statuses of admission control and
cancellation on disconnect are tested deterministically against a fake model in
test_scheduler_native.py.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ninfer.runtime import Server

pytestmark = pytest.mark.e2e

CHUNK = 8  # step budget: the 20/45/90-token prompts take several steps each


@pytest.fixture(scope="module")
def batching(qwen3_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("batching") / "requests.jsonl"
    args = ("--prefill-chunk", str(CHUNK), "--max-concurrency", "4", "--request-log", str(log))
    with Server(qwen3_model.out_dir, threads=2, extra_args=args) as srv:
        yield srv, log


def _metrics(srv) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(srv.client.get("/metrics").text):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


def _greedy(srv, ids: list[int]) -> dict:
    r = srv.client.post("/v1/completions", json={
        "prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_concurrent_requests_all_answered_and_equal_to_solo(qwen3_server):
    c = qwen3_server.client
    bodies = [{"prompt": f"Request number {i}:", "max_tokens": 12, "temperature": 0,
               "ignore_eos": True} for i in range(4)]
    solo = [c.post("/v1/completions", json=b).json()["choices"][0]["text"] for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: c.post("/v1/completions", json=b), bodies))
    assert [r.status_code for r in results] == [200] * 4
    assert [r.json()["choices"][0]["text"] for r in results] == solo


def test_four_mixed_streams_are_batched_and_equal_to_solo(batching):
    srv, log = batching
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 2000, n).tolist() for n in (3, 20, 45, 90)]
    solo = [_greedy(srv, ids)["choices"][0]["token_ids"] for ids in prompts]
    overlapped = 0
    for _ in range(5):
        before = len(log.read_text().splitlines())
        m0 = _metrics(srv)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda ids: _greedy(srv, ids), prompts))
        assert [r["choices"][0]["token_ids"] for r in results] == solo
        m1 = _metrics(srv)
        served_prompt = m1["ninfer:prompt_tokens_total"] - m0["ninfer:prompt_tokens_total"]
        served_gen = m1["ninfer:generation_tokens_total"] - m0["ninfer:generation_tokens_total"]
        assert served_prompt == sum(map(len, prompts))
        assert served_gen == 4 * 24
        # Running intervals (admission .. done) from the request log.
        events = [json.loads(line) for line in log.read_text().splitlines()[before:]]
        start = {e["id"]: e["time"] for e in events if e["event"] == "start"}
        done = {e["id"]: e["time"] for e in events if e["event"] == "done"}
        assert set(start) == set(done) and len(start) == 4
        ids = sorted(start, key=start.get)
        overlapped += sum(start[b] < done[a] for a, b in itertools.pairwise(ids))
        if overlapped:
            break
    assert overlapped, "the four requests never ran at the same time"
    m = _metrics(srv)
    assert m["ninfer:kv_blocks_used"] == 0
    assert m["ninfer:num_requests_running"] == 0


def test_prompt_longer_than_the_step_budget_is_prefilled_in_chunks(batching):
    srv, _ = batching
    ids = list(range(7, 7 + 5 * CHUNK + 3))
    before = _metrics(srv)
    _greedy(srv, ids)
    after = _metrics(srv)
    steps = after["ninfer:iteration_tokens_total_count"] - before[
        "ninfer:iteration_tokens_total_count"]
    assert steps >= -(-len(ids) // CHUNK) + 23  # prefill chunks + one step per later token
