"""Client-side tools for a running ninfer-server (the benchmarks, `ninfer-bench` and
`ninfer-check`): the server under test, /metrics, RSS, SSE arrival times."""

from __future__ import annotations

import json
import re
import selectors
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ninfer.runtime.server import Server

MIB = 1 << 20


class BenchError(RuntimeError):
    """The benchmark cannot run (no server, a missing metric, a bad option)."""


class MetricsError(BenchError):
    """GET /metrics failed or lacks a metric the benchmark needs."""


# ---------------------------------------------------------------------------------------
# The server under test


@dataclass
class Endpoint:
    """Where the server listens; `pid` is known when it runs on this machine."""

    base_url: str
    pid: int | None = None
    server: Server | None = None
    build_dir: Path | None = None

    def client(self, *, timeout: float = 300.0, connections: int = 16) -> httpx.Client:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.Client(base_url=self.base_url, timeout=timeout, limits=limits)

    def alive(self) -> bool:
        if self.server is not None:
            return self.server.alive()
        return self.pid is None or Path(f"/proc/{self.pid}").exists()

    def log_tail(self, n: int = 20) -> str:
        if self.server is None:
            return ""
        return "\n".join(list(self.server.output)[-n:])

    def server_line(self, pattern: str) -> re.Match[str] | None:
        """The first line of the server's startup output matching `pattern`."""
        if self.server is None:
            return None
        for line in list(self.server.output):
            m = re.search(pattern, line)
            if m:
                return m
        return None


@contextmanager
def open_endpoint(build_dir: Path | None, url: str | None, *, threads: int | None = None,
                  server_args: tuple[str, ...] = (), pid: int | None = None
                  ) -> Iterator[Endpoint]:
    """Start `build_dir`'s ninfer-server (stopped on exit), or use the one at `url`."""
    if url:
        base = url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        try:
            ok = httpx.get(base + "/health", timeout=10).status_code == 200
        except httpx.HTTPError as exc:
            raise BenchError(f"{base}/health: {exc}") from exc
        if not ok:
            raise BenchError(f"{base}/health did not answer 200")
        yield Endpoint(base, pid=pid, build_dir=build_dir)
        return
    if build_dir is None:
        raise BenchError("give a BUILD_DIR to start a server, or --url of a running one")
    with Server(build_dir, threads=threads, extra_args=server_args) as srv:
        assert srv.proc is not None
        yield Endpoint(srv.base_url, pid=srv.proc.pid, server=srv, build_dir=build_dir)


@dataclass
class ModelFacts:
    model_id: str
    max_model_len: int
    vocab_size: int | None  # None when /v1/models does not say


def model_facts(client: httpx.Client) -> ModelFacts:
    r = client.get("/v1/models")
    if r.status_code != 200:
        raise BenchError(f"GET /v1/models answered {r.status_code}: {r.text[:200]}")
    m = r.json()["data"][0]
    vocab = m.get("vocab_size")
    return ModelFacts(m["id"], int(m.get("max_model_len") or 0), int(vocab) if vocab else None)


def compiled_limits(build_dir: Path | None) -> dict[str, Any]:
    """plan.limits of BUILD_DIR/compile_report.json ({} when there is none)."""
    if build_dir is None:
        return {}
    path = Path(build_dir) / "compile_report.json"
    if not path.exists():
        return {}
    limits = json.loads(path.read_text()).get("plan", {}).get("limits", {})
    return dict(limits)


# ---------------------------------------------------------------------------------------
# /metrics


@dataclass
class Metrics:
    """One scrape: sample name -> [(labels, value)]."""

    samples: dict[str, list[tuple[dict[str, str], float]]]

    def has(self, name: str) -> bool:
        return name in self.samples

    def value(self, name: str, **labels: str) -> float:
        """The sample's value, summed over the series matching `labels`."""
        if name not in self.samples:
            known = ", ".join(sorted(n for n in self.samples if not n.endswith("_bucket")))
            raise MetricsError(f"the server's /metrics has no '{name}' (it has: {known or 'none'})")
        return sum(v for lab, v in self.samples[name]
                   if all(lab.get(k) == want for k, want in labels.items()))

    def get(self, name: str, default: float | None = None) -> float | None:
        return self.value(name) if name in self.samples else default


def parse_metrics(text: str) -> Metrics:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:  # a test extra, not a runtime dependency
        raise BenchError("ninfer-bench reads /metrics with prometheus_client: "
                         "pip install prometheus-client") from exc
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return Metrics(samples)


def fetch_metrics(client: httpx.Client) -> Metrics:
    try:
        r = client.get("/metrics", timeout=30)
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET /metrics: {exc}") from exc
    if r.status_code != 200:
        raise MetricsError(f"GET /metrics answered {r.status_code}: {r.text[:200]}")
    return parse_metrics(r.text)


RUNNING = "ninfer:num_requests_running"
WAITING = "ninfer:num_requests_waiting"
KV_USED = "ninfer:kv_blocks_used"
KV_TOTAL = "ninfer:kv_blocks_total"
DRAFTS = "ninfer:spec_decode_num_draft_tokens_total"  # speculative decoding's
ACCEPTED = "ninfer:spec_decode_num_accepted_tokens_total"
CANCELLED = "ninfer:requests_cancelled_total"
REJECTED = "ninfer:requests_rejected_total"
SUCCESS = "ninfer:request_success_total"
TTFT = "ninfer:time_to_first_token_seconds"
ITL = "ninfer:inter_token_latency_seconds"


def wait_idle(client: httpx.Client, timeout: float, grace: float = 2.0) -> tuple[Metrics, bool]:
    """Polls /metrics until nothing runs or waits (at most `timeout` s), then up to `grace`
    s more until no KV block is held (the gauges may be published a step apart).

    Returns the last scrape and whether the server went idle (running = waiting = 0).
    """
    deadline = time.monotonic() + timeout
    while True:
        m = fetch_metrics(client)
        if m.value(RUNNING) == 0 and m.value(WAITING) == 0:
            break
        if time.monotonic() > deadline:
            return m, False
        time.sleep(0.1)
    deadline = time.monotonic() + grace
    while m.value(KV_USED) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        m = fetch_metrics(client)
    return m, True


# ---------------------------------------------------------------------------------------
# Resident memory

RSS_RULE = "flat: end <= start x 1.10 + 16 MiB"


def rss_bytes(pid: int) -> int:
    """VmRSS of process `pid` from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(value) * 1024
    raise BenchError(f"/proc/{pid}/status has no VmRSS line")


def rss_flat(start: int, end: int) -> bool:
    return end <= start * 1.10 + 16 * MIB


# ---------------------------------------------------------------------------------------
# Server-sent events


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payloads of an SSE stream, in order ("[DONE]" included)."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


@dataclass
class StreamTrace:
    """One streamed completion: when it was sent, when each token arrived."""

    sent: float
    status: int = 0
    headers: float = 0.0
    done: float = 0.0
    times: list[float] = field(default_factory=list)  # one entry per generated token
    finish_reason: str | None = None
    error: str | None = None

    @property
    def first(self) -> float:
        return self.times[0]

    @property
    def last(self) -> float:
        return self.times[-1]


def stream_tokens(client: httpx.Client, body: dict[str, Any], route: str = "/v1/completions",
                  on_tokens: Callable[[int], None] | None = None) -> StreamTrace:
    """Streams `body` (return_token_ids on) to `client`'s server and records each token's
    arrival time. `on_tokens(n)` is called with the number of tokens received so far after
    each event that carried tokens."""
    return stream_many(client, [body], route, on_tokens)[0]


def stream_many(client: httpx.Client, bodies: list[dict[str, Any]],
                route: str = "/v1/completions",
                on_tokens: Callable[[int], None] | None = None) -> list[StreamTrace]:
    """Streams every body at once (return_token_ids on) and records each token's arrival.

    All streams are read by this one thread through a selector, over plain sockets: the
    client shares the machine's cores with the server it measures, and per event this
    costs a fraction of what a thread per stream with an HTTP library does (one wake-up
    serves every stream whose tokens a decode step emitted, with no GIL hand-offs).
    """
    url = client.base_url
    host, port = url.host, url.port or 80
    timeout = client.timeout.read or 300.0
    path = url.path.rstrip("/") + route
    streams: list[SseReader] = []
    sel = selectors.DefaultSelector()
    try:
        for body in bodies:
            payload = json.dumps({**body, "stream": True, "return_token_ids": True}).encode()
            head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
            st = SseReader(StreamTrace(sent=time.perf_counter()), on_tokens)
            st.sock = socket.create_connection((host, port), timeout=timeout)
            st.sock.sendall(head + payload)
            st.sock.setblocking(False)
            sel.register(st.sock, selectors.EVENT_READ, st)
            streams.append(st)
        open_streams = len(streams)
        while open_streams:
            events = sel.select(timeout)
            if not events:
                raise BenchError(f"streaming POST {route} to {url}: no data for {timeout} s")
            for key, _ in events:
                st = key.data
                data = st.sock.recv(1 << 16)
                if not data or not st.feed(data):
                    st.trace.done = time.perf_counter()
                    if not data and st.state != "done" and st.trace.error is None:
                        st.trace.error = "the server closed the stream before [DONE]"
                    sel.unregister(st.sock)
                    open_streams -= 1
    except (OSError, ValueError, IndexError) as exc:  # IndexError: a malformed status line
        raise BenchError(f"streaming POST {route} to {url}: {exc}") from exc
    finally:
        sel.close()
        for st in streams:
            if st.sock is not None:
                st.sock.close()
    return [st.trace for st in streams]


class SseReader:
    """Incremental parser of one HTTP/1.1 response carrying server-sent events."""

    def __init__(self, trace: StreamTrace, on_tokens: Callable[[int], None] | None) -> None:
        self.trace = trace
        self.on_tokens = on_tokens
        self.sock: socket.socket | None = None
        self.state = "headers"  # -> "body" (-> "end": the last chunk came) -> "done"
        self.chunked = False
        self.raw = bytearray()  # bytes not yet parsed as headers or chunk framing
        self.events = bytearray()  # de-chunked body not yet split into events
        self.error_body = bytearray()

    def feed(self, data: bytes, clock: Callable[[], float] = time.perf_counter) -> bool:
        """Consumes received bytes; False once the response is complete. Each event's
        tokens are stamped with `clock()` when the event is parsed: as a reader that
        timestamps lines, so that events read together still get distinct times."""
        if self.state == "done":
            return False
        self.raw += data
        if self.state == "headers":
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return True
            lines = bytes(self.raw[:end]).decode("latin-1").split("\r\n")
            del self.raw[:end + 4]
            self.trace.status = int(lines[0].split()[1])
            self.trace.headers = clock()
            self.chunked = any(h.lower().replace(" ", "") == "transfer-encoding:chunked"
                               for h in lines[1:])
            self.state = "body"
        if self.trace.status != 200:  # read the error body to the end of the connection
            self.error_body += self.raw
            self.raw.clear()
            self.trace.error = self.error_body.decode("utf-8", "replace")[:300]
            return True
        if self.chunked:
            while True:
                eol = self.raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(bytes(self.raw[:eol]).split(b";")[0], 16)
                if size == 0:  # the last chunk: the events before it are still parsed
                    self.state = "end"
                    break
                if len(self.raw) < eol + 2 + size + 2:
                    break
                self.events += self.raw[eol + 2:eol + 2 + size]
                del self.raw[:eol + 2 + size + 2]
        else:
            self.events += self.raw
            self.raw.clear()
        while True:
            end = self.events.find(b"\n\n")
            if end < 0:
                break
            event = bytes(self.events[:end])
            del self.events[:end + 2]
            if not self._event(event, clock()):
                self.state = "done"
                break
        if self.state == "end":
            self.state = "done"
            if self.trace.error is None:
                self.trace.error = "the stream ended without [DONE]"
        return self.state != "done"

    def _event(self, event: bytes, now: float) -> bool:
        """Handles one SSE event; False at [DONE] or an error."""
        trace = self.trace
        for data in sse_data(event.decode("utf-8", "replace").split("\n")):
            if data == "[DONE]":
                return False
            chunk = json.loads(data)
            if "error" in chunk:
                trace.error = json.dumps(chunk["error"])
                return False
            for choice in chunk.get("choices", []):
                n = len(choice.get("token_ids") or [])
                trace.times.extend([now] * n)
                if n and self.on_tokens is not None:
                    self.on_tokens(len(trace.times))
                if choice.get("finish_reason"):
                    trace.finish_reason = choice["finish_reason"]
        return True


def rate_in_window(times: Iterable[float], lo: float, hi: float) -> float | None:
    """Tokens arriving in (lo, hi] per second; None for an empty window or < 2 tokens."""
    if hi <= lo:
        return None
    n = sum(1 for t in times if lo < t <= hi)
    return n / (hi - lo) if n >= 2 else None
