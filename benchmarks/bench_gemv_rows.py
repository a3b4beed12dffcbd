"""Cost of each extra decode row in the CPU float GEMV, against one row in the same run.

    .venv/bin/python benchmarks/bench_gemv_rows.py [--threads 2] [--rounds 30]

For each shape (k x n_out, default: the 'small' benchmark model's projections) builds the
gemv kernel once, then calls it with 1..--max-rows rows of x on weights cycled through
enough copies (--stream-mb) that w comes from memory, as in a decode step. Rounds
alternate the row counts, so a slow spell of the machine lands on all of them. Prints
the median us per call, GB/s of weights read, and the ratio to one row: the marginal cost
of batching one more sequence into a decode step.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--max-rows", type=int, default=4)
    ap.add_argument("--shapes", default="512x3072,1536x512,512x512",
                    help="comma-separated KxN_OUT")
    ap.add_argument("--stream-mb", type=int, default=160)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import tvm

    from ninfer.kernels import MatmulSpec, build_cpu_module
    from ninfer.quantize.weight_formats import pack

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    specs = [MatmulSpec(k=k, n_out=n, schedule="gemv", layout="panels") for k, n in shapes]
    ex = build_cpu_module(specs)
    rng = np.random.default_rng(0)
    rows = range(1, args.max_rows + 1)
    print(f"float32 gemv, threads={args.threads}, median of {args.rounds} interleaved rounds")
    print(f"{'kernel':<30}{'rows':>5}{'us':>9}{'GB/s':>7}{'vs 1 row':>10}")
    for (k, n), spec in zip(shapes, specs, strict=True):
        copies = max(2, (args.stream_mb << 20) // (k * n * 4))
        ws = [tvm.runtime.tensor(pack(rng.standard_normal((n, k), dtype=np.float32), "float32",
                                      "panels")["w"]) for _ in range(copies)]
        fn = ex[spec.name()]
        xs = {r: tvm.runtime.tensor(rng.standard_normal((r, k), dtype=np.float32)) for r in rows}
        outs = {r: tvm.runtime.tensor(np.zeros((r, n), np.float32)) for r in rows}
        times: dict[int, list[float]] = {r: [] for r in rows}
        for _ in range(args.rounds):
            for r in rows:
                t0 = time.perf_counter()
                for w in ws:
                    fn(xs[r], w, outs[r])
                times[r].append((time.perf_counter() - t0) / len(ws))
        one = statistics.median(times[1])
        for r in rows:
            t = statistics.median(times[r])
            print(f"{spec.name():<30}{r:>5}{t * 1e6:>9.0f}{k * n * 4 / t / 1e9:>7.1f}"
                  f"{t / one:>9.2f}x")


if __name__ == "__main__":
    main()
