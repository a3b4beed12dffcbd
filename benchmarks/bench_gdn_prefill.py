"""The Gated DeltaNet recurrence's two prefill forms on the CPU, in one run: row by row
(GdnRecurrentSpec chunk 1) and the chunked WY form (chunk 64), at Qwen3.5-27B's 128 x 128
heads over a 512-row prompt, best of N alternating calls; prints microseconds per row and
head and the ratio. Decides --gdn-prefill auto (ninfer.options)."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2, help="value heads (one per thread)")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import tvm

    from ninfer.kernels import GdnRecurrentSpec, build_cpu_module
    from ninfer.kernels import gdn_reference as gdn

    H, n, f = args.heads, args.rows, np.float32
    specs = [GdnRecurrentSpec(1, H, 128, 128, 1), GdnRecurrentSpec(1, H, 128, 128, 1, chunk=64)]
    ex = build_cpu_module(specs)
    rng = np.random.default_rng(0)
    g, beta = gdn.gating(rng.standard_normal((n, H)), rng.standard_normal((n, H)),
                         np.log(rng.uniform(0.01, 16, H)), np.ones(H))
    inputs = [rng.standard_normal((n, specs[0].channels)).astype(f),
              np.concatenate([g, beta], axis=1).astype(f), np.arange(n, dtype=np.int32),
              np.zeros(n, np.int32), np.zeros((1, H, 128, 128), f)]
    tensors = [tvm.runtime.tensor(a) for a in inputs]
    out = tvm.runtime.tensor(np.zeros((n, H, 128), f))
    best = dict.fromkeys((s.name() for s in specs), float("inf"))
    for _ in range(args.reps):
        for s in specs:
            t = time.perf_counter()
            ex[s.name()](*tensors, out)
            best[s.name()] = min(best[s.name()], time.perf_counter() - t)
    per = {k: v / n / H * min(args.threads, H) * 1e6 for k, v in best.items()}
    for k, v in per.items():
        print(f"{k:48s} {v:7.2f} us per row and head")
    rec, chunked = (per[s.name()] for s in specs)
    print(f"chunked / row by row: {chunked / rec:.2f}x the time")


if __name__ == "__main__":
    main()
