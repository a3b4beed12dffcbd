"""The launch verifier and the coop split-K router.

`unit` tests use fixed KernelResources (independent of what nvcc chooses), including the
regression test of the crash this project exists to prevent. `cuda_build` tests run nvcc
(no GPU needed; results cached in build/.cuda-cache) and check every shipped GPU target.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from ninfer.kernels.cuda.coop import CoopProjectionSpec, coop_family, render_coop_source
from ninfer.kernels.launch import Const, LaunchShape, N, ceil_div
from ninfer.occupancy.coop import compile_coop_family, coop_launch, route_coop
from ninfer.occupancy.resources import (
    CudaCompileError,
    KernelResources,
    compile_cuda,
    find_nvcc,
    nvcc_resources,
)
from ninfer.occupancy.verifier import (
    LaunchSpec,
    LaunchVerificationError,
    RuntimeLimits,
    format_table,
    verify,
)
from ninfer.paths import DEFAULT_BUILD_DIR, ROOT
from ninfer.targets import available_targets, load_target

CUDA_CACHE = DEFAULT_BUILD_DIR / ".cuda-cache"
GPU_TARGETS = [t for t in available_targets() if load_target(t).is_cuda]
PREFILL_CHUNK = 2048
README_SHAPE = (2048, 2048)  # k, n_out of the README table

# The crashing schedule: split-2, 512 threads x 74 registers; 3 column blocks x 128-token
# tiles -> grid 6 x ceil(tokens / 128): 78 CTAs at 1664 tokens, 84 at 1665.
SPLIT2 = CoopProjectionSpec(k=2048, n_out=192, split=2, threads=512, token_tile=128,
                            col_block=64)
UNSPLIT = CoopProjectionSpec(k=2048, n_out=192, split=1, threads=512, token_tile=128,
                             col_block=64)
FIXED = {s.name(): KernelResources(s.name(), registers=74, static_smem_bytes=24832)
         for s in (SPLIT2, UNSPLIT)}


def _one(name: str, **kw: int) -> dict[str, KernelResources]:
    return {name: KernelResources(name, **kw)}


def _launch(kernel: str, threads: int, grid, **kw) -> LaunchSpec:
    """A launch site along tokens (unless `axis` says otherwise)."""
    axis = kw.pop("axis", "tokens")
    return LaunchSpec(LaunchShape(kernel, threads, grid, **kw), axis=axis)


# ---------------------------------------------------------------- unit: the regression


@pytest.mark.unit
def test_regression_grid_matches_the_crash_report():
    assert (SPLIT2.grid(1664), SPLIT2.grid(1665)) == (78, 84)
    assert SPLIT2.grid_expr().c() == "(6 * ((n + 127) / 128))"  # evaluated and printed


@pytest.mark.unit
def test_regression_split2_rejected_at_1665_on_4080s():
    target = load_target("rtx4080s")
    report = verify(target, [coop_launch(SPLIT2)], FIXED, RuntimeLimits(PREFILL_CHUNK))
    assert not report.ok
    (v,) = report.violations
    assert (v.kernel, v.size, v.value, v.allowed, v.target) == (SPLIT2.name(), 1665, 84, 80,
                                                                 "rtx4080s")
    assert "resident budget" in v.limit
    check = report.checks[0]
    assert check.max_ok_size == 1664  # the derived boundary
    assert (check.ctas_per_sm, check.limited_by, check.resident_budget) == (1, "registers", 80)
    with pytest.raises(LaunchVerificationError, match=r"rtx4080s: kernel .* at tokens=1665.*"
                       r"84 exceeds 80"):
        report.raise_if_failed()


@pytest.mark.unit
def test_regression_same_schedule_fits_on_4090():
    report = verify(load_target("rtx4090"), [coop_launch(SPLIT2)], FIXED,
                    RuntimeLimits(PREFILL_CHUNK))
    assert report.ok
    assert report.checks[0].resident_budget == 128
    assert report.checks[0].max_ok_size == PREFILL_CHUNK  # 6 x 16 = 96 <= 128


@pytest.mark.unit
def test_regression_router_reroutes_1665_on_4080s():
    router = route_coop(load_target("rtx4080s"), [UNSPLIT, SPLIT2], FIXED, PREFILL_CHUNK)
    spans = [(r.min_tokens, r.max_tokens, r.variant.split) for r in router.routes]
    assert spans == [(1, 1664, 2), (1665, PREFILL_CHUNK, 1)]
    assert router.variant_for(1664) == SPLIT2 and router.variant_for(1665) == UNSPLIT
    assert router.report.ok
    assert router.max_tokens_by_variant()[SPLIT2.name()] == 1664


@pytest.mark.unit
def test_regression_router_keeps_split2_on_4090():
    router = route_coop(load_target("rtx4090"), [SPLIT2, UNSPLIT], FIXED, PREFILL_CHUNK)
    assert [(r.min_tokens, r.max_tokens, r.variant) for r in router.routes] == [
        (1, PREFILL_CHUNK, SPLIT2)]


@pytest.mark.unit
def test_router_fails_when_no_variant_fits():
    with pytest.raises(LaunchVerificationError, match=r"rtx4080s: kernel coop_splitk\S*_s2_"
                       r"\S* at tokens=1665.*resident budget 84 exceeds 80"):
        route_coop(load_target("rtx4080s"), [SPLIT2], FIXED, PREFILL_CHUNK)


# ------------------------------------------------------------- unit: each limit flagged


@pytest.mark.unit
def test_flags_block_of_2048_threads():
    launch = _launch("big_block", 2048, Const(4))
    report = verify(load_target("rtx4090"), [launch], _one("big_block", registers=32),
                    RuntimeLimits(16))
    (v,) = report.violations
    assert (v.limit, v.value, v.allowed, v.size) == ("threads per block", 2048, 1024, None)


@pytest.mark.unit
def test_flags_300_registers():
    launch = _launch("fat", 128, ceil_div(N, 64))
    report = verify(load_target("h100"), [launch], _one("fat", registers=300),
                    RuntimeLimits(16))
    (v,) = report.violations
    assert (v.limit, v.value, v.allowed) == ("registers per thread", 300, 255)
    assert "h100: kernel fat: registers per thread 300 exceeds 255" in str(v)


@pytest.mark.unit
def test_dynamic_smem_above_opt_in_is_flagged_at_the_first_size():
    # 1024 static + 512 per token: 1024 + 196 x 512 = 101376, the opt-in limit; 197 fails.
    launch = _launch("attn", 128, N, dynamic_smem=N * 512)
    report = verify(load_target("rtx4080s"), [launch],
                    _one("attn", registers=32, static_smem_bytes=1024), RuntimeLimits(256))
    (v,) = report.violations
    assert v.limit == "shared memory per block (opt-in limit)"
    assert (v.size, v.value, v.allowed, v.failing_sizes) == (197, 101888, 101376, 60)
    assert report.checks[0].max_ok_size == 196
    assert report.checks[0].needs_smem_optin


@pytest.mark.unit
def test_opt_in_attribute_recorded_only_above_the_default_limit():
    target = load_target("rtx4080s")
    res = _one("k", registers=32)
    small = verify(target, [_launch("k", 128, Const(1), dynamic_smem=Const(40_000))], res,
                   RuntimeLimits(8))
    large = verify(target, [_launch("k", 128, Const(1), dynamic_smem=Const(64 * 1024))], res,
                   RuntimeLimits(8))
    assert small.ok and not small.checks[0].needs_smem_optin
    assert large.ok and large.checks[0].needs_smem_optin
    assert large.checks[0].max_dynamic_smem == 64 * 1024


@pytest.mark.unit
def test_spills_flagged_against_the_stated_bound():
    res = _one("spiller", registers=24, spill_store_bytes=8, spill_load_bytes=8)
    launch = _launch("spiller", 128, Const(2))
    target = load_target("rtx5080")
    (v,) = verify(target, [launch], res, RuntimeLimits(8)).violations
    assert (v.limit, v.value, v.allowed) == ("spilled bytes", 16, 0)
    assert verify(target, [launch], res, RuntimeLimits(8, max_spill_bytes=16)).ok


@pytest.mark.unit
def test_kernel_without_resource_usage_cannot_be_proven():
    report = verify(load_target("h200"), [_launch("ghost", 64, Const(1))], {},
                    RuntimeLimits(8))
    (v,) = report.violations
    assert v.limit == "resource usage" and "sm_90" in str(v)


@pytest.mark.unit
def test_axes_cover_batch_and_verify_rows():
    limits = RuntimeLimits(512, max_concurrency=4, max_draft=3)
    assert limits.sizes("tokens") == (1, 512)
    assert limits.sizes("batch") == (1, 4)
    assert limits.sizes("rows") == (1, 16)
    launch = _launch("verify_rows", 64, N, cooperative=True, axis="rows")
    report = verify(load_target("rtx4080s"), [launch], _one("verify_rows", registers=32),
                    limits)
    assert report.ok and report.checks[0].sizes == (1, 16)


@pytest.mark.unit
def test_plain_table_lists_numbers_and_violations():
    target = load_target("rtx4080s")
    report = verify(target, [coop_launch(SPLIT2), coop_launch(UNSPLIT)], FIXED,
                    RuntimeLimits(PREFILL_CHUNK))
    text = format_table(report)
    assert "target rtx4080s (sm_89, 80 SMs)" in text
    row = next(ln for ln in text.splitlines() if ln.startswith(SPLIT2.name()))
    assert row.split()[1:] == ["512", "74", "24832", "1", "(registers)", "80", "tokens",
                               "1..2048", "1664"]
    assert "VIOLATION rtx4080s: kernel" in text and "tokens=1665" in text


# ------------------------------------------------------------------ cuda_build: nvcc

PARSE_SOURCE = r"""
__device__ __forceinline__ float hungry(const float* __restrict__ in) {  // ~72 registers
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = in[threadIdx.x + i * 256];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s = fmaf(v[i], v[63 - i], s);
  return s;
}
extern "C" __global__ void staged(const float* in, float* out) {
  __shared__ float tile[1024];
  tile[threadIdx.x] = in[blockIdx.x * 1024 + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * 1024 + threadIdx.x] = tile[(threadIdx.x * 7) % 1024] + tile[threadIdx.x];
}
// 2 CTAs of 768 threads resident -> at most 65536 / 1536 = 42 registers.
extern "C" __global__ void __launch_bounds__(768, 2) bounded(const float* in, float* out) {
  out[threadIdx.x] = hungry(in);
}
// No launch bounds: -maxrregcount=48 caps it.
extern "C" __global__ void capped(const float* in, float* out) { out[threadIdx.x] = hungry(in); }
__global__ void mangled_kernel(float* out, int n) { if (threadIdx.x < n) out[threadIdx.x] = n; }
"""

SPILL_SOURCE = r"""
extern "C" __global__ void spill_heavy(const float* __restrict__ in, float* __restrict__ out) {
  float v[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) v[i] = in[threadIdx.x + i * 1024];
  float s = 0.0f;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int i = 0; i < 48; ++i) s = fmaf(v[i], v[(i * 7 + r) % 48], s);
  out[threadIdx.x] = s;
}
"""


@pytest.fixture(scope="session")
def nvcc_available() -> None:
    try:
        find_nvcc()
    except CudaCompileError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def coop_resources(nvcc_available) -> dict[str, dict[str, KernelResources]]:
    """The README-shape family compiled once per arch (cached on disk across sessions)."""
    specs = coop_family(*README_SHAPE)
    archs = sorted({load_target(t).arch for t in GPU_TARGETS})
    return {arch: dict(compile_coop_family(specs, arch, nvcc_resources(CUDA_CACHE)))
            for arch in archs}


@pytest.mark.cuda_build
def test_parse_real_nvcc_output(nvcc_available):
    compiled = compile_cuda(PARSE_SOURCE, "sm_89", CUDA_CACHE, ["-maxrregcount=48"])
    staged = compiled.resources["staged"]
    assert staged.static_smem_bytes == 4096
    assert staged.spill_bytes == 0 and staged.const_bytes > 0
    assert 0 < compiled.resources["bounded"].registers <= 42
    assert 42 < compiled.resources["capped"].registers <= 48
    mangled = compiled.resources["mangled_kernel"]  # reachable by its plain identifier
    assert mangled.name.startswith("_Z") and mangled.static_smem_bytes == 0
    assert compiled.cubin_path.stat().st_size > 0
    assert "Compiling entry function 'staged' for 'sm_89'" in compiled.log


@pytest.mark.cuda_build
def test_spilling_kernel_parsed_and_flagged(nvcc_available):
    compiled = compile_cuda(SPILL_SOURCE, "sm_89", CUDA_CACHE, ["-maxrregcount=16"])
    res = compiled.resources["spill_heavy"]
    assert res.registers <= 24  # sm_89 raises a 16-register cap to its lower bound, 24
    assert res.spill_store_bytes > 0 and res.spill_load_bytes > 0
    assert res.local_bytes >= res.spill_store_bytes
    report = verify(load_target("rtx4080s"), [_launch("spill_heavy", 1024, Const(1))],
                    compiled.resources, RuntimeLimits(1))
    (v,) = report.violations
    assert v.limit == "spilled bytes" and v.value == res.spill_bytes


@pytest.mark.cuda_build
def test_nvcc_failure_is_reported(nvcc_available, tmp_path):
    with pytest.raises(CudaCompileError, match="nvcc failed"):
        compile_cuda("__global__ void broken( { }", "sm_89", tmp_path)


@pytest.mark.cuda_build
@pytest.mark.parametrize("name", GPU_TARGETS)
def test_coop_family_routes_every_prefill_size(name, coop_resources):
    target = load_target(name)
    specs = coop_family(*README_SHAPE)
    resources = coop_resources[target.arch]
    for spec in specs:
        res = resources[spec.name()]
        assert 0 < res.registers <= target.registers_per_thread_max
        assert res.spill_bytes == 0 and res.static_smem_bytes > 0
    router = route_coop(target, specs, resources, PREFILL_CHUNK)
    assert router.report.ok, format_table(router.report)
    spans = [(r.min_tokens, r.max_tokens) for r in router.routes]
    assert spans[0][0] == 1 and spans[-1][1] == PREFILL_CHUNK
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))
    splits = [r.variant.split for r in router.routes]
    assert splits == sorted(splits, reverse=True)  # largest split first, never back
    for route, check in zip(router.routes, router.report.checks, strict=True):
        v = route.variant
        if v.cooperative:  # each boundary is tight: one token more no longer fits
            assert check.resident_budget is not None
            assert v.grid(route.max_tokens) <= check.resident_budget
            if route.max_tokens < PREFILL_CHUNK:
                assert v.grid(route.max_tokens + 1) > check.resident_budget
    table = format_table(router.report)
    for route in router.routes:
        assert re.search(rf"{route.variant.name()} .* {route.max_tokens}$", table, re.M)


def _readme_rows() -> dict[str, list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## GPU targets: launch safety", 1)[1].split("\n## ", 1)[0]
    rows = [ln.strip("|").split("|") for ln in section.splitlines() if ln.startswith("| `")]
    return {cells[0].strip(" `"): [c.strip(" `") for c in cells] for cells in rows}


@pytest.mark.cuda_build
def test_readme_route_table_is_what_the_compiler_derives(coop_resources):
    rows = _readme_rows()
    assert sorted(rows) == sorted(GPU_TARGETS)
    for name in GPU_TARGETS:
        target = load_target(name)
        router = route_coop(target, coop_family(*README_SHAPE), coop_resources[target.arch],
                            PREFILL_CHUNK)
        budget = next(c.resident_budget for c in router.report.checks if c.resident_budget)
        ranges = {r.variant.split: f"{r.min_tokens}..{r.max_tokens}" for r in router.routes}
        expect = [name, target.arch, str(target.sm_count),
                  str(router.report.checks[0].ctas_per_sm), str(budget),
                  *(ranges.get(s, "-") for s in (8, 4, 2, 1)),
                  f"python -m ninfer.occupancy.explain --target {name} --k 2048 --n 2048"]
        assert rows[name] == expect, f"README row for {name} is stale; rerun the command"


@pytest.mark.cuda_build
def test_explain_cli_prints_the_routes(coop_resources):
    r = subprocess.run([sys.executable, "-m", "ninfer.occupancy.explain", "--target",
                        "rtx4080s", "--plain"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "routes on rtx4080s" in r.stdout and "tokens     1..64" in r.stdout
    assert "VIOLATION" not in r.stdout


# ------------------------------------------------------------- unit: the coop family


@pytest.mark.unit
def test_empty_grid_is_flagged():
    report = verify(load_target("rtx4090"), [_launch("idle", 64, Const(0))],
                    _one("idle", registers=16), RuntimeLimits(4))
    (v,) = report.violations
    assert v.limit == "empty grid" and v.size == 1 and v.failing_sizes == 4


@pytest.mark.unit
def test_coop_spec_name_grid_and_tiling():
    spec = CoopProjectionSpec(k=2048, n_out=2048, split=8)
    assert spec.name() == "coop_splitk_k2048_n2048_s8_t256_tt64_cb128_f32"
    assert spec.name().isidentifier()
    assert (spec.col_blocks, spec.micro_tile(), spec.k_slice) == (16, (8, 4), 256)
    assert (spec.grid(1), spec.grid(64), spec.grid(65)) == (128, 128, 256)
    assert spec.workspace_floats(100) == 8 * 100 * 2048
    assert CoopProjectionSpec(2048, 2048, 1).workspace_floats(100) == 0
    with pytest.raises(ValueError, match="multiple of threads"):
        CoopProjectionSpec(k=64, n_out=64, split=2, threads=256, token_tile=3, col_block=64)
    with pytest.raises(ValueError, match="split must be a positive int"):
        CoopProjectionSpec(k=64, n_out=64, split=0)


@pytest.mark.unit
def test_rendered_source_syncs_only_split_variants():
    specs = coop_family(256, 192)
    src = render_coop_source(specs)
    assert src.startswith("// generated by ninfer")
    for spec in specs:
        assert f'extern "C" __global__ void __launch_bounds__({spec.threads})\n{spec.name()}(' \
            in src
    assert src.count("this_grid().sync()") == 3  # split8, split4, split2; not unsplit
