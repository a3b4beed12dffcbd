"""A/B variants of the CPU matmul kernels, interleaved round by round in one process.

    .venv/bin/python benchmarks/ab_cpu_matmul.py --format f16 --schedule gemv --rows 1,4 \
        --variant 'lanes8: matmul.matmul_lanes=lambda: 8' --variant 'host:'

Each --variant is `NAME: ATTR=EXPR; ATTR=EXPR ...`, ATTR a name in
ninfer.kernels.cpu.matmul (`matmul.`), ninfer.kernels.cpu.qmatmul (`qmatmul.`; its
activations' module `qactivations.`, K_BLOCK there), the helpers they share,
ninfer.kernels.cpu.build (`build.`), ninfer.kernels.cpu.common (`common.`), or (for
ab_engine_decode) ninfer.kernels.cpu.attention (`attention.`), ninfer.plan (`plan.`) or
ninfer.roofline (`roofline.`: e.g. `roofline.host_gemv_streams=lambda *a: (1, "ab")` for
one gemv stream a thread whatever the host's probe says), EXPR evaluated with those
modules and MatmulTiles / QTiles in scope; an empty list is the code as it stands.
`NAME: @REV` is the kernel file (matmul.py, or qmatmul.py for quantized formats) as it was at git
revision REV, fed the weight layout that revision's spec names (rows before the panels
layout existed); ab_engine_decode takes `@REV` as matmul.py, qmatmul.py and attention.py
at REV. Every variant builds the projection shapes of bench_llamacpp's 0.5B model (TVM's
runtime and thread pool, --threads). gemv: weights cycled through copies that fill
--stream-mb (in one huge-page mapping, as the CPU engine holds them; --small-pages: TVM's
own allocations), GB/s of weights (scales included) read; gemm: --gemm-rows rows, GFLOP/s.
Variants alternate within each round, so a slow spell of this VM lands on all of them;
medians and bests of --rounds.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any

SHAPES = [(1024, 2048), (1024, 1024), (2048, 1024), (1024, 6144), (3072, 1024)]  # k, n_out


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--format", default="f16", help="float32, f16, bf16, q8g32, q4g64, ...")
    p.add_argument("--schedule", choices=["gemv", "gemm"], default="gemv")
    p.add_argument("--rows", default="1", help="comma-separated row counts (gemv)")
    p.add_argument("--gemm-rows", type=int, default=256)
    p.add_argument("--bf16-activations", choices=["auto", "bf16", "f32"], default="auto",
                   help="bf16 weights: what they multiply, as --cpu-bf16-activations (auto: x "
                        "rounded to bf16 where this host has vdpbf16ps, as the plan does)")
    p.add_argument("--gemv-streams", type=int, choices=[0, 1], default=None,
                   help="gemv: 1 = one weight stream a thread (MatmulSpec.streams), 0 = the "
                        "kernels' prefetched streams; default: this host's choice, as "
                        "--cpu-gemv-streams auto makes it")
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stream-mb", type=int, default=1024,
                   help="gemv: weight copies cycled to fill this much (0: one copy, so a "
                        "shape small enough stays in cache)")
    p.add_argument("--passes", type=int, default=1,
                   help="passes over the weight copies per timing (many for a hot measure)")
    p.add_argument("--small-pages", action="store_true",
                   help="weights in TVM's own allocations (4 KiB pages) instead of one "
                        "anonymous huge-page mapping, as the CPU engine holds them")
    p.add_argument("--shapes", default=None,
                   help="K:N,... instead of the 0.5B model's five projection shapes")
    p.add_argument("--layout", choices=["rows", "lanes", "panels"], default=None,
                   help="the weight layout of the working tree's variants (default: the "
                        "plan's for the format; @REV variants take their revision's)")
    return p.parse_args()


@contextlib.contextmanager
def variant_applied(variant: str) -> Iterator[None]:
    """The kernel modules with a variant's `ATTR=EXPR; ...` assignments set, restored after."""
    from ninfer import plan, roofline
    from ninfer.kernels.cpu import attention, build, common, matmul, qactivations, qmatmul

    scope = {"common": common, "matmul": matmul, "qmatmul": qmatmul, "attention": attention,
             "plan": plan, "build": build, "qactivations": qactivations, "roofline": roofline,
             "MatmulTiles": matmul.MatmulTiles, "QTiles": qmatmul.QTiles}
    saved = []
    builders = dict(build._BUILDERS)
    if variant.strip().startswith("@"):  # the kernel files as they were at that revision
        rev = variant.strip()[1:]
        variant = ""
        for name in ("matmul", "qmatmul"):
            module = scope[name]
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, getattr(rev_module(rev, name), name))
        build._BUILDERS["attention"] = rev_module(rev, "attention").attention
    try:
        for assignment in filter(None, (a.strip() for a in variant.split(";"))):
            target, expr = (s.strip() for s in assignment.split("=", 1))
            module_name, attr = target.split(".", 1)
            module = scope[module_name]
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, eval(expr, scope))
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)
        build._BUILDERS.update(builders)


def _build(variant: str, specs: list[Any]) -> Any:
    """The module of `specs` with the variant's attributes set (and restored after)."""
    from ninfer.kernels import build_cpu_module

    with variant_applied(variant):
        return build_cpu_module(specs)


def _rev_source(rev: str, module: str) -> str:
    """compiler/ninfer/`module`.py as it was at git revision `rev`."""
    import subprocess

    return subprocess.run(["git", "show", f"{rev}:compiler/ninfer/{module}.py"], check=True,
                          capture_output=True, text=True).stdout


def rev_module(rev: str, name: str) -> Any:
    """The kernel module `name` (matmul, qmatmul with its qactivations and their weight
    formats' constants) as it was at git revision `rev`."""
    import importlib.util
    import sys
    import tempfile
    from pathlib import Path

    src = _rev_source(rev, name if "/" in name else f"kernels/cpu/{name}")
    if name == "qmatmul" and "from .qactivations import" in src:  # its x side at `rev` too
        acts = rev_module(rev, "qactivations")
        src = src.replace("from .qactivations import",
                          f"from .{acts.__name__.rsplit('.', 1)[1]} import")
    formats = "from ninfer.quantize.weight_formats import"
    if formats in src:  # the layout constants the kernel was written against
        src = src.replace(formats, f"from {rev_module(rev, 'quantize/weight_formats').__name__} "
                                   "import")
    name = name.replace("/", "_")
    path = Path(tempfile.mkdtemp()) / f"_ab_{name}.py"
    path.write_text(src)
    modname = "ninfer.kernels.cpu._ab_{}_{}".format(name, re.sub(r"\W", "_", rev))
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    module.SOURCE = src
    return module


def _build_rev(rev: str, specs: list[Any]) -> tuple[Any, list[Any]]:
    """The module compiled from the kernel file at git revision `rev`, and `specs` in the
    weight layout it takes."""
    import tvm

    from ninfer.kernels.cpu import bf16dot, build

    quantized = specs[0].wdtype.startswith("q")
    name = "qmatmul" if quantized else "matmul"
    module = rev_module(rev, name)
    src = module.SOURCE
    # float: panels where the revision reads spec.layout; quantized: the revision's lanes
    # layout where it has one for the format (quantize.weight_formats.LANES_FORMATS), else rows
    if quantized:
        lanes = re.search(r'^LANES_FORMATS = \((.*)\)', _rev_source(rev, "quantize/weight_formats"),
                          re.M)
        layout = "lanes" if lanes and f'"{specs[0].wdtype}"' in lanes.group(1) else "rows"
    else:
        layout = "panels" if "spec.layout" in src else "rows"
    # a revision before x_bf16 takes bf16 x as float32 whatever the spec says; rows
    # (before the panels layout) cannot carry the flag
    specs = [dataclasses.replace(s, layout=layout, x_bf16=s.x_bf16 and layout == "panels")
             for s in specs]
    funcs = {s.name(): getattr(module, name)(s).with_attr("global_symbol", s.name())
             for s in specs}
    with tvm.transform.PassContext(config=build._PASS_CONFIG):
        ex = tvm.compile(tvm.IRModule(funcs), target=build.cpu_target())
    return bf16dot.patch(ex), specs  # vdpbf16ps placeholders of a revision that has them


class _HugeArena:
    """Arrays placed in one 2 MiB-aligned anonymous mapping with MADV_HUGEPAGE (as the CPU
    engine's weights: Artifact::copy_to_huge_pages), handed to TVM without a copy."""

    def __init__(self, nbytes: int) -> None:
        import mmap

        import numpy as np

        align = 2 << 20
        self._map = mmap.mmap(-1, nbytes + 2 * align,  # private: a shared one is shmem (no THP)
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(self._map, dtype=np.uint8)
        start = (-raw.ctypes.data) % align
        self._raw = raw[start:]
        self._used = 0

    def put(self, a: Any) -> Any:
        import tvm

        n = a.nbytes
        view = self._raw[self._used:self._used + n].view(a.dtype).reshape(a.shape)
        view[...] = a
        self._used += -(-n // 64) * 64
        return tvm.runtime.from_dlpack(view)


def main() -> None:
    args = _parse()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import tvm

    from ninfer.kernels.cpu import matmul
    from ninfer.plan import matmul_spec
    from ninfer.quantize.weight_formats import pack, packed_nbytes
    from ninfer.targets import load_target

    if args.bf16_activations != "auto" and args.format != "bf16":
        raise SystemExit(f"--bf16-activations is for --format bf16, not {args.format}")
    x_bf16 = (args.bf16_activations == "bf16"
              or (args.bf16_activations == "auto" and matmul.use_dpbf16()))
    shapes = ([tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
              if args.shapes else SHAPES)
    streams = args.gemv_streams
    if streams is not None and args.schedule != "gemv":
        raise SystemExit("--gemv-streams is for --schedule gemv (the gemm reads its own way)")
    if streams is None:
        from ninfer.roofline import host_gemv_streams

        streams = 1 if host_gemv_streams()[0] == 1 else 0
    specs = [matmul_spec(load_target("cpu"), k, n, False, args.schedule, args.format,
                         streams, x_bf16=x_bf16) for k, n in shapes]
    if args.layout:
        specs = [dataclasses.replace(s, layout=args.layout) for s in specs]
    variants = {}  # name -> (executable, its specs)
    for v in args.variant:
        name, _, body = v.partition(":")
        body = body.strip()
        if body.startswith("@"):
            variants[name.strip()] = _build_rev(body[1:], specs)
        else:
            variants[name.strip()] = (_build(body, specs), specs)
    rng = np.random.default_rng(0)
    w_rows = [(rng.standard_normal((s.n_out, s.k)) * 0.05).astype(np.float32) for s in specs]
    weights: dict[str, list[list[list[Any]]]] = {}  # layout -> copies of every spec's parts
    # GB/s count the weights' bytes (scales included) without a layout's padding
    wbytes = sum(packed_nbytes(args.format, s.n_out, s.k) for s in specs)
    copies = max(1, (args.stream_mb << 20) // wbytes) if args.schedule == "gemv" else 1
    for vlayout in sorted({vs[0].layout for _, vs in variants.values()}):
        base = [list(pack(w, args.format, vlayout).values()) for w in w_rows]
        if args.small_pages:
            def place(a: Any) -> Any:
                return tvm.runtime.tensor(a.copy())
        else:
            arena = _HugeArena(copies * sum(-(-a.nbytes // 64) * 64 for p in base for a in p))
            place = arena.put
        weights[vlayout] = [[[place(a) for a in parts] for parts in base]
                            for _ in range(copies)]
    rows = [int(r) for r in args.rows.split(",")] if args.schedule == "gemv" else [args.gemm_rows]
    results: dict[tuple[str, int], list[float]] = {(v, r): [] for v in variants for r in rows}
    for _ in range(args.rounds):
        for r in rows:
            xs = [tvm.runtime.tensor(rng.standard_normal((r, s.k)).astype(np.float32))
                  for s in specs]
            outs = [tvm.runtime.tensor(np.zeros((r, s.n_out), np.float32)) for s in specs]
            for name, (ex, vspecs) in variants.items():
                fns = [ex[s.name()] for s in vspecs]
                copies_of = weights[vspecs[0].layout]
                t0 = time.perf_counter()
                for _ in range(args.passes):
                    for copy in copies_of:
                        for fn, x, w, o in zip(fns, xs, copy, outs, strict=True):
                            fn(x, *w, o)
                dt = time.perf_counter() - t0
                if args.schedule == "gemv":
                    results[(name, r)].append(wbytes * len(copies_of) * args.passes / dt / 1e9)
                else:
                    flops = sum(2 * r * s.k * s.n_out for s in specs) * args.passes
                    results[(name, r)].append(flops / dt / 1e9)
    unit = "GB/s" if args.schedule == "gemv" else "GFLOP/s"
    print(f"{args.format} {args.schedule}, threads={args.threads}, {args.rounds} interleaved "
          f"rounds, {copies} weight copies in "
          f"{'4 KiB pages' if args.small_pages else 'huge pages'}")
    for r in rows:
        for name in variants:
            v = results[(name, r)]
            print(f"rows {r:>4}  {name:<24} median {statistics.median(v):7.1f}  best "
                  f"{max(v):7.1f} {unit}")


if __name__ == "__main__":
    main()
