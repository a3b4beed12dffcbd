"""The CPU kernels of a sparse MoE block against their float64 references
(kernels.reference.moe_router / moe_combine), and the router against transformers'
Qwen3-Next routing (softmax in float32, topk, renormalised)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels import MoeCombineSpec, MoeRouterSpec
from ninfer.kernels.reference import moe_router_parts, reference

ROUTERS = [MoeRouterSpec(8, 2, True), MoeRouterSpec(10, 3, False), MoeRouterSpec(4, 4, True)]
COMBINES = [MoeCombineSpec(32, 2, 12), MoeCombineSpec(20, 3, 9)]  # 20: no whole vectors


@pytest.fixture(scope="module")
def moe_kernels():  # type: ignore[no-untyped-def]
    import os

    os.environ.setdefault("TVM_NUM_THREADS", "2")
    from ninfer.kernels import build_cpu_module

    return build_cpu_module(ROUTERS + COMBINES)


@pytest.mark.parametrize("spec", ROUTERS, ids=lambda s: s.name())
def test_router_picks_the_reference_experts_and_weights(moe_kernels, spec) -> None:  # type: ignore[no-untyped-def]
    import tvm

    rng = np.random.default_rng(spec.experts)
    logits = (rng.standard_normal((9, spec.experts)) * 3).astype(np.float32)
    logits[0] = 0.5  # all tied: the lowest ids, in order
    logits[1, :2] = logits[1, 2:4] = 7.0  # two pairs of ties at the top
    ids = tvm.runtime.tensor(np.full((9, spec.top_k), -7, np.int32))
    w = tvm.runtime.tensor(np.full((9, spec.top_k), np.nan, np.float32))
    moe_kernels[spec.name()](tvm.runtime.tensor(logits), ids, w)
    want_ids, want_w = moe_router_parts(spec, logits)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=3e-6, atol=1e-7)
    assert list(ids.numpy()[0]) == list(range(spec.top_k))
    assert np.allclose(reference(spec, logits)[:, :spec.top_k], want_ids)


def test_router_matches_transformers_qwen3_next_routing() -> None:
    torch = pytest.importorskip("torch")
    spec = MoeRouterSpec(16, 4, True)
    logits = torch.randn(33, 16, generator=torch.Generator().manual_seed(5))
    # transformers' Qwen3NextSparseMoeBlock / its router: softmax in float, topk, renorm
    p = torch.softmax(logits, dim=-1, dtype=torch.float)
    w, ids = torch.topk(p, spec.top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    got_ids, got_w = moe_router_parts(spec, logits.numpy())
    np.testing.assert_array_equal(got_ids, ids.numpy())
    np.testing.assert_allclose(got_w, w.numpy(), rtol=1e-6)


@pytest.mark.parametrize("spec", COMBINES, ids=lambda s: s.name())
def test_combine_matches_reference(moe_kernels, spec) -> None:  # type: ignore[no-untyped-def]
    import tvm

    rng = np.random.default_rng(spec.hidden)
    f = np.float32
    n = spec.rows // spec.top_k
    inputs = [rng.standard_normal((spec.rows, spec.hidden)).astype(f),
              rng.permutation(spec.rows)[:n * spec.top_k].reshape(n, spec.top_k).astype(np.int32),
              rng.uniform(0, 1, (n, spec.top_k)).astype(f),
              rng.standard_normal((n, spec.hidden)).astype(f),
              (rng.standard_normal(spec.hidden) * 0.3).astype(f),
              rng.standard_normal((n, spec.hidden)).astype(f)]
    out = tvm.runtime.tensor(np.full((n, spec.hidden), np.nan, f))
    moe_kernels[spec.name()](*(tvm.runtime.tensor(a) for a in inputs), out)
    np.testing.assert_allclose(out.numpy(), reference(spec, *inputs), rtol=2e-5, atol=2e-6)
    # a row's result does not depend on the other rows of the step
    one = tvm.runtime.tensor(np.full((1, spec.hidden), np.nan, f))
    row = [inputs[0], inputs[1][2:3], inputs[2][2:3], inputs[3][2:3], inputs[4], inputs[5][2:3]]
    moe_kernels[spec.name()](*(tvm.runtime.tensor(np.ascontiguousarray(a)) for a in row), one)
    np.testing.assert_array_equal(one.numpy()[0], out.numpy()[2])
