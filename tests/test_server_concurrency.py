"""Requests that arrive together are all answered, each as if it were alone.

(Cancellation on disconnect becomes observable with issue 4's /metrics and request
log; with the tiny test model a full abandoned generation takes milliseconds, so a
timing test here could not fail.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.e2e


def test_concurrent_requests_all_answered_and_equal_to_solo(qwen3_server):
    c = qwen3_server.client
    bodies = [{"prompt": f"Request number {i}:", "max_tokens": 12, "temperature": 0,
               "ignore_eos": True} for i in range(4)]
    solo = [c.post("/v1/completions", json=b).json()["choices"][0]["text"] for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: c.post("/v1/completions", json=b), bodies))
    assert [r.status_code for r in results] == [200] * 4
    assert [r.json()["choices"][0]["text"] for r in results] == solo
