"""Continuous batching without a compiled model.

tests/native/test_engine.cpp drives KV block accounting, step planning and the engine
loop (batch invariance, preemption, cancellation, admission control), /metrics text and
the request log against a fake paged model (tests/native/fake_model.h). The same fake
model behind the real server (runtime_cpp/server/, tests/native/fake_server_model.cpp)
checks the HTTP side: 429 / 503 / 400 statuses, cancellation when a client disconnects,
/metrics. Both are built through tests/native/CMakeLists.txt (tests/native_build.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
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


@pytest.mark.parametrize("case", ["scheduler", "invariance", "cancel", "admission", "sampling",
                                  "slowdown"])
def test_native(test_engine: Path, case: str) -> None:
    assert f"{case} ok" in _run(test_engine, case)


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


# ---------------------------------------------------------------------------------------
# ninfer-server over HTTP, with the fake model (context 64, 4 slots, 16 rows per step)


def _letters_tokenizer() -> dict[str, Any]:
    vocab = {chr(ord("a") + i): i for i in range(26)}
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"id": 26, "content": "<eos>", "special": True}]}


@pytest.fixture(scope="session")
def fake_server() -> Path:
    from ninfer.artifact import write_artifact

    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    manifest = {
        "model": {"id": "fake"},
        "target": {"name": "fake", "hash": "0"},
        "tokenizer": _letters_tokenizer(),
        "chat_format": {"version": 1, "prefix": "",
                        "roles": {"user": {"before": "", "after": ""},
                                  "assistant": {"before": "", "after": ""}},
                        "generation_prompt": ""},
        "eos_token_ids": [26],
    }
    write_artifact(binary.parent / "model.ninfer", manifest, [])
    return binary


@pytest.fixture
def serve(fake_server: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    from ninfer.runtime import Server

    started: list[Any] = []

    def start(*args: str, step_ms: int = 10) -> Any:
        monkeypatch.setenv("NINFER_FAKE_STEP_MS", str(step_ms))
        srv = Server(fake_server, extra_args=args, startup_timeout=30).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.alive(), "\n".join(srv.output)  # no CHECK in the fake model failed
        srv.stop()


def _metrics(srv: Any) -> dict[str, Any]:
    return _parse_metrics(srv.client.get("/metrics").text)


def _wait_for(srv: Any, cond: Callable[[dict[str, Any]], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(srv)
        if cond(m):
            return
        assert time.monotonic() < deadline, {n: [(s.labels, s.value) for s in f.samples]
                                            for n, f in m.items() if f.type != "histogram"}
        time.sleep(0.02)


def _idle(m: dict[str, Any]) -> bool:
    return (_sample(m, "ninfer:num_requests_running") == 0
            and _sample(m, "ninfer:num_requests_waiting") == 0
            and _sample(m, "ninfer:kv_blocks_used") == 0)


def _post_in_background(srv: Any, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def go() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=60) as c:
            out.append(c.post("/v1/completions", json=body))

    t = threading.Thread(target=go)
    t.start()
    return t, out


def _raw_request(srv: Any, body: dict[str, Any]) -> socket.socket:
    """Sends a completion request on a raw socket (so the test decides when to hang up)."""
    host, port = srv.base_url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


LONG = {"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": True, "temperature": 0}


def test_fake_server_serves_and_exports_metrics(serve: Callable[..., Any]) -> None:
    srv = serve(step_ms=0)
    body = {"prompt": "hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = srv.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert r.json()["usage"]["completion_tokens"] == 8
    with srv.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        chunks = [json.loads(line[5:]) for line in s.iter_lines()
                  if line.startswith("data:") and "[DONE]" not in line]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert any("concurrent requests" in line for line in srv.output)
    m = _metrics(srv)
    assert set(m) == set(FAMILIES)
    assert _sample(m, "ninfer:request_success_total", finished_reason="length") == 2
    assert _sample(m, "ninfer:generation_tokens_total") == 16


def test_too_long_is_400_with_the_numbers(serve: Callable[..., Any]) -> None:
    srv = serve()
    r = srv.client.post("/v1/completions", json={"prompt": [1] * 70})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = srv.client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 60})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens"
    assert all(str(n) in err["message"] for n in (64, 70, 10, 60))


def test_full_queue_is_429_with_retry_after(serve: Callable[..., Any]) -> None:
    srv = serve("--max-concurrency", "1", "--max-pending-requests", "1")
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_running") == 1)
    tb, rb = _post_in_background(srv, LONG)
    _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_waiting") == 1)
    r = srv.client.post("/v1/completions", json=LONG)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "queue_full"
    ta.join()
    tb.join()
    assert ra[0].status_code == rb[0].status_code == 200
    m = _metrics(srv)
    assert _sample(m, "ninfer:requests_rejected_total", reason="queue_full") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_pending_timeout_is_503(serve: Callable[..., Any], stream: bool) -> None:
    srv = serve("--max-concurrency", "1", "--pending-timeout-ms", "150")
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_running") == 1)
    r = srv.client.post("/v1/completions", json={**LONG, "stream": stream})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "pending_timeout"
    ta.join()
    assert ra[0].status_code == 200
    assert _sample(_metrics(srv), "ninfer:requests_rejected_total", reason="pending_timeout") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_cancels_and_frees_blocks(serve: Callable[..., Any], stream: bool) -> None:
    srv = serve(step_ms=20)
    s = _raw_request(srv, {**LONG, "stream": stream})
    if stream:
        received = b""
        while b"data:" not in received:  # streaming has begun
            chunk = s.recv(4096)
            assert chunk, received
            received += chunk
    else:
        _wait_for(srv, lambda m: _sample(m, "ninfer:generation_tokens_total") >= 2)
    s.close()
    _wait_for(srv, lambda m: _sample(m, "ninfer:requests_cancelled_total") == 1 and _idle(m),
              timeout=2)
    # Stopped early: 60 tokens at 20 ms a step would take 1.2 s.
    assert _sample(_metrics(srv), "ninfer:generation_tokens_total") < 30
    assert srv.client.post("/v1/completions", json={**LONG, "max_tokens": 2}).status_code == 200


def test_disconnect_while_queued_never_runs(serve: Callable[..., Any], tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    srv = serve("--max-concurrency", "1", "--request-log", str(log))
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_running") == 1)
    s = _raw_request(srv, LONG)
    _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_waiting") == 1)
    s.close()
    _wait_for(srv, lambda m: _sample(m, "ninfer:requests_cancelled_total") == 1)
    ta.join()
    assert ra[0].status_code == 200
    _wait_for(srv, _idle)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    by_id: dict[str, list[str]] = {}
    for e in events:
        by_id.setdefault(e["id"], []).append(e["event"])
    assert sorted(by_id.values()) == [["cancelled"], ["start", "done"]]
    assert all(i.startswith("cmpl-") for i in by_id)


def test_sigterm_ends_requests_with_503_and_exits_cleanly(fake_server: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM: the running and the waiting request both end at once with 503
    shutting_down, and the server exits 0 (not killed by the signal)."""
    import signal

    from ninfer.runtime import Server

    monkeypatch.setenv("NINFER_FAKE_STEP_MS", "100")  # LONG alone would take 6 s
    srv = Server(fake_server, extra_args=("--max-concurrency", "1"), startup_timeout=30).start()
    try:
        ta, ra = _post_in_background(srv, LONG)
        _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_running") == 1)
        tb, rb = _post_in_background(srv, LONG)
        _wait_for(srv, lambda m: _sample(m, "ninfer:num_requests_waiting") == 1)
        srv.client.close()  # an idle keep-alive connection holds its HTTP thread up to 5 s
        t0 = time.monotonic()
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        ta.join(5)
        tb.join(5)
        assert time.monotonic() - t0 < 2
        for r in (ra[0], rb[0]):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "shutting_down"
        assert srv.proc.wait(3) == 0
        assert any("SIGTERM, stopping" in line for line in srv.output)
    finally:
        srv.stop()
