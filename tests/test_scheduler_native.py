"""Continuous batching without a compiled model.

The test_engine binary (tests/native/test_*.cpp) drives KV block accounting, step
planning and the engine loop (batch invariance, preemption, cancellation, admission
control, the decode-slowdown cap, stop strings), the sampler, /metrics text and the
request log against a fake paged model (tests/native/fake_model.h) whose steps are gated
and timed by a fake clock, so no case depends on how fast the machine is. Built through
tests/native/CMakeLists.txt (tests/native_build.py). tests/test_fake_server.py puts the
same fake model behind the real server.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import native_build


@pytest.fixture(scope="session")
def test_engine() -> Path:
    return native_build.build("test_engine") / "test_engine"


def _run(binary: Path, *args: str) -> str:
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout


# ---------------------------------------------------------------------------------------
# Engine and scheduler against the fake model


def test_device_sampling_path() -> None:
    """The engine sampling on the device (Model::samples_on_device) through the CUDA
    sampler's exact source under emulation: greedy rows equal the host's with every logits
    processor and constraint, logprobs within 1e-5, seeds repeat, masks hold."""
    binary = native_build.build("test_device_sampling") / "test_device_sampling"
    assert "device sampling ok" in _run(binary)


@pytest.mark.parametrize("case", ["scheduler", "invariance", "cancel", "admission", "sampling",
                                  "slowdown", "stops", "fork", "token_controls", "processors",
                                  "speculate", "prefix"])
def test_native(test_engine: Path, case: str) -> None:
    assert f"{case} ok" in _run(test_engine, case)


def test_cpu_feature_check(test_engine: Path) -> None:
    """The CPU server's start check (runtime_cpp/backend/cpu/cpu_features.h) sees the
    vector features Linux lists for this CPU, and refuses a name it does not know, naming
    what is missing."""
    from ninfer.kernels.cpu.common import CPUINFO_FEATURES, host_flags

    flags = host_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo to compare with")
    names = [*CPUINFO_FEATURES.values(), "no_such_feature"]
    lines = _run(test_engine, "cpu_features", *names).splitlines()
    got = dict(line.split() for line in lines[:-1])
    want = {feat: str(int(flag in flags)) for flag, feat in CPUINFO_FEATURES.items()}
    assert got == {**want, "no_such_feature": "0"}
    missing = [n for n in names if got[n] == "0"]
    assert lines[-1] == (f"refusal: this server's kernels were compiled for a CPU with "
                         f"{', '.join(names)}; this CPU lacks {', '.join(missing)}: compile "
                         "the model on this machine (ninfer-compile --target cpu)")
    present = [n for n in names if got[n] == "1"]
    assert present and _run(test_engine, "cpu_features", *present).splitlines()[-1] == "refusal: "


FAMILIES = {  # family name (as prometheus_client reports it) -> type
    "ninfer:num_requests_running": "gauge",
    "ninfer:num_requests_waiting": "gauge",
    "ninfer:kv_blocks_used": "gauge",
    "ninfer:kv_blocks_total": "gauge",
    "ninfer:kv_cache_usage_perc": "gauge",
    "ninfer:prompt_tokens": "counter",
    "ninfer:generation_tokens": "counter",
    "ninfer:num_preemptions": "counter",
    "ninfer:request_success": "counter",
    "ninfer:requests_rejected": "counter",
    "ninfer:requests_cancelled": "counter",
    "ninfer:time_to_first_token_seconds": "histogram",
    "ninfer:inter_token_latency_seconds": "histogram",
    "ninfer:e2e_request_latency_seconds": "histogram",
    "ninfer:request_queue_time_seconds": "histogram",
    "ninfer:request_prefill_time_seconds": "histogram",
    "ninfer:request_decode_time_seconds": "histogram",
    "ninfer:iteration_tokens_total": "histogram",
    "ninfer:iteration_sequences": "histogram",
    # prefix caching (on by default)
    "ninfer:prefix_cache_queries": "counter",
    "ninfer:prefix_cache_hits": "counter",
    "ninfer:prefix_cache_blocks": "gauge",
    "ninfer:prefix_cache_evictions": "counter",
}


def _parse_metrics(text: str) -> dict[str, Any]:
    parser = pytest.importorskip("prometheus_client.parser")
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _sample(families: dict[str, Any], sample: str, **labels: str) -> float:
    return next(s.value for f in families.values() for s in f.samples
                if s.name == sample and s.labels == labels)


def test_metrics_parse_with_prometheus_client(test_engine: Path) -> None:
    families = _parse_metrics(_run(test_engine, "metrics"))
    assert {name: f.type for name, f in families.items()} == FAMILIES
    assert _sample(families, "ninfer:generation_tokens_total") > 0
    assert _sample(families, "ninfer:prompt_tokens_total") > 0
    assert _sample(families, "ninfer:kv_blocks_total") == 20
    assert _sample(families, "ninfer:kv_blocks_used") == 0
    hits = _sample(families, "ninfer:prefix_cache_hits_total")
    assert 0 <= hits <= _sample(families, "ninfer:prefix_cache_queries_total")
    assert _sample(families, "ninfer:requests_rejected_total", reason="context_length") == 1
    assert {s.labels["reason"] for s in families["ninfer:requests_rejected"].samples} == {
        "queue_full", "context_length", "kv_capacity", "pending_timeout"}
    assert sum(s.value for s in families["ninfer:request_success"].samples) == 14
    for name, f in families.items():
        if f.type != "histogram":
            continue
        buckets = [s for s in f.samples if s.name == f"{name}_bucket"]
        counts = [s.value for s in buckets]
        assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
        assert counts[-1] == _sample(families, f"{name}_count")
    for name in ("ninfer:e2e_request_latency_seconds", "ninfer:time_to_first_token_seconds"):
        assert _sample(families, f"{name}_count") == 14


def test_request_log_json_lines(test_engine: Path, tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    _run(test_engine, "log", str(path))
    by_id: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert {"event", "id", "time", "prompt_tokens", "max_tokens"} <= rec.keys()
        by_id.setdefault(rec["id"], []).append(rec)
    assert [r["event"] for r in by_id["done-1"]] == ["start", "done"]
    done = by_id["done-1"][1]
    assert done["finish_reason"] == "length" and done["generated_tokens"] == 5
    for key in ("queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "e2e_ms"):
        assert done[key] >= 0, key
    assert done["ttft_ms"] <= done["e2e_ms"]
    [too_long] = by_id["too-long"]
    assert too_long["event"] == "rejected" and too_long["reason"] == "context_length"
    assert "64" in too_long["error"]
    assert by_id["full-1"][0]["reason"] == "queue_full"
    assert [r["event"] for r in by_id["cancel-1"]] == ["start", "cancelled"]
    assert by_id["wait-1"][-1]["event"] == "cancelled"
    assert by_id["error-1"][-1]["event"] == "error"
    assert "device lost" in by_id["error-1"][-1]["error"]
