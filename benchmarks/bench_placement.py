"""Decode windows and read probes sorted by where this VM put its two vCPUs.

    .venv/bin/python benchmarks/bench_placement.py --format q4g64 --seconds 120

On the 2-core Zen 4 VM of RESULTS session 32 the two vCPUs move, every few seconds, between
SMT siblings of one core, two cores of one CCD and cores of two CCDs. A cache-line round
trip between them (placement_probe.c: ~70, ~150-250, ~500 ns) tells which; a 2-thread
read reads ~30-35 GB/s in the first two and up to ~60 in the third (each CCD has its own
link to memory), where every hand-off between the threads costs ~2.5x. So a decode
window and a read probe taken seconds apart may see different machines, and a fraction of
one against the other says little. This alternates 16-step decode windows of the
bench_llamacpp model (profile_decode's build of --format, f16 KV cache, contexts 64-1000)
and read probes (256 MB, huge pages, best of 2), each bracketed by two round trips, keeps
those whose two round trips name the same placement, and prints per placement the
windows' median and best tokens/s, the best window's GB/s (weights less the embedding
table, plus the KV cache at its context), the probes' median and best GB/s, and the best
window against the median probe of the same placement.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import time

import bench_llamacpp as bench
import profile_decode

WINDOW = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="q4g64")
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()
    from ninfer.runtime.engine import load_engine

    exe = bench.placement_binary()
    build = profile_decode._build("qwen3", args.format)
    report = json.loads((build / "compile_report.json").read_text())
    ckpt = bench.bench_dir() / "qwen3-0.5b"
    cfg = json.loads((ckpt / "config.json").read_text())
    weights = bench.decode_weight_bytes(report["plan"], ckpt)

    def run(*a: str) -> list[float]:
        out = subprocess.run([str(exe), *a], capture_output=True, text=True, check=True)
        return [float(v) for v in out.stdout.split()]

    engine = load_engine(build, threads=2)
    for i in range(64):
        engine.forward([3 + i % 50], i)
    windows: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    probes: dict[str, list[float]] = collections.defaultdict(list)
    pos, end = 64, time.time() + args.seconds
    while time.time() < end:
        if pos + WINDOW >= bench.N_CTX:
            pos = 64
        (before,) = run("rtt")
        t0 = time.perf_counter()
        for i in range(WINDOW):
            engine.forward([5 + i], pos + i)
        rate = WINDOW / (time.perf_counter() - t0)
        (after,) = run("rtt")
        if bench.placement(before) == bench.placement(after):
            gb = (weights + bench.state_bytes_per_token(cfg, pos + WINDOW / 2)) / 1e9
            windows[bench.placement(before)].append((rate, rate * gb))
        pos += WINDOW
        before, gbps, after = run("read", "256")
        if bench.placement(before) == bench.placement(after):
            probes[bench.placement(before)].append(gbps)
    print(f"qwen3 0.5B {args.format}, {args.seconds:.0f} s of {WINDOW}-step windows and "
          f"256 MB read probes, 2 threads")
    for name, _ in bench.PLACES:
        w, p = windows.get(name, []), probes.get(name, [])
        line = f"{name}: {len(w)} windows"
        if w:
            best = max(w)
            line += (f", median {statistics.median(r for r, _ in w):.1f} best {best[0]:.1f} "
                     f"tok/s ({best[1]:.1f} GB/s)")
        line += f"; {len(p)} probes"
        if p:
            line += f", median {statistics.median(p):.1f} best {max(p):.1f} GB/s"
        if w and p:
            line += f"; best window / median probe {max(w)[1] / statistics.median(p):.0%}"
        print(line)


if __name__ == "__main__":
    main()
