"""ninfer-server over HTTP without a compiled model.

The real server (runtime_cpp/server/) runs over the fake paged model of
tests/native/fake_model.h (context 64, 4 slots, 16 rows per step): 429 / 503 / 400
statuses, cancellation when a client disconnects (also in the middle of a chunked
prefill), SIGTERM, stop strings in a stream, /metrics.

Nothing here depends on the machine's speed. Where a test needs a request to be at a
known point, the fake model's steps pass a gate (NINFER_FAKE_GATE, a FIFO: one byte per
step), so a request cannot finish on its own and cancellation or shutdown is the only way
it can end; timeouts are generous and only turn a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import native_build
from chat_suite import FAKE_TEMPLATE
from ninfer.frontend.chat_template import ChatTemplate, manifest_entry
from test_scheduler_native import FAMILIES, _parse_metrics, _sample

HANG = 60.0  # seconds: only a hang takes this long


def _letters_tokenizer() -> dict[str, Any]:
    vocab = {chr(ord("a") + i): i for i in range(26)}
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"id": 26, "content": "<eos>", "special": True}]}


MANIFEST = {
    "model": {"id": "fake"},
    "target": {"name": "fake", "hash": "0"},
    "tokenizer": _letters_tokenizer(),
    "chat_template": manifest_entry((ChatTemplate("default", FAKE_TEMPLATE),), {}),
    "eos_token_ids": [26],
}


def tool_use_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, str]:
    """The fake server's binary, an artifact whose "default" template is FAKE_TEMPLATE and
    whose "tool_use" one is the official Qwen3 template (from the cached corpus; a request
    with tools renders with it, as transformers' get_chat_template and vLLM pick it), and
    that template's source. The environment gives 1024 tokens of context and no step gate."""
    import real_world
    from ninfer.artifact import write_artifact

    real_world.models_dir()
    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    qwen3 = real_world.corpus_templates()["Qwen-Qwen3-0.6B"]
    entry = manifest_entry((ChatTemplate("default", FAKE_TEMPLATE),
                            ChatTemplate("tool_use", qwen3)), {})
    artifact = tmp_path / "model.ninfer"
    write_artifact(artifact, {**MANIFEST, "chat_template": entry}, [])
    monkeypatch.setenv("NINFER_FAKE_MAX_CONTEXT", "1024")
    monkeypatch.delenv("NINFER_FAKE_GATE", raising=False)
    return binary, artifact, qwen3


@pytest.fixture(scope="session")
def fake_server() -> Path:
    from ninfer.artifact import write_artifact

    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    write_artifact(binary.parent / "model.ninfer", MANIFEST, [])
    return binary


class Gate:
    """The fake model's step gate: each step takes one byte from a FIFO."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        # Read-write: opening never blocks, and the server's read-only open finds a writer.
        self._fd: int | None = os.open(path, os.O_RDWR)

    def allow(self, steps: int) -> None:
        assert self._fd is not None
        os.write(self._fd, b"s" * steps)

    def open(self) -> None:
        """Every later step runs freely (the server reads end of file)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    g = Gate(tmp_path / "gate")
    yield g
    g.open()


@pytest.fixture
def serve(fake_server: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    from ninfer.runtime import Server

    started: list[tuple[Any, Gate | None]] = []

    def start(*args: str, gate: Gate | None = None) -> Any:
        if gate:
            monkeypatch.setenv("NINFER_FAKE_GATE", str(gate.path))
        else:
            monkeypatch.delenv("NINFER_FAKE_GATE", raising=False)
        srv = Server(fake_server, extra_args=args, startup_timeout=HANG).start()
        started.append((srv, gate))
        return srv

    yield start
    for srv, g in started:
        if g:
            g.open()
        assert srv.alive(), "\n".join(srv.output)  # no CHECK in the fake model failed
        srv.stop()


def _metrics(srv: Any) -> dict[str, Any]:
    return _parse_metrics(srv.client.get("/metrics").text)


def _wait_for(srv: Any, cond: Callable[[dict[str, Any]], bool]) -> None:
    deadline = time.monotonic() + HANG
    while True:
        m = _metrics(srv)
        if cond(m):
            return
        assert time.monotonic() < deadline, {n: [(s.labels, s.value) for s in f.samples]
                                            for n, f in m.items() if f.type != "histogram"}
        time.sleep(0.01)


def _running(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: _sample(m, "ninfer:num_requests_running") == n


def _waiting(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: _sample(m, "ninfer:num_requests_waiting") == n


def _steps(m: dict[str, Any]) -> float:
    return _sample(m, "ninfer:iteration_tokens_total_count")


def _idle(m: dict[str, Any]) -> bool:
    return (_sample(m, "ninfer:num_requests_running") == 0
            and _sample(m, "ninfer:num_requests_waiting") == 0
            and _sample(m, "ninfer:kv_blocks_used") == 0)


def _post_in_background(srv: Any, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def go() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=HANG) as c:
            out.append(c.post("/v1/completions", json=body))

    t = threading.Thread(target=go)
    t.start()
    return t, out


def _raw_request(srv: Any, body: dict[str, Any]) -> socket.socket:
    """Sends a completion request on a raw socket (so the test decides when to hang up)."""
    host, port = srv.base_url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(HANG)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _hang_up(s: socket.socket) -> bytes:
    """Closes the client's side and reads what the server still sends until it closes.

    The handler notices the closed side, cancels the request and returns; the connection
    closes only after that, on the handler's thread. So once this returns, the request is
    marked cancelled (the engine may still be inside the step it was running).
    """
    s.shutdown(socket.SHUT_WR)
    received = b""
    while chunk := s.recv(65536):
        received += chunk
    s.close()
    return received


LONG = {"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": True, "temperature": 0}


def test_fake_server_serves_and_exports_metrics(serve: Callable[..., Any]) -> None:
    srv = serve()
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


def test_cuda_graph_counters_and_overlapping_requests_in_metrics(
        serve: Callable[..., Any], gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA backend's graph counters reach /metrics (here the fake backend's, from
    NINFER_FAKE_GRAPHS; absent without a backend that has graphs), and two requests at once
    show as steps of two sequences (what the GPU check reads to know they overlapped)."""
    import sys

    from ninfer.runtime.client import parse_metrics

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    srv = serve(gate=gate)
    body = {"prompt": "hello", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(srv.client.post, "/v1/completions", json=body)
                   for _ in range(2)]
        deadline = time.monotonic() + HANG  # both admitted while the first step is held
        while _sample(_metrics(srv), "ninfer:num_requests_running") + _sample(
                _metrics(srv), "ninfer:num_requests_waiting") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gate.open()
        for f in futures:
            assert f.result().status_code == 200, f.result().text
    text = srv.client.get("/metrics").text
    assert "cuda_graph" not in text
    m = parse_metrics(text)
    assert m.value("ninfer:iteration_sequences_count") > m.value(
        "ninfer:iteration_sequences_bucket", le="1.0")
    assert gpu_check.overlap_verdict(text)[0]
    monkeypatch.setenv("NINFER_FAKE_GRAPHS", "3,41")
    srv = serve()
    text = srv.client.get("/metrics").text
    m = parse_metrics(text)
    assert m.value("ninfer:cuda_graphs_captured_total") == 3
    assert m.value("ninfer:cuda_graph_replays_total") == 41
    assert gpu_check.graphs_verdict(text, graphs=True)[0]
    assert not gpu_check.graphs_verdict(text, graphs=False)[0]


def test_chat_renders_the_compiled_template(serve: Callable[..., Any]) -> None:
    srv = serve()
    body = {"messages": [{"role": "system", "content": "ab"},
                         {"role": "user", "content": [{"type": "text", "text": "cd"},
                                                      {"type": "text", "text": "ef"}]}],
            "max_tokens": 1, "return_token_ids": True}
    r = srv.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    # FAKE_TEMPLATE concatenates contents; text parts are joined with a newline (vLLM),
    # which the letters tokenizer has no token for
    assert r.json()["prompt_token_ids"] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "robot", "content": "x"}, "messages[0].role"),
    ({"role": "tool", "content": "x"}, "messages[0].tool_call_id"),
    ({"role": "user"}, "messages[0].content"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_chat_message_validation(serve: Callable[..., Any], message: dict, param: str) -> None:
    r = serve().client.post("/v1/chat/completions", json={"messages": [message]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
])
def test_chat_field_validation(serve: Callable[..., Any], extra: dict, param: str) -> None:
    body = {"messages": [{"role": "user", "content": "a"}], **extra}
    r = serve().client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def _serve_manifest(fake_server: Path, tmp_path: Path, chat_template: Any) -> Any:
    from ninfer.artifact import write_artifact
    from ninfer.runtime import Server

    artifact = tmp_path / "model.ninfer"
    write_artifact(artifact, {**MANIFEST, "chat_template": chat_template}, [])
    return Server(fake_server, extra_args=("--artifact", str(artifact)), startup_timeout=HANG)


def test_model_without_template_serves_completions_only(fake_server: Path,
                                                        tmp_path: Path) -> None:
    with _serve_manifest(fake_server, tmp_path, None) as srv:
        r = srv.client.post("/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "a"}]})
        assert r.status_code == 400 and "--chat-template" in r.json()["error"]["message"]
        r = srv.client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
        assert r.status_code == 200


def test_artifact_with_another_template_is_refused(fake_server: Path, tmp_path: Path) -> None:
    from ninfer.runtime.server import ServerError

    other = manifest_entry((ChatTemplate("default", "{{ 'not compiled in' }}"),), {})
    with pytest.raises(ServerError, match="is not compiled into this server"):
        _serve_manifest(fake_server, tmp_path, other).start()


def test_render_mode_reports_template_errors(fake_server: Path, tmp_path: Path) -> None:
    import subprocess

    lines = tmp_path / "c.jsonl"
    lines.write_text(json.dumps({"template": "fake", "context": {"messages": [
        {"role": "user", "content": "x"}]}}) + "\n" + json.dumps(
        {"template": "fake", "context": {"messages": 3}}) + "\n")
    out = subprocess.run([str(fake_server), "--render-chat-template", str(lines)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert json.loads(out[0]) == {"text": "x"}
    assert json.loads(out[1])["error_type"] == "TypeError"


def _stream_text(srv: Any, body: dict[str, Any]) -> tuple[list[str], str]:
    """The text deltas of a streamed completion, and its finish_reason."""
    deltas, finish = [], ""
    with srv.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            choice = json.loads(line[5:])["choices"][0]
            if choice["text"]:
                deltas.append(choice["text"])
            finish = choice["finish_reason"] or finish
    return deltas, finish


def test_stop_strings_in_a_stream(serve: Callable[..., Any]) -> None:
    srv = serve()
    body = {"prompt": [4, 5, 6], "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    full = srv.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert len(full) >= 30  # letters, a space between tokens
    # Stops spanning several tokens, two at once: the stream ends right before the one
    # that starts first, and no delta ever shows a part of it.
    stops = [full[20:25], full[9:14]]
    cut = min(full.find(s) for s in stops)
    deltas, finish = _stream_text(srv, {**body, "stop": stops})
    assert finish == "stop" and "".join(deltas) == full[:cut]
    # A stop that the last letter starts but nothing completes: that letter is held back,
    # and released when the request ends on its length.
    deltas, finish = _stream_text(srv, {**body, "stop": [full[-1] + "#"]})
    assert finish == "length" and "".join(deltas) == full
    assert deltas[-1].endswith(full[-1])


def test_too_long_is_400_with_the_numbers(serve: Callable[..., Any]) -> None:
    srv = serve()
    r = srv.client.post("/v1/completions", json={"prompt": [1] * 70})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = srv.client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 60})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens"
    assert all(str(n) in err["message"] for n in (64, 70, 10, 60))


def test_full_queue_is_429_with_retry_after(serve: Callable[..., Any], gate: Gate) -> None:
    srv = serve("--max-concurrency", "1", "--max-pending-requests", "1", gate=gate)
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, _running(1))  # held at its first step
    tb, rb = _post_in_background(srv, LONG)
    _wait_for(srv, _waiting(1))
    r = srv.client.post("/v1/completions", json=LONG)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "queue_full"
    gate.open()
    ta.join(HANG)
    tb.join(HANG)
    assert ra[0].status_code == rb[0].status_code == 200
    m = _metrics(srv)
    assert _sample(m, "ninfer:requests_rejected_total", reason="queue_full") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_pending_timeout_is_503(serve: Callable[..., Any], gate: Gate, stream: bool) -> None:
    srv = serve("--max-concurrency", "1", "--pending-timeout-ms", "150", gate=gate)
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, _running(1))
    tb, rb = _post_in_background(srv, {**LONG, "stream": stream})
    _wait_for(srv, _waiting(1))
    # The engine checks the timeout between steps: A's steps pass one per 10 ms or more,
    # so B has waited over 150 ms well before the 50th. A needs 60 steps: it cannot finish
    # and make room for B first.
    for _ in range(50):
        gate.allow(1)
        tb.join(0.01)
        if not tb.is_alive():
            break
    tb.join(HANG)
    r = rb[0]
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "pending_timeout"
    gate.open()
    ta.join(HANG)
    assert ra[0].status_code == 200
    assert _sample(_metrics(srv), "ninfer:requests_rejected_total", reason="pending_timeout") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_cancels_and_frees_blocks(serve: Callable[..., Any], gate: Gate,
                                             stream: bool) -> None:
    srv = serve(gate=gate)
    gate.allow(3)  # the prompt and two more steps: three tokens, then the gate holds it
    s = _raw_request(srv, {**LONG, "stream": stream})
    _wait_for(srv, lambda m: _sample(m, "ninfer:generation_tokens_total") == 3)
    received = _hang_up(s)
    assert received.startswith(b"HTTP/1.1 200") == stream, received  # streams began
    assert b"[DONE]" not in received
    # Cancelled within one step: the step in flight may pass, then no other.
    gate.allow(1)
    _wait_for(srv, lambda m: _sample(m, "ninfer:requests_cancelled_total") == 1 and _idle(m))
    m = _metrics(srv)
    assert _sample(m, "ninfer:generation_tokens_total") in (3, 4)
    assert _sample(m, "ninfer:request_success_total", finished_reason="length") == 0
    gate.open()
    assert srv.client.post("/v1/completions", json={**LONG, "max_tokens": 2}).status_code == 200


def test_disconnect_while_queued_never_runs(serve: Callable[..., Any], gate: Gate,
                                            tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    srv = serve("--max-concurrency", "1", "--request-log", str(log), gate=gate)
    ta, ra = _post_in_background(srv, LONG)
    _wait_for(srv, _running(1))  # held at its first step
    s = _raw_request(srv, LONG)
    _wait_for(srv, _waiting(1))
    assert not _hang_up(s).startswith(b"HTTP/1.1 200")
    gate.open()  # the queued request is reaped before the running one can finish
    _wait_for(srv, lambda m: _sample(m, "ninfer:requests_cancelled_total") == 1)
    ta.join(HANG)
    assert ra[0].status_code == 200
    _wait_for(srv, _idle)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    by_id: dict[str, list[str]] = {}
    for e in events:
        by_id.setdefault(e["id"], []).append(e["event"])
    assert sorted(by_id.values()) == [["cancelled"], ["start", "done"]]
    assert all(i.startswith("cmpl-") for i in by_id)


# A 40-token prompt in 4-token chunks: ten steps of prefill.
PREFILL = {"prompt": list(range(1, 21)) * 2, "max_tokens": 4, "temperature": 0}


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_mid_prefill_cancels(serve: Callable[..., Any], gate: Gate,
                                        stream: bool) -> None:
    srv = serve("--prefill-chunk", "4", gate=gate)
    gate.allow(2)  # two of the ten chunks
    s = _raw_request(srv, {**PREFILL, "stream": stream})
    _wait_for(srv, lambda m: _steps(m) == 2)
    received = _hang_up(s)
    assert received.startswith(b"HTTP/1.1 200") == stream, received  # streams began
    assert b"data:" not in received  # no token yet
    gate.allow(1)  # the chunk in flight, if any; no fourth one
    _wait_for(srv, lambda m: _sample(m, "ninfer:requests_cancelled_total") == 1 and _idle(m))
    m = _metrics(srv)
    assert _steps(m) in (2, 3)
    assert _sample(m, "ninfer:generation_tokens_total") == 0
    assert _sample(m, "ninfer:prompt_tokens_total") == 0  # counted at the first token only


def _start_gated(fake_server: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch,
                 *args: str) -> Any:
    from ninfer.runtime import Server

    monkeypatch.setenv("NINFER_FAKE_GATE", str(gate.path))
    return Server(fake_server, extra_args=args, startup_timeout=HANG).start()


def _stop_taking_work(srv: Any) -> None:
    """SIGTERM, then wait for the server to say it stopped taking work."""
    srv.client.close()  # an idle keep-alive connection holds its HTTP thread up to 5 s
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + HANG
    while not any("SIGTERM, stopping" in line for line in srv.output):
        assert time.monotonic() < deadline and srv.alive(), "\n".join(srv.output)
        time.sleep(0.01)


def _sigterm(srv: Any, gate: Gate) -> None:
    """SIGTERM, then let the step in flight pass (the engine ends every request after it)."""
    _stop_taking_work(srv)
    gate.allow(1)


def test_sigterm_ends_requests_with_503_and_exits_cleanly(
        fake_server: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM: the running and the waiting request both end within one step with 503
    shutting_down, and the server exits 0 (not killed by the signal)."""
    srv = _start_gated(fake_server, gate, monkeypatch, "--max-concurrency", "1")
    try:
        ta, ra = _post_in_background(srv, LONG)
        _wait_for(srv, _running(1))  # held at its first step: it cannot finish
        tb, rb = _post_in_background(srv, LONG)
        _wait_for(srv, _waiting(1))
        _sigterm(srv, gate)
        ta.join(HANG)
        tb.join(HANG)
        for r in (ra[0], rb[0]):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "shutting_down"
        assert srv.proc.wait(HANG) == 0
    finally:
        gate.open()
        srv.stop()


def test_sigterm_does_not_wait_for_idle_kept_alive_clients(fake_server: Path) -> None:
    """A client that keeps its connection open after its answer (as the openai client's
    pool does) does not hold the exit: the server ends the idle connection at once. With
    an hour's keep-alive timeout, a server that waited for it would not exit within HANG."""
    from ninfer.runtime import Server

    srv = Server(fake_server, extra_args=("--keep-alive-timeout", "3600"),
                 startup_timeout=HANG).start()
    try:
        with httpx.Client(base_url=srv.base_url) as client:
            r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
            assert r.status_code == 200, r.text
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(HANG) == 0
    finally:
        srv.stop()


def test_keep_alive_timeout_closes_idle_connections(fake_server: Path) -> None:
    """--keep-alive-timeout 1: an idle connection is closed by the server (the next read
    on it sees the end), and a bad value is refused at start."""
    from ninfer.runtime import Server

    with Server(fake_server, extra_args=("--keep-alive-timeout", "1"),
                startup_timeout=HANG) as srv:
        s = _raw_request(srv, {"prompt": "ab", "max_tokens": 2})
        received = b""
        while chunk := s.recv(65536):  # the answer, then the server's close (not HANG)
            received += chunk
        s.close()
        assert received.startswith(b"HTTP/1.1 200"), received
    r = subprocess.run([str(fake_server), "--keep-alive-timeout", "0"], capture_output=True,
                       text=True, timeout=HANG)
    assert r.returncode != 0 and "--keep-alive-timeout" in r.stderr


@pytest.mark.parametrize("stream", [False, True])
def test_sigterm_mid_prefill(fake_server: Path, gate: Gate, monkeypatch: pytest.MonkeyPatch,
                             stream: bool) -> None:
    """SIGTERM while a prompt is half prefilled: 503 shutting_down for a plain request, an
    error event for a stream (its 200 headers went out at admission); exit 0."""
    srv = _start_gated(fake_server, gate, monkeypatch, "--prefill-chunk", "4")
    try:
        gate.allow(2)  # two of the ten chunks
        s = _raw_request(srv, {**PREFILL, "stream": stream})
        _wait_for(srv, lambda m: _steps(m) == 2)
        _sigterm(srv, gate)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        s.close()
        head, _, body = received.partition(b"\r\n\r\n")
        if stream:
            assert head.startswith(b"HTTP/1.1 200"), received
            assert b"The server is shutting down" in body and b"[DONE]" in body
        else:
            assert head.startswith(b"HTTP/1.1 503"), received
            assert json.loads(body)["error"]["code"] == "shutting_down"
        assert srv.proc.wait(HANG) == 0
    finally:
        gate.open()
        srv.stop()
