"""Time the CPU matmul kernels against numpy's `x @ w.T` measured in the same run.

    .venv/bin/python benchmarks/bench_cpu_kernels.py [--threads 2] [--rounds 7]

Pinned settings: float32, k = n_out = 4096, gemv at n = 1 and gemm at n = 128, both
sides on the same number of threads (TVM_NUM_THREADS / OPENBLAS_NUM_THREADS are set
before numpy and tvm are imported). Rounds alternate between the two sides, with a pause
in between because OpenBLAS worker threads spin after each call and would steal cores
from TVM's pool. Every call is timed on its own. Reported per side: the best call (the
machine may be shared; the best call is the least disturbed one) as ms, GB/s of weights
read and GFLOP/s, then the ratio numpy time / our time for the best calls and for the
median calls (> 1 means faster than numpy).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n-out", type=int, default=4096)
    p.add_argument("--gemm-rows", type=int, default=128)
    return p.parse_args()


ARGS = _parse()
for var in ("TVM_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from ninfer.kernels import MatmulSpec, build_cpu_module  # noqa: E402

PAUSE_S = 0.3


def _call_times(fn, min_time: float = 0.25) -> list[float]:
    """Seconds of each call of `fn` over a batch lasting at least `min_time`."""
    fn()
    times: list[float] = []
    while sum(times) < min_time:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _compare(ours, theirs, rounds: int) -> tuple[list[float], list[float]]:
    t_ours: list[float] = []
    t_theirs: list[float] = []
    for _ in range(rounds):
        t_ours += _call_times(ours)
        time.sleep(PAUSE_S)
        t_theirs += _call_times(theirs)
        time.sleep(PAUSE_S)
    return t_ours, t_theirs


def main() -> None:
    k, n_out, rows = ARGS.k, ARGS.n_out, ARGS.gemm_rows
    gemv = MatmulSpec(k=k, n_out=n_out, schedule="gemv")
    gemm = MatmulSpec(k=k, n_out=n_out, schedule="gemm")
    ex = build_cpu_module([gemv, gemm])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_out, k), dtype=np.float32)
    tw = tvm.runtime.tensor(w)
    print(
        f"threads={ARGS.threads} (tvm pool: {tvm.runtime.num_threads()}), "
        f"cpu={tvm.target.codegen.llvm_get_system_cpu()}, w=[{n_out}, {k}] float32"
    )
    print(
        f"{'kernel':<34}{'rows':>6}{'ms':>9}{'GB/s':>8}{'GFLOP/s':>9}"
        f"{'numpy ms':>10}{'GB/s':>8}{'GFLOP/s':>9}{'ratio':>7}{'median':>8}"
    )
    for spec, n in ((gemv, 1), (gemm, rows)):
        x = rng.standard_normal((n, k), dtype=np.float32)
        tx = tvm.runtime.tensor(x)
        tout = tvm.runtime.tensor(np.zeros((n, n_out), np.float32))
        fn = ex[spec.name()]
        fn(tx, tw, tout)
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        err = np.linalg.norm(tout.numpy() - ref) / np.linalg.norm(ref)
        if err > 1e-5:
            raise SystemExit(f"{spec.name()}: wrong result, relative error {err:.3g}")
        t_ours, t_theirs = _compare(lambda: fn(tx, tw, tout), lambda: x @ w.T, ARGS.rounds)
        ours, theirs = min(t_ours), min(t_theirs)
        median_ratio = float(np.median(t_theirs) / np.median(t_ours))
        gb, gflop = w.nbytes / 1e9, 2.0 * n * k * n_out / 1e9
        print(
            f"{spec.name():<34}{n:>6}{ours * 1e3:>9.3f}{gb / ours:>8.1f}{gflop / ours:>9.1f}"
            f"{theirs * 1e3:>10.3f}{gb / theirs:>8.1f}{gflop / theirs:>9.1f}"
            f"{theirs / ours:>7.2f}{median_ratio:>8.2f}"
        )


if __name__ == "__main__":
    main()
