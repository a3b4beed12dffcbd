"""Golden generated code: fixed models and targets render to checked-in sources.

A change that alters generated code shows up here as a readable diff. After an
intended change, regenerate with:
    NINFER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden_codegen.py

The CUDA snapshot (rtx4080s) holds the launch code whose grids, shared memory and
resident budgets the launch verifier derived from each kernel's resource usage. That usage
is recorded from nvcc 13.0 for sm_89 in golden/qwen2-mini-rtx4080s/resource-usage.json,
keyed by a digest of the CUDA source it was measured on, so this test needs no nvcc; a
change to the device code misses the record and the test says so. Re-measure (needs nvcc)
with:
    NINFER_RECORD_RESOURCES=1 NINFER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden_codegen.py
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import pytest

from ninfer.codegen import CpuBackend, cuda_backend, render_tree
from ninfer.frontend import open_checkpoint
from ninfer.frontend.llama import build_graph
from ninfer.occupancy.model_launches import verify_cuda_model
from ninfer.occupancy.resources import KernelResources, ResourceSource
from ninfer.plan import ServeLimits, make_plan
from ninfer.targets import load_target
from test_frontend import BASE, make_ckpt

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden" / "qwen2-mini-cpu"
FILES = ("model.cpp", "kernels.h", "launch.cpp")  # CMakeLists.txt holds machine paths
GOLDEN_CUDA = Path(__file__).parent / "golden" / "qwen2-mini-rtx4080s"
CUDA_FILES = ("model.cpp", "kernels.h", "launch.cu")
RESOURCES = GOLDEN_CUDA / "resource-usage.json"
LIMITS = ServeLimits(max_context=128, prefill_chunk=32)
# A prefill chunk large enough that the cooperative family's routes meet the resident
# budget: the boundaries the verifier derives show in the snapshot.
CUDA_CONFIG = {**BASE, "head_dim": 32, "max_position_embeddings": 2048}
CUDA_LIMITS = ServeLimits(max_context=2048, prefill_chunk=2048)


def _elide_device_code(text: str) -> str:
    """Device code (TVM's and the templates', ~1 MB here) replaced by its size and digest:
    the snapshot is about the launch code; a kernel change still shows as a changed line."""
    out: list[str] = []
    body: list[str] | None = None
    for line in text.splitlines(True):
        if body is None:
            out.append(line)
            if line.startswith("// ---- device code"):
                body = []
        elif line.startswith("// ---- end of"):
            digest = hashlib.sha256("".join(body).encode()).hexdigest()[:16]
            out += [f"// <{len(body)} lines of device code, sha256 {digest}>\n", line]
            body = None
        else:
            body.append(line)
    return "".join(out)


def _compare(directory: Path, golden_dir: Path, names: tuple[str, ...], target_hash: str,
             build_digest: str) -> None:
    """The hashes are elided: they change with every field of the target or the plan,
    which the rest of the sources show."""
    for name in names:
        got = (directory / name).read_text().replace(target_hash, "<target-hash>")
        got = got.replace(build_digest, "<build-digest>")
        got = _elide_device_code(got) if name.endswith(".cu") else got
        golden = golden_dir / name
        if os.environ.get("NINFER_UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(got)
        want = golden.read_text()
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{name}", f"generated/{name}"))
        assert not diff, f"generated {name} changed:\n{diff}"


def test_generated_sources_match_golden(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path / "ckpt")))
    target = load_target("cpu")
    plan = make_plan(graph, target, LIMITS)
    backend = CpuBackend(Path("kernels.o"), ("avx2", "f16c", "fma"))
    tree = render_tree(graph, plan, target, "qwen2-mini", backend, tmp_path / "src",
                       tmp_path / "out")
    _compare(tree.directory, GOLDEN, FILES, target.stable_hash(),
             plan.build_digest(graph.config, target, "qwen2-mini"))


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _recorded() -> ResourceSource:
    data = json.loads(RESOURCES.read_text())

    def lookup(source: str, arch: str) -> Mapping[str, KernelResources]:
        kernels = data["sources"].get(_digest(source))
        assert arch == data["arch"] and kernels is not None, (
            f"no recorded resource usage for this {arch} source (digest {_digest(source)}): "
            "the device code changed; re-measure it (see this file's docstring)")
        return {name: KernelResources(name, **fields) for name, fields in kernels.items()}

    return lookup


def _recording(cache: Path, record: dict[str, dict[str, dict[str, int]]]) -> ResourceSource:
    from ninfer.occupancy.resources import nvcc_resources

    nvcc = nvcc_resources(cache)

    def measure(source: str, arch: str) -> Mapping[str, KernelResources]:
        found = nvcc(source, arch)
        record[_digest(source)] = {name: {k: v for k, v in asdict(r).items() if k != "name"}
                                   for name, r in sorted(found.items())}
        return found

    return measure


def test_cuda_launch_code_matches_golden(tmp_path):
    """rtx4080s, prefill projections through the cooperative family (the default on CUDA):
    the CPU snapshot's model with head_dim 32 (the CUDA attention takes multiples of 32),
    compiled for a 2048-token context and prefill chunk."""
    from ninfer.kernels.cuda.lower import build_cuda_source  # imports TVM

    graph = build_graph(open_checkpoint(make_ckpt(tmp_path / "ckpt", CUDA_CONFIG)))
    target = load_target("rtx4080s")
    plan = make_plan(graph, target, CUDA_LIMITS)
    record: dict[str, dict[str, dict[str, int]]] = {}
    if os.environ.get("NINFER_RECORD_RESOURCES"):
        from ninfer.occupancy.resources import find_nvcc, nvcc_version
        from ninfer.paths import DEFAULT_BUILD_DIR

        resources = _recording(DEFAULT_BUILD_DIR / ".cuda-cache", record)
    else:
        resources = _recorded()
    module = build_cuda_source(plan.unique_kernels(), target)
    verified = verify_cuda_model(module, target, plan, graph.config.num_heads, resources,
                                 coop=True)
    verified.raise_if_failed()
    if record:
        RESOURCES.parent.mkdir(parents=True, exist_ok=True)
        RESOURCES.write_text(json.dumps({"arch": target.arch,
                                         "nvcc": nvcc_version(find_nvcc()),
                                         "sources": record}, indent=1) + "\n")
    backend = cuda_backend(verified, plan.limits.prefill_chunk, nvcc="nvcc")
    tree = render_tree(graph, plan, target, "qwen2-mini", backend, tmp_path / "src",
                       tmp_path / "out")
    _compare(tree.directory, GOLDEN_CUDA, CUDA_FILES, target.stable_hash(),
             plan.build_digest(graph.config, target, "qwen2-mini"))


def test_speculation_sizes_the_logits_rows_of_every_target(tmp_path):
    """--spec ngram with 4 drafts at concurrency 4: 20 logits rows (the step has 2048), and
    every kernel that handles them (the LM head's gather and GEMM, CUDA's sampler) is
    proven for that many; the CPU plan likewise without a sampler."""
    from ninfer.occupancy.model_launches import max_rows_per_spec

    graph = build_graph(open_checkpoint(make_ckpt(tmp_path / "ckpt", CUDA_CONFIG)))
    limits = ServeLimits(max_context=2048, prefill_chunk=2048, max_concurrency=4,
                         spec="ngram", max_draft_tokens=4)
    assert limits.logit_rows == 20
    for name in ("rtx4080s", "cpu"):
        plan = make_plan(graph, load_target(name), limits)
        rows = max_rows_per_spec(plan, graph.config.num_heads)
        for role in ("gather", "lm_head_gemm") + (("sampler",) if name != "cpu" else ()):
            assert rows[plan.kernels[role].name()] >= 20, (name, role)
        if name != "cpu":
            assert plan.kernels["sampler"].max_rows == 20
