"""Load the `ninfer_engine_<model>` module built beside a compiled server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def load_engine_module(out_dir: str | Path) -> ModuleType:
    """Import the compiled model's Python module from its build directory."""
    found = sorted(Path(out_dir).glob("ninfer_engine_*.so"))
    if not found:
        raise FileNotFoundError(f"no ninfer_engine_* module in {out_dir}; compile without "
                                "--no-python-module")
    if len(found) > 1:
        raise ImportError(f"{out_dir} holds {len(found)} engine modules "
                          f"({', '.join(f.name for f in found)}): recompile into it or remove "
                          "the stale ones")
    name = found[0].name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, found[0])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {found[0]}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_engine(out_dir: str | Path, threads: int = 0, mmap_weights: bool = False) -> Any:
    """An `Engine` over the model.ninfer in `out_dir`. On the CPU its weights are copied into
    huge-page memory, as the server does, unless `mmap_weights` (the server's
    --mmap-weights): then they are read in place from the mapped file."""
    return load_engine_module(out_dir).Engine(str(Path(out_dir) / "model.ninfer"), threads,
                                              mmap_weights)
