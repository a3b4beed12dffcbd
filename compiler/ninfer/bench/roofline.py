"""The machine's roofline, measured the way a decode step reads: a multi-threaded C read
loop (roofline.c, compiled here with the host's native flags and cached) over a buffer of
the model's weight size, and the FMA peak for prefill. Every decode and prefill figure a
benchmark prints sits beside the fraction of these it reaches."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
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
    fma_gflops: float  # f32 FMA peak of `threads` threads
    buffer_bytes: int

    @property
    def best_read_gbps(self) -> float:
        return max(self.read_gbps, self.read_huge_gbps)

    def describe(self) -> str:
        return (f"roofline ({self.threads} threads, C probe over {self.buffer_bytes / 1e9:.2f} GB):"
                f" read {self.read_gbps:.1f} GB/s (4 KiB pages), {self.read_huge_gbps:.1f} GB/s"
                f" (huge pages); f32 FMA peak {self.fma_gflops:.0f} GFLOP/s")


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


def fma_gflops(threads: int, repeats: int = 3) -> float:
    return float(_run(["fma", str(threads), str(repeats)])["gflops"])


def measure(nbytes: int, threads: int, repeats: int = 5) -> Roofline:
    """The roofline for a model whose decode step reads `nbytes` of weights."""
    nbytes = max(nbytes, 256 << 20)  # far beyond the last-level cache either way
    return Roofline(threads, read_gbps(nbytes, threads, repeats),
                    read_gbps(nbytes, threads, repeats, huge=True),
                    fma_gflops(threads), nbytes)
