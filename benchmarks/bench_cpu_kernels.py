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

Then one line per weight format (quantize.weight_formats.WEIGHT_FORMATS): the gemv at n = 1 with
its packed weights streamed from memory (the call cycles through enough copies of them
to exceed --stream-mb, well above the L3 cache), as ms, GB/s of packed bytes (weights and
scales) and that rate as a fraction of the float32 gemv's, measured in the same rounds;
then the gemm at n = --gemm-rows as ms and GFLOP/s (2 * n * k * n_out flops; one copy of
the weights, which stays in cache). Formats alternate within every round; best calls.
"""

from __future__ import annotations

import argparse
import os
import time


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n-out", type=int, default=4096)
    p.add_argument("--gemm-rows", type=int, default=128)
    p.add_argument("--formats", default=None,
                   help="comma-separated weight formats for the second table (default: all)")
    p.add_argument("--stream-mb", type=int, default=160,
                   help="bytes of weight copies each gemv cycles through, in MB")
    p.add_argument("--skip-numpy", action="store_true", help="only the weight-format table")
    return p.parse_args()


ARGS = _parse()
for var in ("TVM_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from ninfer.kernels import MatmulSpec, build_cpu_module, reference  # noqa: E402
from ninfer.kernels.cpu.matmul import use_dpbf16  # noqa: E402
from ninfer.plan import matmul_spec  # noqa: E402
from ninfer.quantize.weight_formats import (  # noqa: E402
    WEIGHT_FORMATS,
    pack,
    packed_nbytes,
    part_layout,
)
from ninfer.targets import load_target  # noqa: E402

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


def _spec(k: int, n_out: int, schedule: str, fmt: str = "float32") -> MatmulSpec:
    """The matmul as the cpu target's plan makes it on this host (plan.matmul_spec, x
    rounded to bf16 for bf16 weights where the host has vdpbf16ps, as
    --cpu-bf16-activations auto)."""
    return matmul_spec(load_target("cpu"), k, n_out, False, schedule,  # type: ignore[arg-type]
                       fmt, x_bf16=use_dpbf16())


def numpy_table() -> None:
    k, n_out, rows = ARGS.k, ARGS.n_out, ARGS.gemm_rows
    gemv = _spec(k, n_out, "gemv")
    gemm = _spec(k, n_out, "gemm")
    ex = build_cpu_module([gemv, gemm])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_out, k), dtype=np.float32)
    tw = tvm.runtime.tensor(pack(w, "float32", "panels")["w"])
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


def _best(times: list[float], fn, argsets: list[list]) -> None:
    """Calls fn on every argument set in turn for ~0.1 s, appending each call's time."""
    start = time.perf_counter()
    while time.perf_counter() - start < 0.1:
        for args in argsets:
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)


def format_table() -> None:
    k, n_out, rows = ARGS.k, ARGS.n_out, ARGS.gemm_rows
    formats = ARGS.formats.split(",") if ARGS.formats else list(WEIGHT_FORMATS)
    if "float32" not in formats:
        formats.insert(0, "float32")
    specs = {(f, s): _spec(k, n_out, s, f) for f in formats for s in ("gemv", "gemm")}
    ex = build_cpu_module(specs.values())
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n_out, k), dtype=np.float32)
    x1 = rng.standard_normal((1, k), dtype=np.float32)
    xg = rng.standard_normal((rows, k), dtype=np.float32)
    t1, tg = tvm.runtime.tensor(x1), tvm.runtime.tensor(xg)
    o1 = tvm.runtime.tensor(np.zeros((1, n_out), np.float32))
    og = tvm.runtime.tensor(np.zeros((rows, n_out), np.float32))
    gemv_sets, gemm_sets, nbytes = {}, {}, {}
    for f in formats:
        layout = specs[f, "gemv"].layout
        parts = pack(w, f, layout)
        arrays = [parts[name] for name, _, _ in part_layout(f, n_out, k, layout)]
        nbytes[f] = packed_nbytes(f, n_out, k, layout)
        copies = max(1, -(-ARGS.stream_mb * 1_000_000 // nbytes[f]))
        gemv_sets[f] = [[t1, *(tvm.runtime.tensor(a.copy()) for a in arrays), o1]
                        for _ in range(copies)]
        gemm_sets[f] = [[tg, *gemv_sets[f][0][1:-1], og]]
        ex[specs[f, "gemv"].name()](*gemv_sets[f][0])
        ref = reference(specs[f, "gemv"], x1, *arrays)
        err = np.linalg.norm(o1.numpy() - ref) / np.linalg.norm(ref)
        if err > 1e-5:
            raise SystemExit(f"{specs[f, 'gemv'].name()}: wrong result, relative error {err:.3g}")
    t_gemv: dict[str, list[float]] = {f: [] for f in formats}
    t_gemm: dict[str, list[float]] = {f: [] for f in formats}
    for _ in range(ARGS.rounds):
        for f in formats:
            _best(t_gemv[f], ex[specs[f, "gemv"].name()], gemv_sets[f])
        for f in formats:
            _call = ex[specs[f, "gemm"].name()]
            t_gemm[f] += _call_times(lambda c=_call, a=gemm_sets[f][0]: c(*a), 0.1)
        time.sleep(PAUSE_S)
    print(f"\nweight formats: gemv n=1 streaming >= {ARGS.stream_mb} MB of weight copies; "
          f"gemm n={rows}")
    print(f"{'format':<9}{'B/weight':>9}{'gemv ms':>9}{'GB/s':>8}{'vs f32':>8}"
          f"{'gemm ms':>10}{'GFLOP/s':>9}")
    f32_rate = nbytes["float32"] / min(t_gemv["float32"])
    flop = 2.0 * rows * k * n_out
    for f in formats:
        tv, tm = min(t_gemv[f]), min(t_gemm[f])
        rate = nbytes[f] / tv
        print(f"{f:<9}{nbytes[f] / (k * n_out):>9.4f}{tv * 1e3:>9.3f}{rate / 1e9:>8.1f}"
              f"{rate / f32_rate:>8.2f}{tm * 1e3:>10.3f}{flop / tm / 1e9:>9.1f}")


def main() -> None:
    if not ARGS.skip_numpy:
        numpy_table()
    format_table()


if __name__ == "__main__":
    main()
