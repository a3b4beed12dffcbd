"""Serving fairness and concurrency scaling of a compiled model (`ninfer-bench serving`).

    .venv/bin/python benchmarks/bench_serving.py --size small --threads 2

Builds the random-weight Qwen3 checkpoint of bench_decode.py (ninfer.bench.checkpoints), compiles it
for `cpu` with --max-concurrency 8 and the chosen prefill chunk (once; reused while the
options match), starts its ninfer-server and measures:
  - fairness: stream A's decode tokens/s while stream B prefills 8 x chunk tokens, as a
    fraction of A alone (target >= 0.5)
  - scaling: aggregate decode tokens/s at 1, 2, 4, 8 streams over 1 stream (targets on
    CPU: >= 1.8x at 2, >= 3x at 4)
Rates come from SSE token arrival times (see ninfer.bench.serving). Prints an entry for
benchmarks/RESULTS.md. Not a test: numbers depend on the machine and its load (the
client runs on the same cores as the server).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

from ninfer.bench.checkpoints import SIZES, compiled_checkpoint


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=32, help="compiled prefill chunk")
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--build-dir", type=Path,
                    help="serve this build instead of compiling the benchmark model")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    from ninfer.bench.serving import ServingConfig, format_text, run_serving
    from ninfer.runtime.client import open_endpoint

    levels = tuple(int(x) for x in args.levels.split(","))
    out = args.build_dir or compiled_checkpoint(
        args.size, f"serve-c{args.chunk}", max_context=args.max_context,
        prefill_chunk=args.chunk, max_concurrency=max(levels))

    command = " ".join([".venv/bin/python benchmarks/bench_serving.py",
                        *map(shlex.quote, sys.argv[1:])])
    cfg = ServingConfig(decode_tokens=args.decode_tokens, levels=levels, repeats=args.repeats)
    with open_endpoint(out, None, threads=args.threads) as ep:
        res = run_serving(ep, cfg, command, log=lambda s: print(s, file=sys.stderr))

    print(f"## {datetime.date.today().isoformat()} — serving: fairness and scaling\n")
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; server threads={args.threads}; "
          f"build {out}\n")
    print(f"`{command}`\n")
    for line in format_text(res):
        print("    " + line)
    if args.json:
        args.json.write_text(json.dumps(res.to_json(), indent=2) + "\n")


if __name__ == "__main__":
    main()
