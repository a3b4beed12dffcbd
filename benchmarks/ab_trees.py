"""Decode of the whole tree at another git revision against this checkout's, alternated.

    .venv/bin/python benchmarks/ab_trees.py --rev 43cceae --format q4g64 --rounds 3

ab_engine_decode's `@REV` swaps the kernel files alone; this runs everything (plan,
runtime, thread pool, kernels) of both trees. The revision is checked out as a git
worktree under build/ab-trees/<rev> (kept for the next run), sharing this checkout's
virtual environment, third-party sources and bench checkpoint; each round runs each
tree's `bench_llamacpp.py --worker ninfer` (its own build of the 0.5B bench model, best
16-step decode window of --repeats runs, and 256-token prefill) in a fresh process, every
other round in reverse order, with the tree's own `compiler/` first on PYTHONPATH. Prints
each round's rates and the per-round ratio this tree / the revision.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench_llamacpp as bench

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "qwen3-0.5b"  # bench_llamacpp's dense model (its --model-name default)


def worktree(rev: str) -> Path:
    """The revision's tree under build/ab-trees, made on first use, with this checkout's
    .venv, build/third_party and bench checkpoint linked in."""
    sha = subprocess.run(["git", "rev-parse", "--short=12", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = ROOT / "build" / "ab-trees" / sha
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)
    (tree / "build" / "bench").mkdir(parents=True, exist_ok=True)
    links = {tree / ".venv": ROOT / ".venv",
             tree / "build" / "third_party": ROOT / "build" / "third_party",
             tree / "build" / "bench" / MODEL_NAME: bench.bench_dir() / MODEL_NAME}
    for link, target in links.items():
        if not link.exists():
            link.symlink_to(target)
    return tree


def run(root: Path, fmt: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{root / 'compiler'}:{root / 'benchmarks'}",
           "TVM_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads),
           "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, str(root / "benchmarks" / "bench_llamacpp.py"), "--worker",
           "ninfer", "--target", fmt, "--threads", str(args.threads), "--decode-tokens", "64",
           "--repeats", str(args.repeats), "--model-name", MODEL_NAME]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
    raise SystemExit(f"{root}: the ninfer worker failed (rc {proc.returncode}): {tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="git revision to set against this checkout")
    ap.add_argument("--format", default="q4g64", help="f32, f16, bf16, q8g32, q4g64, q4g128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="decode runs per tree per round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    bench.build_checkpoint(bench.bench_dir() / MODEL_NAME)
    trees = {"this": ROOT, args.rev: worktree(args.rev)}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            got = run(trees[name], args.format, args)
            rates[name].append(got["decode"])
            print(f"round {r}  {name:>12}  decode {got['decode']:6.1f} tok/s  "
                  f"prefill {got['prefill']:5.0f} tok/s", flush=True)
    for name, values in rates.items():
        print(f"{name:>12}  median decode {statistics.median(values):6.1f} tok/s")
    ratios = [a / b for a, b in zip(rates["this"], rates[args.rev])]
    print(f"this / {args.rev} per round: " + " ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
