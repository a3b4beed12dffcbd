"""Soak: N mixed requests with C in flight, some streaming clients hanging up mid stream.

Every request that is read to the end must be answered 200 with a well-formed body and
finish_reason stop or length; afterwards the server must drain (nothing running or
waiting), hold no KV block, and its RSS must stay flat (RSS_RULE) from after the
warm-up to the end.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ninfer.runtime.client import (
    ACCEPTED,
    CANCELLED,
    DRAFTS,
    ITL,
    KV_TOTAL,
    KV_USED,
    MIB,
    REJECTED,
    RSS_RULE,
    RUNNING,
    SUCCESS,
    TTFT,
    WAITING,
    BenchError,
    Endpoint,
    Metrics,
    fetch_metrics,
    model_facts,
    rss_bytes,
    rss_flat,
    sse_data,
    wait_idle,
)

FINISH_REASONS = ("stop", "length")
SAFE_VOCAB = 256  # every byte-level BPE vocabulary has at least the 256 byte tokens
WORDS = ("the server answers every request while others stream and some clients hang up "
         "early; blocks return to the pool and memory stays flat over time").split()


@dataclass
class SoakConfig:
    requests: int = 100
    concurrency: int = 8
    seed: int = 0
    disconnect_rate: float = 0.2
    max_tokens_range: tuple[int, int] = (1, 64)
    prompt_len_range: tuple[int, int] = (1, 200)
    stream_rate: float = 0.5  # of the requests read to the end
    chat_rate: float = 0.25
    # of the token-prompt requests: logit_bias holds the output to a few of the prompt's
    # ids, so it repeats itself (speculative decoding's drafts are accepted and rejected)
    narrow_rate: float = 0.0
    request_timeout: float = 120.0
    drain_timeout: float = 30.0


@dataclass
class SoakRequest:
    index: int
    route: str  # "/v1/completions" | "/v1/chat/completions"
    stream: bool
    disconnect_after: int | None  # data events read before hanging up; None: read all
    body: dict[str, Any]

    @property
    def max_tokens(self) -> int:
        return int(self.body["max_tokens"])

    def describe(self) -> str:
        kind = "chat" if "chat" in self.route else "completion"
        mode = ("stream, hang up after " + str(self.disconnect_after) if self.disconnect_after
                is not None else "stream" if self.stream else "non-stream")
        return f"#{self.index} {kind} {mode}, max_tokens {self.max_tokens}"


@dataclass
class ChatCost:
    """Prompt tokens of a chat request of `words` words: overhead + per_word x words."""

    overhead: int = 48
    per_word: float = 2.0

    def words_for(self, tokens: int) -> int:
        """The most words whose prompt stays within `tokens` (with a 25 % margin)."""
        return int((tokens - self.overhead) / (1.25 * self.per_word))


def plan_requests(cfg: SoakConfig, vocab_size: int, max_model_len: int,
                  chat_cost: ChatCost | None = None) -> list[SoakRequest]:
    """The soak's requests, fixed by cfg.seed; every one fits max_model_len."""
    chat_cost = chat_cost or ChatCost()
    rng = random.Random(cfg.seed)
    lo_mt, hi_mt = cfg.max_tokens_range
    lo_pl, hi_pl = cfg.prompt_len_range
    out = []
    for i in range(cfg.requests):
        max_tokens = rng.randint(lo_mt, hi_mt)
        if max_model_len:
            max_tokens = max(1, min(max_tokens, max_model_len // 2))
        room = max_model_len - max_tokens if max_model_len else hi_pl
        disconnect = rng.random() < cfg.disconnect_rate
        stream = disconnect or rng.random() < cfg.stream_rate
        chat = rng.random() < cfg.chat_rate
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "seed": rng.randrange(1 << 31),
        }
        if disconnect or rng.random() < 0.5:  # a hang-up must come before the end
            body["ignore_eos"] = True
        if rng.random() < 0.5:
            body["return_token_ids"] = True
        if rng.random() < 0.3:
            body["top_p"] = 0.9
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        if chat:
            # Text, so its token count is estimated (chat_cost, measured by run_soak).
            words = max(1, min(rng.randint(lo_pl, hi_pl), chat_cost.words_for(room)))
            text = " ".join(rng.choice(WORDS) for _ in range(words))
            body["messages"] = [{"role": "user", "content": text}]
            route = "/v1/chat/completions"
        else:
            n = max(1, min(rng.randint(lo_pl, hi_pl), room))
            body["prompt"] = [rng.randrange(vocab_size) for _ in range(n)]
            route = "/v1/completions"
            if cfg.narrow_rate and rng.random() < cfg.narrow_rate:
                body["logit_bias"] = {str(t): 60 for t in sorted(set(body["prompt"]))[:5]}
        after = rng.randint(0, max_tokens - 1) if disconnect else None
        out.append(SoakRequest(i, route, stream, after, body))
    return out


@dataclass
class Outcome:
    index: int
    route: str
    stream: bool
    disconnected: bool = False  # hung up on purpose before the end of the stream
    status: int = 0
    ok: bool = False
    error: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0


class Invalid(Exception):
    """A response that breaks the contract."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise Invalid(msg)


def _check_counts(req: SoakRequest, finish: str | None, completion_tokens: int | None,
                  token_ids: int | None, prompt_n: int | None) -> None:
    _check(finish in FINISH_REASONS, f"finish_reason {finish!r} not in {FINISH_REASONS}")
    if req.body.get("ignore_eos"):
        _check(finish == "length", f"ignore_eos without stop strings ended with {finish!r}")
    if completion_tokens is not None:
        _check(0 <= completion_tokens <= req.max_tokens,
               f"{completion_tokens} completion tokens for max_tokens {req.max_tokens}")
        if finish == "length":
            _check(completion_tokens == req.max_tokens,
                   f"finish 'length' after {completion_tokens} of {req.max_tokens} tokens")
        if token_ids is not None:
            # An EOS token that ends the reply is counted but not returned.
            _check(completion_tokens - 1 <= token_ids <= completion_tokens,
                   f"{token_ids} token ids for {completion_tokens} completion tokens")
    if prompt_n is not None and isinstance(req.body.get("prompt"), list):
        _check(prompt_n == len(req.body["prompt"]),
               f"timings.prompt_n {prompt_n} for a prompt of {len(req.body['prompt'])} ids")


def _validate_body(req: SoakRequest, body: Any) -> tuple[str, int]:
    chat = "chat" in req.route
    _check(isinstance(body, dict), "body is not a JSON object")
    _check(body.get("object") == ("chat.completion" if chat else "text_completion"),
           f"object {body.get('object')!r}")
    choices = body.get("choices")
    _check(isinstance(choices, list) and len(choices) == 1, "choices is not a 1-element list")
    c = choices[0]
    if chat:
        msg = c.get("message") or {}
        _check(msg.get("role") == "assistant" and isinstance(msg.get("content"), str),
               "message is not an assistant message with string content")
    else:
        _check(isinstance(c.get("text"), str), "text is not a string")
    usage, timings = body.get("usage") or {}, body.get("timings") or {}
    for key in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms"):
        _check(key in timings, f"timings lacks {key}")
    _check(usage.get("completion_tokens") == timings["predicted_n"],
           "usage.completion_tokens != timings.predicted_n")
    ids = c.get("token_ids")
    if req.body.get("return_token_ids"):
        _check(isinstance(ids, list), "return_token_ids: no choices[0].token_ids")
    _check_counts(req, c.get("finish_reason"), timings["predicted_n"],
                  len(ids) if isinstance(ids, list) else None, timings["prompt_n"])
    return c["finish_reason"], int(timings["predicted_n"])


def _read_stream(req: SoakRequest, r: httpx.Response, out: Outcome) -> None:
    chat = "chat" in req.route
    want = "chat.completion.chunk" if chat else "text_completion"
    _check(r.headers.get("content-type", "").startswith("text/event-stream"),
           f"content-type {r.headers.get('content-type')!r}")
    ids: set[str] = set()
    finish: str | None = None
    usage: dict[str, Any] | None = None
    events = token_ids = 0
    done = False
    for data in sse_data(r.iter_lines()):
        _check(not done, "data after [DONE]")
        if data == "[DONE]":
            done = True
            continue
        if req.disconnect_after is not None and events >= req.disconnect_after:
            out.disconnected = True
            return  # the caller's `with` closes the connection
        events += 1
        chunk = json.loads(data)
        _check("error" not in chunk, f"error event {chunk.get('error')}")
        _check(chunk.get("object") == want, f"chunk object {chunk.get('object')!r}")
        ids.add(chunk.get("id", ""))
        choices = chunk.get("choices")
        if not choices:  # the include_usage chunk
            _check(usage is None and "usage" in chunk, "choice-less chunk without usage")
            usage = chunk["usage"]
            continue
        _check(finish is None, "a choice after the finish_reason chunk")
        c = choices[0]
        if req.body.get("return_token_ids") and c.get("finish_reason") is None:
            _check(isinstance(c.get("token_ids"), list), "chunk without token_ids")
        token_ids += len(c.get("token_ids") or [])
        if c.get("finish_reason") is not None:
            finish = c["finish_reason"]
    _check(done, "stream ended without data: [DONE]")
    _check(len(ids) == 1, f"{len(ids)} different ids in one stream")
    _check(finish is not None, "no chunk with a finish_reason")
    want_usage = bool((req.body.get("stream_options") or {}).get("include_usage"))
    _check((usage is not None) == want_usage,
           f"usage chunk {'missing' if want_usage else 'not asked for'}")
    completion = int(usage["completion_tokens"]) if usage else None
    _check_counts(req, finish, completion,
                  token_ids if req.body.get("return_token_ids") else None,
                  usage.get("prompt_tokens") if usage else None)
    if completion is None and req.body.get("return_token_ids"):
        _check(token_ids <= req.max_tokens, f"{token_ids} tokens for max_tokens {req.max_tokens}")
        completion = token_ids
    out.finish_reason, out.completion_tokens = finish, completion


def run_request(client: httpx.Client, req: SoakRequest) -> Outcome:
    out = Outcome(req.index, req.route, req.stream)
    t0 = time.perf_counter()
    try:
        if req.stream:
            with client.stream("POST", req.route, json=req.body) as r:
                out.status = r.status_code
                if r.status_code != 200:
                    r.read()
                    raise Invalid(f"HTTP {r.status_code}: {r.text[:200]}")
                _read_stream(req, r, out)
        else:
            r = client.post(req.route, json=req.body)
            out.status = r.status_code
            _check(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}")
            out.finish_reason, out.completion_tokens = _validate_body(req, r.json())
        out.ok = True
    except Invalid as exc:
        out.error = str(exc)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class SoakResult:
    config: dict[str, Any]
    url: str
    requests: int = 0
    completed: int = 0
    disconnected: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    drained: bool = False
    running: float | None = None
    waiting: float | None = None
    kv_blocks_used: float | None = None
    kv_blocks_total: float | None = None
    cancelled: float | None = None  # server counter, delta over the soak
    rejected: float | None = None
    succeeded: float | None = None
    mean_ttft_ms: float | None = None
    mean_itl_ms: float | None = None
    # speculative decoding (a server running drafts): draft tokens verified and accepted
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    rss_start_mib: float | None = None
    rss_middle_mib: float | None = None
    rss_end_mib: float | None = None
    rss_rule: str = RSS_RULE
    rss_flat: bool | None = None  # None: RSS not sampled (server pid unknown)
    server_alive: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def _hist_mean_ms(before: Metrics, after: Metrics, name: str) -> float | None:
    if not (after.has(name + "_sum") and before.has(name + "_sum")):
        return None
    n = after.value(name + "_count") - before.value(name + "_count")
    s = after.value(name + "_sum") - before.value(name + "_sum")
    return 1000 * s / n if n > 0 else None


def _warm_up(client: httpx.Client, vocab: int) -> None:
    body = {"prompt": [i % vocab for i in range(1, 9)], "max_tokens": 4, "temperature": 0}
    for stream in (False, True):
        with client.stream("POST", "/v1/completions", json={**body, "stream": stream}) as r:
            r.read()
            if r.status_code != 200:
                raise BenchError(f"warm-up request answered {r.status_code}: {r.text[:200]}")


def chat_cost(client: httpx.Client) -> ChatCost:
    """Measures the chat template's overhead and the tokens per word of WORDS."""
    def prompt_tokens(words: list[str]) -> int:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": " ".join(words)}], "max_tokens": 1})
        if r.status_code != 200:
            raise BenchError(f"chat calibration answered {r.status_code}: {r.text[:200]}")
        return int(r.json()["usage"]["prompt_tokens"])

    one, all_words = prompt_tokens(WORDS[:1]), prompt_tokens(list(WORDS))
    per_word = max(1.0, (all_words - one) / (len(WORDS) - 1))
    return ChatCost(overhead=max(0, one - int(per_word)) + 4, per_word=per_word)


def run_soak(endpoint: Endpoint, cfg: SoakConfig, *, vocab_size: int | None = None,
             progress: Any = None) -> SoakResult:
    """Runs the soak against `endpoint`; `progress(done, total)` is called per request."""
    res = SoakResult(config=asdict(cfg), url=endpoint.base_url, requests=cfg.requests)
    with endpoint.client(timeout=cfg.request_timeout,
                         connections=cfg.concurrency + 4) as client:
        facts = model_facts(client)
        vocab = vocab_size or facts.vocab_size or SAFE_VOCAB
        _warm_up(client, vocab)
        cost = chat_cost(client) if cfg.chat_rate > 0 else None
        plan = plan_requests(cfg, vocab, facts.max_model_len, cost)
        before = fetch_metrics(client)
        for name in (KV_USED, KV_TOTAL, CANCELLED):  # fail early on a missing metric
            before.value(name)
        pid = endpoint.pid
        rss: dict[str, int] = {}
        if pid is not None:
            rss["start"] = rss_bytes(pid)
        outcomes: list[Outcome] = []
        lock = threading.Lock()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(cfg.concurrency) as pool:
            futures = [pool.submit(run_request, client, req) for req in plan]
            for fut in as_completed(futures):
                with lock:
                    outcomes.append(fut.result())
                    done = len(outcomes)
                if pid is not None and done == max(1, cfg.requests // 2):
                    rss["middle"] = rss_bytes(pid)
                if progress is not None:
                    progress(done, cfg.requests)
        res.wall_seconds = time.perf_counter() - t0
        res.server_alive = endpoint.alive()
        if not res.server_alive:
            res.problems.append("the server exited:\n" + endpoint.log_tail())
            after: Metrics | None = None
        else:
            after, res.drained = wait_idle(client, cfg.drain_timeout)
            if pid is not None:
                rss["end"] = rss_bytes(pid)

    by_index = {req.index: req for req in plan}
    outcomes.sort(key=lambda o: o.index)
    for o in outcomes:
        res.statuses[str(o.status)] = res.statuses.get(str(o.status), 0) + 1
        if not o.ok:
            res.failed += 1
            res.failures.append(f"{by_index[o.index].describe()}: {o.error}")
        elif o.disconnected:
            res.disconnected += 1
        else:
            res.completed += 1
            res.completion_tokens += o.completion_tokens or 0
    res.finish_reasons = dict(Counter(o.finish_reason for o in outcomes
                                      if o.ok and o.finish_reason))
    if res.failed:
        res.problems.append(f"{res.failed} of {cfg.requests} requests failed")

    if after is not None:
        res.running, res.waiting = after.value(RUNNING), after.value(WAITING)
        res.kv_blocks_used, res.kv_blocks_total = after.value(KV_USED), after.value(KV_TOTAL)
        res.cancelled = after.value(CANCELLED) - before.value(CANCELLED)
        if after.has(REJECTED):
            res.rejected = after.value(REJECTED) - before.value(REJECTED)
        if after.has(SUCCESS):
            res.succeeded = after.value(SUCCESS) - before.value(SUCCESS)
        if after.has(DRAFTS):
            res.draft_tokens = after.value(DRAFTS) - (before.get(DRAFTS) or 0.0)
            res.accepted_tokens = after.value(ACCEPTED) - (before.get(ACCEPTED) or 0.0)
        res.mean_ttft_ms = _hist_mean_ms(before, after, TTFT)
        res.mean_itl_ms = _hist_mean_ms(before, after, ITL)
        if res.running or res.waiting:
            res.problems.append(f"not drained after {cfg.drain_timeout:g} s: "
                                f"{res.running:g} running, {res.waiting:g} waiting")
        if res.kv_blocks_used:
            res.problems.append(f"{res.kv_blocks_used:g} KV blocks still in use after the "
                                "server drained (leak)")
    if "start" in rss:
        res.rss_start_mib = rss["start"] / MIB
        res.rss_middle_mib = rss["middle"] / MIB if "middle" in rss else None
        if "end" in rss:
            res.rss_end_mib = rss["end"] / MIB
            res.rss_flat = rss_flat(rss["start"], rss["end"])
            if not res.rss_flat:
                res.problems.append(f"RSS grew from {res.rss_start_mib:.1f} to "
                                    f"{res.rss_end_mib:.1f} MiB ({RSS_RULE})")
    return res


def render_soak(res: SoakResult) -> Any:
    """A rich Table of the result."""
    from rich.table import Table

    def fmt(v: float | None, spec: str = "g") -> str:
        return "-" if v is None else format(v, spec)

    cfg = res.config
    t = Table(title=f"ninfer-bench soak: {res.url}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("requests", f"{res.requests} with {cfg['concurrency']} in flight, seed "
              f"{cfg['seed']}, disconnect rate {cfg['disconnect_rate']:g}")
    t.add_row("answered in full", str(res.completed))
    t.add_row("hung up mid stream", str(res.disconnected))
    t.add_row("failed", f"[red]{res.failed}[/red]" if res.failed else "0")
    t.add_row("HTTP statuses", ", ".join(f"{k}: {v}" for k, v in sorted(res.statuses.items())))
    t.add_row("finish reasons",
              ", ".join(f"{k}: {v}" for k, v in sorted(res.finish_reasons.items())) or "-")
    rate = res.completion_tokens / res.wall_seconds if res.wall_seconds else 0
    t.add_row("wall time", f"{res.wall_seconds:.1f} s, {res.completion_tokens} tokens in full "
              f"answers ({rate:.1f}/s)")
    t.add_row("server: cancelled/rejected/ok",
              f"{fmt(res.cancelled)} / {fmt(res.rejected)} / {fmt(res.succeeded)}")
    t.add_row("server: mean TTFT / ITL",
              f"{fmt(res.mean_ttft_ms, '.1f')} ms / {fmt(res.mean_itl_ms, '.2f')} ms")
    if res.draft_tokens is not None:
        t.add_row("server: draft tokens accepted",
                  f"{fmt(res.accepted_tokens)} of {fmt(res.draft_tokens)}")
    t.add_row("drained", f"{res.drained} (running {fmt(res.running)}, waiting "
              f"{fmt(res.waiting)})")
    leak = res.kv_blocks_used not in (None, 0)
    t.add_row("KV blocks used, drained",
              ("[red]" if leak else "") + f"{fmt(res.kv_blocks_used)} of "
              f"{fmt(res.kv_blocks_total)}" + ("[/red]" if leak else ""))
    if res.rss_start_mib is None:
        t.add_row("RSS", "not sampled (server pid unknown; pass --pid with --url)")
    else:
        t.add_row("RSS start/middle/end",
                  f"{fmt(res.rss_start_mib, '.1f')} / {fmt(res.rss_middle_mib, '.1f')} / "
                  f"{fmt(res.rss_end_mib, '.1f')} MiB ({RSS_RULE}: "
                  f"{'yes' if res.rss_flat else 'NO'})")
    t.add_row("verdict", "[green]PASS[/green]" if res.passed else "[red]FAIL[/red]")
    return t
