"""A/B variants of the CPU kernels in whole decode steps: one build per variant, decode runs
alternated round by round.

    .venv/bin/python benchmarks/ab_engine_decode.py --format q4g64 --rounds 6 \
        --variant 'cur:' --variant 'nr3: qmatmul.GEMV_TILES=QTiles(mr=1, nr=3, mb=1, panels=0)'

Each --variant is ab_cpu_matmul's `NAME: ATTR=EXPR; ...` (the kernel modules' attributes
while that variant's build compiles). Every build is bench_llamacpp's 0.5B Qwen3 in
--format (as profile_decode builds it, into build/bench/ab-<format>-<NAME>); each round runs
every build's decode (profile_decode's worker: 64 warm-up steps, then --steps timed ones,
a fresh process each) in turn. Prints each variant's median tokens/s and the median of its
per-round ratio to the first variant. ab_cpu_matmul times kernels from Python, a few
microseconds of call overhead each, which understates the small quantized shapes; this
times the engine itself (RESULTS 2026-12-05).

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench_llamacpp as bench
from ab_cpu_matmul import variant_applied

PROFILE = Path(__file__).with_name("profile_decode.py")


def _build(fmt: str, name: str, body: str) -> Path:
    from ninfer.pipeline import CompileOptions, compile_model

    ckpt = bench.build_checkpoint(bench.bench_dir() / "qwen3-0.5b")
    out = bench.bench_dir() / f"ab-{fmt}-{name}"
    with variant_applied(body):
        compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=f"ab-{fmt}-{name}",
                                     max_context=bench.N_CTX, prefill_chunk=bench.PREFILL_TOKENS,
                                     weights=fmt, kv_dtype="f16"))
    return out


def _decode_rate(build: Path, threads: int, steps: int) -> float:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, str(PROFILE), "--worker", str(build), "--threads",
                          str(threads), "--steps", str(steps)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("DECODE ")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="q4g64", help="f32, f16, bf16, q8g32, q4g64, q4g128")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=128)
    args = ap.parse_args()
    builds = {}
    for v in args.variant:
        name, _, body = v.partition(":")
        name = name.strip()
        if not name or name in builds:
            ap.error(f"--variant {v!r}: each variant needs a distinct NAME before ':'")
        builds[name] = _build(args.format, name, body)
    rates: dict[str, list[float]] = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, build in builds.items():
            rates[name].append(_decode_rate(build, args.threads, args.steps))
    first = rates[next(iter(builds))]
    print(f"{args.format} decode, threads={args.threads}, {args.rounds} interleaved rounds of "
          f"{args.steps} steps")
    for name, v in rates.items():
        ratio = statistics.median(a / b for a, b in zip(v, first, strict=True))
        print(f"{name:<16} median {statistics.median(v):7.1f} tok/s  best {max(v):7.1f}  "
              f"per-round ratio to {next(iter(builds))} {ratio:.3f}")


if __name__ == "__main__":
    main()
