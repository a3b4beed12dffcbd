"""Render the model-specific sources (step program, CMakeLists) from templates/."""

from __future__ import annotations

import math
import re
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pybind11
import tvm_ffi

from ninfer.codegen.backend import Backend
from ninfer.codegen.stubs import kv_parts, make_stub, weight_parts
from ninfer.frontend.graph import ModelGraph
from ninfer.frontend.hybrid import LINEAR, HybridTraits
from ninfer.kernels.spec import KernelSpec, MatmulSpec
from ninfer.paths import RUNTIME_DIR, TEMPLATES_DIR
from ninfer.plan import Plan
from ninfer.targets import Target

# (template, generated file) pairs per backend: the step program and stub declarations
# are shared, the launch table is the backend's own.
GENERATED_FILES = {
    "cpu": (("model.cpp.j2", "model.cpp"), ("kernels.h.j2", "kernels.h"),
            ("launch_cpu.cpp.j2", "launch.cpp"), ("CMakeLists.txt.j2", "CMakeLists.txt")),
    "cuda": (("model.cpp.j2", "model.cpp"), ("kernels.h.j2", "kernels.h"),
             ("launch_cuda.cu.j2", "launch.cu"), ("CMakeLists.txt.j2", "CMakeLists.txt")),
}


@dataclass(frozen=True)
class GeneratedTree:
    directory: Path
    files: tuple[Path, ...]


def _row_elems(spec: KernelSpec) -> list[int]:
    """Elements of each stored part of a matmul weight per output row (whole rows, or
    whole panels of PANEL columns: plan.qkv_fusable)."""
    if not isinstance(spec, MatmulSpec):
        raise TypeError(f"{spec.name()} is not a matmul")
    out = []
    for part in weight_parts("q", spec):
        total = math.prod(part.shape)
        if total % spec.n_out:
            raise ValueError(f"{spec.name()}: part {part.arg} is not whole output rows")
        out.append(total // spec.n_out)
    return out


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["prefix"] = lambda s, p: f"{p}{s}"
    env.filters["suffix"] = lambda s, x: f"{s}{x}"
    return env


def model_slug(model_id: str) -> str:
    """`model_id` as a C identifier fragment (names the model's Python module)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", model_id) or "model"


def module_name(model_id: str, build_digest: str) -> str:
    """The Python module of a build: CPython keeps one extension module per name in a
    process, so two builds of one model (other limits, --spec ...) need two names."""
    return f"ninfer_engine_{model_slug(model_id)}_{build_digest}"


def tvm_include_dirs() -> list[str]:
    base = Path(tvm_ffi.__file__).resolve().parent / "include"
    tvm_inc = Path(tvm_ffi.__file__).resolve().parents[1] / "tvm" / "include"
    return [str(base), str(tvm_inc)]


def render_tree(graph: ModelGraph, plan: Plan, target: Target, model_id: str,
                backend: Backend, src_dir: Path, out_dir: Path,
                python_module: bool = True,
                chat_sources: Mapping[str, str] | None = None) -> GeneratedTree:
    """Write the generated sources into `src_dir`; return what was written.

    `backend` holds the backend's own template values (codegen.backend), of the target's
    kind; `chat_sources` the generated chat templates (frontend.chat_codegen), by file name.
    """
    if backend.kind != target.kind:
        raise ValueError(f"a {backend.kind} backend cannot render target {target.name} "
                         f"({target.kind})")
    env = _environment()
    src_dir.mkdir(parents=True, exist_ok=True)
    kernels = {role: spec.name() for role, spec in plan.kernels.items()}
    hybrid = graph.traits if isinstance(graph.traits, HybridTraits) else None
    stubs = [make_stub(spec) for spec in sorted(plan.unique_kernels(), key=lambda s: s.name())]
    digest = plan.build_digest(graph.config, target, model_id)
    context = {
        "model_id": model_id,
        "model_slug": model_slug(model_id),
        "build_digest": digest,
        "module_name": module_name(model_id, digest),
        "cfg": graph.config,
        "traits": graph.traits,
        "target": target,
        "target_hash": target.stable_hash(),
        "limits": plan.limits,
        "kv": plan.kv,
        "kernels": kernels,
        "plan_kernels": plan.kernels,
        "wparts": {role: weight_parts(role, plan.kernels[f"{role}_gemv"])
                   for role in plan.matmul_roles},
        "layer_roles": [r for r in plan.matmul_roles if r not in ("lm_head", "mtp_fc")],
        # per stored part of q (and k, v): elements per output row, where the three are
        # read as one matrix (plan.qkv_fusable)
        "qkv_row_elems": _row_elems(plan.kernels["q_gemv"]) if "qkv_gemv" in plan.kernels
        else [],
        "mtp": plan.limits.spec == "mtp",
        "mtp_sparse": plan.limits.spec == "mtp" and any(
            w.name == "mtp.layers.0.router" for w in graph.weights),
        "hybrid": hybrid,
        "linear_flags": ["true" if t == LINEAR else "false"
                         for t in (hybrid.layer_types if hybrid else ())],
        "rope_dims": graph.rope_dims,
        "moe": bool(hybrid and hybrid.sparse_layers),
        "sparse_flags": ["true" if i in hybrid.sparse_layers else "false"
                         for i in range(len(hybrid.layer_types))] if hybrid else [],
        "dense_mlp": hybrid.dense_mlp if hybrid else True,
        "kvparts": kv_parts(plan.kernels["attention"]),
        "stubs": stubs,
        "buffers": plan.buffers,
        "runtime_dir": str(RUNTIME_DIR),
        "tvm_includes": tvm_include_dirs(),
        "coop": {},
        "coop_source": "",
        **backend.template_values(),
        "out_dir": str(out_dir),
        "python_module": python_module,
        "pybind11_cmake_dir": pybind11.get_cmake_dir(),
        "python_include": sysconfig.get_paths()["include"],
        "chat_template_files": sorted(chat_sources or {}),
    }
    written = []
    for name, text in sorted((chat_sources or {}).items()):
        path = src_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for template, name in GENERATED_FILES[target.kind]:
        text = env.get_template(template).render(**context)
        path = src_dir / name
        if not path.exists() or path.read_text() != text:  # keep mtimes for Ninja
            path.write_text(text)
        written.append(path)
    return GeneratedTree(src_dir, tuple(written))
