"""CPU run of the hand-written CUDA kernels (paged attention, KV-cache store, group-
quantized matmuls).

The exact source `build_cuda_source` emits for them (templates/cuda/paged_attention.cu.j2)
is compiled with g++ against a small host emulation of CUDA (cuda_emulation.h: one
coroutine per CUDA thread, real barriers for __syncthreads and warp shuffles) and launched
with the grid and block of its CudaLaunch, then compared with the float64 reference.
Pool rows that no key may read are NaN, so a stray read shows up in the output.

Attention split over its keys (flash-decoding) runs both of its launches, with NaN-filled
scratch. Pools are f32, f16 or bf16 (stored bits compared exactly for the store). Cases
cover GQA ratios 1..8, head_dim 32..256 (vector widths 1, 2 and 4), rows from
several sequences in one launch, positions 0 (most warps without keys), clamped positions
and block ids, and the schedule of two shipped targets plus a small-block target whose
warps take 8 keys per step (masked tails).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from ninfer.kernels import AttentionSpec, KernelSpec, KvStoreSpec, MatmulSpec, reference
from ninfer.kernels.cuda.attention import (
    MAX_LOADED_FLOATS,
    MAX_UNROLL,
    attention_layout,
    attention_splits,
    splits_expr,
)
from ninfer.kernels.cuda.lower import CudaLaunch, CudaModule, build_cuda_source
from ninfer.kernels.cuda.schedules import cuda_params, pow2_floor
from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.quantize import kv_formats
from ninfer.quantize import weight_formats as quant
from ninfer.targets import Target, load_target

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
CACHE = DEFAULT_BUILD_DIR / ".cuda-emulation"
TOL = 1e-5
CXX = shutil.which("g++")
_CTYPES = {"float*": ctypes.c_void_p, "int32_t*": ctypes.c_void_p, "uint16_t*": ctypes.c_void_p,
           "int8_t*": ctypes.c_void_p, "uint8_t*": ctypes.c_void_p, "int64_t": ctypes.c_int64}


def small_block_target() -> Target:
    """64 threads per attention block, and so much bandwidth per SM that every warp takes
    the most keys per step."""
    return load_target("h200").with_overrides(max_threads_per_block=64, sm_count=1)


TARGETS = {"h200": lambda: load_target("h200"), "rtx4090": lambda: load_target("rtx4090"),
           "small": small_block_target}

ATTENTION = [
    AttentionSpec(heads=4, kv_heads=2, head_dim=32, max_ctx=256, block_size=16, max_seqs=3,
                  kv_blocks=40),
    AttentionSpec(heads=4, kv_heads=4, head_dim=64, max_ctx=128, block_size=8, max_seqs=2,
                  kv_blocks=33),
    AttentionSpec(heads=8, kv_heads=2, head_dim=128, max_ctx=192, block_size=16, max_seqs=3,
                  kv_blocks=30),
    AttentionSpec(heads=2, kv_heads=2, head_dim=96, max_ctx=64, block_size=16, max_seqs=2,
                  kv_blocks=8),
    AttentionSpec(heads=8, kv_heads=1, head_dim=256, max_ctx=64, block_size=32, max_seqs=2,
                  kv_blocks=4),
]
# 16-bit KV pools (f16, bf16): vector widths 4, 2 and 1, a split target among them.
ATTENTION += [
    dataclasses.replace(ATTENTION[0], kv_dtype="f16"),
    dataclasses.replace(ATTENTION[2], kv_dtype="bf16"),
    dataclasses.replace(ATTENTION[3], kv_dtype="f16"),
]
KV_STORE = [KvStoreSpec(width=64, pool_rows=50), KvStoreSpec(width=6, pool_rows=9),
            KvStoreSpec(width=5, pool_rows=9),
            KvStoreSpec(width=64, pool_rows=50, kv_dtype="f16", head_dim=32),
            KvStoreSpec(width=6, pool_rows=9, kv_dtype="bf16", head_dim=6),
            KvStoreSpec(width=10, pool_rows=9, kv_dtype="f16", head_dim=5)]
NAN_BITS = {"f16": 0x7E00, "bf16": 0x7FC0}  # a quiet NaN as stored
# Group-quantized matmuls: 1..3 groups, n_out off the 64-column tile, with and without bias.
QMATMUL = [MatmulSpec(k, n_out, bias, schedule, fmt)
           for fmt, k, n_out in (("q8g32", 96, 37), ("q4g64", 192, 70), ("q4g128", 384, 37))
           for schedule in ("gemv", "gemm") for bias in (False, True)]


@functools.cache
def emulated(target_name: str) -> tuple[ctypes.CDLL, dict[str, list[CudaLaunch]]]:
    """The hand-written kernels as built for `target_name`, compiled for the host."""
    return compile_emulated(build_cuda_source([*ATTENTION, *KV_STORE, *QMATMUL],
                                              TARGETS[target_name]()))


def shared_library(source: str, flags: list[str], *, sources: tuple[Path, ...] = (),
                   depends: tuple[bytes, ...] = ()) -> ctypes.CDLL:
    """`source` and the files `sources` compiled by g++ (C++20, -O1) with `flags` into a
    shared library, cached under CACHE by all that goes into it (`depends`: the contents
    of the headers they include)."""
    if CXX is None:
        pytest.skip("g++ not found")
    flags = ["-std=c++20", "-O1", "-shared", "-fPIC", *flags]
    key = hashlib.sha256(b"\0".join([source.encode(), " ".join(flags).encode(), *depends,
                                     *(p.read_bytes() for p in sources)]))
    lib = CACHE / f"{key.hexdigest()[:24]}.so"
    if not lib.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        src = lib.with_suffix(".cpp")
        src.write_text(source)
        tmp = lib.with_suffix(f".so.tmp{os.getpid()}")  # the suite's workers may race here
        result = subprocess.run([CXX, *flags, "-o", str(tmp), str(src), *map(str, sources)],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr[-4000:]
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


def compile_emulated(module: CudaModule) -> tuple[ctypes.CDLL, dict[str, list[CudaLaunch]]]:
    """`module`'s exact source compiled with g++ against cuda_emulation.h (cached by
    content), with one `emu_<symbol>` driver per launch; its launches by spec name."""
    drivers = []
    for launch in module.launches:
        params = ", ".join(f"{p.ctype} a{i}" for i, p in enumerate(launch.params))
        args = ", ".join(f"a{i}" for i in range(len(launch.params)))
        drivers.append(
            f'extern "C" void emu_{launch.kernel_symbol}({params}, unsigned grid_x, '
            f"unsigned grid_y, unsigned threads, unsigned smem) {{\n"
            f"  emu::launch(grid_x, grid_y, threads, [=] {{ {launch.kernel_symbol}({args}); }}, "
            "smem);\n}\n")
    source = '#include "cuda_emulation.h"\n' + module.source + "\n" + "".join(drivers)
    lib = shared_library(source, ["-Wno-unknown-pragmas", f"-I{HERE}"],
                         depends=((HERE / "cuda_emulation.h").read_bytes(),))
    launches: dict[str, list[CudaLaunch]] = {}
    for launch in module.launches:
        launches.setdefault(launch.spec_name, []).append(launch)
    return lib, launches


def run(target_name: str, spec: KernelSpec, arrays: list[np.ndarray], n: int) -> int:
    """Run `spec`'s launches on `arrays` (signature order, contiguous) with n rows, as the
    generated launch table would (run_launches). Returns the number of launches."""
    return run_launches(emulated(target_name), spec, arrays, n)


def run_launches(built: tuple[ctypes.CDLL, dict[str, list[CudaLaunch]]], spec: KernelSpec,
                 arrays: list[np.ndarray], n: int,
                 scratch: dict[str, np.ndarray] | None = None) -> int:
    """Run `spec`'s launches from `built` (compile_emulated) with n rows: scratch buffers
    NaN-filled (so an unwritten element shows) unless given in `scratch` (float32, to read
    back), `expr` parameters and grids evaluated for n. Returns the number of launches."""
    lib, launches = built
    tensors = dict(zip([a.name for a in spec.signature()], arrays, strict=True))
    for a in arrays:
        assert a.flags.c_contiguous
    scratch = {} if scratch is None else scratch
    for launch in launches[spec.name()]:
        for alloc in launch.host_allocs:
            if alloc.name not in scratch:
                assert alloc.dtype == "float32"
                scratch[alloc.name] = np.full(alloc.elements.evaluate({"n": n}), np.nan,
                                              np.float32)
        values: list[int] = []
        for p in launch.params:
            if p.kind == "tensor":
                values.append(tensors[p.name].ctypes.data)
            elif p.kind == "scratch":
                values.append(scratch[p.name].ctypes.data)
            elif p.kind == "size":
                assert p.name == "n"
                values.append(n)
            else:
                assert p.kind == "expr"
                assert p.expr is not None
                values.append(p.expr.evaluate({"n": n}))
        assert launch.block[1:] == (1, 1) and launch.grid[2].c() == "1"
        fn = getattr(lib, f"emu_{launch.kernel_symbol}")
        fn.argtypes = [_CTYPES[p.ctype] for p in launch.params] + [ctypes.c_uint] * 4
        fn.restype = None
        fn(*values, launch.grid[0].evaluate({"n": n}), launch.grid[1].evaluate({"n": n}),
           launch.block[0], launch.dynamic_smem.evaluate({"n": n}))
    return len(launches[spec.name()])


def attention_inputs(spec: AttentionSpec, rng: np.random.Generator
                     ) -> tuple[list[np.ndarray], int]:
    """Rows of every sequence slot: a prefill chunk, decode rows, position 0, positions
    past max_ctx and below 0 (clamped), and a block table with out-of-range ids."""
    bs, blocks = spec.block_size, spec.blocks_per_seq
    tables = np.full((spec.max_seqs, blocks), -12345, np.int32)  # never read
    free = rng.permutation(spec.kv_blocks)
    for s in range(spec.max_seqs):
        used = min(blocks, spec.kv_blocks // spec.max_seqs)
        tables[s, :used] = free[s * used:(s + 1) * used]
    ctx = [min(spec.max_ctx, bs * min(blocks, spec.kv_blocks // spec.max_seqs))
           for _ in range(spec.max_seqs)]
    tables[0, 0] = spec.kv_blocks + 7  # clamped to the last block
    if blocks > 1 and ctx[0] > bs:
        tables[0, 1] = -3  # clamped to block 0
    pos, seq = [], []
    chunk0 = min(5, ctx[0])
    for p in range(ctx[0] - chunk0, ctx[0]):  # a prefill chunk ending at the last key
        pos.append(p)
        seq.append(0)
    for s in range(spec.max_seqs):
        pos += [0, int(rng.integers(0, ctx[s])), ctx[s] - 1]
        seq += [s, s, s]
    if ctx[1] == spec.max_ctx:
        pos += [spec.max_ctx + 40, -9]  # clamped to max_ctx - 1 and 0
        seq += [1, 1]
    n = len(pos)
    pos_a = np.array(pos, np.int32)
    seq_a = np.array(seq, np.int32)
    pool_shape = (spec.kv_blocks * bs, spec.kv_heads, spec.head_dim)
    k_pool = rng.standard_normal(pool_shape).astype(np.float32)
    v_pool = rng.standard_normal(pool_shape).astype(np.float32)
    read = np.zeros(pool_shape[0], bool)
    for p, s in zip(pos_a, seq_a):
        j = np.arange(np.clip(p, 0, spec.max_ctx - 1) + 1)
        read[np.clip(tables[s][j // bs], 0, spec.kv_blocks - 1) * bs + j % bs] = True
    k_pool, v_pool = (stored(spec.kv_dtype, pool, read) for pool in (k_pool, v_pool))
    q = rng.standard_normal((n, spec.heads, spec.head_dim)).astype(np.float32)
    return [q, k_pool, v_pool, pos_a, seq_a, tables], n


def stored(kv_dtype: str, pool: np.ndarray, read: np.ndarray) -> np.ndarray:
    """`pool` in the KV format (f32, f16 or bf16), NaN in the rows no key may read."""
    (out,) = kv_formats.encode(kv_dtype, pool)
    if kv_dtype == "f32":
        out[~read] = np.nan
    else:
        out.view(np.uint16)[~read] = NAN_BITS[kv_dtype]
    return out


@pytest.mark.parametrize("target_name", sorted(TARGETS))
@pytest.mark.parametrize("spec", ATTENTION, ids=lambda s: s.name())
def test_attention_matches_reference(target_name: str, spec: AttentionSpec) -> None:
    rng = np.random.default_rng(zlib.crc32(spec.name().encode()))
    inputs, n = attention_inputs(spec, rng)
    out = np.full((n, spec.heads, spec.head_dim), np.nan, np.float32)
    run(target_name, spec, [*inputs, out], n)
    ref = reference(spec, *inputs)
    assert np.isfinite(out).all()
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"relative error {err:.3g} > {TOL:g}"
    rows = np.abs(out - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
    assert rows.max() <= 10 * TOL, rows  # every row, not just on average


SPLIT_CASES = [(t, s) for t in ("h200", "rtx4090") for s in ATTENTION
               if attention_splits(s, cuda_params(TARGETS[t]())) > 1]


@pytest.mark.parametrize(("target_name", "spec"), SPLIT_CASES,
                         ids=[f"{t}-{s.name()}" for t, s in SPLIT_CASES])
def test_split_attention_decode_rows(target_name: str, spec: AttentionSpec) -> None:
    """Decode batches (a row or three) split their keys over several blocks: the partials
    of every split, including the empty ones of a row at position 0, merge to the same
    result as one block per row."""
    params = cuda_params(TARGETS[target_name]())
    rng = np.random.default_rng(zlib.crc32(spec.name().encode()) + 1)
    (q, k_pool, v_pool, pos, seq, tables), n_all = attention_inputs(spec, rng)
    longest = int(np.argmax(np.where(seq == 0, pos, -1)))  # seq 0's last key
    first = int(np.argmax((seq == 1) & (pos == 0)))  # seq 1 at position 0: one key
    middle = int(np.argmax(seq == spec.max_seqs - 1)) + 1  # a random position
    assert longest < n_all and pos[first] == 0 and middle < n_all
    most = attention_splits(spec, params)
    for rows in ([longest], [first, longest], [first, longest, middle]):
        n = len(rows)
        splits = splits_expr(spec, params).evaluate({"n": n})
        assert splits == -(-most // n) and (n > 1 or splits > 1)
        inputs = [np.ascontiguousarray(q[rows]), k_pool, v_pool, pos[rows], seq[rows], tables]
        out = np.full((n, spec.heads, spec.head_dim), np.nan, np.float32)
        assert run(target_name, spec, [*inputs, out], n) == 2  # keys, then the merge
        ref = reference(spec, *inputs)
        assert np.isfinite(out).all()
        err = np.abs(out - ref).max() / np.abs(ref).max()
        assert err <= 10 * TOL, f"{n} rows in {splits} splits: relative error {err:.3g}"


def test_split_count_follows_the_target() -> None:
    """One decode row of a Qwen3-0.6B layer: enough blocks for 4 per SM where the context
    allows, one split per row once the rows fill the target, none for a short context."""
    spec = AttentionSpec(heads=16, kv_heads=8, head_dim=128, max_ctx=4096, block_size=16,
                         max_seqs=8, kv_blocks=2049)
    for name, sms in (("h200", 132), ("rtx4080s", 80), ("rtx4090", 128)):
        params = cuda_params(load_target(name))
        assert attention_splits(spec, params) == -(-4 * sms // 16)
        assert splits_expr(spec, params).evaluate({"n": 1}) == -(-4 * sms // 16)
        assert splits_expr(spec, params).evaluate({"n": 4 * sms // 16}) == 1
    short = AttentionSpec(heads=16, kv_heads=8, head_dim=128, max_ctx=64, block_size=16,
                          max_seqs=8, kv_blocks=33)
    assert attention_splits(short, cuda_params(load_target("h200"))) == 1


def test_small_target_takes_several_keys_per_warp_step() -> None:
    """On the small target only the register cap limits the keys per warp and step."""
    params = cuda_params(small_block_target())
    layouts = [attention_layout(spec, params) for spec in ATTENTION]
    assert all(layout.threads == 64 for layout in layouts)
    assert [layout.unroll for layout in layouts] == [
        min(MAX_UNROLL, pow2_floor(max(1, MAX_LOADED_FLOATS // (2 * layout.per_lane))))
        for layout in layouts]
    assert max(layout.unroll for layout in layouts) == MAX_UNROLL


@pytest.mark.parametrize("target_name", ["h200", "small"])
@pytest.mark.parametrize("spec", KV_STORE, ids=lambda s: s.name())
def test_kv_store_writes_only_valid_rows(target_name: str, spec: KvStoreSpec) -> None:
    rng = np.random.default_rng(zlib.crc32(spec.name().encode()))
    rows = np.array([3, -1, 0, spec.pool_rows - 1, spec.pool_rows, 5, 2**31 - 1], np.int32)
    n = len(rows)
    x = rng.standard_normal((n, spec.width)).astype(np.float32)
    x[0, :3] = [1e6, -1e6, 1 + 2**-11]  # f16 saturates; ties round to even
    pool = rng.standard_normal((spec.pool_rows, spec.width)).astype(np.float32)
    if spec.kv_dtype != "f32":
        heads = (spec.width // spec.head_dim, spec.head_dim)
        (pool,) = kv_formats.encode(spec.kv_dtype, pool.reshape(-1, *heads))
    want = pool.copy()
    for i, r in enumerate(rows):
        if 0 <= r < spec.pool_rows:
            want[r] = kv_formats.encode(spec.kv_dtype, x[i].reshape(want[r].shape))[0]
    run(target_name, spec, [x, rows, pool], n)
    np.testing.assert_array_equal(pool.view(np.uint8), want.view(np.uint8))  # bit for bit


@pytest.mark.parametrize("spec", QMATMUL, ids=lambda s: s.name())
def test_quantized_matmul_matches_dequantized_weights(spec: MatmulSpec) -> None:
    """The stored integers and float16 scales, read in place, times float32 x: against
    float64 x @ dequantize(w).T (+ bias); gemv rows beyond one block's 4 and gemm rows and
    columns beyond one 64 x 64 tile take further blocks."""
    rng = np.random.default_rng(zlib.crc32(spec.name().encode()))
    scale = np.exp(rng.uniform(-3, 1, size=(spec.n_out, 1)))
    parts = quant.pack((rng.standard_normal((spec.n_out, spec.k)) * scale).astype(np.float32),
                       spec.wdtype)
    w = quant.dequantize(parts, spec.wdtype, spec.k)
    for n in ((1, 3, 6) if spec.schedule == "gemv" else (1, 70)):
        x = rng.standard_normal((n, spec.k)).astype(np.float32)
        args = [x, *(parts[name] for name, _, _ in quant.part_layout(spec.wdtype, spec.n_out,
                                                                      spec.k))]
        want = x.astype(np.float64) @ w.astype(np.float64).T
        if spec.bias:
            args.append(rng.standard_normal(spec.n_out).astype(np.float32))
            want += args[-1]
        out = np.full((n, spec.n_out), np.nan, np.float32)
        assert run("h200", spec, [*args, out], n) == 1
        assert np.isfinite(out).all()
        err = np.abs(out - want).max() / np.abs(want).max()
        assert err <= TOL, f"{spec.name()} n={n}: relative error {err:.3g}"
