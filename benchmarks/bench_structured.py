"""The cost of structured output: decode tokens/s with `response_format: json_schema`
against the same requests unconstrained, on one compiled model in one run.

    .venv/bin/python benchmarks/bench_structured.py --size small --threads 2
    .venv/bin/python benchmarks/bench_structured.py --build-dir build/test-models/qwen3-tiny-cpu

Builds the random-weight Qwen3 checkpoint of bench_decode.py (ninfer.bench.checkpoints) and
compiles it for `cpu` (once; reused while the options match), unless --build-dir names a
build to serve. Each round sends one constrained request (a schema whose one string field
has a fixed length, so the grammar holds the model for a few hundred tokens) and one
unconstrained request of the same length (ignore_eos), alternating; the rate is the
server's own `timings.predicted_per_second` (decode only, no client on the clock).
Prints the medians and their ratio (target >= 0.8). Not a test: numbers depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

from ninfer.bench.checkpoints import SIZES, compiled_checkpoint


def schema(essay_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 12},
            "score": {"type": "integer", "minimum": 0, "maximum": 100},
            "essay": {"type": "string", "minLength": essay_chars, "maxLength": essay_chars},
            "done": {"type": "boolean"},
        },
        "required": ["title", "score", "essay", "done"],
        "additionalProperties": False,
    }


def post(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--essay-chars", type=int, default=600,
                    help="length of the schema's fixed-length string (sets the reply length)")
    ap.add_argument("--build-dir", type=Path,
                    help="serve this build instead of compiling the benchmark model")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    from ninfer.runtime.client import open_endpoint

    out = args.build_dir or compiled_checkpoint(args.size, "structured", max_context=1024)

    command = " ".join([".venv/bin/python benchmarks/bench_structured.py",
                        *map(shlex.quote, sys.argv[1:])])
    messages = [{"role": "user", "content": "Write a short review as JSON."}]
    rates: dict[str, list[float]] = {"json_schema": [], "unconstrained": []}
    tokens: list[int] = []
    with open_endpoint(out, None, threads=args.threads) as ep, \
            httpx.Client(base_url=ep.base_url, timeout=600) as client:
        context = client.get("/v1/models").json()["data"][0]["max_model_len"]
        fmt = {"type": "json_schema",
               "json_schema": {"name": "review", "schema": schema(args.essay_chars)}}
        post(client, {"messages": messages, "max_tokens": 8, "response_format": fmt})  # warm-up
        for seed in range(args.rounds):
            c = post(client, {"messages": messages, "seed": seed, "max_tokens": context - 64,
                              "response_format": fmt})
            if c["choices"][0]["finish_reason"] != "stop":
                raise SystemExit(f"round {seed}: the constrained output did not finish: {c}")
            n = c["usage"]["completion_tokens"]
            u = post(client, {"messages": messages, "seed": seed, "max_tokens": n,
                              "ignore_eos": True})
            rates["json_schema"].append(c["timings"]["predicted_per_second"])
            rates["unconstrained"].append(u["timings"]["predicted_per_second"])
            tokens.append(n)

    js, free = (statistics.median(rates[k]) for k in ("json_schema", "unconstrained"))
    print(f"## {datetime.date.today().isoformat()} — structured output: json_schema decode\n")
    print(f"Machine: {os.cpu_count()} cores; server threads={args.threads}; build {out}\n")
    print(f"`{command}`\n")
    print(f"    {args.rounds} rounds, {min(tokens)}-{max(tokens)} tokens per reply "
          f"(the same count unconstrained)")
    print(f"    decode tokens/s   json_schema {js:8.1f}   unconstrained {free:8.1f}   "
          f"ratio {js / free:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
