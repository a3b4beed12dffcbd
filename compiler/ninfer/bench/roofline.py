"""The machine's roofline, measured the way a decode step reads: a multi-threaded C read
loop (roofline.c, compiled here with the host's native flags and cached) over a buffer of
the model's weight size, and the FMA peak for prefill. Every decode and prefill figure a
benchmark prints sits beside the fraction of these it reaches."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from ninfer.paths import DEFAULT_BUILD_DIR

SOURCE = Path(__file__).with_name("roofline.c")


class RooflineError(RuntimeError):
    """The probe cannot be built or run here."""


@dataclass(frozen=True)
class Roofline:
    threads: int
    read_gbps: float  # best pass, 4 KiB pages (what the weights get today)
    read_huge_gbps: float  # the same with transparent huge pages asked for
    fma_gflops: float  # f32 FMA peak of `threads` threads (the widest vectors the host has)
    buffer_bytes: int
    fma_256_gflops: float = 0.0  # the same with 256-bit vectors, the width of ninfer's kernels

    @property
    def best_read_gbps(self) -> float:
        return max(self.read_gbps, self.read_huge_gbps)

    def describe(self) -> str:
        return (f"roofline ({self.threads} threads, C probe over {self.buffer_bytes / 1e9:.2f} GB):"
                f" read {self.read_gbps:.1f} GB/s (4 KiB pages), {self.read_huge_gbps:.1f} GB/s"
                f" (huge pages); f32 FMA peak {self.fma_gflops:.0f} GFLOP/s"
                f" ({self.fma_256_gflops:.0f} with 256-bit vectors)")


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


def _run(args: list[str]) -> dict[str, float]:
    proc = subprocess.run([str(probe_binary()), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RooflineError(f"roofline {' '.join(args)} failed: {proc.stderr.strip()}")
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def read_gbps(nbytes: int, threads: int, repeats: int = 5, huge: bool = False) -> float:
    """Best-of-`repeats` GB/s of `threads` threads reading an `nbytes` buffer."""
    return float(_run(["read", str(nbytes), str(threads), str(repeats), str(int(huge))])["gbps"])


def fma_gflops(threads: int, repeats: int = 3) -> tuple[float, float]:
    """(peak, peak with 256-bit vectors) f32 GFLOP/s of `threads` threads."""
    out = _run(["fma", str(threads), str(repeats)])
    return float(out["gflops"]), float(out["gflops_256"])


def measure(nbytes: int, threads: int, repeats: int = 5) -> Roofline:
    """The roofline for a model whose decode step reads `nbytes` of weights."""
    nbytes = max(nbytes, 256 << 20)  # far beyond the last-level cache either way
    peak, peak_256 = fma_gflops(threads)
    return Roofline(threads, read_gbps(nbytes, threads, repeats),
                    read_gbps(nbytes, threads, repeats, huge=True), peak, nbytes, peak_256)


def best_of(roofs: list[Roofline]) -> Roofline:
    """The best of each figure over rooflines measured at several moments of one run (this
    VM's bandwidth moves by a third over minutes)."""
    if not roofs:
        raise ValueError("best_of: no rooflines")
    return replace(roofs[0], read_gbps=max(r.read_gbps for r in roofs),
                   read_huge_gbps=max(r.read_huge_gbps for r in roofs),
                   fma_gflops=max(r.fma_gflops for r in roofs),
                   fma_256_gflops=max(r.fma_256_gflops for r in roofs))
