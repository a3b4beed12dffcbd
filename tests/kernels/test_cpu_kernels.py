"""Reference harness for the CPU kernel library.

Every case compiles `case.spec` (all cases share one TVM build per module), feeds it
inputs drawn fresh from a seeded rng and compares `out` with the float64 numpy reference
(`ninfer.kernels.reference`) as ||out - ref|| / ||ref|| <= TOL.

To add a case, append `Case(spec, n)` to CASES (attention: an AttnCase to ATTN_CASES); the
rng, the inputs (from `spec.signature()`), the build and the comparison are shared. A new kernel
family additionally needs its reference in reference.py and, when its integer inputs
must lie in a range, a line in `_int_input`.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")  # exercise the parallel loops

import numpy as np
import pytest
import tvm

from ninfer.kernels import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    KvStoreSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SigmoidGateSpec,
    SiluMulSpec,
    build_cpu_module,
    build_cpu_object,
    reference,
)
from ninfer.kernels.spec_hybrid import GdnGateSpec, GdnNormSpec
from ninfer.quantize import kv_formats

pytestmark = pytest.mark.unit

# float32 kernels against a float64 reference: a few ulp per element, accumulated over
# reductions of up to a few thousand terms.
TOL = 1e-5


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    n: int  # token rows

    @property
    def id(self) -> str:
        return f"{self.spec.name()}-n{self.n}"


def _mm(**kw: object) -> MatmulSpec:
    """A float matmul in the layout the CPU kernels take."""
    return MatmulSpec(**kw, layout="panels")  # type: ignore[arg-type]


CASES = [
    Case(EmbeddingSpec(vocab=1000, hidden=72), 1),
    Case(EmbeddingSpec(vocab=1000, hidden=72), 33),
    Case(EmbeddingSpec(vocab=151, hidden=256), 7),
    Case(RMSNormSpec(hidden=72, eps=1e-6), 1),
    Case(RMSNormSpec(hidden=72, eps=1e-6), 33),
    Case(RMSNormSpec(hidden=1024, eps=1e-5), 7),
    Case(RMSNormSpec(hidden=128, eps=1e-6), 7 * 16),  # per-head q/k norm: rows = tokens*heads
    Case(_mm(k=200, n_out=72), 1),
    Case(_mm(k=200, n_out=72, bias=True), 7),
    Case(_mm(k=1024, n_out=3072), 1),
    Case(_mm(k=203, n_out=74, bias=True), 3),  # k and n_out tails
    Case(_mm(k=1024, n_out=96, schedule="gemm"), 1),
    Case(_mm(k=200, n_out=72, bias=True, schedule="gemm"), 7),
    Case(_mm(k=200, n_out=72, bias=True, schedule="gemm"), 33),
    Case(_mm(k=2100, n_out=520, schedule="gemm"), 70),  # 3 k blocks, 3 row blocks
    Case(_mm(k=5, n_out=2, bias=True), 3),  # smaller than one vector / one tile
    Case(_mm(k=5, n_out=2, bias=True, schedule="gemm"), 5),
    Case(_mm(k=203, n_out=74, schedule="gemm"), 33),
    Case(_mm(k=256, n_out=64 * 9 + 10, bias=True), 1),  # streams, a panel left, a tail panel
    Case(_mm(k=256, n_out=64 * 9 + 10, bias=True), 2),  # 2 rows in streams
    Case(_mm(k=256, n_out=64 * 9 + 10, bias=True, wdtype="f16"), 3),  # 3 rows in streams
    Case(_mm(k=1100, n_out=192, wdtype="f16"), 8),  # k blocks: a 6-row tile and 2 rows
    Case(RopeSpec(heads=4, head_dim=64, max_pos=512), 1),
    Case(RopeSpec(heads=4, head_dim=64, max_pos=512), 33),
    Case(RopeSpec(heads=3, head_dim=128, max_pos=64), 7),
    Case(RopeSpec(heads=2, head_dim=36, max_pos=64), 7),  # half = 18: vector + scalar tail
    # partial rotary (Qwen3.5: a quarter of the head), whole vectors and a scalar tail
    Case(RopeSpec(heads=2, head_dim=256, max_pos=64, rotary=64), 7),
    Case(RopeSpec(heads=3, head_dim=64, max_pos=64, rotary=20), 5),
    Case(SiluMulSpec(inter=72), 1),
    Case(SiluMulSpec(inter=1000), 33),
    Case(SiluMulSpec(inter=77), 7),
    Case(SigmoidGateSpec(width=1024), 5),
    Case(SigmoidGateSpec(width=77), 3),  # a scalar tail
    Case(AddSpec(hidden=72), 1),
    Case(AddSpec(hidden=1027), 33),
]




def _attn(heads: int, kv_heads: int, head_dim: int, max_ctx: int, seqs: int = 3,
          blocks: int = 0) -> AttentionSpec:
    blocks = blocks or seqs * max_ctx // 16 + 1
    return AttentionSpec(heads, kv_heads, head_dim, max_ctx, 16, seqs, blocks)


@dataclass(frozen=True)
class AttnCase:
    """Paged attention over a step made of segments (slot, first position, rows)."""

    spec: AttentionSpec
    segments: tuple[tuple[int, int, int], ...]

    @property
    def n(self) -> int:
        return sum(rows for _, _, rows in self.segments)

    @property
    def id(self) -> str:
        return self.spec.name() + "-" + "_".join(f"s{s}p{p}n{r}" for s, p, r in self.segments)


ATTN_CASES = [
    # one sequence: decode and prefill; GQA ratios 1, 2, 4, 6, 8; head_dim 32/64/128
    AttnCase(_attn(4, 4, 64, 256), ((0, 0, 1),)),
    AttnCase(_attn(4, 4, 64, 256), ((0, 100, 1),)),
    AttnCase(_attn(4, 4, 64, 256), ((0, 0, 33),)),
    AttnCase(_attn(8, 4, 32, 256), ((1, 61, 7),)),
    AttnCase(_attn(8, 4, 32, 256), ((2, 200, 1),)),
    AttnCase(_attn(8, 2, 128, 512), ((0, 300, 1),)),
    AttnCase(_attn(8, 2, 128, 512), ((0, 7, 33),)),
    AttnCase(_attn(16, 2, 64, 128), ((0, 31, 7),)),
    AttnCase(_attn(6, 1, 64, 128), ((0, 0, 33),)),
    # mixed steps: decode rows of several slots with a prefill chunk (tiles that straddle
    # sequences run row by row), and two chunks side by side
    AttnCase(_attn(8, 2, 64, 256), ((2, 77, 1), (0, 5, 1), (1, 0, 13))),
    AttnCase(_attn(8, 2, 64, 256), ((1, 16, 9), (0, 150, 1), (2, 3, 12))),
    AttnCase(_attn(4, 4, 32, 256, seqs=5), tuple((s, 40 * s, 1) for s in range(5))),
]

KV_STORE_CASES = [KvStoreSpec(width=64, pool_rows=100), KvStoreSpec(width=130, pool_rows=40)]


def _kv(spec: AttentionSpec, kv_dtype: str) -> AttentionSpec:
    """`spec` over pools in `kv_dtype` (int4: rotated keys, as the plan compiles it)."""
    rot = kv_formats.rotation_block(spec.head_dim) if kv_dtype == "int4" else 0
    return dataclasses.replace(spec, kv_dtype=kv_dtype, rotate=rot)


KV_DTYPES = [f for f in kv_formats.KV_DTYPES if f != "f32"]
# Every KV format: a decode step of 3 slots, a prefill chunk with a tail, a mixed step
# (head_dim 32, 64 and 128: one, two and four scale groups; GQA 1, 4 and 4).
KV_ATTN_CASES = [
    AttnCase(_kv(spec, f), segments) for f in KV_DTYPES for spec, segments in (
        (_attn(4, 4, 32, 256), ((0, 40, 1), (1, 80, 1), (2, 120, 1))),
        (_attn(8, 2, 128, 256), ((0, 3, 33),)),
        (_attn(8, 2, 64, 256), ((2, 77, 1), (0, 5, 1), (1, 0, 13))),
    )
]
KV_FORMAT_STORES = [
    KvStoreSpec(width=128, pool_rows=40, kv_dtype=f, head_dim=32,
                rotate=32 if f == "int4" else 0) for f in KV_DTYPES
] + [KvStoreSpec(width=256, pool_rows=40, kv_dtype="int4", head_dim=128, rotate=128)]


# The head-major pool layouts (kv_formats.KV_LAYOUTS): the CPU plan's "planes" with
# decode, prefill and mixed steps and every KV format's mixed step, "heads" with the
# steps.
BASE_ATTN_CASES = [ATTN_CASES[5], ATTN_CASES[6], ATTN_CASES[-3], ATTN_CASES[-1]]
HEADS_ATTN_CASES = [
    AttnCase(dataclasses.replace(c.spec, layout="planes"), c.segments)
    for c in BASE_ATTN_CASES + [c for c in KV_ATTN_CASES if c.spec.head_dim == 64]
] + [AttnCase(dataclasses.replace(c.spec, layout="heads"), c.segments) for c in BASE_ATTN_CASES]
# Other KV block sizes the runtime allows (plan.ServeLimits: 8 to 64): the kernel walks
# a key block as runs of min(KEY_BLOCK, block) keys, so runs smaller than, equal to and
# within a block; decode, prefill and mixed steps whose rows end mid-run.
BLOCK_ATTN_CASES = [
    AttnCase(dataclasses.replace(c.spec, layout=layout, block_size=bs,
                                 kv_blocks=c.spec.max_seqs * c.spec.max_ctx // bs + 1),
             c.segments)
    for layout, sizes in (("planes", (8, 32, 64)), ("heads", (8, 64)))
    for bs in sizes for c in [ATTN_CASES[5], ATTN_CASES[6], ATTN_CASES[-3]]
]
HEADS_ATTN_CASES += BLOCK_ATTN_CASES
HEADS_STORES = [
    KvStoreSpec(width=128, pool_rows=48, kv_dtype=f, head_dim=32, layout=layout,
                block_size=16 if layout == "heads" else 0, rotate=32 if f == "int4" else 0)
    for layout in ("planes", "heads") for f in kv_formats.KV_DTYPES
]


def _rows_twin(spec: KvStoreSpec) -> KvStoreSpec:
    return dataclasses.replace(spec, layout="rows", block_size=0)


@pytest.fixture(scope="module")
def kernels() -> tvm.runtime.Executable:
    specs = [case.spec for case in CASES] + [case.spec for case in ATTN_CASES + KV_ATTN_CASES]
    specs += [case.spec for case in HEADS_ATTN_CASES]
    specs += [dataclasses.replace(case.spec, layout="rows") for case in BLOCK_ATTN_CASES]
    stores = KV_STORE_CASES + KV_FORMAT_STORES + HEADS_STORES
    specs += stores + [_rows_twin(s) for s in HEADS_STORES]
    return build_cpu_module(list(dict.fromkeys(specs)))  # (rows twins shared by layouts)


def attention_inputs(case: AttnCase, rng: np.random.Generator) -> list[np.ndarray]:
    """q, pools, pos, seq, block tables for `case`: each slot gets random distinct blocks
    (block 0 never), and every pool row no row may read holds NaN."""
    spec = case.spec
    free = rng.permutation(np.arange(1, spec.kv_blocks))
    tables = np.zeros((spec.max_seqs, spec.blocks_per_seq), np.int32)
    for s in range(spec.max_seqs):
        tables[s] = free[s * spec.blocks_per_seq:(s + 1) * spec.blocks_per_seq]
    rows = spec.kv_blocks * spec.block_size
    shape = (rows, spec.kv_heads, spec.head_dim)
    k = np.full(shape, np.nan, np.float32)
    v = np.full(shape, np.nan, np.float32)
    pos, seq = [], []
    for slot, first, count in case.segments:
        last = first + count - 1
        j = np.arange(last + 1)
        phys = tables[slot][j // spec.block_size] * spec.block_size + j % spec.block_size
        k[phys] = rng.standard_normal((len(j), *shape[1:]))
        v[phys] = rng.standard_normal((len(j), *shape[1:]))
        pos += range(first, last + 1)
        seq += [slot] * count
    q = rng.standard_normal((case.n, spec.heads, spec.head_dim)).astype(np.float32)
    return [q, k, v, np.array(pos, np.int32), np.array(seq, np.int32), tables]


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: c.id)
def test_attention_matches_reference(kernels: tvm.runtime.Executable, case: AttnCase) -> None:
    inputs = attention_inputs(case, np.random.default_rng(zlib.crc32(case.id.encode())))
    out = tvm.runtime.tensor(np.full(inputs[0].shape, np.nan, np.float32))
    kernels[case.spec.name()](*(tvm.runtime.tensor(a) for a in inputs), out)
    ref = reference(case.spec, *inputs)
    err = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


def test_attention_rows_are_batch_invariant(kernels: tvm.runtime.Executable) -> None:
    """A sequence's rows give bit-identical outputs alone and in a mixed step."""
    mixed = ATTN_CASES[-2]
    inputs = attention_inputs(mixed, np.random.default_rng(1))
    out = tvm.runtime.tensor(np.zeros(inputs[0].shape, np.float32))
    kernels[mixed.spec.name()](*(tvm.runtime.tensor(a) for a in inputs), out)
    start = 0
    for slot, _, count in mixed.segments:
        sl = slice(start, start + count)
        alone = [inputs[0][sl], inputs[1], inputs[2], inputs[3][sl], inputs[4][sl], inputs[5]]
        solo = tvm.runtime.tensor(np.zeros(alone[0].shape, np.float32))
        kernels[mixed.spec.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a))
                                     for a in alone), solo)
        assert np.array_equal(solo.numpy(), out.numpy()[sl]), f"slot {slot}"
        start += count


@pytest.mark.parametrize("spec", KV_STORE_CASES, ids=lambda s: s.name())
def test_kv_store_writes_only_its_rows(kernels: tvm.runtime.Executable,
                                       spec: KvStoreSpec) -> None:
    rng = np.random.default_rng(spec.width)
    rows = np.array([3, spec.pool_rows - 1, 0, -1, spec.pool_rows, 17], np.int32)
    x = rng.standard_normal((len(rows), spec.width)).astype(np.float32)
    pool = rng.standard_normal((spec.pool_rows, spec.width)).astype(np.float32)
    out = tvm.runtime.tensor(pool)
    kernels[spec.name()](tvm.runtime.tensor(x), tvm.runtime.tensor(rows), out)
    want = pool.copy()
    for i, r in enumerate(rows):
        if 0 <= r < spec.pool_rows:  # out-of-range rows are skipped
            want[r] = reference(spec, x, rows)[i]
    assert np.array_equal(out.numpy(), want)


@pytest.mark.parametrize("case", KV_ATTN_CASES, ids=lambda c: c.id)
def test_attention_reads_kv_formats(kernels: tvm.runtime.Executable, case: AttnCase) -> None:
    """Attention over pools stored in a KV format equals the float64 reference over the
    exactly decoded pools (rotated keys against rotated queries), to float32 rounding."""
    q, k, v, pos, seq, tables = attention_inputs(case, np.random.default_rng(
        zlib.crc32(case.id.encode())))
    k, v = np.nan_to_num(k), np.nan_to_num(v)  # unread rows: any finite value encodes
    kparts = kv_formats.encode(case.spec.kv_dtype, k, rotate=case.spec.rotate > 0)
    vparts = kv_formats.encode(case.spec.kv_dtype, v)
    inputs = [q, *kparts, *vparts, pos, seq, tables]
    out = tvm.runtime.tensor(np.full(q.shape, np.nan, np.float32))
    kernels[case.spec.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs),
                              out)
    ref = reference(case.spec, *inputs)
    err = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


def test_attention_without_avx512_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build an AVX2 host makes (8 lanes, 16 registers: other tiles, other lane sums)
    also meets the reference, over float and grouped KV formats (int4: the nibble runs of
    8-lane vectors)."""
    from ninfer.kernels.cpu import attention

    monkeypatch.setattr(attention, "attention_lanes", lambda: 8)
    monkeypatch.setattr(attention, "_registers", lambda: 16)
    cases = [ATTN_CASES[6], ATTN_CASES[-2]] + [
        c for c in KV_ATTN_CASES if c.spec.kv_dtype in ("int4", "int8") and c.n > 1]
    ex = build_cpu_module([c.spec for c in cases])
    for case in cases:
        q, k, v, pos, seq, tables = attention_inputs(case, np.random.default_rng(7))
        if case.spec.kv_dtype == "f32":
            inputs = [q, k, v, pos, seq, tables]
        else:
            k, v = np.nan_to_num(k), np.nan_to_num(v)
            inputs = [q, *kv_formats.encode(case.spec.kv_dtype, k, rotate=case.spec.rotate > 0),
                      *kv_formats.encode(case.spec.kv_dtype, v), pos, seq, tables]
        out = tvm.runtime.tensor(np.full(q.shape, np.nan, np.float32))
        ex[case.spec.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs),
                             out)
        ref = reference(case.spec, *inputs)
        err = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
        assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


@pytest.mark.parametrize("spec", KV_FORMAT_STORES, ids=lambda s: s.name())
def test_kv_store_encodes_like_the_reference(kernels: tvm.runtime.Executable,
                                             spec: KvStoreSpec) -> None:
    """The store writes exactly kv_formats.encode's bytes into valid rows (rotated int4:
    the float32 rotation may land a value on the other side of a rounding tie, so the
    decoded values may differ by one quantization step there) and nothing elsewhere."""
    rng = np.random.default_rng(spec.width)
    rows = np.array([3, spec.pool_rows - 1, 0, -1, spec.pool_rows, 17], np.int32)
    # magnitudes from 1e-3 to 300: fp8 subnormals and saturation, f16 and int ranges
    x = (rng.standard_normal((len(rows), spec.width))
         * rng.choice([1e-3, 0.1, 3.0, 300.0], (len(rows), spec.width))).astype(np.float32)
    kvh, d = spec.kv_heads, spec.head_dim
    parts = kv_formats.pool_parts(spec.kv_dtype, spec.pool_rows, kvh, d)
    pools = [rng.integers(0, 255, shape, np.uint8).view(dt) if np.dtype(dt).itemsize == 1
             else rng.standard_normal(shape).astype(dt) for _, dt, shape in parts]
    outs = [tvm.runtime.tensor(p) for p in pools]
    kernels[spec.name()](tvm.runtime.tensor(x), tvm.runtime.tensor(rows), *outs)
    want = [p.copy() for p in pools]
    enc = kv_formats.encode(spec.kv_dtype, x.reshape(len(rows), kvh, d), rotate=spec.rotate > 0)
    for i, r in enumerate(rows):
        if 0 <= r < spec.pool_rows:
            for w, e in zip(want, enc):
                w[r] = e[i]
    got = [o.numpy() for o in outs]
    if not spec.rotate:
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8))
        return
    dec_got, dec_want = kv_formats.decode("int4", got), kv_formats.decode("int4", want)
    step = np.repeat(np.abs(want[1].astype(np.float64)), kv_formats.KV_GROUP, axis=-1)
    assert np.all(np.abs(dec_got - dec_want) <= step * 1.001 + 1e-12)
    assert np.mean(dec_got == dec_want) > 0.99


@pytest.mark.parametrize("case", HEADS_ATTN_CASES, ids=lambda c: c.id)
def test_attention_head_major_layouts_read_the_same_keys(kernels: tvm.runtime.Executable,
                                                         case: AttnCase) -> None:
    """Over pools stored head-major (one plane a head, the CPU plan's layout, or per
    block), attention gives bitwise the outputs of token-major pools holding the same
    keys and values (a wrong
    index reads another key, or a NaN row no row may read), and meets the reference."""
    spec = case.spec
    rows_spec = dataclasses.replace(spec, layout="rows")
    q, k, v, pos, seq, tables = attention_inputs(case, np.random.default_rng(
        zlib.crc32(case.id.encode())))
    if spec.kv_dtype == "f32":
        kparts, vparts = [k], [v]
    else:  # unread rows: any finite value encodes
        kparts = kv_formats.encode(spec.kv_dtype, np.nan_to_num(k), rotate=spec.rotate > 0)
        vparts = kv_formats.encode(spec.kv_dtype, np.nan_to_num(v))
    outs = []
    for s, layout in ((rows_spec, "rows"), (spec, spec.layout)):
        stored = [kv_formats.pool_from_rows(np.ascontiguousarray(p), layout, spec.block_size)
                  for p in (*kparts, *vparts)]
        inputs = [q, *stored, pos, seq, tables]
        out = tvm.runtime.tensor(np.full(q.shape, np.nan, np.float32))
        kernels[s.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in inputs), out)
        outs.append(out.numpy())
    assert np.array_equal(outs[0], outs[1])
    ref = reference(spec, q, *stored, pos, seq, tables)
    err = np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


@pytest.mark.parametrize("spec", HEADS_STORES, ids=lambda s: s.name())
def test_kv_store_head_major_layouts(kernels: tvm.runtime.Executable, spec: KvStoreSpec
                                     ) -> None:
    """The store into a head-major pool writes the bytes the token-major store writes, at
    the places kv_formats.pool_to_rows maps them to, and nothing else."""
    rng = np.random.default_rng(spec.width + 1)
    rows = np.array([3, spec.pool_rows - 1, 0, -1, spec.pool_rows, 17, 16], np.int32)
    x = rng.standard_normal((len(rows), spec.width)).astype(np.float32)
    parts = kv_formats.pool_parts(spec.kv_dtype, spec.pool_rows, spec.kv_heads, spec.head_dim)
    pools = [rng.integers(0, 255, shape, np.uint8).view(dt) if np.dtype(dt).itemsize == 1
             else rng.standard_normal(shape).astype(dt) for _, dt, shape in parts]
    twin = _rows_twin(spec)
    flat = [tvm.runtime.tensor(p.reshape(spec.pool_rows, -1) if twin.flat else p)
            for p in pools]
    kernels[twin.name()](tvm.runtime.tensor(x), tvm.runtime.tensor(rows), *flat)
    heads = [tvm.runtime.tensor(kv_formats.pool_from_rows(p, spec.layout, spec.block_size))
             for p in pools]
    kernels[spec.name()](tvm.runtime.tensor(x), tvm.runtime.tensor(rows), *heads)
    for f, h, p in zip(flat, heads, pools):
        want = f.numpy().reshape(p.shape)
        got = kv_formats.pool_to_rows(h.numpy(), spec.layout, spec.block_size)
        assert not np.array_equal(want.view(np.uint8), p.view(np.uint8))  # rows written
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_pool_layout_round_trip() -> None:
    a = np.arange(48 * 3 * 5, dtype=np.float32).reshape(48, 3, 5)
    stored = kv_formats.pool_from_rows(a, "heads", 16)
    # block 1, head 2: tokens 16..31 of head 2, one contiguous run
    run = stored.reshape(-1)[(1 * 3 + 2) * 16 * 5:(1 * 3 + 3) * 16 * 5].reshape(16, 5)
    assert np.array_equal(run, a[16:32, 2])
    assert np.array_equal(kv_formats.pool_to_rows(stored, "heads", 16), a)
    # planes: head 1's plane is tokens 0..47 of head 1, contiguous across blocks
    planes = kv_formats.pool_from_rows(a, "planes", 0)
    assert planes.shape == a.shape
    assert np.array_equal(planes.reshape(-1)[48 * 5:2 * 48 * 5].reshape(48, 5), a[:, 1])
    assert np.array_equal(kv_formats.pool_to_rows(planes, "planes", 0), a)
    assert kv_formats.pool_from_rows(a, "rows", 0) is a
    with pytest.raises(ValueError, match="block size"):
        kv_formats.pool_to_rows(a, "heads", 0)
    with pytest.raises(ValueError, match="layout"):
        AttentionSpec(4, 2, 64, 64, 16, 2, 9, layout="cols")
    with pytest.raises(ValueError, match="multiple of block_size"):
        KvStoreSpec(width=64, pool_rows=40, head_dim=32, layout="heads", block_size=16)


def _int_input(spec: KernelSpec, name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    high = {"ids": getattr(spec, "vocab", 0), "pos": getattr(spec, "max_pos", 0)}[name]
    return rng.integers(0, high, size=n, dtype=np.int32)


def make_inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray | int]:
    """Random inputs for every argument of `case.spec` except `out`, in signature order."""
    inputs: list[np.ndarray | int] = []
    for arg in case.spec.signature()[:-1]:
        shape = tuple(case.n if d == "n" else d for d in arg.shape)
        if arg.dtype == "int32":
            inputs.append(_int_input(case.spec, arg.name, case.n, rng))
            continue
        inputs.append(rng.standard_normal(shape).astype(arg.dtype))
    return inputs


def run_kernel(ex: tvm.runtime.Executable, case: Case, inputs: list) -> np.ndarray:
    out_arg = case.spec.signature()[-1]
    out_shape = tuple(case.n if d == "n" else d for d in out_arg.shape)
    args = [tvm.runtime.tensor(a) if isinstance(a, np.ndarray) else a for a in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype=out_arg.dtype))
    ex[case.spec.name()](*args, out)
    return out.numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_reference(kernels: tvm.runtime.Executable, case: Case) -> None:
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    inputs = make_inputs(case, rng)
    out = run_kernel(kernels, case, inputs)
    ref = reference(case.spec, *inputs)
    assert out.shape == ref.shape
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{case.id}: relative error {err:.3g} > {TOL:g}"


def test_spec_names_are_c_identifiers() -> None:
    assert MatmulSpec(k=1024, n_out=3072, bias=True).name() == "matmul_k1024_n3072_f32_bias_gemv"
    assert _mm(k=64, n_out=8, wdtype="f16").name() == "matmul_k64_n8_f16_p64_gemv"
    assert RMSNormSpec(hidden=72, eps=1e-6).name() == "rmsnorm_h72_eps1em06_f32"
    assert RMSNormSpec(hidden=72, eps=2.5e-7).name() == "rmsnorm_h72_eps2p5em07_f32"
    specs = {case.spec for case in CASES}
    names = {spec.name() for spec in specs}
    assert len(names) == len(specs)
    assert all(name.isidentifier() for name in names)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AttentionSpec(6, 4, 64, 64, 16, 2, 9),
        lambda: AttentionSpec(4, 4, 64, 64, 0, 2, 9),
        lambda: MatmulSpec(k=64, n_out=64, schedule="tiled"),
        lambda: MatmulSpec(k=64, n_out=64, wdtype="int4"),
        lambda: MatmulSpec(k=64, n_out=64, wdtype="q8g32", layout="panels"),
        lambda: MatmulSpec(k=64, n_out=64, layout="columns"),  # type: ignore[arg-type]
        lambda: RopeSpec(heads=2, head_dim=63, max_pos=8),
        lambda: RopeSpec(heads=2, head_dim=64, max_pos=8, rotary=66),
        lambda: RopeSpec(heads=2, head_dim=64, max_pos=8, rotary=15),
        lambda: RMSNormSpec(hidden=0, eps=1e-6),
    ],
)
def test_invalid_specs_are_rejected(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_attention_refuses_a_block_size_its_runs_cannot_tile() -> None:
    """The kernel walks runs of min(KEY_BLOCK, block) keys: a block of 24 (neither divides
    the other) is refused with the numbers, not miscompiled."""
    from ninfer.kernels.cpu.attention import KEY_BLOCK, attention

    assert KEY_BLOCK % 24 and 24 % KEY_BLOCK
    with pytest.raises(NotImplementedError,
                       match=f"divide or be a multiple of {KEY_BLOCK}, got 24"):
        attention(AttentionSpec(4, 2, 64, 96, 24, 1, 5, layout="heads"))


# Undefined symbols an object from build_cpu_object may reference. Seen so far: the TVM-FFI
# error hook (the host links tvm_ffi or a shim) and memset (LLVM's rewrite of the zero fill
# in bias-less matmuls with large n_out); memcpy likewise for copy loops. The __TVMBackend*
# hooks are weak function-pointer variables the host fills in, so they do not show up as
# "U"; a libm name such as expf showing up here would mean a kernel lost its vectorized math.
ALLOWED_UNDEFINED = {
    "TVMFFIErrorSetRaisedFromCStrParts",
    "memcpy",
    "memset",
}

ONE_PER_FAMILY = [
    EmbeddingSpec(vocab=1000, hidden=72),
    RMSNormSpec(hidden=72, eps=1e-6),
    _mm(k=200, n_out=72, bias=True),
    _mm(k=200, n_out=72, schedule="gemm"),
    RopeSpec(heads=4, head_dim=64, max_pos=512),
    SiluMulSpec(inter=72),
    AddSpec(hidden=72),
    _attn(8, 2, 64, 256),
    KvStoreSpec(width=128, pool_rows=512),
]


def test_object_exports_every_kernel(tmp_path: Path) -> None:
    obj = build_cpu_object(ONE_PER_FAMILY, tmp_path / "kernels.o")
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in symbols.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TtWwDdBbRrVv":
            defined.add(parts[2])
    for spec in ONE_PER_FAMILY:
        assert f"__tvm_ffi_{spec.name()}" in defined, f"{spec.name()} not exported"
    assert undefined <= ALLOWED_UNDEFINED, f"unexpected undefined: {undefined - ALLOWED_UNDEFINED}"


@pytest.mark.parametrize("wdtype", ["float32", "f16", "bf16", "bf16+x", "q8g32", "q4g64"])
def test_gemv_reads_one_stream_with_the_same_bits(wdtype: str) -> None:
    """MatmulSpec.streams == 1 (one weight stream a thread, no software prefetch; chosen
    per host by ninfer.roofline) changes how the gemv walks memory, not its arithmetic:
    every row count gives bitwise the default gemv's outputs (with a bias, and the
    quantized tail of N % 2 columns)."""
    from ninfer.quantize import weight_formats as quant

    wdtype, _, x = wdtype.partition("+")  # bf16+x: x rounded to bf16 (MatmulSpec.x_bf16)
    layout = "rows" if quant.format_info(wdtype).quantized else "panels"
    k, n_out = 256, 64 * 5 + 3
    specs = {s: MatmulSpec(k=k, n_out=n_out, bias=True, wdtype=wdtype, layout=layout,
                           streams=s, x_bf16=x == "x") for s in (0, 1)}
    assert specs[1].name() == specs[0].name() + "_s1"
    ex = build_cpu_module(list(specs.values()))
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((n_out, k)) * 0.05).astype(np.float32)
    parts = [tvm.runtime.tensor(a) for a in quant.pack(w, wdtype, layout).values()]
    bias = tvm.runtime.tensor(rng.standard_normal(n_out).astype(np.float32))
    for n in (1, 2, 3, 5):
        x = tvm.runtime.tensor(rng.standard_normal((n, k)).astype(np.float32))
        outs = {}
        for s, spec in specs.items():
            out = tvm.runtime.tensor(np.full((n, n_out), np.nan, np.float32))
            ex[spec.name()](x, *parts, bias, out)
            outs[s] = out.numpy()
        assert np.isfinite(outs[0]).all()
        assert np.array_equal(outs[0], outs[1]), f"{wdtype}, {n} rows"


def test_one_stream_is_a_gemv_schedule_only() -> None:
    with pytest.raises(ValueError, match="streams must be 0, or 1 with the gemv"):
        MatmulSpec(k=64, n_out=64, schedule="gemm", streams=1)
    with pytest.raises(ValueError, match="streams must be 0, or 1 with the gemv"):
        MatmulSpec(k=64, n_out=64, streams=2)


@pytest.mark.parametrize("wdtype", ["float32", "bf16", "bf16+x"])
def test_matmul_rows_are_bitwise_the_same_in_gemv_and_gemm(monkeypatch: pytest.MonkeyPatch,
                                                            wdtype: str) -> None:
    """Batch invariance: a row's result does not depend on the schedule, on the other rows
    or on the vector width (k = 2100 spans several k blocks; n_out = 138 is two full
    panels and a padded one). Both widths are built here
    whatever the host (8 lanes with the 6 x 2 tile, 16 with 6 x 4; LLVM splits 16 lanes
    where they do not fit), and every row count from 1 to 9 in both schedules must give
    the bits of the 9-row gemm, which is within TOL of float64."""
    from ninfer.kernels.cpu import matmul
    from ninfer.quantize import weight_formats as quant

    wdtype, _, x_round = wdtype.partition("+")  # bf16+x: MatmulSpec.x_bf16
    k, n_out = 2100, 64 * 2 + 10
    specs = [_mm(k=k, n_out=n_out, bias=True, schedule=s, wdtype=wdtype, x_bf16=x_round == "x")
             for s in ("gemv", "gemm")]
    builds = {}
    for lanes in (8, 16):
        monkeypatch.setattr(matmul, "matmul_lanes", lambda lanes=lanes: lanes)
        builds[lanes] = build_cpu_module(specs)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, k)).astype(np.float32)
    w = rng.standard_normal((n_out, k)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    wp = quant.pack(w, wdtype, "panels")["w"]

    def run(ex: tvm.runtime.Executable, spec: MatmulSpec, rows: np.ndarray) -> np.ndarray:
        out = tvm.runtime.tensor(np.zeros((len(rows), n_out), np.float32))
        ex[spec.name()](*(tvm.runtime.tensor(a) for a in (rows, wp, b)), out)
        return out.numpy()

    batched = run(builds[16], specs[1], x)
    ref = reference(specs[1], x, wp, b)  # x_bf16: x rounded to bf16, as the kernel does
    assert np.linalg.norm(batched - ref) / np.linalg.norm(ref) <= TOL
    for ex in builds.values():
        for spec in specs:
            for i in range(len(x)):
                assert np.array_equal(run(ex, spec, x[i : i + 1])[0], batched[i])
            for n in range(2, len(x) + 1):
                assert np.array_equal(run(ex, spec, x[:n]), batched[:n]), (spec.name(), n)

ROW_KERNELS = [
    EmbeddingSpec(vocab=1000, hidden=72),
    RMSNormSpec(hidden=1024, eps=1e-6),
    RMSNormSpec(hidden=128, eps=1e-6),
    RopeSpec(heads=4, head_dim=64, max_pos=512),
    SiluMulSpec(inter=1000),
    SigmoidGateSpec(width=77),
    AddSpec(hidden=1027),
    GdnGateSpec(v_heads=6),
    GdnNormSpec(v_heads=3, v_dim=40, eps=1e-6),
    KvStoreSpec(width=64, pool_rows=100),
    KvStoreSpec(width=256, pool_rows=64, kv_dtype="int4", head_dim=128, rotate=128,
                layout="heads", block_size=16),
]


def test_row_kernels_give_the_same_bits_serial_or_parallel(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The row-wise kernels run a small call's rows on the calling thread and a large one's
    in parallel (common.SERIAL_BYTES); both loops expand the same row body, so every row
    gets the same bits either way: builds with everything serial, everything parallel and
    the default split agree for 1, 3 and 40 rows (and the embedding, norm, rope, silu,
    gate and add rows match the float64 reference, within TOL)."""
    from ninfer.kernels.cpu import common

    def build(serial_bytes: int) -> tvm.runtime.Executable:
        monkeypatch.setattr(common, "SERIAL_BYTES", serial_bytes)
        return build_cpu_module(ROW_KERNELS)

    mods = {"default": build(32 << 10), "parallel": build(0), "serial": build(1 << 40)}
    for spec in ROW_KERNELS:
        for n in (1, 3, 40):
            rng = np.random.default_rng(n)
            sig = spec.signature()
            shapes = [tuple(n if d == "n" else d for d in a.shape) for a in sig]
            ins: list[np.ndarray] = []
            for arg, shape in zip(sig, shapes):
                if arg.name == "rows":  # distinct pool rows, one out of range
                    rows = rng.permutation(spec.pool_rows)[:n].astype(np.int32)
                    rows[-1] = -1 if n > 1 else rows[-1]
                    ins.append(rows)
                elif arg.dtype == "int32":
                    ins.append(_int_input(spec, arg.name, n, rng))
                else:
                    ins.append(rng.standard_normal(shape).astype(arg.dtype))
            outs = {}
            for mode, ex in mods.items():
                args = [tvm.runtime.tensor(a) for a in ins]
                ex[spec.name()](*args)
                outs[mode] = [a.numpy() for a in args]
            for mode in ("parallel", "serial"):
                for got, want in zip(outs[mode], outs["default"]):
                    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (
                        f"{spec.name()} n={n}: {mode} differs from the default split")
            if spec.family in {"embedding", "rmsnorm", "rope", "silu_mul", "sigmoid_gate",
                               "add"}:
                ref = reference(spec, *ins[:-1])
                err = np.linalg.norm(outs["default"][-1] - ref) / np.linalg.norm(ref)
                assert err <= TOL, f"{spec.name()} n={n}: relative error {err:.3g}"


@pytest.mark.parametrize("wdtype", ["float32", "f16", "bf16+x", "q8g32", "q4g64", "q4g128"])
@pytest.mark.parametrize("streams", [0, 1])
def test_fused_qkv_gemv_gives_the_three_gemvs_bits(wdtype: str, streams: int) -> None:
    """A one-row decode step computes q, k and v in one gemv over the three matrices laid
    back to back (plan.qkv_fusable; the artifact writes each part of the three in a row):
    its columns are bitwise the separate q, k and v gemvs' (one row), and the rows those
    compute among others (a gemv of 3 rows, a gemm of 6), so a sequence's tokens do not
    depend on whether the fused call served them."""
    from ninfer.quantize import weight_formats as quant

    wdtype, _, x_mode = wdtype.partition("+")
    layout = "rows" if quant.format_info(wdtype).quantized else "panels"
    k, dims = 256, {"q": 128, "k": 64, "v": 64}

    def spec(n_out: int, schedule: str = "gemv") -> MatmulSpec:
        return MatmulSpec(k=k, n_out=n_out, bias=True, schedule=schedule,  # type: ignore[arg-type]
                          wdtype=wdtype, layout=layout, streams=streams if schedule == "gemv"
                          else 0, x_bf16=x_mode == "x")

    fused = spec(sum(dims.values()))
    singles = {r: spec(d) for r, d in dims.items()}
    gemms = {r: spec(d, "gemm") for r, d in dims.items()}
    ex = build_cpu_module([fused, *singles.values(), *gemms.values()])
    rng = np.random.default_rng(11)
    packed = {r: quant.pack((rng.standard_normal((d, k)) * 0.05).astype(np.float32), wdtype,
                            layout) for r, d in dims.items()}
    bias = {r: rng.standard_normal(d).astype(np.float32) for r, d in dims.items()}
    # the three back to back, part by part (rows, or whole panels, along axis 0)
    joined = [np.concatenate([packed[r][p] for r in dims]) for p in packed["q"]]
    x = rng.standard_normal((6, k)).astype(np.float32)

    def run(s: MatmulSpec, parts: list[np.ndarray], b: np.ndarray, rows: np.ndarray
            ) -> np.ndarray:
        out = tvm.runtime.tensor(np.full((len(rows), s.n_out), np.nan, np.float32))
        ex[s.name()](tvm.runtime.tensor(rows), *(tvm.runtime.tensor(p) for p in parts),
                     tvm.runtime.tensor(b), out)
        return out.numpy()

    got = run(fused, joined, np.concatenate(list(bias.values())), x[:1])
    assert np.isfinite(got).all()
    for s_map, rows in ((singles, x[:1]), (singles, x[:3]), (gemms, x)):
        want = np.concatenate([run(s_map[r], list(packed[r].values()), bias[r], rows)[:1]
                               for r in dims], axis=1)
        assert np.array_equal(got, want), f"{wdtype} streams={streams}: {len(rows)} rows"
