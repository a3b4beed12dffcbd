"""Build: CMake + Ninja over a generated tree -> ninfer-server (+ ninfer_engine module)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


class BuildError(RuntimeError):
    """The C++ build failed; the message carries the tail of the compiler output."""


def _tool(name: str) -> str:
    # Prefer the copies installed with the package (PyPI cmake/ninja) next to this Python.
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise BuildError(f"'{name}' not found; install the project (pip install -e .)")
    return found


def cmake_build(src_dir: Path, build_dir: Path, jobs: int | None = None,
                log: Path | None = None) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    # No CCACHE_BASEDIR: with absolute paths the runtime's objects hash the same in every
    # build directory of a checkout (relative ones differ with the directory's depth), so
    # the runtime compiles once for all models and the native tests (same flags: Release,
    # PIC, as the top-level CMakeLists.txt sets them).
    env = dict(os.environ)
    configure = [_tool("cmake"), "-S", str(src_dir), "-B", str(build_dir), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", f"-DPython_EXECUTABLE={sys.executable}",
                 "-DCMAKE_BUILD_TYPE=Release"]
    build = [_tool("cmake"), "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)]
    output = []
    for cmd in (configure, build):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        output.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            if log:
                log.write_text("\n".join(output))
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            raise BuildError(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}):\n{tail}")
    if log:
        log.write_text("\n".join(output))
