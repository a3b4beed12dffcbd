"""A/B variants of the CPU decode attention, interleaved round by round in one process.

    .venv/bin/python benchmarks/ab_attention.py --contexts 160,1024 \
        --variant 'cur:' --variant 'kb64: attention.KEY_BLOCK=64'

Each --variant is ab_cpu_matmul's `NAME: ATTR=EXPR; ...` (`attention.`, `common.`,
`build.`, ... in scope), or `NAME: @REV` for attention.py as it was at git revision REV;
`--block-size` builds every variant with that KV block instead of the plan's 16, and
`--layout` with that pool layout instead of the plan's; a variant's own `layout=NAME`
(e.g. `--variant 'heads: layout=heads'`) builds it with that layout, so that layouts
alternate in one run, and `tables=interleaved` gives it block tables whose sequences'
blocks interleave one by one (as sequences that decode in step got them from an allocator
that hands out the lowest free block: runs of one block), where the default gives each
sequence consecutive blocks. The kernel is bench_llamacpp's
model layer (16 query heads, 8 kv heads, head_dim 128, f16 pools in the CPU plan's
layout, max context --max-context) at one decode row, as a decode
step calls it: the row's keys and values come from memory, not from the caches (a step
streams the weights between two visits of a layer's KV cache), so each call takes the
next of enough sequences to fill --pool-mb. Prints per context the median and best
microseconds a call and the KV GB/s read (keys and values of positions 0..context-1)
beside a read probe taken each round,
with --threads threads (TVM's pool, as the engine), the pools in huge pages (as the
engine's).

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any

from ab_cpu_matmul import _HugeArena, variant_applied

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128


def _parse() -> argparse.Namespace:
    from ninfer.quantize import kv_formats as K

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--contexts", default="160,1024", help="comma-separated key counts")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layout", choices=list(K.KV_LAYOUTS), default=None,
                   help="the pools' layout (default: the CPU plan's, plan.CPU_KV_LAYOUT)")
    p.add_argument("--max-context", type=int, default=1024,
                   help="the kernel's max context (bench_llamacpp's model: 1024)")
    p.add_argument("--kv-dtype", default="f16", choices=list(K.KV_DTYPES),
                   help="the pools' format (int4: keys Hadamard-rotated, as the plan makes them)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200, help="calls per timing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pool-mb", type=int, default=256,
                   help="KV bytes the calls cycle through (0: one sequence, cache-resident)")
    p.add_argument("--small-pages", action="store_true",
                   help="pools in TVM's own allocations (4 KiB pages) instead of huge pages, "
                        "as the CPU engine holds them")
    args = p.parse_args()
    args.context_list = [int(c) for c in args.contexts.split(",")]
    if not all(1 <= c <= args.max_context for c in args.context_list):
        p.error(f"--contexts {args.contexts}: each must be in [1, --max-context "
                f"{args.max_context}]")
    return args


def _build(body: str, spec: Any) -> Any:
    """`spec`'s kernel with the variant applied (`@REV`: attention.py at REV)."""
    from ninfer.kernels import build_cpu_module

    with variant_applied(body):
        return build_cpu_module([spec])


def main() -> None:
    args = _parse()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import tvm

    from ninfer.kernels import AttentionSpec
    from ninfer.plan import CPU_KV_LAYOUT
    from ninfer.quantize import kv_formats as K

    bs, max_ctx = args.block_size, args.max_context
    contexts = args.context_list
    row_bytes = 2 * K.pool_bytes_per_row(args.kv_dtype, KV_HEADS, HEAD_DIM)  # K + V
    per_seq = -(-max_ctx // bs)
    seqs = max(1, (args.pool_mb << 20) // (max_ctx * row_bytes)) if args.pool_mb else 1
    rotate = K.rotation_block(HEAD_DIM) if args.kv_dtype == "int4" else 0
    spec = AttentionSpec(HEADS, KV_HEADS, HEAD_DIM, max_ctx, bs, seqs, seqs * per_seq,
                         args.kv_dtype, rotate, layout=args.layout or CPU_KV_LAYOUT)
    ids = np.arange(seqs * per_seq, dtype=np.int32)
    table_kinds = {"consecutive": ids.reshape(seqs, per_seq),
                   "interleaved": ids.reshape(per_seq, seqs).T.copy()}
    variants, variant_tables = {}, {}
    for v in args.variant:
        name, _, body = v.partition(":")
        name = name.strip()
        opts = {"layout": spec.layout, "tables": "consecutive"}
        rest = []
        for part in (a.strip() for a in body.split(";")):
            key = part.split("=", 1)[0].strip()
            if key in opts:
                opts[key] = part.split("=", 1)[1].strip()
            else:
                rest.append(part)
        if opts["tables"] not in table_kinds:
            raise SystemExit(f"variant {name}: tables={opts['tables']}: not one of "
                             f"{', '.join(table_kinds)}")
        vspec = dataclasses.replace(spec, layout=opts["layout"])
        variants[name] = _build("; ".join(rest), vspec)[vspec.name()]
        variant_tables[name] = tvm.runtime.tensor(table_kinds[opts["tables"]])
    rng = np.random.default_rng(0)
    shape = (seqs * per_seq * bs, KV_HEADS, HEAD_DIM)
    pools = []
    for _ in range(2):  # keys, values: random values in the format's storage
        stored = K.encode(args.kv_dtype, rng.standard_normal(shape).astype(np.float32),
                          rotate=rotate > 0)
        if args.small_pages:
            pools.append([tvm.runtime.tensor(a) for a in stored])
        else:  # as the CPU engine holds its KV pools (backend/cpu/cpu_memory.cpp)
            arena = _HugeArena(sum(-(-a.nbytes // 64) * 64 for a in stored))
            pools.append([arena.put(a) for a in stored])
    q = tvm.runtime.tensor(rng.standard_normal((1, HEADS, HEAD_DIM)).astype(np.float32))
    out = tvm.runtime.tensor(np.zeros((1, HEADS, HEAD_DIM), np.float32))
    seq_ids = [tvm.runtime.tensor(np.array([s], np.int32)) for s in range(seqs)]
    from ninfer.roofline import probe_bytes, read_patterns

    results: dict[tuple[str, int], list[float]] = {(v, c): [] for v in variants for c in contexts}
    probes = []
    for _ in range(args.rounds):
        probes.append(max(read_patterns(probe_bytes(0), args.threads, 1, huge=True).values()))
        for c in contexts:
            pos = tvm.runtime.tensor(np.array([c - 1], np.int32))
            for name, fn in variants.items():
                tables = variant_tables[name]
                fn(q, *pools[0], *pools[1], pos, seq_ids[0], tables, out)  # warm the code
                t0 = time.perf_counter()
                for i in range(args.calls):
                    fn(q, *pools[0], *pools[1], pos, seq_ids[i % seqs], tables, out)
                results[(name, c)].append((time.perf_counter() - t0) / args.calls)
    print(f"decode attention {HEADS}/{KV_HEADS} x {HEAD_DIM}, {args.kv_dtype} KV, block {bs}, "
          f"threads={args.threads}, {args.rounds} interleaved rounds of {args.calls} calls "
          f"over {seqs} sequence(s); a read probe (ninfer.roofline, huge pages) each round: "
          f"median {statistics.median(probes):.1f} GB/s, best {max(probes):.1f}")
    for c in contexts:
        for name in variants:
            v = results[(name, c)]
            med, best = statistics.median(v), min(v)
            gbps = c * row_bytes / med / 1e9
            print(f"context {c:>5}  {name:<20} median {med * 1e6:7.2f} us ({gbps:5.1f} GB/s)"
                  f"  best {best * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
