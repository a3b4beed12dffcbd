"""Decode attention per KV-cache format (`--kv-dtype`), against f32 in the same run.

    .venv/bin/python benchmarks/bench_kv_attention.py --threads 2 --context 2048

Compiles the CPU attention kernel for a Qwen3-0.6B layer (16 query heads, 8 kv heads,
head_dim 128, block 16) once per format, fills every sequence's pool with random keys and
values encoded by ninfer.quantize.kv_formats, and times one decode step (one query row per
sequence at position context - 1; best of --repeats calls after a warm-up). With 1
sequence the pool of one layer (8 MiB at f32 and 2048 tokens) partly fits the caches;
with 4 it does not, and the formats that read fewer bytes win. Prints ms per call, the
KV bytes read per second, and the speed-up over f32.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time


def main() -> None:
    from ninfer.plan import CPU_KV_LAYOUT
    from ninfer.quantize.kv_formats import KV_LAYOUTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--seqs", default="1,4", help="sequences per step (comma list)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--layout", choices=list(KV_LAYOUTS), default=CPU_KV_LAYOUT,
                    help="the pools' layout (kv_formats.KV_LAYOUTS; default the CPU plan's, "
                         "plan.CPU_KV_LAYOUT)")
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import tvm

    from ninfer.kernels import AttentionSpec, build_cpu_module
    from ninfer.quantize import kv_formats as K

    seqs = [int(s) for s in args.seqs.split(",")]
    heads, kvh, d, bs = 16, 8, 128, 16
    per_seq = -(-args.context // bs)
    base = AttentionSpec(heads, kvh, d, args.context, bs, max(seqs), max(seqs) * per_seq + 1,
                         layout=args.layout)
    specs = {f: dataclasses.replace(base, kv_dtype=f,
                                    rotate=K.rotation_block(d) if f == "int4" else 0)
             for f in K.KV_DTYPES}
    ex = build_cpu_module(list(specs.values()))
    rng = np.random.default_rng(0)
    rows = base.kv_blocks * bs
    k = rng.standard_normal((rows, kvh, d)).astype(np.float32)
    v = rng.standard_normal((rows, kvh, d)).astype(np.float32)
    tables = np.arange(1, 1 + max(seqs) * per_seq, dtype=np.int32).reshape(max(seqs), per_seq)
    print(f"attention h{heads}/kv{kvh} x {d}, context {args.context}, threads "
          f"{args.threads}, {args.layout} pools; one decode row per sequence, best of "
          f"{args.repeats}")
    print(f"{'seqs':>4} {'kv dtype':<8}{'ms':>9}{'GB/s':>8}{'vs f32':>8}")
    for n in seqs:
        base_ms = None
        for f, spec in specs.items():
            parts = [K.pool_from_rows(p, args.layout, bs)
                     for p in (*K.encode(f, k, rotate=spec.rotate > 0), *K.encode(f, v))]
            tensors = [tvm.runtime.tensor(np.ascontiguousarray(p)) for p in parts]
            q = tvm.runtime.tensor(rng.standard_normal((n, heads, d)).astype(np.float32))
            pos = tvm.runtime.tensor(np.full(n, args.context - 1, np.int32))
            seq = tvm.runtime.tensor(np.arange(n, dtype=np.int32))
            out = tvm.runtime.tensor(np.zeros((n, heads, d), np.float32))
            call = [q, *tensors, pos, seq, tvm.runtime.tensor(tables), out]
            fn = ex[spec.name()]
            for _ in range(3):
                fn(*call)
            best = float("inf")
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn(*call)
                best = min(best, time.perf_counter() - t)
            nbytes = 2 * n * args.context * K.pool_bytes_per_row(f, kvh, d)
            base_ms = base_ms or best
            print(f"{n:>4} {f:<8}{best * 1e3:>9.3f}{nbytes / best / 1e9:>8.1f}"
                  f"{base_ms / best:>7.2f}x")


if __name__ == "__main__":
    main()
