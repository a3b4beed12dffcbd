"""Weight formats (ninfer.quantize.weight_formats) and their CPU matmul kernels.

Kernels are compared with the float64 reference (`ninfer.kernels.reference`: weights
dequantized with quant.dequantize, and for q8/q4 the activations rounded as the kernels
round them) as ||out - ref|| / ||ref|| <= TOL. After the roundings that the reference
models, what is left is float32 arithmetic: products d * dx, converted exact integer dot
products and k / 8 lane sums per output, a few ulp each, the same budget as the float32
kernels in test_cpu_kernels.py.
"""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")  # exercise the parallel loops


import numpy as np
import pytest
import tvm

from ninfer import plan
from ninfer.kernels import MatmulSpec, build_cpu_module, reference
from ninfer.quantize import weight_formats as quant
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

TOL = 1e-5
# "bf16+x": bf16 weights times x rounded to bf16 (MatmulSpec.x_bf16, the plan's default);
# q8g32, q4g64 and q4g128 in the lanes layout (the plan's on the cpu target), "+rows" by rows
FORMATS = ["f16", "bf16", "bf16+x", "q8g32", "q8g32+rows", "q4g64", "q4g64+rows", "q4g128",
           "q4g128+rows"]

# (k, n_out) shapes per format: several groups, odd n_out (column tails of both
# schedules), and k over several 1024-long k blocks with a partial last block.
SHAPES = {
    "f16": [(200, 37), (2100, 74)],
    "bf16": [(200, 37), (2100, 74)],
    "bf16+x": [(201, 37), (2101, 74)],  # odd k: a last k step without its pair
    # 3 groups (a two-group step and a one-group step); 67 groups = 2 full blocks + 3 groups;
    # then k of whole k blocks (the model's shapes: no partial block)
    # lanes: no whole 16-group block; 4 whole blocks + 3 groups; 4 whole blocks
    "q8g32": [(96, 37), (2144, 74), (2048, 19)],
    "q8g32+rows": [(96, 37), (2144, 74), (2048, 19)],
    # lanes: no whole 16-group block; 2 whole blocks + 3 groups; 1 whole block
    "q4g64": [(192, 37), (2240, 74), (1024, 19)],
    "q4g64+rows": [(192, 37), (2240, 74), (1024, 19)],
    # lanes (8-group blocks): no whole block; 2 whole blocks + 1 group; 2 whole blocks
    "q4g128": [(384, 37), (2176, 74), (2048, 19)],
    "q4g128+rows": [(384, 37), (2176, 74), (2048, 19)],
}
ROWS = [1, 3, 7, 33]


def _spec(k: int, n_out: int, bias: bool, schedule: str, fmt: str) -> MatmulSpec:
    """A matmul in the layout the cpu plan takes (panels for float formats, lanes for
    the quantized ones), or the one a "+rows" / "+lanes" suffix names."""
    fmt, _, x = fmt.partition("+")
    layout = x if x in ("rows", "lanes") else plan.matmul_layout(load_target("cpu"), fmt)
    return MatmulSpec(k, n_out, bias, schedule, fmt, layout,  # type: ignore[arg-type]
                      x_bf16=x == "x")


def _cases() -> list[tuple[MatmulSpec, int]]:
    cases = []
    for fmt in FORMATS:
        for idx, (k, n_out) in enumerate(SHAPES[fmt]):
            for schedule in ("gemv", "gemm"):
                spec = _spec(k, n_out, idx == 1, schedule, fmt)
                cases += [(spec, n) for n in ROWS]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def kernels() -> tvm.runtime.Executable:
    return build_cpu_module(sorted({spec for spec, _ in CASES}, key=lambda s: s.name()))


def _weights(rng: np.random.Generator, n_out: int, k: int) -> np.ndarray:
    # Rows of different magnitudes, so scales vary a lot between groups.
    scale = np.exp(rng.uniform(-3, 1, size=(n_out, 1)))
    return (rng.standard_normal((n_out, k)) * scale).astype(np.float32)


def _inputs(spec: MatmulSpec, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((n, spec.k)).astype(np.float32)
    parts = quant.pack(_weights(rng, spec.n_out, spec.k), spec.wdtype, spec.layout)
    layout = quant.part_layout(spec.wdtype, spec.n_out, spec.k, spec.layout)
    args = [x] + [parts[name] for name, _, _ in layout]
    if spec.bias:
        args.append(rng.standard_normal(spec.n_out).astype(np.float32))
    return args


def _run(ex: tvm.runtime.Executable, spec: MatmulSpec, args: list[np.ndarray]) -> np.ndarray:
    out = tvm.runtime.tensor(np.full((args[0].shape[0], spec.n_out), np.nan, np.float32))
    ex[spec.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args), out)
    return out.numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name()}-n{c[1]}")
def test_matches_reference(kernels: tvm.runtime.Executable,
                           case: tuple[MatmulSpec, int]) -> None:
    spec, n = case
    rng = np.random.default_rng(zlib.crc32(f"{spec.name()}{n}".encode()))
    args = _inputs(spec, n, rng)
    out = _run(kernels, spec, args)
    ref = reference(spec, *args)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err <= TOL, f"{spec.name()} n={n}: relative error {err:.3g} > {TOL:g}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_bitwise_the_same_in_gemv_and_gemm(kernels: tvm.runtime.Executable,
                                                     fmt: str) -> None:
    """Batch invariance: a row's result depends neither on the schedule nor on the other
    rows (k spans three k blocks, n_out = 74 has column tails in both schedules)."""
    k, n_out = SHAPES[fmt][1]
    gemv = _spec(k, n_out, True, "gemv", fmt)
    gemm = _spec(k, n_out, True, "gemm", fmt)
    args = _inputs(gemm, 37, np.random.default_rng(3))
    x, rest = args[0], args[1:]
    batched = _run(kernels, gemm, args)
    for i in range(len(x)):
        row = [x[i : i + 1], *rest]
        assert np.array_equal(_run(kernels, gemv, row)[0], batched[i]), f"gemv row {i}"
        assert np.array_equal(_run(kernels, gemm, row)[0], batched[i]), f"gemm row {i}"
    for n in range(2, 10):  # every gemv row tile (4, 3, 2 and 1 rows) and a tail
        assert np.array_equal(_run(kernels, gemv, [x[:n], *rest]), batched[:n]), f"gemv {n}"
    assert np.array_equal(_run(kernels, gemm, [x[5:12], *rest]), batched[5:12])


@pytest.mark.parametrize("fmt", ["q8g32", "q8g32+rows", "q4g64", "q4g64+rows", "q4g128"])
def test_every_group_dot_path_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch,
                                                  fmt: str) -> None:
    """vpdpbusd on zmm (AVX-512 VNNI), on two ymm halves (AVX-VNNI) and vpmaddubsw +
    vpmaddwd (AVX2) give the same integer step dots, so the same outputs to the bit: every
    build the host can run (k spans three k blocks and, for q8, ends in a one-group step)."""
    from ninfer.kernels.cpu import qmatmul

    if not qmatmul.use_vnni():  # decided before any build: nothing to compare
        pytest.skip("this host has neither VNNI form: only the vpmaddubsw path can run")
    k, n_out = SHAPES[fmt][1]
    specs = [_spec(k, n_out, True, s, fmt) for s in ("gemv", "gemm")]
    args = _inputs(specs[1], 9, np.random.default_rng(5))
    paths = {"host": build_cpu_module(specs)}
    if qmatmul.use_zmm():
        monkeypatch.setattr(qmatmul, "use_zmm", lambda: False)
        paths["ymm"] = build_cpu_module(specs)
    monkeypatch.setattr(qmatmul, "use_vnni", lambda: False)
    paths["avx2"] = build_cpu_module(specs)
    for spec in specs:
        want = _run(paths["host"], spec, args)
        for name, ex in paths.items():
            assert np.array_equal(_run(ex, spec, args), want), f"{spec.name()}: {name}"


# Output error of the formats against float32 weights and unrounded activations, with
# Gaussian x and w (k = 4096). Measured (rel. L2): f16 2e-4, bf16 1.7e-3, q8g32 7.6e-3
# (5.4e-3 from the weights, the rest from rounding x to int8), q4g64 9.6e-2, q4g128
# 1.04e-1. Rounding x alone adds 5-7e-3 (Gaussian x), up to 1.4e-2 for heavy-tailed x;
# bf16 with x rounded to bf16 2.5e-3 (k = 2101; each rounding alone 1.7e-3).
ACCURACY_BOUND = {"f16": 4e-4, "bf16": 3e-3, "bf16+x": 4e-3, "q8g32": 1e-2, "q8g32+rows": 1e-2,
                  "q4g64": 0.11, "q4g64+rows": 0.11,
                  "q4g128": 0.12, "q4g128+rows": 0.12}


@pytest.mark.parametrize("fmt", FORMATS)
def test_accuracy_against_unquantized_matmul(kernels: tvm.runtime.Executable, fmt: str) -> None:
    k, n_out = SHAPES[fmt][1]
    spec = _spec(k, n_out, True, "gemv", fmt)
    rng = np.random.default_rng(11)
    w = rng.standard_normal((n_out, k)).astype(np.float32)
    x = rng.standard_normal((7, k)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    wd = spec.wdtype  # fmt without "+x"
    parts = quant.pack(w, wd, spec.layout)
    names = [name for name, _, _ in quant.part_layout(wd, n_out, k, spec.layout)]
    out = _run(kernels, spec, [x, *(parts[p] for p in names), b])
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    err = np.linalg.norm(out - b - exact) / np.linalg.norm(exact)
    assert err <= ACCURACY_BOUND[fmt], f"{fmt}: relative error {err:.3g}"
    if quant.format_info(wd).quantized:
        # the part due to rounding x only (against dequantized weights, float64)
        deq = x.astype(np.float64) @ quant.dequantize(parts, wd, k, spec.layout).T.astype(
            np.float64)
        act_err = np.linalg.norm(out - b - deq) / np.linalg.norm(deq)
        assert act_err <= 1e-2, f"{fmt}: activation rounding error {act_err:.3g}"


# ---- pack / dequantize ---------------------------------------------------------------


def _rt(fmt: str, w: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    parts = quant.pack(w, fmt)
    return parts, quant.dequantize(parts, fmt, w.shape[1]).astype(np.float64)


def _group_scales(parts: dict[str, np.ndarray], fmt: str, k: int) -> np.ndarray:
    """|d| of every element's group, [n_out, k]."""
    G = quant.format_info(fmt).group
    return np.repeat(np.abs(parts["scales"].astype(np.float64)), G, axis=1)[:, :k]


@pytest.mark.parametrize("fmt", quant.WEIGHT_FORMATS)
def test_pack_matches_part_layout(fmt: str) -> None:
    w = _weights(np.random.default_rng(1), 13, 256)
    parts = quant.pack(w, fmt)
    layout = quant.part_layout(fmt, 13, 256)
    assert list(parts) == [name for name, _, _ in layout]
    for name, dtype, shape in layout:
        assert parts[name].dtype == np.dtype(dtype) and parts[name].shape == shape, name
        assert parts[name].flags.c_contiguous
    assert quant.packed_nbytes(fmt, 13, 256) == sum(p.nbytes for p in parts.values())
    assert quant.packed_nbytes(fmt, 13, 256) == quant.bytes_per_weight(fmt) * 13 * 256
    spec = MatmulSpec(256, 13, wdtype=fmt)
    sig = [(a.name, a.dtype, a.shape) for a in spec.signature()[1:-1]]
    assert sig == [("w" if n == "w" else f"w_{n}", d, s) for n, d, s in layout]


@pytest.mark.parametrize("fmt", ["float32", "f16", "bf16"])
@pytest.mark.parametrize("n_out", [13, 64, 130])
def test_panels_layout(fmt: str, n_out: int) -> None:
    """w_panels[p, k, c] = w[64 p + c, k] with zero padding rows, and back; the spec's
    weight argument has the same shape; quantized formats have no panels layout."""
    w = _weights(np.random.default_rng(4), n_out, 96)
    rows = quant.pack(w, fmt)["w"]
    panels = quant.pack(w, fmt, "panels")["w"]
    ((_, dtype, shape),) = quant.part_layout(fmt, n_out, 96, "panels")
    assert panels.shape == shape == (-(-n_out // 64), 96, 64) and panels.dtype == dtype
    assert panels.flags.c_contiguous
    for j in (0, n_out // 2, n_out - 1):
        assert np.array_equal(panels[j // 64, :, j % 64], rows[j])
    assert not np.any(panels.transpose(0, 2, 1).reshape(-1, 96)[n_out:])
    assert np.array_equal(quant.dequantize({"w": panels}, fmt, 96, "panels", n_out),
                          quant.dequantize({"w": rows}, fmt, 96))
    spec = MatmulSpec(96, n_out, wdtype=fmt, layout="panels")
    assert [(a.name, a.dtype, a.shape) for a in spec.signature()[1:-1]] == [("w", dtype, shape)]
    with pytest.raises(ValueError, match="panels layout needs n_out"):
        quant.dequantize({"w": panels}, fmt, 96, "panels")
    with pytest.raises(ValueError, match="float formats only"):
        quant.part_layout("q8g32", n_out, 96, "panels")


@pytest.mark.parametrize("fmt", ["q8g32", "q4g64", "q4g128"])
def test_lanes_layout(fmt: str) -> None:
    """"lanes": the rows' parts and shapes, each whole block of 512 bytes of q (16 groups
    of 32 bytes, or 8 of 64) with byte 64 j + 4 l + t holding byte 32 (l // B) + 4 j + t
    of group l % B (B groups a block: group g's bytes in 32-bit lane g, and g + 8, of step
    j's vector), the groups after the last whole block in order; the same scales, the same
    dequantized weight; other formats have no lanes layout."""
    gb = quant.group_bytes(fmt)
    per_block = 512 // gb
    per_byte = 1 if fmt == "q8g32" else 2  # k per byte of q
    k = (1024 + 3 * gb) * per_byte  # two whole blocks and three groups
    w = _weights(np.random.default_rng(6), 5, k)
    rows = quant.pack(w, fmt)
    lanes = quant.pack(w, fmt, "lanes")
    assert quant.part_layout(fmt, 5, k, "lanes") == quant.part_layout(fmt, 5, k)
    assert np.array_equal(lanes["scales"], rows["scales"])
    for b0 in (0, 512):
        for j, lane, t in ((0, 0, 0), (0, 1, 0), (1, 0, 3), (7, 15, 3), (3, 9, 2), (2, 8, 1)):
            byte = gb * (lane % per_block) + 32 * (lane // per_block) + 4 * j + t
            assert np.array_equal(lanes["q"][:, b0 + 64 * j + 4 * lane + t],
                                  rows["q"][:, b0 + byte]), (b0, j, lane, t)
    assert np.array_equal(lanes["q"][:, 1024:], rows["q"][:, 1024:])
    assert sorted(quant.lanes_order(k // per_byte, gb)) == list(range(k // per_byte))
    assert np.array_equal(quant.dequantize(lanes, fmt, k, "lanes"),
                          quant.dequantize(rows, fmt, k))
    assert MatmulSpec(k, 5, wdtype=fmt, layout="lanes").name().endswith(f"{fmt}_l16_gemv")
    for other in ("f16", "bf16"):
        with pytest.raises(ValueError, match="lanes layout is for q8g32, q4g64, q4g128 only"):
            quant.part_layout(other, 5, 1024, "lanes")


def test_bytes_per_weight() -> None:
    assert [quant.bytes_per_weight(f) for f in quant.WEIGHT_FORMATS] == [
        4.0, 2.0, 2.0, 1.0625, 0.53125, 0.515625
    ]


def test_float_round_trips() -> None:
    w = _weights(np.random.default_rng(2), 64, 512)
    w64 = w.astype(np.float64)
    assert np.array_equal(quant.dequantize(quant.pack(w, "float32"), "float32", 512), w)
    _, f16 = _rt("f16", w)
    assert np.all(np.abs(f16 - w64) <= np.abs(w64) * 2.0**-11 + 2.0**-25)
    _, bf16 = _rt("bf16", w)
    assert np.all(np.abs(bf16 - w64) <= np.abs(w64) * 2.0**-8)
    # bf16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
    ties = np.array([[1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), np.nan]], np.float32)
    got = quant.dequantize(quant.pack(ties, "bf16"), "bf16", 4)[0]
    assert got[:3].tolist() == [1.0, 1 + 2.0**-6, -1.0] and np.isnan(got[3])


def test_q8_round_trip_error_is_at_most_half_a_step() -> None:
    w = _weights(np.random.default_rng(4), 64, 512)
    parts, deq = _rt("q8g32", w)
    d = _group_scales(parts, "q8g32", 512)
    assert np.all(np.abs(deq - w) <= d / 2 * (1 + 1e-6))
    assert parts["q"].min() >= -127 and parts["q"].max() <= 127
    # the largest magnitude of every group is (close to) +-127 steps
    g = np.abs(parts["q"].astype(np.int32)).reshape(64, -1, 32).max(axis=-1)
    assert np.all(g >= 126)


@pytest.mark.parametrize("fmt", ["q4g64", "q4g128"])
def test_q4_round_trip_error(fmt: str) -> None:
    G = quant.format_info(fmt).group
    w = _weights(np.random.default_rng(5), 64, 1024)
    parts, deq = _rt(fmt, w)
    d = _group_scales(parts, fmt, 1024)
    err = np.abs(deq - w)
    q = quant.unpack_ints(parts, fmt, 1024)
    assert q.min() >= -8 and q.max() <= 7
    # every element within one step; unclipped ones (|w / d| <= 7.5) within half a step
    assert np.all(err <= d * (1 + 1e-6))
    unclipped = np.abs(w / np.where(d == 0, 1, d)) <= 7.5
    assert np.all(err[unclipped] <= d[unclipped] / 2 * (1 + 1e-6))
    # each group's squared error is no larger than with the symmetric scale max|w| / 7
    wg = w.astype(np.float64).reshape(64, -1, G)
    d_sym = (np.abs(wg).max(-1) / 7).astype(np.float16).astype(np.float64)[..., None]
    sse_sym = ((np.clip(np.rint(wg / d_sym), -8, 7) * d_sym - wg) ** 2).sum(-1)
    sse = ((deq - w).reshape(64, -1, G) ** 2).sum(-1)
    assert np.all(sse <= sse_sym * (1 + 1e-9))
    assert sse.sum() < 0.85 * sse_sym.sum()  # the -8 level pays off on Gaussian weights


def test_q4_nibble_order_and_offset() -> None:
    # one group of 64: w[k] = (k % 16 - 8) / 2, exact with d = 0.5 and q = k % 16 - 8
    k = np.arange(64)
    w = ((k % 16) - 8).astype(np.float32)[None, :] * np.float32(0.5)
    parts = quant.pack(w, "q4g64")
    assert parts["scales"][0, 0] == np.float16(0.5)
    b = parts["q"][0]
    assert b[0] == 0x10 and b[1] == 0x32  # k = 0 (q = -8) low nibble 0, k = 1 high nibble 1
    assert np.array_equal(b & 0x0F, (k[0::2] % 16))  # nibble = q + 8
    assert np.array_equal(b >> 4, (k[1::2] % 16))
    assert np.array_equal(quant.dequantize(parts, "q4g64", 64), w)


def test_zero_groups_and_int_weights() -> None:
    w = np.zeros((2, 128), np.float32)
    w[1, 64:] = np.arange(64) - 32
    for fmt in ("q8g32", "q4g64", "q4g128"):
        parts, deq = _rt(fmt, w)
        assert np.all(deq[0] == 0), fmt
        assert np.all(parts["scales"][0] == 0), fmt
    parts = quant.pack(w, "q4g64")
    assert np.all(parts["q"][0] == 0x88)  # q = 0 stored as nibble 8


@pytest.mark.parametrize("fmt", ["q8g32", "q4g64", "q4g128"])
def test_invalid_k_is_rejected_with_the_numbers(fmt: str) -> None:
    G = quant.format_info(fmt).group
    k = G * 3 + 16
    with pytest.raises(ValueError, match=rf"k = {k} is not a multiple of the group size {G}"):
        quant.pack(np.ones((4, k), np.float32), fmt)
    with pytest.raises(ValueError, match=rf"k = {k} .* group size {G}"):
        MatmulSpec(k=k, n_out=8, wdtype=fmt)
    with pytest.raises(ValueError, match=str(k)):
        quant.part_layout(fmt, 8, k)


def test_overflowing_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="overflows float16"):
        quant.pack(np.full((1, 64), 1e5, np.float32), "f16")
    with pytest.raises(ValueError, match="overflows float16"):
        quant.pack(np.full((1, 64), 1e7, np.float32), "q4g64")


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown weight format"):
        quant.pack(np.ones((1, 64), np.float32), "q3g64")
    with pytest.raises(ValueError):
        MatmulSpec(k=64, n_out=8, wdtype="int4")


def test_activation_model() -> None:
    x = np.array([[0.0] * 31 + [0.0], [1.0, -2.0, 0.5] + [0.25] * 29], np.float32)
    xq, dx = quant.quantize_activations(x.reshape(1, 64), "q8g32")
    assert dx.tolist() == [[0.0, np.float32(2.0) / np.float32(127)]]
    assert np.all(xq[0, :32] == 0)
    assert xq[0, 32:35].tolist() == [64, -127, 32]  # 63.5 rounds half to even: 64


def test_names_are_unique_c_identifiers() -> None:
    names = {MatmulSpec(256, 8, b, s, f).name()
             for f in quant.WEIGHT_FORMATS for s in ("gemv", "gemm") for b in (False, True)}
    assert len(names) == len(quant.WEIGHT_FORMATS) * 4
    assert all(name.isidentifier() for name in names)
    assert MatmulSpec(256, 8, wdtype="q4g64").name() == "matmul_k256_n8_q4g64_gemv"


ALLOWED_UNDEFINED = {"TVMFFIErrorSetRaisedFromCStrParts", "memcpy", "memset"}


def test_object_exports_every_format(kernels: tvm.runtime.Executable, tmp_path: Path) -> None:
    # the object the model build links, written from the module the tests above ran:
    # every format, both schedules, with and without bias (CASES)
    obj = tmp_path / "q.o"
    kernels.mod.write_to_file(str(obj))
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True)
    undefined = {line.split()[1] for line in symbols.stdout.splitlines()
                 if len(line.split()) == 2 and line.split()[0] == "U"}
    specs = {spec for spec, _ in CASES}
    suffix = {("bf16", "panels", True): "+x", ("q8g32", "rows", False): "+rows",
              ("q4g64", "rows", False): "+rows", ("q4g128", "rows", False): "+rows"}
    assert {(s.wdtype + suffix.get((s.wdtype, s.layout, s.x_bf16), ""), s.schedule, s.bias)
            for s in specs} == {
        (f, sched, b) for f in FORMATS for sched in ("gemv", "gemm") for b in (False, True)}
    for spec in specs:
        assert f"__tvm_ffi_{spec.name()}" in symbols.stdout
    assert undefined <= ALLOWED_UNDEFINED, f"unexpected undefined: {undefined - ALLOWED_UNDEFINED}"
