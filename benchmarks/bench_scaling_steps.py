"""Server-side decode scaling without a streaming client: c non-streaming requests of
the same length at once; aggregate tokens/s over wall time and the mean step time (from
/metrics' step counter). Complements `ninfer-bench serving`, whose SSE client shares the
machine's cores with the server.

    .venv/bin/python benchmarks/bench_scaling_steps.py build/bench/qwen3-small-cpu-serve-c32
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))


def main() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from ninfer.runtime import Server

    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per concurrency level, interleaved; the best one counts")
    args = ap.parse_args()

    def steps(client) -> float:
        for family in text_string_to_metric_families(client.get("/metrics").text):
            for s in family.samples:
                if s.name == "ninfer:iteration_tokens_total_count":
                    return s.value
        raise SystemExit("the server exports no ninfer:iteration_tokens_total")

    with Server(args.build, threads=args.threads) as srv:
        client = srv.client

        def one(_: int) -> int:
            r = client.post("/v1/completions", json={
                "prompt": [5, 6, 7, 8], "max_tokens": args.tokens, "temperature": 0,
                "ignore_eos": True}, timeout=600).json()
            return int(r["usage"]["completion_tokens"])

        one(0)
        levels = (1, 2, 4, 8)
        best: dict[int, tuple[float, float]] = {}  # level -> (tok/s, ms per step)
        for _ in range(args.repeats):  # interleaved, so a slow spell hits every level
            for c in levels:
                s0, t0 = steps(client), time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    tokens = sum(pool.map(one, range(c)))
                wall, n = time.perf_counter() - t0, steps(client) - s0
                if tokens / wall > best.get(c, (0.0, 0.0))[0]:
                    best[c] = (tokens / wall, wall / n * 1000)
        print(f"{'streams':>7}{'agg tok/s':>11}{'ratio':>7}{'ms/step':>9}   (best of "
              f"{args.repeats})")
        for c in levels:
            agg, ms = best[c]
            print(f"{c:>7}{agg:>11.1f}{agg / best[1][0]:>7.2f}{ms:>9.2f}")

if __name__ == "__main__":
    main()
