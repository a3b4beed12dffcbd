"""Build the native test targets (tests/native/CMakeLists.txt) for the Python tests.

The repository's top-level CMake project, with NINFER_BUILD_TESTS=ON, is configured once
into build/native with the PyPI cmake and ninja next to this Python (ccache as the
compiler launcher when present); each test session then builds the targets it needs,
and Ninja rebuilds only what changed. The runtime is built through the same targets a
compiled model links (runtime_cpp/CMakeLists.txt), so no test lists runtime sources.

The chat templates of fake_server and ninfer_chat_ext are generated C++ (as ninfer-compile
generates a model's): before those targets build, the templates of tests/chat_suite.py are
generated into build/native/<dir>/ (a file is rewritten only when it changes).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pybind11

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "native"
NATIVE = BUILD / "tests" / "native"  # where tests/native/CMakeLists.txt puts its targets


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def build(*targets: str) -> Path:
    """Configure build/native if needed, build `targets`; returns the tests' output dir."""
    BUILD.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CCACHE_BASEDIR": str(ROOT)}
    with open(BUILD / ".lock", "w") as lock:  # one configure/build at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        for target in targets:
            _write_chat_templates(target)
        if not (BUILD / "build.ninja").exists():
            _run([_tool("cmake"), "-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja",
                  f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", "-DNINFER_BUILD_TESTS=ON",
                  f"-DPython_EXECUTABLE={sys.executable}",
                  f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"], env)
        _run([_tool("cmake"), "--build", str(BUILD), "--target", *targets], env)
    return NATIVE


def _write_chat_templates(target: str) -> None:
    import chat_suite
    from ninfer.frontend.chat_codegen import generate

    sets = chat_suite.native_template_sets()
    if target not in sets:
        return
    directory, templates = sets[target]
    out = BUILD / directory
    out.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for k, (name, template) in enumerate(templates):
        wanted[f"t{k:03d}.cpp"] = generate(template, f"t{k:03d}", name)
    for stale in out.glob("*.cpp"):
        if stale.name not in wanted:
            stale.unlink()
    for file, text in wanted.items():
        path = out / file
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def _run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{tail}")


def extension(name: str) -> ModuleType:
    """Build the pybind11 test module `name` (a tests/native/CMakeLists.txt target) and
    import it."""
    out = build(name) / "python"
    [path] = out.glob(f"{name}.*.so")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
