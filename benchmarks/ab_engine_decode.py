"""A/B variants of the CPU kernels in whole decode steps: one build per variant, decode runs
alternated round by round.

    .venv/bin/python benchmarks/ab_engine_decode.py --format q4g64 --rounds 8 --in-process 16 \
        --variant 'cur:' --variant 'nr3: qmatmul.GEMV_TILES=QTiles(mr=1, nr=3, mb=1, panels=0)'

Each --variant is ab_cpu_matmul's `NAME: ATTR=EXPR; ...` (the kernel modules' attributes
while that variant's build compiles). Every build is bench_llamacpp's 0.5B Qwen3 in
--format (as profile_decode builds it, into build/bench/ab-<format>-<NAME>). With
--in-process BLOCK, every build's engine is loaded into one process (64 warm-up steps
each) and each round decodes --steps steps per build in blocks of BLOCK, the builds
taking turns block by block. (Until session 28 every variant linked the first build's
cached kernels, so the "1-2%" this mode was credited with was the spread of identical
builds; with distinct kernels the same variant read 1.05 and 1.16 in two runs on the Zen 4
VM: repeat a run before trusting a few percent.) A variant with attributes compiles its
kernels into a cache of its own. Two f16 engines (2 GB of weights) favoured whichever
loaded first by 5-22%, and builds whose runtime (thread pool) differs meet each other's
idle workers, so those need the other mode. Without it,
each round runs every build's decode in a fresh process (profile_decode's worker: 64
warm-up steps, then --steps timed ones) in turn, every other round in reverse order; a
process's place in its round moved its rate by 10-20% while this VM was busy (RESULTS
2026-12-05), so that mode needs many rounds. Prints each variant's median tokens/s and
the median of its per-round ratio to the first variant. ab_cpu_matmul times kernels from
Python, a few microseconds of call overhead each, which understates the small quantized
shapes; this times the engine itself.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import bench_llamacpp as bench
from ab_cpu_matmul import variant_applied
from profile_decode import PROMPT, check_context, warm_up

PROFILE = Path(__file__).with_name("profile_decode.py")


def _build(fmt: str, name: str, body: str) -> Path:
    from ninfer.pipeline import CompileOptions, compile_model

    ckpt = bench.build_checkpoint(bench.bench_dir() / "qwen3-0.5b")
    out = bench.bench_dir() / f"ab-{fmt}-{name}"
    # The shared kernel cache is keyed by the kernel sources, not by attributes a variant
    # sets: a variant compiles its kernels into a cache of its own, emptied first (until
    # session 28 every variant got the first build's cached kernels).
    options = {}
    if body.strip():
        cache = out / ".kernel-cache"
        shutil.rmtree(cache, ignore_errors=True)
        options["kernel_cache"] = cache
    with variant_applied(body):
        compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=f"ab-{fmt}-{name}",
                                     max_context=bench.N_CTX, prefill_chunk=bench.PREFILL_TOKENS,
                                     weights=fmt, kv_dtype="f16", **options))
    return out


def _decode_rate(build: Path, threads: int, steps: int, context: int) -> float:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, str(PROFILE), "--worker", str(build), "--threads",
                          str(threads), "--steps", str(steps), "--context", str(context)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("DECODE ")))


def _interleaved(builds: dict[str, Path], threads: int, steps: int, rounds: int,
                 block: int, context: int) -> dict[str, list[float]]:
    """Every build's engine in this one process, decoding blocks of `block` steps in turn
    (every other round in reverse order) until each has run `steps` a round: each round's
    rate per build. Engines share the machine's minute-scale phases block by block, which
    a process per run does not (a process's place in its round moved its rate by up to 20%
    while this VM was busy)."""
    import time

    from ninfer.runtime.engine import load_engine

    engines = {name: load_engine(b, threads=threads) for name, b in builds.items()}
    for engine in engines.values():
        warm_up(engine, context)
    rates: dict[str, list[float]] = {name: [] for name in builds}
    order = list(builds)
    for r in range(rounds):
        spent = dict.fromkeys(builds, 0.0)
        for b0 in range(0, steps, block):
            for name in (order if (r + b0 // block) % 2 == 0 else order[::-1]):
                engine = engines[name]
                t0 = time.perf_counter()
                for i in range(b0, min(steps, b0 + block)):
                    engine.forward([7], context + i)
                spent[name] += time.perf_counter() - t0
        for name in builds:
            rates[name].append(steps / spent[name])
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="q4g64", help="f32, f16, bf16, q8g32, q4g64, q4g128")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--context", type=int, default=PROMPT,
                    help=f"tokens before the first timed step (default {PROMPT}; more are "
                         "prefilled as a prompt)")
    ap.add_argument("--in-process", type=int, default=0, metavar="BLOCK",
                    help="load every build in this one process and alternate blocks of "
                         "BLOCK steps between them (0: a fresh process per run)")
    args = ap.parse_args()
    check_context(ap, args.context, args.steps)
    builds = {}
    for v in args.variant:
        name, _, body = v.partition(":")
        name = name.strip()
        if not name or name in builds:
            ap.error(f"--variant {v!r}: each variant needs a distinct NAME before ':'")
        builds[name] = _build(args.format, name, body)
    if args.in_process:
        rates = _interleaved(builds, args.threads, args.steps, args.rounds, args.in_process,
                             args.context)
    else:
        rates = {name: [] for name in builds}
        order = list(builds)
        for r in range(args.rounds):
            # every other round in reverse: a process's place in its round moved its rate
            # by up to 20% while this VM was busy, whatever the build (RESULTS 2026-12-05)
            for name in (order if r % 2 == 0 else order[::-1]):
                rates[name].append(_decode_rate(builds[name], args.threads, args.steps,
                                                args.context))
    first = rates[next(iter(builds))]
    print(f"{args.format} decode, threads={args.threads}, {args.rounds} interleaved rounds of "
          f"{args.steps} steps")
    for name, v in rates.items():
        ratio = statistics.median(a / b for a, b in zip(v, first, strict=True))
        print(f"{name:<16} median {statistics.median(v):7.1f} tok/s  best {max(v):7.1f}  "
              f"per-round ratio to {next(iter(builds))} {ratio:.3f}")


if __name__ == "__main__":
    main()
