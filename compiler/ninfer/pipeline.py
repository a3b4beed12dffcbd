"""The compile pipeline: the stage list, in one place, one comment per phase.

Data flows one way, frontend -> plan -> kernels -> occupancy -> codegen -> build ->
artifact, then the chat templates of the built server are checked against jinja2; each
stage is a function over typed data in its own package. Here they are
called in order and timed, and with `--dump DIR` each one's output is written as soon as
it exists (graph.json, plan.json, kernels.json, launches.json, generated/, report.json).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ninfer.artifact import write_model
from ninfer.chat_verify import verify_server
from ninfer.dump import Dump
from ninfer.frontend.chat_codegen import chat_template_sources
from ninfer.frontend.model import FrontendModel, read_model
from ninfer.kernels import MatmulSpec
from ninfer.kernels.cuda.module import CudaLaunch
from ninfer.options import CompileOptions
from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.plan import Plan, make_plan
from ninfer.report import CompileReport, CoopRouteRow, LaunchRow, coop_route_rows, launch_rows
from ninfer.targets import Target, load_target

if TYPE_CHECKING:
    from ninfer.codegen import Backend, CudaBackend

__all__ = ["CompileOptions", "CompileResult", "compile_model", "write_model_artifact"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompileResult:
    out_dir: Path
    server: Path
    artifact: Path
    report_path: Path  # compile_report.json
    report: CompileReport


def compile_model(opts: CompileOptions, progress: Progress = lambda _: None) -> CompileResult:
    # The kernel stages import TVM, codegen tvm_ffi (which loads torch when present: ~3 s
    # together) and the build needs a toolchain: each is imported by the stage that uses
    # it, so that a bad option, checkpoint or plan fails at once, and write_model_artifact
    # runs where none of them exists.
    stage = _Stages(progress)
    dump = Dump(opts.dump_dir)

    # 1. Target profile: every hardware number comes from here.
    with stage("target"):
        target = load_target(opts.target).with_overrides(memory_gib=opts.memory_gib)
        opts.check_target(target)

    # 2. Frontend: checkpoint -> typed graph; tokenizer read; the chat templates compiled
    #    to C++ now (pure Python), so a construct the generator lacks fails at once.
    with stage("frontend"):
        model = read_model(opts.model_dir, opts.chat_template, mtp=opts.spec == "mtp")
        opts, weights_note = opts.with_checkpoint_weights(model.native_weight_format())
        chat_sources = chat_template_sources(model.chat_templates)
    dump.json("graph.json", model.graph_json())

    # 3. Plan: serve limits, kernel instances per role, memory budget.
    with stage("plan"):
        positions = model.graph.config.max_position_embeddings
        opts, plan, read_note = _plan(opts, model, target)
        bf16_note = _x_bf16_note(plan, opts, target)
    dump.json("plan.json", plan.to_json())

    model_id = opts.resolved_model_id
    out_dir = (opts.out_dir or DEFAULT_BUILD_DIR / f"{model_id}-{target.name}").resolve()
    src_dir = out_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)

    # 4. Kernels: TVM PrimFuncs scheduled for the target. CPU: one LLVM object. CUDA:
    #    one device translation unit; then occupancy: nvcc reads each kernel's registers
    #    and shared memory for the target's arch, and every launch the step program can
    #    make is proven to fit (launch verifier, coop routes); a violation stops here.
    with stage("kernels"):
        launches: tuple[LaunchRow, ...] = ()
        routes: tuple[CoopRouteRow, ...] = ()
        backend: Backend
        if target.is_cuda:
            backend, launches, routes = _cuda_stages(plan, target, model.graph.config.num_heads,
                                             opts, dump)
        else:
            from ninfer.codegen import CpuBackend
            from ninfer.kernels.cpu.build import cached_cpu_object
            from ninfer.kernels.cpu.common import host_vector_features

            dump.json("kernels.json", _kernel_table(plan))
            backend = CpuBackend(cached_cpu_object(plan.unique_kernels(), target,
                                                   opts.kernel_cache, src_dir / "kernels.o"),
                                 host_vector_features())

    # 5. Codegen: step program, kernel stubs, launch table, CMakeLists from templates/.
    with stage("codegen"):
        from ninfer.codegen import render_tree

        tree = render_tree(model.graph, plan, target, model_id, backend, src_dir, out_dir,
                           python_module=opts.python_module, chat_sources=chat_sources)
    dump.tree("generated", tree.directory)

    # 6. Artifact: weights (fused where the step program wants it) + manifest.
    artifact_path = out_dir / "model.ninfer"
    with stage("artifact"):
        if opts.write_artifact:
            write_model(artifact_path, model, plan, target, model_id)

    # 7. Build: CMake + Ninja -> ninfer-server (+ ninfer_engine Python module).
    if opts.build:
        with stage("build"):
            from ninfer.build import cmake_build

            cmake_build(src_dir, out_dir / "cmake-build", log=out_dir / "build.log")
            # a module of an earlier compile into this directory under another model id
            # would be the one load_engine() imports
            from ninfer.codegen.render import module_name

            own = module_name(model_id, plan.build_digest(model.graph.config, target,
                                                          model_id)) + "."
            for stale in out_dir.glob("ninfer_engine_*.so"):
                if not stale.name.startswith(own):
                    stale.unlink()

    # 8. Chat templates: the built server renders generated conversations, and each must
    #    equal jinja2's rendering (or raise the same error) or the compile fails.
    if model.chat_templates and opts.build:
        with stage("chat-check"):
            verify_server(out_dir / "ninfer-server", model.chat_templates,
                          model.tokenizer.special_tokens, count=opts.chat_template_checks)

    report = CompileReport(model_id, model.graph.config.architecture, target, plan,
                           tuple((s.name(), s.family) for s in plan.unique_kernels()),
                           tuple(str(p.relative_to(out_dir)) for p in tree.files),
                           launches, stage.seconds,
                           (*((weights_note,) if weights_note else ()),
                            *((read_note,) if read_note else ()),
                            *((bf16_note,) if bf16_note else ()), *model.notes,
                            *opts.limit_notes(positions),
                            *(() if opts.build else (
                                "--no-build: sources in src/, not built; the chat-template "
                                "check runs with the build",))),
                           routes)
    report_path = out_dir / "compile_report.json"
    report_path.write_text(json.dumps(report.to_json(), indent=2))
    dump.json("report.json", report.to_json())
    return CompileResult(out_dir, out_dir / "ninfer-server", artifact_path, report_path,
                         report)


def write_model_artifact(opts: CompileOptions, path: Path) -> Path:
    """Only stage 6: the model.ninfer that compile_model(opts) would write. For a CUDA
    target it needs no TVM and no compiler (scripts/gpu_check.sh runs it on the GPU
    machine); for the cpu target it plans the kernels as a compile on this host does (the
    build digest names them): the host's gemv stream choice (its cached read probe, else
    the probe compiled and run) and whether bf16 rounds x (TVM's host features). The
    weights may differ from the compiling machine's; the shapes, target, limits and
    tokenizer must not, or the server refuses the artifact."""
    target = load_target(opts.target).with_overrides(memory_gib=opts.memory_gib)
    model = read_model(opts.model_dir, opts.chat_template, mtp=opts.spec == "mtp")
    opts, _ = opts.with_checkpoint_weights(model.native_weight_format())
    opts, plan, _ = _plan(opts, model, target)
    return write_model(path, model, plan, target, opts.resolved_model_id)


def _plan(opts: CompileOptions, model: FrontendModel, target: Target
          ) -> tuple[CompileOptions, Plan, str | None]:
    """Stage 3, for compile_model and write_model_artifact alike: the artifact's build
    digest names every kernel of the plan, so both must choose them the same way (the host's
    gemv streams included). Returns the options as resolved, the plan, and the note on the
    gemv stream choice."""
    opts, read_note = opts.with_host_read(target)
    limits = opts.serve_limits(target, model.graph.config.max_position_embeddings)
    plan = make_plan(model.graph, target, limits, opts.weight_formats(),
                     opts.gemv_streams(target), opts.x_bf16(target, _auto_x_bf16(opts, target)[0]))
    return opts, plan, read_note


def _cuda_stages(plan: Plan, target: Target, num_heads: int, opts: CompileOptions,
                 dump: Dump
                 ) -> tuple[CudaBackend, tuple[LaunchRow, ...], tuple[CoopRouteRow, ...]]:
    """Kernels -> occupancy -> the codegen values of a CUDA target; the proof is dumped
    (launches.json) before a violation is raised."""
    from ninfer.codegen import cuda_backend
    from ninfer.kernels.cuda.lower import build_cuda_source
    from ninfer.occupancy.model_launches import verify_cuda_model
    from ninfer.occupancy.resources import find_nvcc, nvcc_resources

    module = build_cuda_source(plan.unique_kernels(), target)
    dump.json("kernels.json", _kernel_table(plan, module.launches))
    resources = nvcc_resources(opts.kernel_cache.parent / ".cuda-cache")
    verified = verify_cuda_model(module, target, plan, num_heads, resources,
                                 coop=opts.projections(target) == "coop")
    rows = launch_rows(verified.reports)
    routes = coop_route_rows(verified.coop)
    dump.json("launches.json", {"launches": [r.to_json() for r in rows],
                                "coop_routes": [r.to_json() for r in routes],
                                "violations": [str(v) for v in verified.violations]})
    verified.raise_if_failed()
    return cuda_backend(verified, plan.limits.prefill_chunk, str(find_nvcc())), rows, routes


def _kernel_table(plan: Plan, launches: Sequence[CudaLaunch] = ()) -> dict[str, object]:
    """kernels.json: each kernel instance and its roles; on CUDA each device launch, in C."""
    table: dict[str, object] = {
        "kernels": [{"name": s.name(), "family": s.family,
                     "roles": [r for r, k in plan.kernels.items() if k.name() == s.name()]}
                    for s in plan.unique_kernels()]}
    if launches:
        table["launches"] = [
            {"spec": la.spec_name, "kernel": la.kernel_symbol,
             "grid": [g.c() for g in la.grid], "block": list(la.block),
             "dynamic_smem": la.dynamic_smem.c(),
             "scratch": {a.name: a.elements.c() for a in la.host_allocs}}
            for la in launches]
    return table


@dataclass
class _Stages:
    """`with stages("plan"): ...` reports progress and records the stage's seconds."""

    progress: Progress
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.progress(name)
        t0 = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - t0, 3)


def _host_dpbf16(target: Target) -> bool:
    """Whether the cpu target's kernels use vdpbf16ps on this host (TVM's view of its
    features); no TVM import for a CUDA target."""
    if target.is_cuda:
        return False
    from ninfer.kernels.cpu.matmul import use_dpbf16

    return use_dpbf16()


def _auto_x_bf16(opts: CompileOptions, target: Target) -> tuple[bool, str]:
    """What --cpu-bf16-activations auto takes on this host, and why: bf16 x where the host
    has vdpbf16ps and it pays (roofline.host_dpbf16_pays: its multiply-add rate against
    the FMAs', measured once per CPU); the probe is run only for an auto cpu compile."""
    if target.is_cuda or opts.cpu_bf16_activations != "auto":
        return False, ""
    if not _host_dpbf16(target):
        return False, "this host has no AVX512_BF16"
    from ninfer.roofline import RooflineError, host_dpbf16_pays

    try:
        return host_dpbf16_pays()
    except RooflineError as exc:
        return True, f"this host has AVX512_BF16 (its probe failed: {exc})"


def _x_bf16_note(plan: Plan, opts: CompileOptions, target: Target) -> str | None:
    """The compile summary's note on how the cpu target's bf16 matmuls take x."""
    bf16 = [s for s in plan.unique_kernels() if isinstance(s, MatmulSpec) and s.wdtype == "bf16"]
    if target.is_cuda or not bf16:
        return None
    if not any(s.x_bf16 for s in bf16):
        if opts.cpu_bf16_activations != "auto":
            return None
        return (f"--cpu-bf16-activations not given: bf16 weights multiply float32 x "
                f"({_auto_x_bf16(opts, target)[1]}: rounding x to bf16 would cost accuracy "
                "and gain nothing here; --cpu-bf16-activations bf16 rounds it anyway)")
    how = ("vdpbf16ps, two k steps an instruction" if _host_dpbf16(target) else
           "two FMAs a pair of k steps: this host has no AVX512_BF16")
    return (f"bf16 weights multiply x rounded to bf16 ({how}; as llama.cpp's BF16 path); "
            "--cpu-bf16-activations f32 keeps x float32")
