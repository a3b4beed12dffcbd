"""The machine's roofline, measured the way a decode step reads: a multi-threaded C read
loop (roofline.c, compiled here with the host's native flags and cached) over a buffer of
the model's weight size, in a plain and in prefetched multi-stream patterns (the best of
them is the roofline: what the machine gives a well-shaped read), and the FMA peak for
prefill. Every decode and prefill figure a benchmark prints sits beside the fraction of
these it reaches."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ninfer.paths import DEFAULT_BUILD_DIR

SOURCE = Path(__file__).with_name("roofline.c")


class RooflineError(RuntimeError):
    """The probe cannot be built or run here."""


@dataclass(frozen=True)
class Roofline:
    threads: int
    read_gbps: float  # best pass of any read pattern, 4 KiB pages
    read_huge_gbps: float  # the same with transparent huge pages asked for
    fma_gflops: float  # f32 FMA peak of `threads` threads (the widest vectors the host has)
    buffer_bytes: int
    fma_256_gflops: float = 0.0  # the same with 256-bit vectors, the width of ninfer's kernels
    read_plain_gbps: float = 0.0  # best pass of the plain pattern (hardware prefetch only), 4 KiB

    @property
    def best_read_gbps(self) -> float:
        return max(self.read_gbps, self.read_huge_gbps)

    def describe(self) -> str:
        return (f"roofline ({self.threads} threads, C probe over {self.buffer_bytes / 1e9:.2f} GB):"
                f" read {self.read_gbps:.1f} GB/s (4 KiB pages; {self.read_plain_gbps:.1f} without"
                f" software prefetch), {self.read_huge_gbps:.1f} GB/s (huge pages); f32 FMA peak"
                f" {self.fma_gflops:.0f} GFLOP/s ({self.fma_256_gflops:.0f} with 256-bit vectors)")


def probe_binary(cache: Path = DEFAULT_BUILD_DIR / "bench") -> Path:
    """roofline.c compiled for this host (rebuilt when the source changes)."""
    source = SOURCE.read_bytes()
    exe = cache / f"roofline-{hashlib.sha256(source).hexdigest()[:12]}"
    if exe.exists():
        return exe
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RooflineError("no C compiler (cc) for the roofline probe")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_suffix(".tmp")
    proc = subprocess.run([cc, "-O2", "-march=native", "-pthread", "-o", str(tmp), str(SOURCE)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RooflineError(f"building the roofline probe failed:\n{proc.stderr}")
    tmp.rename(exe)
    return exe


def _run(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([str(probe_binary()), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RooflineError(f"roofline {' '.join(args)} failed: {proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def read_patterns(nbytes: int, threads: int, repeats: int = 5,
                  huge: bool = False) -> dict[str, float]:
    """Best-of-`repeats` GB/s of `threads` threads reading an `nbytes` buffer, per read
    pattern of roofline.c ("plain", and "sNpD": N prefetched streams a thread)."""
    out = _run(["read", str(nbytes), str(threads), str(repeats), str(int(huge))])
    return {name: float(v) for name, v in out["patterns"].items()}


def fma_gflops(threads: int, repeats: int = 3) -> tuple[float, float]:
    """(peak, peak with 256-bit vectors) f32 GFLOP/s of `threads` threads."""
    out = _run(["fma", str(threads), str(repeats)])
    return float(out["gflops"]), float(out["gflops_256"])


CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def last_level_cache_bytes(cache_dir: Path = CACHE_DIR) -> int:
    """The largest CPU cache of this host (sysfs: index*/size, e.g. "491520K"), 0 where
    it does not say."""
    best = 0
    for size in cache_dir.glob("index*/size"):
        text = size.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


def probe_bytes(nbytes: int) -> int:
    """The read probe's buffer for a decode step that reads `nbytes`: at least four times
    the last-level cache (a cache that keeps part of a re-read buffer inflates the probe)
    and 256 MB. On the VM of RESULTS 2026-12-05 (480 MiB of L3), once each thread clocked
    its own pass, the best pattern read 38-39 GB/s over 512 MB to 4 GB alike and 38-44
    over 256 MB; the steeper size curve seen before (124 GB/s over 256 MB) was mostly the
    main thread's late clock, which weighs most on short passes."""
    return max(nbytes, 4 * last_level_cache_bytes(), 256 << 20)


def measure(nbytes: int, threads: int, repeats: int = 3) -> Roofline:
    """The roofline for a model whose decode step reads `nbytes` (see probe_bytes)."""
    nbytes = probe_bytes(nbytes)
    peak, peak_256 = fma_gflops(threads)
    small = read_patterns(nbytes, threads, repeats)
    huge = read_patterns(nbytes, threads, repeats, huge=True)
    return Roofline(threads, max(small.values()), max(huge.values()), peak, nbytes, peak_256,
                    read_plain_gbps=small["plain"])


def best_of(roofs: list[Roofline]) -> Roofline:
    """The best of each figure over rooflines measured at several moments of one run (this
    VM's bandwidth moves by a third over minutes)."""
    if not roofs:
        raise ValueError("best_of: no rooflines")
    return replace(roofs[0], read_gbps=max(r.read_gbps for r in roofs),
                   read_huge_gbps=max(r.read_huge_gbps for r in roofs),
                   fma_gflops=max(r.fma_gflops for r in roofs),
                   fma_256_gflops=max(r.fma_256_gflops for r in roofs),
                   read_plain_gbps=max(r.read_plain_gbps for r in roofs))


# The CPU gemvs read their weights either as one stream a thread with the hardware
# prefetchers alone, or as two streams a thread prefetched in software (the kernels'
# default). Which is faster depends on the host: on the 2-core AMD Zen 4 VM of RESULTS
# 2026-12-06 one stream decoded 5-16% faster (q4g64, f16), on the Intel VMs before it two
# prefetched streams read 20-30% more than a plain loop. The compile picks the pattern
# that reads faster in this probe.
HOST_READ_FILE = DEFAULT_BUILD_DIR / ".host-read.json"
STREAMS_ENV = "NINFER_CPU_GEMV_STREAMS"


def _plain_and_two(patterns: dict[str, float]) -> tuple[float, float]:
    """(the plain read, the best prefetched two-stream pattern) of a read probe, GB/s."""
    two = [v for name, v in patterns.items() if name.startswith("s2")]
    if "plain" not in patterns or not two:
        raise RooflineError(f"the read probe gave no plain and two-stream patterns: {patterns}")
    return patterns["plain"], max(two)


def gemv_streams_for(patterns: dict[str, float]) -> int:
    """1 where the plain read (one stream a thread, hardware prefetch only) beat every
    prefetched two-stream pattern of the probe, else 2."""
    plain, two = _plain_and_two(patterns)
    return 1 if plain > two else 2


def _host_id() -> str:
    """This CPU's model name and feature flags (what the cached choice is valid for)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    blob = f"{fields.get('model name', '')}|{fields.get('flags', '')}|{os.cpu_count()}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _per_host(cache: Path, measure: Callable[[], dict[str, float]]
              ) -> tuple[dict[str, float], str]:
    """A probe's result for this CPU (_host_id) as kept in `cache`, else `measure()`'s,
    then kept; and how it was had."""
    host = _host_id()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    result = known.get(host)
    if isinstance(result, dict):
        return result, "measured before on this CPU"
    result = measure()
    known[host] = result
    try:  # best effort: a build directory that cannot be written measures every time
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(cache)
    except OSError:
        return result, f"measured now; not kept, {cache} cannot be written"
    return result, "measured now"


def host_gemv_streams(cache: Path = HOST_READ_FILE) -> tuple[int, str]:
    """(streams, why) for this host's CPU gemvs: the value of NINFER_CPU_GEMV_STREAMS (1 or
    2) where set, else the choice of gemv_streams_for over the read probe (every core,
    huge pages, as the engine holds its weights), measured once per CPU and kept in
    `cache`."""
    env = os.environ.get(STREAMS_ENV)
    if env is not None:
        if env not in ("1", "2"):
            raise RooflineError(f"{STREAMS_ENV}={env!r}: must be 1 or 2")
        return int(env), f"{STREAMS_ENV}={env}"
    patterns, measured = _per_host(cache, lambda: read_patterns(
        probe_bytes(0), os.cpu_count() or 1, repeats=3, huge=True))
    plain, two = _plain_and_two(patterns)
    return gemv_streams_for(patterns), (f"read probe ({measured}): one plain stream a "
                                        f"thread {plain:.1f} GB/s, two prefetched streams "
                                        f"{two:.1f} GB/s")


# --cpu-bf16-activations auto rounds x to bf16 for AVX512_BF16's vdpbf16ps only where the
# instruction gives at least this many times the multiply-adds a second of 512-bit FMAs
# (the FMA path also widens the bf16 weights, and rounding x costs a little accuracy).
# The instruction's rate is the CPU's: on the Zen 4 VM of RESULTS sessions 29-30 the bf16
# gemm ran 1.6-1.9x as fast with it, on the Intel VM of session 37 (which lists
# avx512_bf16) vdpbf16ps gave half the FMAs' multiply-adds and the gemm 0.60x.
DPBF16_MIN_GAIN = 1.25
HOST_DPBF16_FILE = DEFAULT_BUILD_DIR / ".host-dpbf16.json"


def dpbf16_rates(repeats: int = 3) -> dict[str, float]:
    """{"dp_gmacs", "fma_gmacs"}: one thread's multiply-adds a second by vdpbf16ps chains
    and by 512-bit FMA chains (roofline.c dpbf16; 0 where the probe's compiler saw no
    AVX512_BF16)."""
    out = _run(["dpbf16", str(repeats)])
    return {"dp_gmacs": float(out["dp_gmacs"]), "fma_gmacs": float(out["fma_gmacs"])}


def host_dpbf16_pays(cache: Path | None = None) -> tuple[bool, str]:
    """(pays, why): whether vdpbf16ps gives this CPU DPBF16_MIN_GAIN x the FMAs'
    multiply-adds (dpbf16_rates, measured once per CPU and kept in `cache`, by default
    HOST_DPBF16_FILE)."""
    rates, measured = _per_host(cache or HOST_DPBF16_FILE, dpbf16_rates)
    dp, fma = rates.get("dp_gmacs", 0.0), rates.get("fma_gmacs", 0.0)
    pays = fma > 0 and dp >= DPBF16_MIN_GAIN * fma
    return pays, (f"vdpbf16ps probe ({measured}): {dp:.0f} G multiply-adds/s a thread against "
                  f"{fma:.0f} G by 512-bit FMAs")
