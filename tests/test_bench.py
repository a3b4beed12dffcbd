"""`ninfer-bench`: the pieces on their own, then a short soak and a serving smoke run
against the compiled qwen3-tiny server."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
from click.testing import CliRunner

from ninfer.bench.cli import main as bench_main
from ninfer.runtime.client import (
    MIB,
    MetricsError,
    SseReader,
    StreamTrace,
    parse_metrics,
    rate_in_window,
    rss_bytes,
    rss_flat,
    sse_data,
)
from ninfer.runtime.soak import ChatCost, SoakConfig, plan_requests

METRICS_TEXT = """\
# HELP ninfer:num_requests_running Number of requests holding a sequence slot.
# TYPE ninfer:num_requests_running gauge
ninfer:num_requests_running 2.0
# TYPE ninfer:requests_rejected_total counter
ninfer:requests_rejected_total{reason="queue_full"} 3.0
ninfer:requests_rejected_total{reason="context_length"} 1.0
# TYPE ninfer:time_to_first_token_seconds histogram
ninfer:time_to_first_token_seconds_bucket{le="0.1"} 1.0
ninfer:time_to_first_token_seconds_bucket{le="+Inf"} 2.0
ninfer:time_to_first_token_seconds_sum 0.5
ninfer:time_to_first_token_seconds_count 2.0
"""


@pytest.mark.unit
def test_metrics_lookup_by_name_and_labels():
    m = parse_metrics(METRICS_TEXT)
    assert m.value("ninfer:num_requests_running") == 2
    assert m.value("ninfer:requests_rejected_total") == 4
    assert m.value("ninfer:requests_rejected_total", reason="queue_full") == 3
    assert m.value("ninfer:time_to_first_token_seconds_count") == 2
    with pytest.raises(MetricsError, match="no 'ninfer:kv_blocks_used'"):
        m.value("ninfer:kv_blocks_used")


@pytest.mark.unit
def test_rss_rule_and_reading():
    assert rss_flat(100 * MIB, 110 * MIB + 16 * MIB)
    assert not rss_flat(100 * MIB, 110 * MIB + 16 * MIB + 1)
    import os

    assert rss_bytes(os.getpid()) > MIB


@pytest.mark.unit
def test_rate_in_window_and_sse_payloads():
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    assert rate_in_window(times, 0.0, 0.4) == pytest.approx(10.0)
    assert rate_in_window(times, 0.15, 0.25) is None  # one token is not a rate
    assert rate_in_window(times, 0.4, 0.4) is None
    lines = ["data: {\"a\": 1}", "", ": comment", "data:[DONE]", ""]
    assert list(sse_data(lines)) == ['{"a": 1}', "[DONE]"]


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.mark.unit
@pytest.mark.parametrize("split", [1, 7, 10_000])
def test_sse_reader_splits_chunks_and_events_wherever_bytes_arrive(split):
    """The benchmark's stream reader: HTTP chunk framing and SSE events split at any byte,
    the last chunk in the same read as the events before it."""
    ev = [b'data: {"choices": [{"token_ids": [5, 6]}]}\n\n',
          b'data: {"choices": [{"token_ids": [7], "finish_reason": "length"}]}\n\n'
          b"data: [DONE]\n\n"]
    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(ev[0][:20], ev[0][20:], ev[1]))
    reader = SseReader(StreamTrace(sent=0.0), None)
    clock = itertools.count(1).__next__
    fed = 0
    while reader.feed(raw[fed:fed + split], clock):
        fed += split
        assert fed < len(raw), "the reader missed the end of the stream"
    assert fed + split >= raw.index(b"[DONE]") + 8  # it ends at [DONE], not before
    assert not reader.feed(b"0\r\n\r\n", clock)  # nothing is parsed once it ended
    t = reader.trace
    assert (t.status, len(t.times), t.finish_reason, t.error) == (200, 3, "length", None)
    assert t.headers < t.times[0] == t.times[1] < t.times[2]  # one time per event


@pytest.mark.unit
def test_sse_reader_reports_errors_and_truncated_streams():
    refused = SseReader(StreamTrace(sent=0.0), None)
    assert refused.feed(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 12\r\n\r\n"
                        b'{"error": 1}')  # the error body is read to the close
    assert (refused.trace.status, refused.trace.error) == (429, '{"error": 1}')
    cut = SseReader(StreamTrace(sent=0.0), None)
    body = _chunked(b'data: {"choices": [{"token_ids": [1]}]}\n\n')
    assert not cut.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert len(cut.trace.times) == 1 and "without [DONE]" in (cut.trace.error or "")
    failed = SseReader(StreamTrace(sent=0.0), None)
    body = _chunked(b'data: {"error": {"message": "boom"}}\n\n')
    assert not failed.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert "boom" in (failed.trace.error or "")


@pytest.mark.unit
def test_soak_plan_is_seeded_and_fits_the_context():
    cfg = SoakConfig(requests=300, seed=7, disconnect_rate=0.3, max_tokens_range=(1, 64),
                     prompt_len_range=(1, 400))
    plan = plan_requests(cfg, vocab_size=500, max_model_len=256,
                         chat_cost=ChatCost(overhead=20, per_word=3))
    assert plan == plan_requests(cfg, 500, 256, ChatCost(overhead=20, per_word=3))
    assert plan != plan_requests(SoakConfig(requests=300, seed=8), 500, 256)
    hangups = [r for r in plan if r.disconnect_after is not None]
    assert 0.2 < len(hangups) / len(plan) < 0.4
    for r in hangups:  # they stream, and hang up before the reply can end
        assert r.stream and r.body["ignore_eos"] and r.disconnect_after < r.max_tokens
    for r in plan:
        if "prompt" in r.body:
            assert all(0 <= t < 500 for t in r.body["prompt"])
            assert len(r.body["prompt"]) + r.max_tokens <= 256
        else:
            words = len(r.body["messages"][0]["content"].split())
            assert 20 + 3 * words + r.max_tokens <= 256
    assert {r.route for r in plan} == {"/v1/completions", "/v1/chat/completions"}
    assert {r.stream for r in plan} == {True, False}


@pytest.mark.e2e
def test_soak_answers_everything_and_leaks_no_blocks(qwen3_model, tmp_path):
    out = tmp_path / "soak.json"
    r = CliRunner().invoke(bench_main, [
        "soak", str(qwen3_model.out_dir), "--requests", "24", "--concurrency", "4",
        "--disconnect-rate", "0.25", "--max-tokens-range", "1,16",
        "--prompt-len-range", "1,100", "--seed", "3", "--threads", "2",
        "--json", str(out)])
    res = json.loads(out.read_text()) if out.exists() else {}
    assert r.exit_code == 0, r.output
    assert res["failed"] == 0 and res["failures"] == []
    assert res["drained"] and res["kv_blocks_used"] == 0
    assert res["disconnected"] > 0 and res["completed"] + res["disconnected"] == 24
    assert res["rss_flat"] is True


def _fake_traces(c: int, start: float, step: float, n: int = 10) -> list[StreamTrace]:
    """c streams whose tokens arrive every `step` seconds from `start`, all together."""
    return [StreamTrace(sent=0.0, status=200, done=start + n * step,
                        times=[start + k * step for k in range(n)]) for _ in range(c)]


def test_scaling_rates_come_from_the_common_window_and_pair_by_round(monkeypatch):
    # injected arrival times and server timings: the arithmetic, not the machine's speed
    from ninfer.bench import serving
    rounds = iter([
        _fake_traces(1, 1.0, 0.1),  # round 1: one stream at 10 tok/s
        _fake_traces(2, 1.0, 0.1),  # two streams, same steps: 20 tok/s together
        _fake_traces(1, 1.0, 0.05),  # round 2: the machine is twice as fast
        _fake_traces(2, 1.0, 0.1),
    ])
    monkeypatch.setattr(serving, "stream_many", lambda client, bodies: next(rounds))
    ms = iter([1000.0, 1000.0, 1000.0, 500.0, 500.0, 500.0])  # server: 9 tokens over these

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"timings": {"predicted_n": 10,
                                                     "predicted_ms": next(ms)}})

    cfg = serving.ServingConfig(levels=(1, 2, 4), repeats=2)
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x") as client:
        one, two, four = serving.measure_scaling(client, cfg, max_concurrency=2)
    # 9 tokens in (first, last] = 0.9 s per stream; the median over rounds
    assert one.aggregate_tps == pytest.approx((10 + 20) / 2)
    assert two.aggregate_tps == pytest.approx(20)
    # each round's ratio to its own single stream: 2.0 and 1.0
    assert two.ratio == pytest.approx(1.5)
    assert one.server_tps == pytest.approx((9 + 18) / 2)
    assert two.server_tps == pytest.approx((18 + 36) / 2)
    assert two.server_ratio == pytest.approx(2.0)
    assert four.aggregate_tps is None and "above the server's 2" in four.note


def test_scaling_without_a_common_decode_window_says_so(monkeypatch):
    # every token of a stream in one read (a fast model on a busy machine): no window
    from ninfer.bench import serving
    monkeypatch.setattr(serving, "stream_many",
                        lambda client, bodies: _fake_traces(len(bodies), 1.0, 0.0))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"timings": {"predicted_n": 10, "predicted_ms": 1.0}})

    cfg = serving.ServingConfig(levels=(1,), repeats=1)
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x") as client:
        (one,) = serving.measure_scaling(client, cfg, max_concurrency=None)
    assert one.aggregate_tps is None and one.ratio is None
    assert one.note == "no common decode window"
    assert one.server_tps == pytest.approx(9000.0)


@pytest.mark.e2e
def test_serving_benchmark_runs(qwen3_model, tmp_path):
    # the whole command against a real server; the tiny model decodes 32 tokens in
    # milliseconds, so whether streamed tokens arrive spread out enough to be rated
    # depends on the machine (the arithmetic is tested above with injected times)
    out = tmp_path / "serving.json"
    r = CliRunner().invoke(bench_main, [
        "serving", str(qwen3_model.out_dir), "--levels", "1,2", "--repeats", "1",
        "--decode-tokens", "32", "--threads", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    fair = res["fairness"]
    assert fair["b_prompt_tokens"] == 8 * fair["prefill_chunk"]
    assert (fair["solo_tps"] is not None and fair["solo_tps"] > 0) or \
        any("too close together" in n for n in fair["notes"]), fair
    assert [s["concurrency"] for s in res["scaling"]] == [1, 2]
    one, two = res["scaling"]
    # the server's own timings always rate a request of 32 tokens
    assert all(s["server_tps"] > 0 for s in (one, two)), res
    assert two["server_ratio"] == pytest.approx(two["server_tps"] / one["server_tps"])
    for s in (one, two):
        assert (s["aggregate_tps"] is not None and s["aggregate_tps"] > 0) or \
            s["note"] == "no common decode window", res
    if one["aggregate_tps"] and two["aggregate_tps"]:
        assert two["ratio"] == pytest.approx(two["aggregate_tps"] / one["aggregate_tps"])


@pytest.mark.e2e
def test_soak_reports_failed_requests(qwen3_model, tmp_path):
    out = tmp_path / "soak.json"  # token ids past the vocabulary: every request gets 400
    r = CliRunner().invoke(bench_main, [
        "soak", str(qwen3_model.out_dir), "--requests", "4", "--concurrency", "2",
        "--chat-rate", "0", "--vocab-size", "1000000", "--prompt-len-range", "50,60",
        "--threads", "2", "--json", str(out)])
    assert r.exit_code == 1, r.output
    res = json.loads(out.read_text())
    assert res["failed"] == 4 and res["statuses"] == {"400": 4} and not res["passed"]
    assert "HTTP 400" in res["failures"][0]


def test_roofline_best_of_takes_each_figure_at_its_best():
    from ninfer.roofline import Roofline, best_of

    a = Roofline(2, read_gbps=20.0, read_huge_gbps=30.0, fma_gflops=100.0, buffer_bytes=1,
                 fma_256_gflops=60.0, read_plain_gbps=19.0)
    b = Roofline(2, read_gbps=25.0, read_huge_gbps=28.0, fma_gflops=90.0, buffer_bytes=1,
                 fma_256_gflops=70.0, read_plain_gbps=18.0)
    best = best_of([a, b])
    assert (best.read_gbps, best.read_huge_gbps, best.fma_gflops, best.fma_256_gflops,
            best.read_plain_gbps) == (25.0, 30.0, 100.0, 70.0, 19.0)
    assert best.best_read_gbps == 30.0
    with pytest.raises(ValueError):
        best_of([])


def test_roofline_probe_builds_and_reports_each_pass():
    """The C read/FMA probe the benchmarks print their roofline from: built for this host,
    it reports one figure per pass (each read pattern in turn), each pattern's best, and
    the best of them all."""
    import json
    import subprocess

    from ninfer import roofline

    exe = roofline.probe_binary()
    out = json.loads(subprocess.run([str(exe), "read", str(64 << 20), "2", "3", "1"],
                                    capture_output=True, text=True, check=True).stdout)
    patterns = out["patterns"]
    assert "plain" in patterns and len(patterns) >= 2
    assert len(out["runs"]) == 3 * len(patterns) and out["gbps"] == max(out["runs"]) > 0
    assert max(patterns.values()) == out["gbps"]
    for i, name in enumerate(patterns):  # passes cycle through the patterns
        assert patterns[name] == max(out["runs"][i::len(patterns)])
    assert out["bytes"] == 64 << 20
    assert roofline.read_patterns(64 << 20, 2, repeats=1).keys() == patterns.keys()
    peak, peak_256 = roofline.fma_gflops(1, repeats=1)
    assert peak >= peak_256 > 0
    bad = subprocess.run([str(exe), "write"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_gemv_streams_follow_the_faster_read_pattern():
    """One stream a thread where the plain read beat every prefetched two-stream pattern
    (the Zen 4 VM of RESULTS 2026-12-06), two where a prefetched pattern read faster (the
    Intel VMs before it); no pattern to compare is an error, not a guess."""
    from ninfer import roofline

    zen4 = {"plain": 36.7, "s2p512": 29.7, "s2p1024": 32.2, "s4p512": 34.1}
    intel = {"plain": 27.0, "s2p512": 35.4, "s2p1024": 36.9, "s4p512": 33.0}
    assert roofline.gemv_streams_for(zen4) == 1
    assert roofline.gemv_streams_for(intel) == 2
    assert roofline.gemv_streams_for({**intel, "s4p512": 99.0}) == 2  # only s2 is chosen from
    with pytest.raises(roofline.RooflineError, match="no plain and two-stream"):
        roofline.gemv_streams_for({"plain": 30.0})


def test_host_gemv_streams_measures_once_per_cpu(monkeypatch, tmp_path):
    """The choice is measured once per CPU and read back from the cache file after; the
    environment variable overrides it (and is checked); another CPU is measured anew."""
    from ninfer import roofline

    monkeypatch.delenv(roofline.STREAMS_ENV, raising=False)
    calls = []

    def probe(nbytes, threads, repeats=5, huge=False):
        calls.append((threads, huge))
        return {"plain": 36.7, "s2p512": 29.7, "s2p1024": 32.2, "s4p512": 34.1}

    monkeypatch.setattr(roofline, "read_patterns", probe)
    cache = tmp_path / "host-read.json"
    assert roofline.host_gemv_streams(cache)[0] == 1
    streams, why = roofline.host_gemv_streams(cache)
    assert streams == 1 and "measured before" in why and "36.7" in why and "32.2" in why
    assert len(calls) == 1 and calls[0][1] is True  # huge pages, as the engine's weights
    monkeypatch.setattr(roofline, "_host_id", lambda: "another cpu")
    assert roofline.host_gemv_streams(cache)[0] == 1 and len(calls) == 2
    assert len(json.loads(cache.read_text())) == 2
    blocked = tmp_path / "file"
    blocked.write_text("")
    streams, why = roofline.host_gemv_streams(blocked / "host-read.json")  # a file as its dir
    assert streams == 1 and "not kept" in why and len(calls) == 3
    monkeypatch.setenv(roofline.STREAMS_ENV, "2")
    assert roofline.host_gemv_streams(cache) == (2, f"{roofline.STREAMS_ENV}=2")
    monkeypatch.setenv(roofline.STREAMS_ENV, "3")
    with pytest.raises(roofline.RooflineError, match="must be 1 or 2"):
        roofline.host_gemv_streams(cache)
    assert len(calls) == 3


def test_bf16_activations_auto_follows_the_vdpbf16ps_probe(monkeypatch, tmp_path):
    """--cpu-bf16-activations auto rounds x to bf16 only where vdpbf16ps gives
    DPBF16_MIN_GAIN x the FMAs' multiply-adds (measured once per CPU), never without the
    instruction; the probe itself runs where the host has it."""
    from ninfer import pipeline, roofline
    from ninfer.options import CompileOptions
    from ninfer.targets import load_target

    rates = {"zen4": {"dp_gmacs": 110.0, "fma_gmacs": 55.0},
             "intel": {"dp_gmacs": 56.0, "fma_gmacs": 116.0}}
    host = ["zen4"]
    calls = []
    monkeypatch.setattr(roofline, "_host_id", lambda: host[0])
    monkeypatch.setattr(roofline, "dpbf16_rates",
                        lambda repeats=3: calls.append(host[0]) or rates[host[0]])
    cache = tmp_path / "dpbf16.json"
    pays, why = roofline.host_dpbf16_pays(cache)
    assert pays and "measured now" in why and "110 G" in why and "55 G" in why
    assert roofline.host_dpbf16_pays(cache)[0] and len(calls) == 1  # kept
    host[0] = "intel"
    assert not roofline.host_dpbf16_pays(cache)[0] and calls == ["zen4", "intel"]

    monkeypatch.setattr(roofline, "HOST_DPBF16_FILE", cache)  # the compile's (default) file
    cpu, h100 = load_target("cpu"), load_target("h100")
    auto = CompileOptions(tmp_path)
    for has_dp in (False, True):
        monkeypatch.setattr(pipeline, "_host_dpbf16", lambda target, v=has_dp: v)
        for name in ("zen4", "intel"):
            host[0] = name
            assert pipeline._auto_x_bf16(auto, cpu)[0] == (has_dp and name == "zen4")
        assert pipeline._auto_x_bf16(auto, h100) == (False, "")
        assert pipeline._auto_x_bf16(CompileOptions(tmp_path, cpu_bf16_activations="f32"),
                                     cpu) == (False, "")
    assert len(calls) == 2  # both hosts read back from the cache
    from ninfer.kernels.cpu.matmul import use_dpbf16

    if use_dpbf16():  # this host: the real probe runs and measures both
        real = roofline.dpbf16_rates(repeats=1)
        assert real["dp_gmacs"] > 0 and real["fma_gmacs"] > 0


def test_roofline_probe_buffer_outgrows_the_last_level_cache(monkeypatch):
    """A cache that keeps part of a re-read buffer inflates the read probe: its buffer is
    at least four times the last-level cache, and never smaller than the model's bytes."""
    from ninfer import roofline

    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 480 << 20)
    assert roofline.probe_bytes(1 << 30) == 4 * (480 << 20)
    assert roofline.probe_bytes(3 << 30) == 3 << 30
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 0)
    assert roofline.probe_bytes(1 << 20) == 256 << 20


def test_last_level_cache_is_the_largest_cache_sysfs_lists(tmp_path):
    from ninfer.roofline import last_level_cache_bytes

    for i, size in enumerate(["48K", "64K", "2048K", "491520K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 480 << 20
    (tmp_path / "index4").mkdir()
    (tmp_path / "index4" / "size").write_text("1M\n")  # a unit the kernel may also write
    assert last_level_cache_bytes(tmp_path) == 480 << 20
    (tmp_path / "index3" / "size").write_text("2G\n")
    assert last_level_cache_bytes(tmp_path) == 2 << 30
    assert last_level_cache_bytes(tmp_path / "absent") == 0


def test_bench_counts_kv_and_recurrent_state_bytes_of_a_decode_step():
    """bench_llamacpp's bytes per token beyond the weights, the same for both engines: f16
    K and V of each attention layer up to the context; a Gated DeltaNet layer's f32
    recurrent and conv state, read and written."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_llamacpp import state_bytes_per_token

    dense = {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128}
    assert state_bytes_per_token(dense, 160) == 28 * 2 * 8 * 128 * 160 * 2
    hybrid = {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 256,
              "layer_types": ["linear_attention"] * 3 + ["full_attention"],
              "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 16,
              "linear_conv_kernel_dim": 4}
    kv = 1 * 2 * 2 * 256 * 100 * 2
    state = 16 * 128 * 128 * 4 + (2 * 16 * 128 + 16 * 128) * 3 * 4
    assert state_bytes_per_token(hybrid, 100) == kv + 3 * 2 * state


def test_bench_sets_the_best_decode_window_against_the_probes_beside_it(monkeypatch):
    """bench_llamacpp's "loc": the best decode window's rate over the better of the two
    read probes taken right before and after it (not the probes around the whole run),
    with the clock injected: window w of a repeat takes `costs[w]` seconds."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_llamacpp as bench

    now = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    window_cost = {0: 1.0, 1: 0.5, 2: 2.0, 3: 1.0}  # the second window is the fastest

    def forward(ids: list[int], pos: int) -> None:
        if len(ids) == 1:  # a decode step: its window's share of the window's cost
            w = (pos - bench.DECODE_CONTEXT) // bench.DECODE_WINDOW
            now[0] += window_cost[w] / bench.DECODE_WINDOW
        else:
            now[0] += 0.25

    probes = iter([30.0, 31.0, 20.0, 33.0, 34.0])  # before window 0, then after each
    dec, pre, bw, placed = bench._measure(forward, lambda: None, 4 * bench.DECODE_WINDOW, 1,
                                          probe=lambda: next(probes))
    assert dec == bench.DECODE_WINDOW / 0.5 and pre == len(bench.PROMPT) / 0.25
    assert bw == 31.0  # window 1: probes 31 before it, 20 after it
    assert placed == {}  # probes that name no placement
    run = bench.Rates(dec, pre, 1e9, window_gbps=bw)
    failed = bench.Rates(0.0, 0.0, 0.0, note="failed")
    assert bench._local_fraction([run, failed], 0.0) == dec / 31.0

    # "pl": probes that name the threads' placement before and after them. A window lies in
    # a placement where the probes on both sides agree on it (windows 0: smt, 3: ccd;
    # 1 and 2 straddle a move); a probe counts for a placement where its own two ends agree.
    now[0] = 0.0
    window_cost[3] = 0.8
    probes = iter([(30.0, "smt", "smt"), (31.0, "smt", "smt"), (50.0, "far", "far"),
                   (33.0, "smt", "ccd"), (34.0, "ccd", "ccd")])
    dec, _, bw, placed = bench._measure(forward, lambda: None, 4 * bench.DECODE_WINDOW, 1,
                                        probe=lambda: next(probes))
    assert dec == bench.DECODE_WINDOW / 0.5 and bw == 50.0  # window 1, unplaced
    assert sorted(placed) == ["ccd", "smt"]
    assert placed["smt"] == pytest.approx([bench.DECODE_WINDOW / 1.0, 30.5])  # window 0
    assert placed["ccd"] == pytest.approx([bench.DECODE_WINDOW / 0.8, 34.0])  # window 3
    run = bench.Rates(dec, 0.0, 1e9, placed=placed)
    # "pl": the best placed window (window 3, in ccd); by placement: each its own
    assert bench._placed_fraction([run, failed], 0.0) == pytest.approx(
        bench.DECODE_WINDOW / 0.8 / 34.0)
    assert bench._placed_fraction([run, failed], 0.0, "smt") == pytest.approx(
        bench.DECODE_WINDOW / 30.5)
    assert bench._placed_fraction([run], 0.0, "far") == 0.0  # a probe there, no window
    assert bench._placed_cell([run, failed], 0.0, "smt") == f"{bench.DECODE_WINDOW / 30.5:.0%} (1)"
    assert bench._placed_cell([run], 0.0, "far") == "-"


def test_ab_variant_sets_kernel_attributes_and_restores_them():
    """The A/B benchmarks' variants (ab_cpu_matmul, ab_engine_decode): the kernel modules'
    attributes hold the variant's values while it is applied and their own after, also when
    the build under it fails."""
    import sys
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from ab_cpu_matmul import variant_applied

    from ninfer.kernels.cpu import matmul, qmatmul

    streams, tiles = matmul.GEMV_STREAMS, qmatmul.GEMV_TILES
    with variant_applied("matmul.GEMV_STREAMS={16: (1, 1, 1)}; "
                         "qmatmul.GEMV_TILES=QTiles(mr=1, nr=3, mb=1, panels=0)"):
        assert matmul.GEMV_STREAMS == {16: (1, 1, 1)}
        assert qmatmul.GEMV_TILES.nr == 3
    assert matmul.GEMV_STREAMS is streams and qmatmul.GEMV_TILES is tiles
    with pytest.raises(RuntimeError), variant_applied("matmul.GEMV_STREAMS={}"):
        assert matmul.GEMV_STREAMS == {}
        raise RuntimeError("build failed")
    assert matmul.GEMV_STREAMS is streams
    # `@REV`: the kernel files as they were at REV (attention.py through the builders' table)
    from ninfer.kernels.cpu import attention, build

    own = matmul.matmul
    with variant_applied("@HEAD"):
        for func in (build._BUILDERS["attention"], matmul.matmul):
            assert func.__module__.startswith("ninfer.kernels.cpu._ab_"), func.__module__
    assert build._BUILDERS["attention"] is attention.attention and matmul.matmul is own


def _profiled_calls(out_dir, steps: int, skip: int) -> dict[str, int]:
    """Kernel calls per kernel that NINFER_PROFILE reports for `steps` decode steps of the
    compiled model's engine, the process's first `skip` calls left out."""
    import os
    import re
    import subprocess
    import sys

    code = ("import sys; from ninfer.runtime.engine import load_engine\n"
            "e = load_engine(sys.argv[1], threads=2)\n"
            "for i in range(int(sys.argv[2])): e.forward([3 + i], i)\n")
    env = {**os.environ, "NINFER_PROFILE": "1", "NINFER_PROFILE_SKIP": str(skip)}
    proc = subprocess.run([sys.executable, "-c", code, str(out_dir), str(steps)], env=env,
                          capture_output=True, text=True, check=True)
    rows = re.findall(r"^\s*(\d+)\s+[\d.]+\s+[\d.]+%\s+(\S+)$", proc.stderr, re.MULTILINE)
    return {name: int(n) for n, name in rows}


def test_kernel_profile_skips_the_first_calls(qwen3_model):
    # profile_decode leaves a warm-up out this way: skipping one step's calls of a
    # two-step run leaves exactly the calls of the other step
    one = _profiled_calls(qwen3_model.out_dir, 1, 0)
    two = _profiled_calls(qwen3_model.out_dir, 2, 0)
    rest = _profiled_calls(qwen3_model.out_dir, 2, sum(one.values()))
    assert sum(two.values()) == 2 * sum(one.values()) > 0
    assert rest == one


def test_one_row_decode_takes_q_k_and_v_in_one_gemv(qwen3_model, qwen2_model):
    """The cpu plan's qkv gemv (plan.qkv_fusable) serves a one-row step where the artifact
    holds q, k and v back to back (the tiny Qwen3's f32 panels: whole 4 KiB pages each);
    the tiny Qwen2's 512-byte biases are padded apart, so its model checks that at load and
    keeps the three gemvs (both models' outputs are checked against transformers in
    test_parity)."""
    import json

    def kernels(model) -> dict[str, str]:
        report = json.loads((model.out_dir / "compile_report.json").read_text())
        return report["plan"]["kernels"]

    names = kernels(qwen3_model)
    calls = _profiled_calls(qwen3_model.out_dir, 1, 0)
    assert calls[names["qkv_gemv"]] == 2  # one per layer
    assert names["k_gemv"] not in calls  # the k and v gemvs' shape: no call
    names = kernels(qwen2_model)
    calls = _profiled_calls(qwen2_model.out_dir, 1, 0)
    assert names["qkv_gemv"] not in calls
    assert calls[names["k_gemv"]] == 3 * 2  # q, k and v (one shape, with bias), two layers
