"""Quantized weights and KV caches end to end: the tiny Qwen3 compiled with --weights
q8g32 / q4g64 (and f16), or with --kv-dtype fp8 / int8 / int4, serves, and its drift from
the f32 build is bounded, measured teacher-forced
by the accuracy report over a fixed text set (the random tiny model's next-token
distributions are nearly flat, so top-1 agreement is a weak signal for q4 and KL is the
bound that matters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TEST_MODELS
from ninfer.runtime import Server

pytestmark = pytest.mark.e2e

# format -> (least top-1 agreement, largest mean KL in nats) against f32; measured on
# 254 positions: q8g32 0.90 / 4e-4, q4g64 0.5 / 5e-2, kv:fp8 0.92 / 1.1e-3, kv:int8
# 0.98 / 5e-5, kv:int4 0.69 / 1.5e-2
BOUNDS = {"f16": (0.99, 1e-5), "q8g32": (0.85, 2e-3), "q4g64": (0.3, 0.15),
          "kv:fp8": (0.85, 4e-3), "kv:int8": (0.95, 3e-4), "kv:int4": (0.5, 0.05)}


@pytest.fixture(scope="module")
def accuracy(qwen3_model):
    from ninfer.bench.accuracy import run_accuracy

    rows = run_accuracy(qwen3_model.checkpoint, list(BOUNDS), TEST_MODELS / "accuracy",
                        tokens=256, threads=2)
    return {r.format: r for r in rows}


@pytest.mark.parametrize("fmt", sorted(BOUNDS))
def test_drift_from_f32_is_bounded(accuracy, fmt):
    top1, kl = BOUNDS[fmt]
    r = accuracy[fmt]
    assert r.positions >= 200
    assert r.top1_agreement >= top1, r
    assert r.mean_kl <= kl, r
    assert abs(r.perplexity_delta) < 0.05, r


def test_quantized_build_is_smaller_and_serves(accuracy, qwen3_model):
    import json

    f32 = TEST_MODELS / "accuracy" / f"acc-{qwen3_model.checkpoint.name}-f32"
    q4 = TEST_MODELS / "accuracy" / f"acc-{qwen3_model.checkpoint.name}-q4g64"
    plans = [json.loads((d / "compile_report.json").read_text())["plan"] for d in (f32, q4)]
    assert plans[1]["weights"]["q"] == "q4g64"
    assert plans[1]["memory"]["weights_bytes"] < plans[0]["memory"]["weights_bytes"] / 2
    assert (q4 / "model.ninfer").stat().st_size < (f32 / "model.ninfer").stat().st_size
    with Server(q4) as srv:
        r = srv.client.post("/v1/completions", json={
            "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["token_ids"]) == 16


def test_quantized_kv_build_plans_its_bytes_and_serves(accuracy, qwen3_model):
    import json

    root = TEST_MODELS / "accuracy" / f"acc-{qwen3_model.checkpoint.name}"
    kv = {f: json.loads(Path(f"{root}-kv-{f}", "compile_report.json").read_text())["plan"]["kv"]
          for f in ("int8", "int4")}
    f32 = json.loads(Path(f"{root}-f32", "compile_report.json").read_text())["plan"]["kv"]
    assert (kv["int8"]["dtype"], kv["int4"]["dtype"]) == ("int8", "int4")
    assert f32["bytes_per_token"] / kv["int8"]["bytes_per_token"] == pytest.approx(64 / 17)
    assert f32["bytes_per_token"] / kv["int4"]["bytes_per_token"] == pytest.approx(64 / 9)
    with Server(Path(f"{root}-kv-int4")) as srv:
        r = srv.client.post("/v1/completions", json={
            "prompt": "The quick brown fox", "max_tokens": 40, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["token_ids"]) == 40
