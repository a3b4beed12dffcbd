"""nvcc build of the CUDA kernels for every shipped GPU target (no GPU needed).

For each GPU target and the kernel set of two Qwen3-shaped models, `build_cuda_source`
must succeed, its single translation unit must compile with `nvcc -arch=<arch> -cubin`,
and every launch must fit the target at the largest sizes it can be asked for: threads per
block, static + dynamic shared memory (ptxas --resource-usage plus the launch's dynamic
size), registers of one block, grid dimensions; the hand-written kernels (paged attention,
KV store) must not spill.

Compiled cubins are cached under build/.cuda-cache by sha256 of (nvcc version, arch, flags,
source), so
targets whose generated kernels are equal (h100/h200 and rtx4090/rtx4090d for these
shapes) share one compile, and a second session recompiles nothing.

To add a model shape, append a ModelShape to MODELS; the roles mirror plan.make_plan.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tvm
from tvm.s_tir import dlight

from ninfer.kernels import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    KvStoreSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SiluMulSpec,
)
from ninfer.kernels.cuda.attention import attention_splits
from ninfer.kernels.cuda.lower import (
    CudaModule,
    HostAlloc,
    build_cuda_source,
    cuda_target,
    lower_to_cuda,
)
from ninfer.kernels.cuda.schedules import cuda_params, gemv_rows
from ninfer.kernels.launch import Expr, N, Var, ceil_div
from ninfer.kernels.te_defs import te_primfunc
from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.targets import available_targets, load_target

pytestmark = pytest.mark.cuda_build

SHIPPED_GPU_TARGETS = {"rtx4080s", "rtx4090", "rtx4090d", "rtx5090", "rtx5080", "h100", "h200"}
GPU_TARGETS = sorted(name for name in available_targets() if load_target(name).is_cuda)
NVCC = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/bin/nvcc"
# 177: unused variable, 1046: float literal rounded, 1444: TVM's longlong4 (deprecated)
NVCC_FLAGS = ("-cubin", "--resource-usage", "-diag-suppress", "177,1046,1444")
CACHE = DEFAULT_BUILD_DIR / ".cuda-cache"
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_ctx: int
    max_seqs: int = 4
    block_size: int = 16
    eps: float = 1e-6

    @property
    def kv_blocks(self) -> int:
        return self.max_seqs * self.max_ctx // self.block_size + 1  # + the reserved block

    def kernels(self) -> list[KernelSpec]:
        """The unique kernels of a dense Qwen3 model (q/k norm, no bias), as plan.py builds."""
        h, d = self.hidden, self.head_dim
        q_dim, kv_dim = self.heads * d, self.kv_heads * d
        specs: list[KernelSpec] = [
            EmbeddingSpec(self.vocab, h),
            RMSNormSpec(h, self.eps),
            RMSNormSpec(d, self.eps),
            RopeSpec(self.heads, d, self.max_ctx),
            RopeSpec(self.kv_heads, d, self.max_ctx),
            KvStoreSpec(kv_dim, self.kv_blocks * self.block_size),
            AttentionSpec(self.heads, self.kv_heads, d, self.max_ctx, self.block_size,
                          self.max_seqs, self.kv_blocks),
            SiluMulSpec(self.inter),
            AddSpec(h),
            MatmulSpec(h, self.vocab),
        ]
        for k, n in ((h, q_dim), (h, kv_dim), (q_dim, h), (h, 2 * self.inter), (self.inter, h)):
            specs += [MatmulSpec(k, n), MatmulSpec(k, n, schedule="gemm")]
        return list({spec.name(): spec for spec in specs}.values())


MODELS = {
    m.name: m
    for m in (
        ModelShape("tiny", 128, 320, 4, 2, 32, 2112, 256),
        ModelShape("qwen3-0.6b", 1024, 3072, 16, 8, 128, 151936, 4096),
    )
}


@functools.cache
def cuda_module(model: str, target: str) -> CudaModule:
    return build_cuda_source(MODELS[model].kernels(), load_target(target))


@dataclass(frozen=True)
class Resources:
    registers: int
    static_smem: int
    spill_bytes: int = 0


@functools.cache
def nvcc_version() -> str:
    """`nvcc --version`'s build line: another nvcc may allocate registers differently."""
    r = subprocess.run([NVCC, "--version"], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def nvcc_compile(source: str, arch: str) -> dict[str, Resources]:
    """Compile one translation unit (cached); per-kernel registers and static smem."""
    if not Path(NVCC).exists():
        pytest.skip(f"nvcc not found (looked for {NVCC}); set NVCC to run cuda_build tests")
    key = hashlib.sha256("\0".join((nvcc_version(), arch, *NVCC_FLAGS, source)).encode()
                         ).hexdigest()
    cubin, log = CACHE / f"{key}.cubin", CACHE / f"{key}.log"
    if not (cubin.exists() and log.exists()):
        CACHE.mkdir(parents=True, exist_ok=True)
        src = CACHE / f"{key}.cu"
        src.write_text(source)
        result = subprocess.run(
            [NVCC, f"-arch={arch}", *NVCC_FLAGS, "-o", str(cubin), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            cubin.unlink(missing_ok=True)
            pytest.fail(f"nvcc -arch={arch} failed on {src}:\n{result.stderr[-4000:]}")
        log.write_text(result.stdout + result.stderr)
        src.unlink()
    return _parse_resources(log.read_text())


def _parse_resources(text: str) -> dict[str, Resources]:
    out: dict[str, Resources] = {}
    kernel = None
    spills = 0
    for line in text.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'", line)
        if entry:
            kernel, spills = entry.group(1), 0
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            spills = int(spill.group(1)) + int(spill.group(2))
        used = re.search(r"Used (\d+) registers", line)
        if used and kernel:
            smem = re.search(r"(\d+) bytes smem", line)
            out[kernel] = Resources(int(used.group(1)), int(smem.group(1)) if smem else 0,
                                    spills)
            kernel = None
    return out


def _size_corners(max_ctx: int) -> list[dict[str, int]]:
    """The smallest and largest row counts (launch sizes depend on n only)."""
    return [{"n": n} for n in (1, max_ctx)]


def test_every_shipped_gpu_target_is_covered() -> None:
    assert set(GPU_TARGETS) >= SHIPPED_GPU_TARGETS


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("target_name", GPU_TARGETS)
def test_kernels_compile_and_fit(model: str, target_name: str) -> None:
    target, shape = load_target(target_name), MODELS[model]
    module = cuda_module(model, target_name)
    specs = shape.kernels()
    assert module.arch == target.arch
    in_order = list(dict.fromkeys(launch.spec_name for launch in module.launches))
    assert in_order == [spec.name() for spec in specs]
    resources = nvcc_compile(module.source, target.arch)
    assert set(resources) == {launch.kernel_symbol for launch in module.launches}
    for launch in module.launches:
        name = launch.kernel_symbol
        assert re.fullmatch(rf"{launch.spec_name}_(combine_)?kernel(_\d+)?", name)
        if launch.spec_name.startswith("attention_"):  # a key split's partials, or none
            assert {a.name for a in launch.host_allocs} <= {
                f"{launch.spec_name}_part_acc", f"{launch.spec_name}_part_ml"}, name
        else:
            assert launch.host_allocs == [], f"{name} needs global scratch"
        threads = math.prod(launch.block)
        assert threads <= target.max_threads_per_block, name
        used = resources[name]
        # One block must fit an SM's registers, which are allocated per warp in units of
        # register_alloc_unit (ptxas reports registers per thread).
        warps = -(-threads // 32)
        unit = target.register_alloc_unit
        per_warp = -(-used.registers * 32 // unit) * unit
        assert warps * per_warp <= target.registers_per_sm, (name, used.registers, threads)
        if launch.spec_name.startswith(("attention_", "kv_store_")):
            assert used.spill_bytes == 0, f"{name} spills {used.spill_bytes} B on {target.arch}"
        for sizes in _size_corners(shape.max_ctx):
            smem = used.static_smem + launch.dynamic_smem.evaluate(sizes)
            assert smem <= target.shared_memory_per_block_optin, f"{name} at {sizes}: {smem} B"
            grid = [g.evaluate(sizes) for g in launch.grid]
            assert all(1 <= g <= limit for g, limit in zip(grid, GRID_LIMITS)), (name, grid)


def test_schedule_parameters_follow_the_profile() -> None:
    params = {name: cuda_params(load_target(name)) for name in GPU_TARGETS}
    small, big = params["rtx4080s"], params["rtx5090"]  # 80 vs 170 SMs
    assert (small.gemv_min_blocks, big.gemv_min_blocks) == (4 * 80, 4 * 170)
    assert (gemv_rows(small, 1024), gemv_rows(big, 1024)) == (2, 1)
    # H100: 64 resident warps and 228 KB of shared memory per SM vs 48 warps / 100 KB
    assert params["h100"].attention_threads > params["rtx4090"].attention_threads
    assert params["h100"].gemm.micro_k > params["rtx4090"].gemm.micro_k
    # h200 has more bandwidth per SM: more loads in flight, but the same power-of-two unroll
    assert params["h100"].bytes_in_flight_per_sm < params["h200"].bytes_in_flight_per_sm
    # derived from profile fields, not from the target's name
    more_sms = load_target("rtx4080s").with_overrides(sm_count=170)
    assert cuda_params(more_sms).gemv_min_blocks == big.gemv_min_blocks


def test_generated_kernels_differ_where_the_parameters_do() -> None:
    def o_proj(target: str) -> tuple[tuple[str, ...], tuple[int, int, int]]:
        symbol = MatmulSpec(2048, 1024).name() + "_kernel"
        (launch,) = [
            x for x in cuda_module("qwen3-0.6b", target).launches if x.kernel_symbol == symbol
        ]
        return tuple(g.c() for g in launch.grid), launch.block

    assert o_proj("rtx4080s") == (("512", "n", "1"), (32, 2, 1))
    assert o_proj("rtx5090") == (("1024", "n", "1"), (32, 1, 1))
    assert cuda_module("qwen3-0.6b", "h100").source == cuda_module("qwen3-0.6b", "h200").source


def test_multi_kernel_spec_with_scratch_is_described() -> None:
    """dlight's Fallback splits rmsnorm into a reduction and an elementwise kernel with a
    global scratch buffer in between: both launches and the allocation must show up."""
    spec = RMSNormSpec(128, 1e-6)
    target = cuda_target(load_target("rtx4080s"))
    sch = dlight.gpu.Fallback().apply(te_primfunc(spec), target, False)
    func = sch.mod["main"].with_attr("global_symbol", spec.name())
    module = lower_to_cuda(tvm.IRModule({spec.name(): func}), target, {"n"})
    first, second = module.launches
    assert (first.kernel_symbol, second.kernel_symbol) == (
        f"{spec.name()}_kernel",
        f"{spec.name()}_kernel_1",
    )
    assert first.host_allocs == [HostAlloc("sumsq", "float32", Var("n"))]
    assert second.host_allocs == first.host_allocs
    kinds = {p.name: p.kind for p in second.params}
    assert kinds["sumsq"] == "scratch" and kinds["x"] == kinds["out"] == "tensor"
    (computed,) = [p for p in second.params if p.kind == "expr"]
    assert computed.expr is not None and computed.expr.evaluate({"n": 3}) == 3 * 128
    assert first.grid[0].evaluate({"n": 2048}) == 2
    assert first.block == (1024, 1, 1)


def test_launch_expressions_evaluate_and_print_c() -> None:
    pos0 = Var("pos0")
    cases: list[tuple[Expr, dict[str, int], int, str]] = [
        ((pos0 + N) * 4, {"pos0": 3, "n": 2}, 20, "((pos0 + n) * 4)"),
        ((N + 31) // 32, {"n": 33}, 2, "((n + 31) / 32)"),
        (N % 8, {"n": 33}, 1, "(n % 8)"),
        (ceil_div(N * 8, 256), {"n": 33}, 2, "(((n * 8) + 255) / 256)"),
        (ceil_div(64, N * 2), {"n": 3}, 11, "((64 + n * 2 - 1) / (n * 2))"),
        (8 * ceil_div(N, 64), {"n": 65}, 16, "(8 * ((n + 63) / 64))"),
    ]
    for expr, sizes, value, text in cases:
        assert (expr.evaluate(sizes), expr.c()) == (value, text)
        # the printed C computes the same value (C's / and % on non-negative ints)
        python = text.replace("/", "//")
        assert eval(python, {"__builtins__": {}}, sizes) == value, text
    with pytest.raises(KeyError, match="pos0"):
        (pos0 + 1).evaluate({"n": 1})
    with pytest.raises(ValueError, match="non-negative"):
        ((N - 5) // 2).evaluate({"n": 1})


@pytest.mark.parametrize("target_name", GPU_TARGETS)
def test_hand_written_launches_follow_n(target_name: str) -> None:
    """Paged attention and the KV store take their signature plus n, need no dynamic shared
    memory, and their grids follow n alone (one CUDA graph per row count serves every
    position and block table): attention one block per (row, head) and key split, the
    store one thread per vector of the n x width inputs. Split attention writes partials
    to scratch sized for its grid, and a merge launch (one block per row and head) reads
    them into out."""
    params = cuda_params(load_target(target_name))
    for model, shape in MODELS.items():
        module = cuda_module(model, target_name)
        launches: dict[str, list[Any]] = {}
        for la in module.launches:
            launches.setdefault(la.spec_name, []).append(la)
        for spec in shape.kernels():
            if not isinstance(spec, AttentionSpec | KvStoreSpec):
                continue
            launch, *rest = launches[spec.name()]
            assert launch.kernel_symbol == f"{spec.name()}_kernel"
            for la in launches[spec.name()]:
                assert re.search(rf'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*'
                                 rf"{la.kernel_symbol}\(", module.source), la.kernel_symbol
                assert la.dynamic_smem.c() == "0" and la.grid[2].c() == "1"
            signature = [a.name for a in spec.signature()]
            names = [p.name for p in launch.params]
            splits = attention_splits(spec, params) if isinstance(spec, AttentionSpec) else 1
            if splits == 1:
                assert rest == [] and launch.host_allocs == []
                assert names == [*signature, "n"]
                assert [p.kind for p in launch.params] == ["tensor"] * (len(names) - 1) + ["size"]
                assert launch.grid[1].c() == "1"
            if isinstance(spec, AttentionSpec):
                assert launch.block == (params.attention_threads, 1, 1)
                for n in (1, 2, 7, shape.max_ctx):
                    assert launch.grid[0].evaluate({"n": n}) == n * spec.heads
                    assert launch.grid[1].evaluate({"n": n}) == -(-splits // n)
            else:
                threads = launch.block[0]
                assert threads == params.elementwise_threads
                for n in (1, 2, 7, shape.max_ctx):
                    blocks = launch.grid[0].evaluate({"n": n})
                    assert (blocks - 1) * threads < n * spec.width // 4 <= blocks * threads
            if splits == 1:
                continue
            (merge,) = rest
            assert merge.kernel_symbol == f"{spec.name()}_combine_kernel"
            assert names == [x for x in signature if x != "out"] + [
                f"{spec.name()}_part_acc", f"{spec.name()}_part_ml", "splits", "n"]
            assert [p.name for p in merge.params] == [*names[-4:-2], "out", "splits", "n"]
            assert merge.block == (spec.head_dim, 1, 1) and merge.grid[1].c() == "1"
            sizes = {a.name: a.elements for a in launch.host_allocs}
            assert [a.elements for a in merge.host_allocs] == list(sizes.values())
            for n in (1, 2, 7, shape.max_ctx):
                blocks = launch.grid[0].evaluate({"n": n}) * launch.grid[1].evaluate({"n": n})
                assert sizes[f"{spec.name()}_part_acc"].evaluate({"n": n}) == \
                    blocks * spec.head_dim
                assert sizes[f"{spec.name()}_part_ml"].evaluate({"n": n}) == blocks * 2


def test_unsupported_head_dim_is_refused_with_numbers() -> None:
    spec = AttentionSpec(4, 2, 16, 64, 16, 1, 4)
    with pytest.raises(NotImplementedError, match=r"head_dim 16 .* between 32 and 256"):
        build_cuda_source([spec], load_target("h200"))


def test_head_major_kv_pools_are_refused() -> None:
    """The CUDA KV kernels read and write token-major pools; the CPU plan's head-major
    layout is refused, not compiled into kernels that would index it wrongly."""
    pools = [AttentionSpec(4, 2, 64, 64, 16, 1, 4, layout="heads"),
             KvStoreSpec(width=128, pool_rows=64, head_dim=64, layout="heads", block_size=16)]
    for spec in pools:
        with pytest.raises(NotImplementedError, match="token-major"):
            build_cuda_source([spec], load_target("h200"))
