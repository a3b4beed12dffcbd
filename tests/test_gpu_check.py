"""benchmarks/gpu_check.py's verdicts on faked outputs (no GPU): an early stop is a
mismatch, and a memcheck run is clean only with compute-sanitizer's closing summary of 0
errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check

pytestmark = pytest.mark.unit


def _response(ids: list[int], finish: str = "length") -> dict:
    return {"choices": [{"token_ids": ids, "finish_reason": finish}]}


def test_tokens_match_only_when_equal():
    want = [5, 6, 7, 8]
    assert gpu_check.check_tokens("t", _response([5, 6, 7, 8]), want)
    # an early stop used to pass as a match
    assert not gpu_check.check_tokens("t", _response([5, 6], "stop"), want)
    assert not gpu_check.check_tokens("t", _response([5, 6, 7, 8, 9]), want)
    assert not gpu_check.check_tokens("t", _response([5, 6, 9, 8]), want)
    assert not gpu_check.check_tokens("t", {"error": {"message": "boom"}}, want)


CLEAN = ["========= COMPUTE-SANITIZER", "ninfer-server: listening",
         "========= ERROR SUMMARY: 0 errors"]


def test_memcheck_clean_needs_the_closing_summary():
    assert gpu_check.sanitizer_verdict(CLEAN) == (True, "ERROR SUMMARY: 0 errors")
    # the tool was stopped before it wrote its summary (as the 2026-12-04 run was)
    ok, why = gpu_check.sanitizer_verdict(CLEAN[:2])
    assert not ok and "did not finish" in why
    assert not gpu_check.sanitizer_verdict([])[0]


def test_memcheck_errors_fail():
    errors = ["========= COMPUTE-SANITIZER",
              "========= Invalid __global__ write of size 4 bytes",
              "=========     at attention_kernel+0x50",
              "========= ERROR SUMMARY: 1 error"]
    ok, why = gpu_check.sanitizer_verdict(errors)
    assert not ok and why.startswith("1 errors")
    # a record with a summary that says 0 (a summary line of another process) still fails
    ok, _ = gpu_check.sanitizer_verdict([*errors[:3], "========= ERROR SUMMARY: 0 errors"])
    assert not ok
    ok, _ = gpu_check.sanitizer_verdict(["========= ERROR SUMMARY: 3 errors"])
    assert not ok


def _graph_metrics(captured: int, replays: int) -> str:
    return ("# TYPE ninfer:cuda_graphs_captured_total counter\n"
            f"ninfer:cuda_graphs_captured_total {captured}\n"
            "# TYPE ninfer:cuda_graph_replays_total counter\n"
            f"ninfer:cuda_graph_replays_total {replays}\n")


def test_graph_counters_must_show_replays_with_graphs_on_and_none_off():
    assert gpu_check.graphs_verdict(_graph_metrics(4, 120), graphs=True)[0]
    # a capture counter of 0: every step ran eagerly although graphs were on
    assert not gpu_check.graphs_verdict(_graph_metrics(0, 0), graphs=True)[0]
    assert not gpu_check.graphs_verdict(_graph_metrics(2, 0), graphs=True)[0]
    assert gpu_check.graphs_verdict(_graph_metrics(0, 0), graphs=False)[0]
    assert not gpu_check.graphs_verdict(_graph_metrics(1, 9), graphs=False)[0]
    ok, why = gpu_check.graphs_verdict("# TYPE x counter\nx 1\n", graphs=True)
    assert not ok and "no CUDA graph counters" in why


def _sequences(single: int, total: int) -> str:
    return ("# TYPE ninfer:iteration_sequences histogram\n"
            f'ninfer:iteration_sequences_bucket{{le="1.0"}} {single}\n'
            f'ninfer:iteration_sequences_bucket{{le="+Inf"}} {total}\n'
            f"ninfer:iteration_sequences_count {total}\n"
            f"ninfer:iteration_sequences_sum {total}\n")


def test_concurrent_requests_must_have_shared_a_step():
    assert gpu_check.overlap_verdict(_sequences(30, 41))[0]
    assert not gpu_check.overlap_verdict(_sequences(41, 41))[0]  # one after the other
    assert not gpu_check.overlap_verdict("")[0]
