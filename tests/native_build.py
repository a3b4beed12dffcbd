"""Build a throwaway pybind11 extension from runtime_cpp sources, for unit tests.

Unit tests of model-independent C++ (tokenizer, chat format, ...) use this instead of a
full `ninfer-compile` build: one `c++` call per module, cached by ccache when present.
Each binding file defines `void <bind_fn>(pybind11::module_&)`; the module's init calls
every listed binder in order.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pybind11

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime_cpp"


def build_extension(
    name: str, sources: list[str], binders: list[str], out_dir: Path, libs: tuple[str, ...] = ()
) -> ModuleType:
    """Compile `sources` (paths relative to runtime_cpp/) into module `name` and import it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    decls = "\n".join(f"void {b}(pybind11::module_& m);" for b in binders)
    calls = "\n".join(f"  {b}(m);" for b in binders)
    main = out_dir / f"{name}_module.cpp"
    main.write_text(
        "#include <pybind11/pybind11.h>\n"
        f"{decls}\nPYBIND11_MODULE({name}, m) {{\n{calls}\n}}\n"
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = out_dir / f"{name}{suffix}"
    srcs = [str(RUNTIME / s) for s in sources] + [str(main)]
    digest = hashlib.sha256()
    for s in srcs:
        digest.update(Path(s).read_bytes())
    stamp = out_dir / f"{name}.sha256"
    if not (target.exists() and stamp.exists() and stamp.read_text() == digest.hexdigest()):
        cxx = ["ccache", "c++"] if shutil.which("ccache") else ["c++"]
        cmd = [
            *cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
            f"-I{RUNTIME}", f"-I{pybind11.get_include()}",
            f"-I{sysconfig.get_paths()['include']}",
            *srcs, "-o", str(target), *[f"-l{lib}" for lib in libs],
        ]
        subprocess.run(cmd, check=True)
        stamp.write_text(digest.hexdigest())
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
