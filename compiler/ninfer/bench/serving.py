"""Serving: decode fairness under a long prefill, and decode throughput vs. concurrency.

Streamed rates are measured from client-side SSE arrival times (return_token_ids gives
the number of tokens per event): the tokens arriving in a window (lo, hi] divided by its
length, so prefill, queueing and the tail of a stream do not dilute it.

- fairness: stream A (short prompt, ignore_eos, --decode-tokens) alone gives its solo
  decode rate (window: A's first to last token). Then A again, and once A decodes,
  stream B sends a prompt of --prefill-multiple x the server's prefill chunk. A's rate
  while B prefills (B sent -> B's first token) and while B runs (B sent -> B done), each
  as a fraction of solo; target >= 0.5.
- scaling: c streams started together (ignore_eos, same max_tokens) and read by one
  client thread (common.stream_many: a selector over plain sockets, so that the client,
  which shares the machine's cores with the server, costs as little per token as it
  can); the aggregate rate over the window where all c decode (latest first token ->
  earliest last token); the ratio over c = 1 is the median of each round's own ratio;
  targets (CPU) 1.8x at 2, 3x at 4. The same levels again without streaming, rated by
  the server's own decode timings: the client only waits, so this is the server's
  scaling without a client on its cores.

The benchmark reports; it does not assert. Medians over --repeats runs.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ninfer.runtime.client import (
    BenchError,
    Endpoint,
    StreamTrace,
    compiled_limits,
    model_facts,
    rate_in_window,
    stream_many,
    stream_tokens,
)

FAIRNESS_TARGET = 0.5
SCALING_TARGETS = {2: 1.8, 4: 3.0}  # CPU


@dataclass
class ServingConfig:
    decode_tokens: int = 64  # A's max_tokens, and each scaling stream's
    prefill_chunk: int | None = None  # None: the server's / compiled value
    prefill_multiple: int = 8  # B's prompt = this x prefill chunk
    b_max_tokens: int = 8
    levels: tuple[int, ...] = (1, 2, 4, 8)
    repeats: int = 3
    prompt_tokens: int = 8  # A's and the scaling streams' prompt length
    vocab_span: int = 200  # prompt ids in [1, 1 + span): inside any byte-level vocabulary


@dataclass
class FairnessResult:
    prefill_chunk: int
    b_prompt_tokens: int
    solo_tps: float | None  # None: A's tokens arrived too close together to rate
    during_prefill_tps: float | None
    during_b_tps: float | None
    prefill_ratio: float | None
    during_b_ratio: float | None
    target: float = FAIRNESS_TARGET
    runs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ScalingLevel:
    concurrency: int
    aggregate_tps: float | None  # streamed: SSE arrival times at the client
    per_stream_tps: float | None
    ratio: float | None
    target: float | None
    note: str = ""
    server_tps: float | None = None  # non-streaming: the server's own decode timings
    server_ratio: float | None = None


@dataclass
class ServingResult:
    url: str
    command: str
    model_id: str
    max_concurrency: int | None
    fairness: FairnessResult
    scaling: list[ScalingLevel]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _prompt(cfg: ServingConfig, n: int, salt: int) -> list[int]:
    return [1 + (salt * 7919 + i * 31) % cfg.vocab_span for i in range(n)]


def _decode_body(cfg: ServingConfig, salt: int, max_tokens: int) -> dict[str, Any]:
    return {"prompt": _prompt(cfg, cfg.prompt_tokens, salt), "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def _ok(trace: StreamTrace, what: str) -> StreamTrace:
    if trace.status != 200 or trace.error or not trace.times:
        raise BenchError(f"{what}: HTTP {trace.status}, {trace.error or 'no tokens'}")
    return trace


def solo_rate(trace: StreamTrace) -> float | None:
    return rate_in_window(trace.times, trace.first, trace.last)


def measure_fairness(client: httpx.Client, cfg: ServingConfig, chunk: int,
                     max_model_len: int) -> FairnessResult:
    b_len = cfg.prefill_multiple * chunk
    if max_model_len and b_len + cfg.b_max_tokens > max_model_len:
        raise BenchError(f"B's prompt of {cfg.prefill_multiple} x {chunk} = {b_len} tokens + "
                         f"{cfg.b_max_tokens} does not fit the context of {max_model_len}")
    body_a = _decode_body(cfg, 1, cfg.decode_tokens)
    body_b = {"prompt": _prompt(cfg, b_len, 2), "max_tokens": cfg.b_max_tokens,
              "temperature": 0, "ignore_eos": True}
    _ok(stream_tokens(client, {**body_a, "max_tokens": 4}), "warm-up")
    res = FairnessResult(chunk, b_len, None, None, None, None, None)
    solos = [solo_rate(_ok(stream_tokens(client, body_a), "A alone"))
             for _ in range(cfg.repeats)]
    solo = _median(solos)
    if not solo:
        # a fast model's tokens can arrive in one read: report it, and go on to scaling
        res.notes.append("A alone: its tokens arrived too close together to rate; raise "
                         "--decode-tokens")
        return res
    res.solo_tps = solo
    lead = min(4, max(1, cfg.decode_tokens // 8))  # A's tokens before B is sent
    for _ in range(cfg.repeats):
        decoding = threading.Event()

        def seen(n: int, ev: threading.Event = decoding) -> None:
            if n >= lead:
                ev.set()

        with ThreadPoolExecutor(1) as pool:
            fut_a = pool.submit(stream_tokens, client, body_a, "/v1/completions", seen)
            if not decoding.wait(60):
                raise BenchError("A produced no tokens within 60 s")
            b = _ok(stream_tokens(client, body_b), "B")
            a = _ok(fut_a.result(), "A with B")
        pre_hi, run_hi = min(b.first, a.last), min(b.done, a.last)
        run = {"during_prefill_tps": rate_in_window(a.times, b.sent, pre_hi),
               "during_b_tps": rate_in_window(a.times, b.sent, run_hi),
               "b_prefill_s": b.first - b.sent, "b_total_s": b.done - b.sent,
               "a_covers_b": (run_hi - b.sent) / (b.done - b.sent)}
        res.runs.append(run)
        if a.last < b.first:
            res.notes.append("A finished before B's prefill did: raise --decode-tokens")
    res.during_prefill_tps = _median([r["during_prefill_tps"] for r in res.runs])
    res.during_b_tps = _median([r["during_b_tps"] for r in res.runs])
    if res.during_prefill_tps is not None:
        res.prefill_ratio = res.during_prefill_tps / solo
    else:
        res.notes.append("fewer than 2 of A's tokens arrived during B's prefill")
    if res.during_b_tps is not None:
        res.during_b_ratio = res.during_b_tps / solo
    res.notes = sorted(set(res.notes))
    return res


def measure_level(client: httpx.Client, cfg: ServingConfig, c: int) -> float | None:
    """Aggregate decode tokens/s of c streams over the window where all of them decode."""
    bodies = [_decode_body(cfg, 100 + i, cfg.decode_tokens) for i in range(c)]
    traces = [_ok(t, f"stream {i} of {c}")
              for i, t in enumerate(stream_many(client, bodies))]
    lo, hi = max(t.first for t in traces), min(t.last for t in traces)
    return rate_in_window([x for t in traces for x in t.times], lo, hi)


def measure_level_server(client: httpx.Client, cfg: ServingConfig, c: int) -> float | None:
    """Aggregate decode tokens/s of c non-streaming requests sent together, from the
    server's timings (each request's tokens after its first over first token -> done).
    The client sleeps while they decode, so this is the server's rate alone; the
    requests start together with equal lengths, so their decode windows coincide."""
    def one(i: int) -> float | None:
        r = client.post("/v1/completions", json=_decode_body(cfg, 100 + i, cfg.decode_tokens))
        if r.status_code != 200:
            raise BenchError(f"non-streaming request {i} of {c}: HTTP {r.status_code}, "
                             f"{r.text[:300]}")
        t = r.json()["timings"]
        return (t["predicted_n"] - 1) / (t["predicted_ms"] / 1000) \
            if t["predicted_ms"] > 0 else None

    with ThreadPoolExecutor(c) as pool:
        rates = list(pool.map(one, range(c)))
    return None if None in rates else sum(r for r in rates if r is not None)


def measure_scaling(client: httpx.Client, cfg: ServingConfig,
                    max_concurrency: int | None) -> list[ScalingLevel]:
    """Median aggregate rate per level over cfg.repeats rounds, streamed and server-timed,
    and the median over rounds of each round's ratio to its single stream; each round runs
    every level once in both ways, so a slow spell of a shared machine lands on all of them
    rather than on one."""
    levels = [c for c in cfg.levels if max_concurrency is None or c <= max_concurrency]
    if 1 not in levels:
        raise BenchError("scaling is measured against one stream: --levels must include 1")
    rates: dict[int, list[float | None]] = {c: [] for c in levels}
    server: dict[int, list[float | None]] = {c: [] for c in levels}
    for _ in range(cfg.repeats):
        for c in levels:
            rates[c].append(measure_level(client, cfg, c))
            server[c].append(measure_level_server(client, cfg, c))

    def paired(rs: dict[int, list[float | None]], c: int) -> float | None:
        # the median of each round's ratio to that round's single stream: the machine's
        # slow spells move both, and cancel
        return _median([a / b if a is not None and b else None
                        for a, b in zip(rs[c], rs[1], strict=True)])

    out: list[ScalingLevel] = []
    for c in cfg.levels:
        target = SCALING_TARGETS.get(c)
        if c not in rates:
            out.append(ScalingLevel(c, None, None, None, target,
                                    f"above the server's {max_concurrency} concurrent requests"))
            continue
        agg = _median(rates[c])
        out.append(ScalingLevel(c, agg, agg / c if agg is not None else None,
                                paired(rates, c), target,
                                "" if agg is not None else "no common decode window",
                                _median(server[c]), paired(server, c)))
    return out


def run_serving(endpoint: Endpoint, cfg: ServingConfig, command: str,
                log: Callable[[str], None] = lambda s: None) -> ServingResult:
    limits = compiled_limits(endpoint.build_dir)
    m = endpoint.server_line(r"(\d+) concurrent requests, (\d+) tokens per step")
    chunk = cfg.prefill_chunk or (int(m.group(2)) if m else None) or \
        limits.get("prefill_chunk")
    if not chunk:
        raise BenchError("the server's prefill chunk is unknown: pass --prefill-chunk (or a "
                         "BUILD_DIR with compile_report.json)")
    max_conc = int(m.group(1)) if m else limits.get("max_concurrency")
    conns = max(max(cfg.levels), 2) + 4
    with endpoint.client(connections=conns) as client:
        facts = model_facts(client)
        log(f"fairness: A decodes {cfg.decode_tokens} tokens, B prefills "
            f"{cfg.prefill_multiple} x {chunk} tokens")
        fair = measure_fairness(client, cfg, int(chunk), facts.max_model_len)
        log(f"scaling: concurrency {', '.join(map(str, cfg.levels))}")
        scaling = measure_scaling(client, cfg, int(max_conc) if max_conc else None)
    return ServingResult(endpoint.base_url, command, facts.model_id,
                         int(max_conc) if max_conc else None, fair, scaling)


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _verdict(ratio: float | None, target: float | None) -> str:
    if ratio is None or target is None:
        return "-"
    return "meets" if ratio >= target else "below"


def format_text(res: ServingResult) -> list[str]:
    """Plain lines in the style of benchmarks/RESULTS.md."""
    f = res.fairness
    lines = [f"model: {res.model_id}; prefill chunk {f.prefill_chunk}; max concurrency "
             f"{res.max_concurrency or '?'}",
             f"fairness: A decode alone {_f(f.solo_tps, '.1f')} tok/s; B prompt "
             f"{f.b_prompt_tokens} tokens",
             f"{'':28}{'tok/s':>10}{'of solo':>10}{'target':>9}",
             f"{'A while B prefills':28}{_f(f.during_prefill_tps, '.1f'):>10}"
             f"{_f(f.prefill_ratio, '.2f'):>10}{'>= ' + format(f.target, 'g'):>9}  "
             f"{_verdict(f.prefill_ratio, f.target)}",
             f"{'A while B runs':28}{_f(f.during_b_tps, '.1f'):>10}"
             f"{_f(f.during_b_ratio, '.2f'):>10}{'>= ' + format(f.target, 'g'):>9}  "
             f"{_verdict(f.during_b_ratio, f.target)}",
             *[f"  note: {n}" for n in f.notes],
             "scaling: aggregate decode tok/s, streamed (SSE arrivals over the window where "
             "every stream decodes; the client shares the server's cores) and server-timed "
             "(non-streaming, the server's decode timings)",
             f"{'concurrency':>11}{'streamed':>10}{'ratio':>7}{'':8}{'server':>9}{'ratio':>7}"
             f"{'':8}{'target':>9}"]
    for s in res.scaling:
        tgt = f">= {s.target:g}" if s.target else "-"
        lines.append(f"{s.concurrency:>11}{_f(s.aggregate_tps, '.1f'):>10}"
                     f"{_f(s.ratio, '.2f'):>7} {_verdict(s.ratio, s.target):<7}"
                     f"{_f(s.server_tps, '.1f'):>9}{_f(s.server_ratio, '.2f'):>7} "
                     f"{_verdict(s.server_ratio, s.target):<7}{tgt:>9}"
                     f"{'  ' + s.note if s.note else ''}")
    return lines


def render_tables(res: ServingResult) -> list[Any]:
    from rich.table import Table

    f = res.fairness
    fair = Table(title=f"fairness: A decoding while B prefills {f.b_prompt_tokens} tokens "
                 f"(prefill chunk {f.prefill_chunk}); A alone {_f(f.solo_tps, '.1f')} tok/s")
    for col in ("window", "A tok/s", "of solo", "target", ""):
        fair.add_column(col, justify="left" if col in ("window", "") else "right")
    for name, tps, ratio in (("while B prefills", f.during_prefill_tps, f.prefill_ratio),
                             ("while B runs", f.during_b_tps, f.during_b_ratio)):
        v = _verdict(ratio, f.target)
        fair.add_row(name, _f(tps, ".1f"), _f(ratio, ".2f"), f">= {f.target:g}",
                     f"[green]{v}[/green]" if v == "meets" else f"[yellow]{v}[/yellow]")
    scale = Table(title=f"scaling: aggregate decode tok/s ({res.model_id}, server max "
                  f"concurrency {res.max_concurrency or '?'}), streamed (SSE arrivals at a "
                  "client on the same machine) and server-timed (non-streaming)")
    for col in ("streams", "streamed", "ratio", "", "server", "ratio ", " ", "target"):
        scale.add_column(col, justify="left" if col.strip() == "" else "right")

    def mark(ratio: float | None, target: float | None) -> str:
        v = _verdict(ratio, target)
        return f"[green]{v}[/green]" if v == "meets" else f"[yellow]{v}[/yellow]" \
            if v == "below" else v

    for s in res.scaling:
        scale.add_row(str(s.concurrency), _f(s.aggregate_tps, ".1f"), _f(s.ratio, ".2f"),
                      mark(s.ratio, s.target) + (f" {s.note}" if s.note else ""),
                      _f(s.server_tps, ".1f"), _f(s.server_ratio, ".2f"),
                      mark(s.server_ratio, s.target),
                      f">= {s.target:g}" if s.target else "-")
    return [fair, scale]
