"""Where a decode step goes: the kernel profile (NINFER_PROFILE=1) of bench_llamacpp's
models, decode steps only, with the GB/s each gemv reads.

    .venv/bin/python benchmarks/profile_decode.py --format q4g64
    .venv/bin/python benchmarks/profile_decode.py --format f16 --model qwen35   # the hybrid

Compiles (or reuses) the same build as bench_llamacpp's ninfer side (build/bench/<model>-cpu-
<format>, f16 KV cache) and, with the profile on, runs 64 single-token warm-up steps (with
--context N: a prompt of N - 16 tokens and 16 steps) and then --steps timed ones (contexts
64, or N, to that + steps); a first run of the warm-up alone counts
its kernel calls, and the second leaves that many out of its profile (NINFER_PROFILE_SKIP),
so what is left is the timed steps' alone. Prints tokens/s and ms per token, the gemv
weight bytes per token x tokens/s (GB/s), and every kernel's calls per token, microseconds
per call and share of kernel time; a gemv's row also shows its matrix bytes / time per
call. A read probe (ninfer.roofline, same threads, over a buffer no cache holds much
of: roofline.probe_bytes) is taken right after, so the figures sit beside the bandwidth of
the same minute.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_llamacpp as bench

PROMPT = 64
WARM_STEPS = 16  # single-token steps after a --context prompt, before the timed ones


def warm_up(engine: Any, context: int) -> None:
    """Bring `engine` to `context` tokens: PROMPT single-token steps for the default 64
    (as before --context existed), else a prompt of context - WARM_STEPS tokens prefilled
    in chunks and WARM_STEPS single-token steps. Timed steps then start at `context`."""
    if context == PROMPT:
        for i in range(PROMPT):
            engine.forward([5 + i], i)
        return
    first = context - WARM_STEPS
    engine.forward([5 + i % 1000 for i in range(first)], 0)
    for i in range(first, context):
        engine.forward([5 + i % 1000], i)


def check_context(ap: argparse.ArgumentParser, context: int, steps: int) -> None:
    """Refuse a --context that warm_up cannot reach or whose steps the builds cannot hold."""
    if not (context == PROMPT or WARM_STEPS < context) or context + steps > bench.N_CTX:
        ap.error(f"--context {context} with --steps {steps}: the builds hold {bench.N_CTX} "
                 f"tokens, and a prompt needs more than {WARM_STEPS}")


def _build(model: str, fmt: str) -> Path:
    from ninfer.pipeline import CompileOptions, compile_model

    if model == "qwen35":
        from ninfer.bench.checkpoints import build_checkpoint

        ckpt = bench.bench_dir() / bench.HYBRID_NAME
        build_checkpoint(ckpt, "hybrid")
    else:
        ckpt = bench.build_checkpoint(bench.bench_dir() / "qwen3-0.5b")
    out = bench.bench_dir() / f"{ckpt.name}-cpu-{fmt}"
    compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=f"{ckpt.name}-{fmt}",
                                 max_context=bench.N_CTX, prefill_chunk=bench.PREFILL_TOKENS,
                                 weights=fmt, kv_dtype="f16"))
    return out


def _worker(build: Path, threads: int, steps: int, context: int) -> None:
    from ninfer.runtime.engine import load_engine

    engine = load_engine(build, threads=threads)
    warm_up(engine, context)
    t0 = time.perf_counter()
    for i in range(steps):
        engine.forward([7], context + i)
    if steps:
        print(f"DECODE {steps / (time.perf_counter() - t0):.3f}", flush=True)


_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)%\s+(\S+)$")
_GEMV = re.compile(r"^matmul_k(\d+)_n(\d+)_(\w+?)(?:_p\d+|_l16)?(?:_xbf16)?(?:_bias)?"
                   r"_gemv(?:_s1)?$")


def _gemv_bytes(name: str) -> float | None:
    m = _GEMV.match(name)
    if not m:
        return None
    k, n, fmt = int(m[1]), int(m[2]), m[3]
    return k * n * bench._bytes_per_weight(fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default=None,
                    help="f32, f16, bf16, q8g32, q4g64 (default), q4g128")
    ap.add_argument("--model", choices=("qwen3", "qwen35"), default=None,
                    help="qwen3 (default) or qwen35")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--context", type=int, default=PROMPT,
                    help=f"tokens before the first timed step (default {PROMPT}; more are "
                         "prefilled as a prompt): decode attention's share grows with it")
    ap.add_argument("--build", type=Path, default=None,
                    help="profile this build directory (e.g. an ab_engine_decode variant's) "
                         "instead of compiling --format's")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    check_context(ap, args.context, args.steps)
    if args.worker:
        _worker(Path(args.worker), args.threads, args.steps, args.context)
        return
    if args.build and (args.format or args.model):
        ap.error("--build profiles that build as it is: --format and --model do not apply")
    build = args.build or _build(args.model or "qwen3", args.format or "q4g64")
    label = str(args.build) if args.build else f"{args.model or 'qwen3'} {args.format or 'q4g64'}"
    env = {**os.environ, "NINFER_PROFILE": "1", "TVM_NUM_THREADS": str(args.threads)}
    # The profile counts every call of a process, the first touches of the weights
    # included: a run of the warm-up steps alone counts its calls, and the run with the
    # timed steps after them leaves that many calls out of its profile.
    skip = 0
    for steps in (0, args.steps):
        proc = subprocess.run([sys.executable, __file__, "--worker", str(build), "--threads",
                               str(args.threads), "--steps", str(steps), "--context",
                               str(args.context)],
                              env={**env, "NINFER_PROFILE_SKIP": str(skip)},
                              capture_output=True, text=True, check=True)
        per_call = {}  # kernel -> (calls, seconds)
        for line in proc.stderr.splitlines():
            if m := _ROW.match(line):
                per_call[m[4]] = (int(m[1]), int(m[1]) * float(m[2]) * 1e-6)
        skip = sum(n for n, _ in per_call.values())
    rate = float(next(line.split()[1] for line in proc.stdout.splitlines()
                      if line.startswith("DECODE ")))
    steps = args.steps
    total = sum(sec for _, sec in per_call.values())
    token_bytes = sum((_gemv_bytes(k) or 0.0) * n for k, (n, _) in per_call.items()) / steps
    from ninfer.roofline import measure

    roof = measure(int(token_bytes), args.threads)
    print(f"{label}: {rate:.1f} tok/s, {1e3 / rate:.2f} ms a token;"
          f" gemv weights {token_bytes / 1e9:.3f} GB a token = {token_bytes * rate / 1e9:.1f} GB/s")
    print(roof.describe())
    print(f"{'calls/token':>11} {'us/call':>9} {'share':>6} {'GB/s':>6}  kernel")
    for name, (calls, sec) in sorted(per_call.items(), key=lambda kv: -kv[1][1]):
        nbytes = _gemv_bytes(name)
        gbps = f"{nbytes * calls / sec / 1e9:6.1f}" if nbytes else " " * 6
        print(f"{calls / steps:11.2f} {1e6 * sec / calls:9.2f} {100 * sec / total:5.1f}%"
              f" {gbps}  {name}")


if __name__ == "__main__":
    main()
