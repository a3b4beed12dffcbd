"""Real resource usage of compiled CUDA kernels: run nvcc, parse what ptxas reports.

`compile_cuda` compiles one translation unit (many kernels at once: nvcc's front end
dominates the cost) for one arch into a cubin and returns the registers, shared memory,
local memory and spills of every entry function. Results are cached on disk by
sha256(source, arch, flags, nvcc version), so a second run costs a file read.

`parse_resource_usage` reads the two formats nvcc 13 prints with `--resource-usage`:

    ptxas info    : Compiling entry function 'kc' for 'sm_89'
    ptxas info    : Function properties for kc
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 13 registers, used 1 barriers, 4096 bytes smem, 372 bytes cmem[0]

and, when linking relocatable device code, nvlink's

    nvlink info    : Function properties for 'kc':
    nvlink info    : used 24 registers, used 1 barriers, 0 stack, 4096 bytes smem, ...

Kernels are keyed by the symbol as printed (an `extern "C"` name, or a mangled C++ name);
a mangled name whose plain identifier is unambiguous is also reachable by that
identifier (`_Z5plainPfi` -> `plain`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

# Front-end diagnostics that generated code triggers harmlessly (see TVM_NOTES).
SUPPRESSED_DIAGNOSTICS = ("177", "1046")
BASE_FLAGS = ("-cubin", "--resource-usage", "-O3", "-std=c++17",
              f"-diag-suppress={','.join(SUPPRESSED_DIAGNOSTICS)}")


class CudaCompileError(RuntimeError):
    """nvcc is missing, failed, or printed no resource usage for the source."""


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel needs per thread / per CTA, as ptxas reports it.

    registers: per thread. static_smem_bytes: `__shared__` arrays (dynamic shared memory
    is a launch parameter and is not included). local_bytes: per-thread local memory
    (stack frame, or the cumulative stack size when the kernel calls functions).
    const_bytes: constant banks the kernel uses (parameters live in cmem[0]).
    """

    name: str
    registers: int
    static_smem_bytes: int = 0
    local_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    const_bytes: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class CompiledCuda:
    cubin_path: Path
    resources: dict[str, KernelResources]
    log: str


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for '?([^':\s]+)'?:?\s*$")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"\b[Uu]sed (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE_STACK = re.compile(r"(\d+) bytes cumulative stack size")
_NVLINK_STACK = re.compile(r"(\d+) stack\b")
_LMEM = re.compile(r"(\d+) bytes lmem")
_MANGLED = re.compile(r"_Z(\d+)")


def parse_resource_usage(ptxas_output: str) -> dict[str, KernelResources]:
    """Every entry function in `ptxas_output` (one arch at a time), keyed by its symbol.

    Properties printed for non-entry device functions are skipped; their stack use is
    already part of the calling kernel's cumulative stack size.
    """
    found: dict[str, KernelResources] = {}
    arch_of: dict[str, str] = {}
    entry: str | None = None  # the entry function ptxas is compiling
    props: str | None = None  # whose "Function properties" block we are in
    for line in ptxas_output.splitlines():
        if m := _ENTRY.search(line):
            entry, arch = m.group(1), m.group(2)
            if arch_of.setdefault(entry, arch) != arch:
                raise ValueError(f"kernel {entry} appears for {arch_of[entry]} and {arch}; "
                                 "parse the output of one arch at a time")
            found[entry] = KernelResources(entry, 0)
            props = None
        elif m := _PROPS.search(line):
            props = m.group(1)
            if "nvlink" in line:  # nvlink lists kernels without "Compiling entry" lines
                entry = props
                found.setdefault(entry, KernelResources(entry, 0))
        elif (m := _FRAME.search(line)) and props is not None and props == entry:
            frame, stores, loads = (int(g) for g in m.groups())
            found[entry] = replace(found[entry], local_bytes=max(frame, found[entry].local_bytes),
                                   spill_store_bytes=stores, spill_load_bytes=loads)
        elif (m := _USED.search(line)) and entry is not None and props in (None, entry):
            found[entry] = _with_usage_line(found[entry], int(m.group(1)), line)
    return _with_plain_aliases(found)


def _with_usage_line(res: KernelResources, registers: int, line: str) -> KernelResources:
    def total(pattern: re.Pattern[str]) -> int:
        return sum(int(v) for v in pattern.findall(line))

    local = max(res.local_bytes, total(_CUMULATIVE_STACK), total(_NVLINK_STACK), total(_LMEM))
    return replace(res, registers=registers, static_smem_bytes=total(_SMEM),
                   const_bytes=total(_CMEM), local_bytes=local)


def _plain_identifier(symbol: str) -> str | None:
    """`_Z5plainPfi` -> `plain`; None for anything that is not a simple mangled name."""
    m = _MANGLED.match(symbol)
    if not m:
        return None
    start = m.end()
    return symbol[start:start + int(m.group(1))] or None


def _with_plain_aliases(found: dict[str, KernelResources]) -> dict[str, KernelResources]:
    aliases: dict[str, list[KernelResources]] = {}
    for res in found.values():
        plain = _plain_identifier(res.name)
        if plain is not None:
            aliases.setdefault(plain, []).append(res)
    out = dict(found)
    for plain, matches in aliases.items():
        if len(matches) == 1 and plain not in out:
            out[plain] = matches[0]
    return out


# (CUDA source, arch) -> the resource usage of every kernel in it. The compiler asks nvcc
# (`nvcc_resources`); a test may answer from recorded numbers instead.
ResourceSource = Callable[[str, str], Mapping[str, KernelResources]]


def nvcc_resources(cache_dir: Path) -> ResourceSource:
    """What nvcc reports for each source (`compile_cuda`, cached under `cache_dir`)."""
    return lambda source, arch: compile_cuda(source, arch, cache_dir).resources


def find_nvcc() -> Path:
    """nvcc from PATH, else from the PyPI `nvidia-cuda-nvcc` package if installed."""
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("*/bin/nvcc")):
            if os.access(candidate, os.X_OK):
                return candidate
    raise CudaCompileError(
        "nvcc not found: install the CUDA toolkit and put nvcc on PATH, or "
        "`pip install nvidia-cuda-nvcc` into this environment")


@lru_cache(maxsize=8)
def nvcc_version(nvcc: Path) -> str:
    r = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise CudaCompileError(f"{nvcc} --version failed: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1]


def compile_cuda(source: str, arch: str, cache_dir: Path,
                 extra_flags: Sequence[str] = ()) -> CompiledCuda:
    """Compile `source` for `arch` to a cubin and parse every kernel's resource usage."""
    nvcc = find_nvcc()
    flags = (f"-arch={arch}", *BASE_FLAGS, *extra_flags)
    key = hashlib.sha256("\0".join((source, arch, *flags, nvcc_version(nvcc))).encode())
    entry_dir = Path(cache_dir) / key.hexdigest()[:24]
    cubin, log_path = entry_dir / "kernels.cubin", entry_dir / "resource-usage.txt"
    if not (cubin.exists() and log_path.exists()):
        _compile_into(nvcc, source, flags, entry_dir)
    log = log_path.read_text()
    resources = parse_resource_usage(log)
    if not resources and "__global__" in source:
        raise CudaCompileError(f"nvcc printed no resource usage for {arch}:\n{log}")
    return CompiledCuda(cubin, resources, log)


def _compile_into(nvcc: Path, source: str, flags: Sequence[str], entry_dir: Path) -> None:
    """Build in a scratch directory, then rename it into place (safe under concurrency)."""
    entry_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=entry_dir.name + ".", dir=entry_dir.parent))
    try:
        (scratch / "kernels.cu").write_text(source)
        cmd = [str(nvcc), *flags, "-o", "kernels.cubin", "kernels.cu"]
        r = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=1200)
        log = r.stdout + r.stderr
        if r.returncode != 0:
            raise CudaCompileError(f"nvcc failed (exit {r.returncode}): {' '.join(cmd)}\n"
                                   f"{log[-4000:]}")
        (scratch / "resource-usage.txt").write_text(log)
        try:
            scratch.rename(entry_dir)
        except OSError:  # another process filled this entry first; theirs is identical
            if not (entry_dir / "kernels.cubin").exists():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
