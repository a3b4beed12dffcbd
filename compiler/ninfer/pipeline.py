"""The compile pipeline: the stage list, in one place, one comment per phase."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ninfer import __version__
from ninfer.artifact import ARTIFACT_DTYPES, PendingTensor, write_artifact
from ninfer.frontend import open_checkpoint
from ninfer.frontend.chat_template import compile_chat_template
from ninfer.frontend.config import FrontendError
from ninfer.frontend.graph import ModelGraph, WeightSpec, rope_tables
from ninfer.frontend.llama import build_graph
from ninfer.frontend.tokenizer import TokenizerInfo, tokenizer_info
from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.plan import Plan, ServeLimits, WeightFormats, make_plan, weight_format
from ninfer.targets import Target, load_target

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompileOptions:
    model_dir: Path
    target: str = "cpu"
    out_dir: Path | None = None
    model_id: str | None = None
    max_context: int = 4096
    max_prefill_chunk: int = 512
    max_concurrency: int = 8
    kv_capacity: int = 0  # tokens; 0 = auto
    weights: str = "f32"  # matmul weight format (plan.FORMAT_WDTYPES)
    weight_overrides: tuple[tuple[str, str], ...] = ()  # (role, format), e.g. lm_head
    kv_dtype: str = "f16"  # KV-cache format (ninfer.quantize.kv_formats)
    memory_gib: float | None = None
    python_module: bool = True
    dump_dir: Path | None = None
    # CUDA: "tvm" runs prefill projections through the TVM GEMM; "coop" through the
    # cooperative split-K family with verifier-derived routes (validated on an H200);
    # "auto" = coop on CUDA targets, tvm on the CPU.
    prefill_projections: str = "auto"
    kernel_cache: Path = field(default_factory=lambda: DEFAULT_BUILD_DIR / ".kernel-cache")
    # False: build everything but model.ninfer (write it later with write_model_artifact,
    # e.g. on a machine that holds the weights but not TVM).
    write_artifact: bool = True


@dataclass(frozen=True)
class CompileResult:
    out_dir: Path
    server: Path
    artifact: Path
    report: Path
    report_data: dict[str, Any]


CUDA_KV_DTYPES = ("f32", "f16", "bf16")  # kernels.cuda.attention.CUDA_KV_FORMATS


def compile_model(opts: CompileOptions, progress: Progress = lambda _: None) -> CompileResult:
    # Code generation imports tvm_ffi and the build needs a toolchain; both are imported
    # here so that write_model_artifact runs where neither exists.
    from ninfer.build import cmake_build
    from ninfer.codegen import render_tree

    timings: dict[str, float] = {}

    def stage(name: str) -> Callable[[], None]:
        progress(name)
        t0 = time.perf_counter()
        return lambda: timings.__setitem__(name, round(time.perf_counter() - t0, 3))

    # 1. Target profile: every hardware number comes from here.
    done = stage("target")
    target = load_target(opts.target).with_overrides(memory_gib=opts.memory_gib)
    done()

    # 2. Frontend: checkpoint -> typed graph; tokenizer and chat template checked.
    done = stage("frontend")
    front = _frontend(opts.model_dir)
    graph = front.graph
    model_id = opts.model_id or opts.model_dir.resolve().name
    done()

    # 3. Plan: serve limits, kernel instances per role, memory budget.
    done = stage("plan")
    plan = make_plan(graph, target, _limits(opts, target), _formats(opts))
    done()

    out_dir = (opts.out_dir or DEFAULT_BUILD_DIR / f"{model_id}-{target.name}").resolve()
    src_dir = out_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)

    # 4. Kernels: TVM PrimFuncs scheduled for the target. CPU: one LLVM object. CUDA:
    #    one device translation unit, built by nvcc for the target's arch to read each
    #    kernel's registers and shared memory, then every launch the step program can
    #    make is proven to fit (occupancy + launch verifier); a violation stops here.
    done = stage("kernels")
    verified = None
    coop_reports: list[Any] = []
    projections = opts.prefill_projections
    if projections not in ("auto", "tvm", "coop"):
        raise FrontendError(f"--prefill-projections must be 'auto', 'tvm' or 'coop', got "
                            f"{projections!r}")
    if projections == "coop" and not target.is_cuda:
        raise FrontendError("--prefill-projections coop needs a CUDA target")
    if projections == "auto":
        projections = "coop" if target.is_cuda else "tvm"
    if target.is_cuda:
        if plan.kv.dtype not in CUDA_KV_DTYPES:
            raise FrontendError(f"--kv-dtype {plan.kv.dtype}: the CUDA attention reads "
                                f"{', '.join(CUDA_KV_DTYPES)} KV caches so far; compile "
                                f"{target.name} with one of those (the other KV formats run on "
                                "the cpu target)")
        from ninfer.occupancy.resources import find_nvcc, nvcc_resources

        resources = nvcc_resources(opts.kernel_cache.parent / ".cuda-cache")
        backend, verified, coop_reports = cuda_backend(plan, target, graph, resources,
                                                       projections == "coop")
        backend["nvcc"] = str(find_nvcc())
    else:
        backend = {"kernel_object": str(
            _build_kernels(plan, target, opts.kernel_cache, src_dir / "kernels.o"))}
    done()

    # 5. Codegen: step program, kernel stubs, launch table, CMakeLists from templates/.
    done = stage("codegen")
    tree = render_tree(graph, plan, target, model_id, backend, src_dir, out_dir,
                       python_module=opts.python_module)
    done()

    # 6. Artifact: weights (fused where the step program wants it) + manifest.
    done = stage("artifact")
    artifact_path = out_dir / "model.ninfer"
    if opts.write_artifact:
        _write(artifact_path, front, plan, target, model_id)
    done()

    # 7. Build: CMake + Ninja -> ninfer-server (+ ninfer_engine Python module).
    done = stage("build")
    cmake_build(src_dir, out_dir / "cmake-build", log=out_dir / "build.log")
    done()

    report = {
        "ninfer_version": __version__,
        "model_id": model_id,
        "architecture": graph.config.architecture,
        "target": {"name": target.name, "hash": target.stable_hash()},
        "plan": plan.to_json(),
        "kernels": [{"name": s.name(), "family": s.family} for s in plan.unique_kernels()],
        "generated": [str(p.relative_to(out_dir)) for p in tree.files],
        "launches": _launch_rows(verified, coop_reports),
        "stage_seconds": timings,
    }
    report_path = out_dir / "compile_report.json"
    report_path.write_text(json.dumps(report, indent=2))
    if opts.dump_dir:
        _dump(opts.dump_dir, graph, plan, report, tree.directory)
    return CompileResult(out_dir, out_dir / "ninfer-server", artifact_path, report_path, report)


def _build_kernels(plan: Plan, target: Target, cache: Path, dest: Path) -> Path:
    """Compile every kernel of the plan into one object, cached by spec names + sources."""
    from ninfer.kernels import build_cpu_object  # imports TVM; keep it out of module import

    digest = hashlib.sha256()
    digest.update(target.stable_hash().encode())
    for name in sorted(s.name() for s in plan.unique_kernels()):
        digest.update(name.encode())
    package = Path(__file__).resolve().parent  # the kernels and the formats they read
    for src in sorted(p for d in ("kernels", "quantize") for p in (package / d).rglob("*.py")):
        digest.update(str(src.relative_to(package)).encode())
        digest.update(src.read_bytes())
    cached = cache / f"{digest.hexdigest()[:24]}.o"
    if not cached.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp.o")
        build_cpu_object(plan.unique_kernels(), tmp)
        tmp.replace(cached)
    if not dest.exists() or dest.read_bytes() != cached.read_bytes():
        shutil.copyfile(cached, dest)
    return dest


def cuda_backend(plan: Plan, target: Target, graph: ModelGraph, resources: Any,
                 coop: bool) -> tuple[dict[str, Any], Any, list[Any]]:
    """The CUDA kernels of the plan, verified with `resources` (nvcc's resource usage),
    as template values (all but `nvcc`), with the verification and the coop routers'
    reports."""
    from ninfer.codegen.coop_launch import coop_stubs
    from ninfer.codegen.cuda_launch import launch_views
    from ninfer.kernels.cuda import build_cuda_source  # imports TVM
    from ninfer.kernels.cuda.coop import render_coop_source
    from ninfer.occupancy.model_launches import verify_model_launches

    module = build_cuda_source(plan.unique_kernels(), target)
    verified = verify_model_launches(module, target, plan, graph.config.num_heads, resources)
    verified.report.raise_if_failed()
    launches, scratch = launch_views(verified, plan.limits.max_context)
    backend: dict[str, Any] = {"device_source": module.source, "launches": launches,
                               "scratch": scratch}
    reports: list[Any] = []
    if coop:
        roles, variants, reports = coop_stubs(plan, target, resources)
        backend.update(coop=roles, coop_source=render_coop_source(variants) if variants else "")
    return backend, verified, reports


def _launch_rows(verified: Any, extra_reports: list[Any]) -> list[dict[str, Any]]:
    if verified is None:
        return []
    from ninfer.occupancy.verifier import table_rows

    header = ("kernel", "threads", "registers", "smem", "ctas_per_sm", "resident_budget",
              "sizes", "max_ok_size")
    rows = [row for report in (verified.report, *extra_reports) for row in table_rows(report)]
    return [dict(zip(header, row, strict=True)) for row in rows]


@dataclass(frozen=True)
class _Frontend:
    ckpt: Any
    graph: ModelGraph
    tok: TokenizerInfo
    chat: Any


def _frontend(model_dir: Path) -> _Frontend:
    ckpt = open_checkpoint(model_dir)
    graph = build_graph(ckpt)
    tok = tokenizer_info(ckpt)
    chat = None
    if tok.chat_template is not None:
        chat = compile_chat_template(tok.chat_template, bos_token=tok.bos_token or "",
                                     eos_token=tok.eos_token or "")
    return _Frontend(ckpt, graph, tok, chat)


# Row counts up to this run the GEMV schedule. On the CPU the float GEMV's 2- and 3-row
# micro-kernels beat the GEMM tile up to 8 rows on decode-shaped weights (k 512-3072,
# n 512-3072); the integer GEMV of the quantized formats costs about one 1-row pass per
# row, so past 4 rows their GEMM wins. The CUDA schedules keep 4.
GEMV_MAX_ROWS_CPU_FLOAT = 8
GEMV_MAX_ROWS = 4


def _limits(opts: CompileOptions, target: Target) -> ServeLimits:
    formats = {opts.weights, *(fmt for _, fmt in opts.weight_overrides)}
    floats = formats <= {"f32", "f16", "bf16"}
    gemv_rows = GEMV_MAX_ROWS_CPU_FLOAT if target.kind == "cpu" and floats else GEMV_MAX_ROWS
    return ServeLimits(opts.max_context, min(opts.max_prefill_chunk, opts.max_context),
                       max_concurrency=opts.max_concurrency, gemv_max_rows=gemv_rows,
                       kv_capacity=opts.kv_capacity, kv_dtype=opts.kv_dtype)


def _formats(opts: CompileOptions) -> WeightFormats:
    return WeightFormats(opts.weights, tuple(opts.weight_overrides))


def _write(path: Path, front: _Frontend, plan: Plan, target: Target, model_id: str) -> None:
    manifest = _manifest(front.graph, plan, target, model_id, front.tok, front.chat)
    write_artifact(path, manifest, _pending_tensors(front.graph, front.ckpt, plan))


def write_model_artifact(opts: CompileOptions, path: Path) -> Path:
    """Only stage 6: the model.ninfer that compile_model(opts) would write (needs no TVM,
    no compiler). The weights may differ from the compiling machine's; the shapes, target,
    limits and tokenizer must not, or the server refuses the artifact."""
    target = load_target(opts.target).with_overrides(memory_gib=opts.memory_gib)
    front = _frontend(opts.model_dir)
    model_id = opts.model_id or opts.model_dir.resolve().name
    plan = make_plan(front.graph, target, _limits(opts, target), _formats(opts))
    _write(path, front, plan, target, model_id)
    return path


def _pending_tensors(graph: ModelGraph, ckpt: Any, plan: Plan) -> list[PendingTensor]:
    def loader(w: WeightSpec) -> Callable[[], np.ndarray]:
        return lambda: graph.load_weight(ckpt, w)

    tensors: list[PendingTensor] = []
    for w in graph.weights:
        fmt = weight_format(w, plan.weights)
        if fmt == "f32":
            tensors.append(PendingTensor(w.name, w.shape, loader(w)))
        else:
            tensors += _packed_tensors(w, fmt, loader(w))
    cfg, ctx = graph.config, plan.limits.max_context
    half = (ctx, cfg.head_dim // 2)
    tensors.append(PendingTensor("rope_cos", half,
                                 lambda: rope_tables(cfg.rope, cfg.head_dim, ctx)[0]))
    tensors.append(PendingTensor("rope_sin", half,
                                 lambda: rope_tables(cfg.rope, cfg.head_dim, ctx)[1]))
    return tensors


def _packed_tensors(w: WeightSpec, fmt: str, load: Callable[[], np.ndarray]
                    ) -> list[PendingTensor]:
    """The stored parts of a quantized weight; packed once, when its first part is
    written (parts are written one after the other, so one packed weight is held)."""
    from ninfer.quantize.weight_formats import pack, part_layout

    n_out, k = w.shape
    layout = part_layout(fmt, n_out, k)
    cache: dict[str, np.ndarray] = {}

    def part(name: str) -> Callable[[], np.ndarray]:
        def get() -> np.ndarray:
            if not cache:
                cache.update(pack(load(), fmt))
            return cache.pop(name)
        return get

    single = len(layout) == 1
    return [PendingTensor(w.name if single else f"{w.name}.{name}", tuple(shape), part(name),
                          ARTIFACT_DTYPES[str(np.dtype(dtype))])
            for name, dtype, shape in layout]


def _manifest(graph: ModelGraph, plan: Plan, target: Target, model_id: str,
              tok: TokenizerInfo, chat: Any) -> dict[str, Any]:
    return {
        "model": {"id": model_id, "architecture": graph.config.architecture,
                  "config": {k: v for k, v in asdict(graph.config).items() if k != "extra"}},
        "target": {"name": target.name, "kind": target.kind, "hash": target.stable_hash(),
                   "arch": target.arch, "sm_count": target.sm_count},
        "limits": asdict(plan.limits),
        "weights": plan.to_json()["weights"],
        "tokenizer": tok.tokenizer_json,
        "chat_format": chat.to_json() if chat is not None else None,
        "eos_token_ids": list(tok.eos_token_ids),
        "ninfer_version": __version__,
    }


def _dump(dump_dir: Path, graph: ModelGraph, plan: Plan, report: dict[str, Any],
          src_dir: Path) -> None:
    dump_dir.mkdir(parents=True, exist_ok=True)
    (dump_dir / "graph.json").write_text(json.dumps(
        {"config": asdict(graph.config), "traits": asdict(graph.traits),
         "weights": [asdict(w) for w in graph.weights]}, indent=2, default=str))
    (dump_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2))
    (dump_dir / "report.json").write_text(json.dumps(report, indent=2))
    shutil.copytree(src_dir, dump_dir / "generated", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.o"))
