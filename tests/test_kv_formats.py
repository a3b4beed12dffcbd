"""KV-cache formats (--kv-dtype): the storage layout and rounding of ninfer.quantize.kv_formats
(the reference the CPU kernels are checked against in tests/kernels), and what the
formats do to the plan: bytes per token, tokens --kv-capacity auto can hold, refusals."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ninfer.frontend import open_checkpoint
from ninfer.frontend.llama import build_graph
from ninfer.plan import PlanError, ServeLimits, make_plan
from ninfer.quantize import kv_formats as K
from ninfer.targets import load_target
from test_frontend import BASE, make_ckpt

pytestmark = pytest.mark.unit


def test_fp8_matches_ml_dtypes_e4m3fn():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000) * s for s in (1e-4, 3e-3, 1, 40, 400)])
    x = np.clip(x, -K.FP8_MAX, K.FP8_MAX).astype(np.float32)
    want = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(K.fp8_encode(x), want)
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = ~np.isnan(ref)
    assert np.array_equal(K.fp8_decode(codes)[finite], ref[finite])
    # beyond the range: saturates (ml_dtypes would give NaN)
    assert K.fp8_decode(K.fp8_encode(np.float32([1e4, -1e9]))).tolist() == [448.0, -448.0]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_integer_formats_error_is_half_a_step(fmt):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, 3, 64)) * rng.choice([0.01, 1, 100], (7, 3, 64))
         ).astype(np.float32)
    parts = K.encode(fmt, x)
    assert [p.dtype for p in parts] == [np.int8 if fmt == "int8" else np.uint8, np.float16]
    assert parts[1].shape == (7, 3, 64 // K.KV_GROUP)
    step = np.repeat(parts[1].astype(np.float64), K.KV_GROUP, axis=-1)
    err = np.abs(K.decode(fmt, parts) - x)
    assert np.all(err <= step / 2 * (1 + 1e-6) + 1e-12)
    # The largest |value| of each group takes the extreme code +-qmax (the scale is
    # max|x| / qmax, rounded to float16), so it decodes with the scale's rounding alone:
    # within max|x| x 2^-11 (and the float32 division: 2^-24), far inside half a step.
    qmax = 127 if fmt == "int8" else 7
    groups = x.reshape(7, 3, 2, 32)
    peak = np.abs(groups).argmax(-1)[..., None]
    top = np.take_along_axis(groups, peak, -1)[..., 0].astype(np.float64)
    got = np.take_along_axis(K.decode(fmt, parts).reshape(7, 3, 2, 32), peak, -1)[..., 0]
    assert np.array_equal(got, np.sign(top) * qmax * parts[1].astype(np.float64))
    assert np.all(np.abs(got - top) <= np.abs(top) * (2.0**-11 + 2.0**-23))


def test_int4_nibble_layout():
    """Byte b of a group holds value b (low nibble) and value b + 16 (high), offset by 8."""
    x = np.zeros((1, 1, 32), np.float32)
    x[0, 0, 0], x[0, 0, 16], x[0, 0, 3] = 7.0, -7.0, 2.0
    q, scale = K.encode("int4", x)
    assert scale.item() == 1.0
    assert q.shape == (1, 1, 16)
    assert q[0, 0, 0] == (7 + 8) | ((-7 + 8) << 4)
    assert q[0, 0, 3] == (2 + 8) | (8 << 4)


def test_float_formats_round_to_nearest():
    x = np.float32([1.0 + 2**-11, 1.0 + 3 * 2**-11, 1e6, -1e6, 3.0e-8])
    assert K.encode("f16", x)[0].astype(np.float32).tolist()[:4] == [1.0, 1.001953125,
                                                                     65504.0, -65504.0]
    bf = K.decode("bf16", K.encode("bf16", np.float32([1.0 + 2**-8, 1.0 + 3 * 2**-8])))
    assert bf.tolist() == [1.0, 1.015625]  # ties to even


def test_hadamard_is_orthogonal_and_spreads_outliers():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((200, 2, 128)).astype(np.float32)
    assert np.allclose(K.hadamard(K.hadamard(x, 128), 128), x, atol=1e-5)
    q = rng.standard_normal((200, 2, 128))
    assert np.allclose((K.hadamard(q, 128) * K.hadamard(x, 128)).sum(-1),
                       (q * x).sum(-1), atol=1e-4)
    # one outlier channel (as attention keys have): rotating first cuts the int4 error
    x[..., 5] *= 30
    plain = np.linalg.norm(K.roundtrip("int4", x) - x)
    rotated = np.linalg.norm(K.roundtrip("int4", x, rotate=True) - x)
    assert rotated < 0.5 * plain, (rotated, plain)


def test_rotation_block_and_pool_layout():
    assert [K.rotation_block(d) for d in (32, 64, 96, 128, 256)] == [32, 64, 32, 128, 128]
    assert K.pool_parts("int4", 10, 2, 64) == [("", "uint8", (10, 2, 32)),
                                               ("_scales", "float16", (10, 2, 2))]
    per_row = {f: K.pool_bytes_per_row(f, 8, 128) for f in K.KV_DTYPES}
    assert per_row == {"f32": 4096, "f16": 2048, "bf16": 2048, "fp8": 1024,
                       "int8": 1024 + 64, "int4": 512 + 64}
    with pytest.raises(ValueError, match="head_dim 48 is not a multiple of 32"):
        K.pool_parts("int8", 10, 2, 48)


def _graph(tmp_path, head_dim):
    cfg = {**BASE, "head_dim": head_dim, "max_position_embeddings": 8192}
    return build_graph(open_checkpoint(make_ckpt(tmp_path, cfg=cfg)))


def test_smaller_kv_format_holds_more_tokens_in_the_same_memory(tmp_path):
    """With memory binding (many slots at full context), --kv-capacity auto holds 2x the
    tokens at f16/bf16, 4x at fp8, ~3.8x at int8 and ~7x at int4; the report's table says
    so for every format whatever the chosen one."""
    graph = _graph(tmp_path, 32)
    limits = dict(max_context=4096, prefill_chunk=64, max_concurrency=64)
    mem = make_plan(graph, load_target("cpu"), ServeLimits(**limits)).memory
    fixed = mem.weights_bytes + mem.activation_bytes + mem.workspace_bytes
    # 8 MiB left for the KV cache: below 64 x 4096 tokens even at int4 (36 B per token)
    target = load_target("cpu").with_overrides(memory_gib=(fixed + (8 << 20)) / 2**30)
    plans = {f: make_plan(graph, target, ServeLimits(**limits, kv_dtype=f))
             for f in K.KV_DTYPES}
    tokens = {f: p.kv.tokens for f, p in plans.items()}
    assert tokens["f32"] < 64 * 4096  # memory binds, not the slots
    for f, ratio in (("f16", 2), ("bf16", 2), ("fp8", 4), ("int8", 64 / 17),
                     ("int4", 64 / 9)):
        assert tokens[f] / tokens["f32"] == pytest.approx(ratio, rel=0.01), f
        slack = plans[f].kv.bytes_per_block
        assert plans[f].memory.kv_bytes <= plans["f32"].memory.kv_bytes + slack
    table = plans["f32"].to_json()["kv"]["memory_tokens"]
    assert {f: row["tokens"] for f, row in table.items()} == pytest.approx(
        {f: tokens[f] + 16 for f in K.KV_DTYPES}, abs=16)  # + the reserved block
    assert plans["int4"].to_json()["kv"]["dtype"] == "int4"
    assert plans["int4"].kv.bytes_per_token == 2 * 1 * 9 * 1 * 32 // 16  # 1 layer, 1 kv head
    json.dumps(plans["int4"].to_json())


def test_kv_dtype_kernels_and_refusals(tmp_path):
    graph = _graph(tmp_path / "a", 32)
    cpu = load_target("cpu")
    plan = make_plan(graph, cpu, ServeLimits(256, 16, kv_dtype="int4"))
    k, v, att = (plan.kernels[r] for r in ("kv_store_k", "kv_store_v", "attention"))
    assert (k.kv_dtype, k.rotate, v.rotate, att.rotate) == ("int4", 32, 0, 32)
    assert [a.name for a in att.signature()][:5] == ["q", "k_pool", "k_pool_scales", "v_pool",
                                                     "v_pool_scales"]
    with pytest.raises(PlanError, match="--gdn-prefill chunked: this model has no Gated"):
        make_plan(graph, cpu, ServeLimits(256, 16, gdn_prefill="chunked"))  # a dense model
    plain = make_plan(graph, cpu, ServeLimits(256, 16, kv_dtype="int8"))
    assert plain.kernels["kv_store_k"] == plain.kernels["kv_store_v"]  # one kernel
    with pytest.raises(PlanError, match="head_dim 16 is not a multiple of 32"):
        make_plan(_graph(tmp_path / "b", 16), cpu, ServeLimits(256, 16, kv_dtype="int4"))
    with pytest.raises(PlanError, match="--kv-dtype 'int2' is not one of"):
        make_plan(graph, cpu, ServeLimits(256, 16, kv_dtype="int2"))
    with pytest.raises(PlanError, match="--kv-block-size 12 must be 8, 16, 32 or 64"):
        make_plan(graph, cpu, ServeLimits(256, 16, kv_block_size=12))
