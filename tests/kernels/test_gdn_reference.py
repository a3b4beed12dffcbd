"""The float64 Gated DeltaNet reference (ninfer.kernels.gdn_reference) against itself (the
chunked and recurrent forms, split calls carrying state) and against transformers 5.24's
Qwen3.5 and Qwen3-Next layers (PyTorch fallback kernels, float32)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels import GdnConvSpec, GdnGateSpec, GdnNormSpec, GdnRecurrentSpec
from ninfer.kernels import gdn_reference as gdn

pytestmark = pytest.mark.unit

DIMS = gdn.GdnDims(hidden=48, k_heads=2, v_heads=4, k_dim=16, v_dim=8, conv_kernel=4)


def _weights(d: gdn.GdnDims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def lin(out: int, inp: int) -> np.ndarray:
        return rng.standard_normal((out, inp)) / np.sqrt(inp)

    return {
        "in_proj_qkv": lin(d.conv_dim, d.hidden), "in_proj_z": lin(d.value_width, d.hidden),
        "in_proj_b": lin(d.v_heads, d.hidden), "in_proj_a": lin(d.v_heads, d.hidden),
        "conv1d": rng.standard_normal((d.conv_dim, 1, d.conv_kernel)) * 0.5,
        "dt_bias": rng.uniform(0.5, 1.5, d.v_heads),
        "A_log": np.log(rng.uniform(0.01, 16, d.v_heads)),
        "norm": rng.uniform(0.5, 1.5, d.v_dim), "out_proj": lin(d.hidden, d.value_width),
    }


def _rule_inputs(rng: np.random.Generator, T: int, d: gdn.GdnDims) -> tuple[np.ndarray, ...]:
    q = rng.standard_normal((T, d.k_heads, d.k_dim))
    k = rng.standard_normal((T, d.k_heads, d.k_dim))
    v = rng.standard_normal((T, d.v_heads, d.v_dim))
    g, beta = gdn.gating(rng.standard_normal((T, d.v_heads)), rng.standard_normal((T, d.v_heads)),
                         np.log(rng.uniform(0.01, 16, d.v_heads)), np.ones(d.v_heads))
    ssm = rng.standard_normal((d.v_heads, d.k_dim, d.v_dim))
    return q, k, v, g, beta, ssm


@pytest.mark.parametrize(("T", "chunk"), [(1, 64), (37, 64), (130, 64), (23, 5)])
def test_chunked_form_equals_recurrent_form(T: int, chunk: int) -> None:
    q, k, v, g, beta, ssm = _rule_inputs(np.random.default_rng(T), T, DIMS)
    o_r, s_r = gdn.delta_rule_recurrent(q, k, v, g, beta, ssm)
    o_c, s_c = gdn.delta_rule_chunked(q, k, v, g, beta, ssm, chunk=chunk)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunked", [True, False])
def test_calls_that_carry_the_state_equal_one_call(chunked: bool) -> None:
    """Prefill in pieces, then token by token (decode), from the state each call returns."""
    rng = np.random.default_rng(3)
    w = _weights(DIMS, rng)
    x = rng.standard_normal((50, DIMS.hidden))
    whole, end = gdn.gdn_layer(x, w, DIMS, gdn.GdnState.zeros(DIMS), chunked=chunked)
    state, parts = gdn.GdnState.zeros(DIMS), []
    for a, b in [(0, 2), (2, 31), (31, 47)] + [(t, t + 1) for t in range(47, 50)]:
        y, state = gdn.gdn_layer(x[a:b], w, DIMS, state, chunked=chunked)
        parts.append(y)
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(state.ssm, end.ssm, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(state.conv, x[-3:] @ w["in_proj_qkv"].T, rtol=1e-12, atol=1e-12)


def test_conv_is_causal_with_its_state() -> None:
    rng = np.random.default_rng(4)
    x, wt = rng.standard_normal((6, 5)), rng.standard_normal((5, 3))
    y, st = gdn.causal_conv1d(x, wt, np.zeros((2, 5)))
    want = sum(np.vstack([np.zeros((2 - j, 5)), x[:6 - (2 - j)]]) * wt[:, j] for j in range(3))
    np.testing.assert_allclose(y, gdn.silu(want), rtol=1e-12)
    assert np.array_equal(st, x[-2:])


def test_split_fused_projections_rejects_wrong_shapes() -> None:
    with pytest.raises(ValueError, match="do not match 2 key heads"):
        gdn.split_fused_projections(np.zeros((10, 48)), np.zeros((8, 48)), DIMS)


def _hf_config(cls_name: str):  # type: ignore[no-untyped-def]
    import transformers

    cfg_cls = getattr(transformers, cls_name)
    return cfg_cls(hidden_size=DIMS.hidden, linear_num_key_heads=DIMS.k_heads,
                   linear_num_value_heads=DIMS.v_heads, linear_key_head_dim=DIMS.k_dim,
                   linear_value_head_dim=DIMS.v_dim, linear_conv_kernel_dim=DIMS.conv_kernel,
                   num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                   head_dim=16, intermediate_size=64, vocab_size=64, rms_norm_eps=DIMS.eps)


def _from_module(layer, fused: bool) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    sd = {k: v.detach().double().numpy() for k, v in layer.state_dict().items()}
    w = {"conv1d": sd["conv1d.weight"], "dt_bias": sd["dt_bias"], "A_log": sd["A_log"],
         "norm": sd["norm.weight"], "out_proj": sd["out_proj.weight"]}
    if fused:
        w |= gdn.split_fused_projections(sd["in_proj_qkvz.weight"], sd["in_proj_ba.weight"],
                                         DIMS)
    else:
        w |= {n: sd[f"{n}.weight"] for n in ("in_proj_qkv", "in_proj_z", "in_proj_b",
                                             "in_proj_a")}
    return w


@pytest.mark.parametrize(("config", "module", "attr", "fused"), [
    ("Qwen3_5TextConfig", "transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet",
     False),
    ("Qwen3NextConfig", "transformers.models.qwen3_next.modeling_qwen3_next",
     "Qwen3NextGatedDeltaNet", True),
])
def test_layer_matches_transformers(config: str, module: str, attr: str, fused: bool) -> None:
    torch = pytest.importorskip("torch")
    import importlib

    torch.manual_seed(0)
    layer = getattr(importlib.import_module(module), attr)(_hf_config(config), layer_idx=0)
    with torch.no_grad():
        for p in layer.parameters():  # away from the initialiser's ones and zeros
            p.add_(torch.randn_like(p) * 0.2)
        x = torch.randn(1, 70, DIMS.hidden)
        want = layer(x).double().numpy()[0]
    got, _ = gdn.gdn_layer(x.double().numpy()[0], _from_module(layer, fused), DIMS,
                           gdn.GdnState.zeros(DIMS))
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-5, f"{attr}: relative error {err:.3g}"


def _run_hf(model_cls, cfg, seed: int, tokens: int):  # type: ignore[no-untyped-def]
    """(transformers' logits, the model's tensors as float64 without the `model.` prefix,
    its config as a dict, the prompt) for a tiny random model, weights perturbed away
    from their initialisers."""
    import torch

    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        ids = torch.randint(0, cfg.vocab_size, (1, tokens))
        want = model(ids).logits.double().numpy()[0]
    weights = {k.removeprefix("model."): v.detach().double().numpy()
               for k, v in model.state_dict().items()}
    return want, weights, cfg.to_dict(), ids.numpy()[0]


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_dense_hybrid_model_matches_transformers() -> None:
    """A whole tiny Qwen3.5 (3 Gated DeltaNet layers and a gated full-attention one, partial
    rotary, zero-centred norms, untied head) against Qwen3_5ForCausalLM's logits."""
    pytest.importorskip("torch")
    from transformers import Qwen3_5ForCausalLM

    cfg = _hf_config("Qwen3_5TextConfig")
    cfg.tie_word_embeddings = False
    want, weights, fields, ids = _run_hf(Qwen3_5ForCausalLM, cfg, 1, 41)
    assert gdn.layer_types(fields) == ["linear_attention"] * 3 + ["full_attention"]
    assert fields["rope_parameters"]["partial_rotary_factor"] < 1  # partial rotary exercised
    got = gdn.hybrid_logits(fields, weights, ids)
    assert _rel_err(got, want) < 1e-5, f"relative error {_rel_err(got, want):.3g}"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))



def _torch_mtp(cfg, seed: int):  # type: ignore[no-untyped-def]
    """A tiny Qwen3.5 and an MTP head built from transformers' own modules: the head's
    decoder layer is a one-layer Qwen3_5TextModel of a full-attention layer (its `norm` is
    mtp.norm, its embedding the main model's), fc and the two pre-fc norms torch modules;
    parameters perturbed away from their initialisers. Returns (model, head, a function
    running the head, the checkpoint-named float64 tensors)."""
    import copy

    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextModel
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval().double()
    mtp_cfg = copy.deepcopy(cfg)
    mtp_cfg.num_hidden_layers, mtp_cfg.layer_types = 1, ["full_attention"]
    layer = Qwen3_5TextModel(mtp_cfg).eval().double()
    H = cfg.hidden_size
    fc = torch.nn.Linear(2 * H, H, bias=False).double()
    norm_e = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps).double()
    norm_h = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps).double()
    with torch.no_grad():
        for m in (model, layer, fc, norm_e, norm_h):
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        layer.embed_tokens.weight.copy_(model.model.embed_tokens.weight)

    def head(hidden, next_ids, pos):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            e = norm_e(model.model.embed_tokens(torch.tensor(next_ids)))
            x = fc(torch.cat([e, norm_h(torch.tensor(hidden))], dim=-1))
            out = layer(inputs_embeds=x[None], position_ids=torch.tensor(pos)[None])
            return out.last_hidden_state[0].numpy()

    weights = {k.removeprefix("model."): v.detach().numpy()
               for k, v in model.state_dict().items()}
    weights |= {f"mtp.{k.removeprefix('model.')}": v.detach().numpy()
                for k, v in layer.state_dict().items() if not k.startswith("embed_tokens")}
    weights |= {"mtp.fc.weight": fc.weight.detach().numpy(),
                "mtp.pre_fc_norm_embedding.weight": norm_e.weight.detach().numpy(),
                "mtp.pre_fc_norm_hidden.weight": norm_h.weight.detach().numpy()}
    return model, head, weights


def test_mtp_head_matches_transformers_modules() -> None:
    """The float64 MTP head (gdn_reference.mtp_hidden: fc over [norm(embed(next));
    norm(hidden)], a gated full-attention layer with partial rotary and causal attention
    among its rows, mtp.norm) against the same head assembled from transformers' Qwen3.5
    modules; and mtp_drafts' chain (each draft's row pairs the head's previous result with
    the draft before it) against that head run row by row the same way."""
    torch = pytest.importorskip("torch")
    cfg = _hf_config("Qwen3_5TextConfig")
    cfg.tie_word_embeddings = False
    model, head, weights = _torch_mtp(cfg, 5)
    fields = cfg.to_dict()
    assert set(k for k in weights if k.startswith("mtp.")) >= {
        "mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight", "mtp.layers.0.input_layernorm.weight"}
    rng = np.random.default_rng(6)
    ids = rng.integers(0, cfg.vocab_size, 19)
    hidden = gdn.hybrid_hidden(fields, weights, ids)
    with torch.no_grad():
        want_hidden = model.model(torch.tensor(ids)[None]).last_hidden_state[0].numpy()
    assert _rel_err(hidden, want_hidden) < 1e-6  # transformers runs its delta rule in f32
    pos = np.arange(len(ids) - 1)
    got = gdn.mtp_hidden(fields, weights, hidden[:-1], ids[1:], pos)
    want = head(hidden[:-1], ids[1:], pos)
    assert _rel_err(got, want) < 1e-6, _rel_err(got, want)  # its rotary tables are f32
    # the chain: 3 drafts after the prompt's next token
    t, drafts = gdn.mtp_drafts(fields, weights, ids, 3)
    head_w = weights["lm_head.weight"]
    assert t == int(np.argmax(want_hidden[-1] @ head_w.T))
    rows_h, rows_x = list(want_hidden), [*ids[1:].tolist(), t]
    for d in drafts:
        out = head(np.stack(rows_h), np.array(rows_x), np.arange(len(rows_x)))
        assert d == int(np.argmax(out[-1] @ head_w.T))
        rows_h.append(out[-1])
        rows_x.append(d)
    assert gdn.hybrid_logits(fields, weights, ids).shape == (len(ids), cfg.vocab_size)

# ---- the CPU kernel of the recurrence ------------------------------------------------------

GDN_SPECS = [GdnRecurrentSpec(2, 4, 16, 8, 3), GdnRecurrentSpec(1, 1, 32, 16, 2),
             # the chunked (WY) form: chunks of 8 and 16 rows
             GdnRecurrentSpec(2, 4, 16, 8, 3, chunk=8), GdnRecurrentSpec(1, 1, 32, 16, 2, chunk=16)]
CHUNKED_27B = GdnRecurrentSpec(1, 2, 128, 128, 2, chunk=64)  # Qwen3.5-27B's head dims
CONV_SPECS = [GdnConvSpec(20, 4, 3), GdnConvSpec(16, 2, 2)]  # a channel tail; kernel 2


@pytest.fixture(scope="module")
def gdn_kernels():  # type: ignore[no-untyped-def]
    import os

    os.environ.setdefault("TVM_NUM_THREADS", "2")
    from ninfer.kernels import build_cpu_module

    return build_cpu_module(GDN_SPECS + CONV_SPECS + [CHUNKED_27B])


def _gdn_inputs(spec: GdnRecurrentSpec, slots: list[int], rng: np.random.Generator,
                pos: list[int] | None = None, save: list[int] | None = None
                ) -> list[np.ndarray]:
    n = len(slots)
    f = np.float32
    g, beta = gdn.gating(rng.standard_normal((n, spec.v_heads)),
                         rng.standard_normal((n, spec.v_heads)),
                         np.log(rng.uniform(0.01, 16, spec.v_heads)), np.ones(spec.v_heads))
    return [rng.standard_normal((n, spec.channels)).astype(f),
            np.concatenate([g, beta], axis=1).astype(f),
            np.array(pos or [5] * n, np.int32), np.array(slots, np.int32),
            np.array(save or [-1] * n, np.int32),
            rng.standard_normal((spec.max_seqs, spec.v_heads, spec.k_dim, spec.v_dim)).astype(f)]


@pytest.mark.parametrize("spec", GDN_SPECS, ids=lambda s: s.name())
@pytest.mark.parametrize(("slots", "pos", "save"), [
    ([0], None, None), ([1] * 7, None, None), ([1, 0, 0, 1, 0, 1, 1, 0], None, None),
    # slot 1 starts a new sequence at its third row, slot 0 at its first
    ([1, 0, 1, 1, 0, 1], [3, 0, 4, 0, 1, 1], None),
    # a prompt run from position 5 across chunk boundaries (segments 3, 8, 8, 16, ...), a
    # decode row of slot 0 in between, slot 2 restarting at 0 with a run of 21
    ([1] * 27 + [0] + [1] * 14 + [2] * 21, [*range(5, 32), 40, *range(32, 46), *range(21)],
     None),
    # a verify step: slot 0's last token and 4 drafts, the states after the first two kept
    # in slots 1 and 2 (clamped to 1 in a 2-slot pool)
    ([0] * 5, [*range(9, 14)], [1, 2, -1, -1, -1])],
    ids=["decode", "prefill", "mixed", "restart", "chunks", "verify"])
def test_gdn_recurrent_kernel_matches_reference(gdn_kernels, spec: GdnRecurrentSpec,  # type: ignore[no-untyped-def]
                                                slots: list[int], pos: list[int] | None,
                                                save: list[int] | None) -> None:
    import tvm

    from ninfer.kernels import reference
    from ninfer.kernels.reference import gdn_recurrent_states

    inputs = _gdn_inputs(spec, slots, np.random.default_rng(len(slots) + spec.k_dim), pos, save)
    want_out = reference(spec, *inputs)
    want_state = gdn_recurrent_states(spec, *inputs)
    args = [tvm.runtime.tensor(a) for a in inputs]
    out = tvm.runtime.tensor(np.full(want_out.shape, np.nan, np.float32))
    gdn_kernels[spec.name()](*args, out)
    for got, want, what in ((out.numpy(), want_out, "out"), (args[5].numpy(), want_state,
                                                              "state")):
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 2e-6, f"{spec.name()} {what}: relative error {err:.3g}"
    written = {min(s, spec.max_seqs - 1) for s in slots + [v for v in save or [] if v >= 0]}
    untouched = sorted(set(range(spec.max_seqs)) - written)
    assert np.array_equal(args[5].numpy()[untouched], inputs[5][untouched])


@pytest.mark.parametrize("spec", [*GDN_SPECS[2:], CHUNKED_27B], ids=lambda s: s.name())
def test_saved_states_are_the_bits_of_decoding_row_by_row(gdn_kernels,  # type: ignore[no-untyped-def]
                                                          spec: GdnRecurrentSpec) -> None:
    """Speculative decoding's verify step: a sequence's last token and 3 drafts in one call,
    the state after each of the first three rows saved into slot 1. Each saved state, and
    every output row, is bitwise what plain decoding (one row per call) gives at that point,
    even in the chunked kernel (a saved row ends its segment, so these run row by row), so
    accepting j drafts continues exactly as plain decoding would."""
    pos = [*range(40, 44)]
    for j in range(3):  # the state after row j goes to slot 1
        save = [-1] * 4
        save[j] = 1
        inputs = _gdn_inputs(spec, [0] * 4, np.random.default_rng(7), pos, save)
        out, state = _run_gdn(gdn_kernels, spec, inputs)
        plain_state, plain_out = inputs[5], []
        for i in range(4):
            o, plain_state = _run_gdn(gdn_kernels, spec, [a[i:i + 1] for a in inputs[:4]]
                                      + [np.array([-1], np.int32), plain_state])
            plain_out.append(o[0])
            if i == j:
                assert np.array_equal(state[1], plain_state[0]), f"state after row {j}"
        assert np.array_equal(out, np.stack(plain_out))
        assert np.array_equal(state[0], plain_state[0])


def _run_gdn(ex, spec: GdnRecurrentSpec, inputs: list[np.ndarray]  # type: ignore[no-untyped-def]
             ) -> tuple[np.ndarray, np.ndarray]:
    import tvm

    args = [tvm.runtime.tensor(a) for a in inputs]
    out = tvm.runtime.tensor(np.full((len(inputs[0]), spec.v_heads, spec.v_dim), np.nan,
                                     np.float32))
    ex[spec.name()](*args, out)
    return out.numpy(), args[5].numpy()


def test_chunked_delta_rule_matches_the_recurrence_at_27b_head_dims(gdn_kernels) -> None:  # type: ignore[no-untyped-def]
    """The chunked (WY, 64-row) kernel at Qwen3.5-27B's 128 x 128 heads over a prompt run
    from position 37 (segments of 27, 64 and 59 rows: boundaries that are not multiples of
    64 from the run's start), then 3 decode rows: against the float64 recurrence, and the
    same input split at position 64 into two calls gives the same bits (the segments are
    cut at absolute positions, so a schedule whose steps end there changes nothing)."""
    from ninfer.kernels import reference
    from ninfer.kernels.reference import gdn_recurrent_states

    spec = CHUNKED_27B
    pos = [*range(37, 187), 187, 188, 189]
    inputs = _gdn_inputs(spec, [1] * len(pos), np.random.default_rng(27), pos)
    out, state = _run_gdn(gdn_kernels, spec, inputs)
    for got, want, what in ((out, reference(spec, *inputs), "out"),
                            (state, gdn_recurrent_states(spec, *inputs), "state")):
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 2e-6, f"{what}: relative error {err:.3g}"
    cut = 64 - 37
    first, mid = _run_gdn(gdn_kernels, spec, [a[:cut] for a in inputs[:5]] + [inputs[5]])
    second, end = _run_gdn(gdn_kernels, spec, [a[cut:] for a in inputs[:5]] + [mid])
    assert np.array_equal(np.concatenate([first, second]), out)
    assert np.array_equal(end, state)
    # cut inside a chunk instead: still the same rule, not the same bits
    first, mid = _run_gdn(gdn_kernels, spec, [a[:50] for a in inputs[:5]] + [inputs[5]])
    second, end = _run_gdn(gdn_kernels, spec, [a[50:] for a in inputs[:5]] + [mid])
    np.testing.assert_allclose(np.concatenate([first, second]), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", CONV_SPECS, ids=lambda s: s.name())
@pytest.mark.parametrize(("slots", "pos", "save"), [
    ([2], None, None), ([0] * 6, None, None), ([1, 0, 0, 1, 2, 1, 1, 0], None, None),
    ([0, 1, 0, 1, 0], [0, 7, 1, 0, 2], None),
    # a verify step of slot 0 (the states after its first two rows kept in slots 1 and 2)
    ([0] * 4, [*range(6, 10)], [1, 2, -1, -1])],
    ids=["decode", "prefill", "mixed", "restart", "verify"])
def test_gdn_conv_kernel_matches_reference(gdn_kernels, spec: GdnConvSpec,  # type: ignore[no-untyped-def]
                                            slots: list[int], pos: list[int] | None,
                                            save: list[int] | None) -> None:
    import tvm

    from ninfer.kernels import reference
    from ninfer.kernels.reference import gdn_conv_states

    rng = np.random.default_rng(len(slots) + spec.channels)
    f = np.float32
    inputs = [rng.standard_normal((len(slots), spec.channels)).astype(f),
              rng.standard_normal((spec.channels, spec.kernel)).astype(f),
              np.array(pos or [9] * len(slots), np.int32), np.array(slots, np.int32),
              np.array(save or [-1] * len(slots), np.int32),
              rng.standard_normal((spec.max_seqs, spec.kernel - 1, spec.channels)).astype(f)]
    want_out, want_state = reference(spec, *inputs), gdn_conv_states(spec, *inputs)
    ex = gdn_kernels
    args = [tvm.runtime.tensor(a) for a in inputs]
    out = tvm.runtime.tensor(np.full(want_out.shape, np.nan, f))
    ex[spec.name()](*args, out)
    np.testing.assert_allclose(out.numpy(), want_out, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(args[5].numpy(), want_state.astype(f))  # moved, not computed
    # slot 2 of a 2-slot pool is clamped to slot 1, as in the reference
    written = {min(s, spec.max_seqs - 1) for s in slots + [v for v in save or [] if v >= 0]}
    untouched = sorted(set(range(spec.max_seqs)) - written)
    assert np.array_equal(args[5].numpy()[untouched], inputs[5][untouched])


GATE_SPEC, NORM_SPECS = GdnGateSpec(6), [GdnNormSpec(3, 16), GdnNormSpec(2, 12, 1e-5)]


def test_gdn_gate_and_norm_kernels_match_reference() -> None:
    """Gates over a wide range (softplus's both asymptotes, exp flushed to 0 past -87) and
    the output norm, with a head width that is not a multiple of the vector lanes."""
    import os

    import tvm

    os.environ.setdefault("TVM_NUM_THREADS", "2")
    from ninfer.kernels import build_cpu_module, reference

    ex = build_cpu_module([GATE_SPEC, *NORM_SPECS])
    rng = np.random.default_rng(9)
    f = np.float32
    H = GATE_SPEC.v_heads
    ba = (rng.standard_normal((7, 2 * H)) * 4).astype(f)
    ba[0] = [-200, -30, -1e-3, 0, 30, 200] * 2
    params = [np.log(rng.uniform(0.01, 16, H)).astype(f), rng.uniform(0.5, 1.5, H).astype(f)]
    out = tvm.runtime.tensor(np.full((7, 2 * H), np.nan, f))
    ex[GATE_SPEC.name()](*(tvm.runtime.tensor(a) for a in [ba, *params]), out)
    np.testing.assert_allclose(out.numpy(), reference(GATE_SPEC, ba, *params), rtol=3e-6,
                               atol=1e-30)
    for spec in NORM_SPECS:
        width = spec.v_heads * spec.v_dim
        args = [rng.standard_normal((5, width)).astype(f) * 3,
                rng.standard_normal((5, width)).astype(f) * 3,
                rng.uniform(0.5, 1.5, spec.v_dim).astype(f)]
        got = tvm.runtime.tensor(np.full((5, width), np.nan, f))
        ex[spec.name()](*(tvm.runtime.tensor(a) for a in args), got)
        np.testing.assert_allclose(got.numpy(), reference(spec, *args), rtol=3e-6, atol=3e-6)


def test_gdn_layer_from_the_cpu_kernels_matches_the_reference() -> None:
    """conv -> gates -> recurrence -> norm, projections in numpy, over two sequences: a
    prefill chunk of each, then decode rows of both in one step, from the slots the kernels
    carried; against gdn_layer per sequence."""
    import os

    import tvm

    os.environ.setdefault("TVM_NUM_THREADS", "2")
    from ninfer.kernels import build_cpu_module

    d, seqs = DIMS, 2
    conv = GdnConvSpec(d.conv_dim, d.conv_kernel, seqs)
    gate, norm = GdnGateSpec(d.v_heads), GdnNormSpec(d.v_heads, d.v_dim, d.eps)
    rec = GdnRecurrentSpec(d.k_heads, d.v_heads, d.k_dim, d.v_dim, seqs)
    ex = build_cpu_module([conv, gate, norm, rec])
    rng = np.random.default_rng(12)
    w = _weights(d, rng)
    f = np.float32
    conv_state = tvm.runtime.tensor(np.zeros((seqs, d.conv_kernel - 1, d.conv_dim), f))
    ssm = tvm.runtime.tensor(np.zeros((seqs, d.v_heads, d.k_dim, d.v_dim), f))
    T = tvm.runtime.tensor

    def step(x: np.ndarray, slots: list[int], pos: list[int]) -> np.ndarray:
        n = len(x)
        slot, p = T(np.array(slots, np.int32)), T(np.array(pos, np.int32))
        save = T(np.full(n, -1, np.int32))
        mixed = T(np.zeros((n, d.conv_dim), f))
        ex[conv.name()](T((x @ w["in_proj_qkv"].T).astype(f)),
                        T(w["conv1d"][:, 0].astype(f)), p, slot, save, conv_state, mixed)
        gb = T(np.zeros((n, 2 * d.v_heads), f))
        ba = np.concatenate([x @ w["in_proj_b"].T, x @ w["in_proj_a"].T], axis=1).astype(f)
        ex[gate.name()](T(ba), T(w["A_log"].astype(f)), T(w["dt_bias"].astype(f)), gb)
        o = T(np.zeros((n, d.v_heads, d.v_dim), f))
        ex[rec.name()](mixed, gb, p, slot, save, ssm, o)
        y = T(np.zeros((n, d.value_width), f))
        ex[norm.name()](T(o.numpy().reshape(n, -1)), T((x @ w["in_proj_z"].T).astype(f)),
                        T(w["norm"].astype(f)), y)
        return y.numpy() @ w["out_proj"].T

    xs = [rng.standard_normal((9, d.hidden)), rng.standard_normal((6, d.hidden))]
    # the states start as garbage: position 0 must not read them
    conv_state.copyfrom(rng.standard_normal(conv_state.shape).astype(f))
    ssm.copyfrom(rng.standard_normal(ssm.shape).astype(f))
    got = [[step(xs[0][:7], [0] * 7, list(range(7)))], [step(xs[1][:4], [1] * 4, list(range(4)))]]
    for t in range(2):  # decode rows of both sequences in one step
        y = step(np.stack([xs[0][7 + t], xs[1][4 + t]]), [0, 1], [7 + t, 4 + t])
        got[0].append(y[:1])
        got[1].append(y[1:])
    for s in range(seqs):
        want, _ = gdn.gdn_layer(xs[s], w, d, gdn.GdnState.zeros(d))
        have = np.concatenate(got[s])
        err = np.linalg.norm(have - want) / np.linalg.norm(want)
        assert err < 1e-5, f"sequence {s}: relative error {err:.3g}"


def test_split_gated_query_is_the_attention_s_own_split() -> None:
    rng = np.random.default_rng(13)
    H, hd, hidden = 3, 8, 10
    w = rng.standard_normal((H * 2 * hd, hidden))
    x = rng.standard_normal((4, hidden))
    q_w, g_w = gdn.split_gated_query(w, H, hd)
    qg = (x @ w.T).reshape(4, H, 2 * hd)  # how gated_attention (and transformers) split it
    np.testing.assert_allclose(x @ q_w.T, qg[..., :hd].reshape(4, -1), rtol=1e-12)
    np.testing.assert_allclose(x @ g_w.T, qg[..., hd:].reshape(4, -1), rtol=1e-12)
    with pytest.raises(ValueError, match="not 3 heads"):
        gdn.split_gated_query(w[:-1], H, hd)


def test_moe_hybrid_model_matches_transformers() -> None:
    """A tiny Qwen3-Next (fused GDN projections, sparse MoE blocks with a gated shared
    expert, layer 2 a dense MLP by mlp_only_layers) against its logits."""
    pytest.importorskip("torch")
    from transformers import Qwen3NextForCausalLM

    cfg = _hf_config("Qwen3NextConfig")
    cfg.tie_word_embeddings = False
    cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = 6, 2, 24
    cfg.shared_expert_intermediate_size, cfg.decoder_sparse_step = 20, 1
    cfg.mlp_only_layers, cfg.norm_topk_prob = [2], True
    want, weights, fields, ids = _run_hf(Qwen3NextForCausalLM, cfg, 2, 23)
    assert [gdn.is_sparse_layer(fields, i) for i in range(4)] == [True, True, False, True]
    got = gdn.hybrid_logits(fields, weights, ids)
    assert _rel_err(got, want) < 1e-5, f"relative error {_rel_err(got, want):.3g}"
    # checkpoints on disk name each expert's tensors (transformers fuses them at load)
    per_expert = {}
    for name, t in weights.items():
        if name.endswith("experts.gate_up_proj"):
            base, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                per_expert[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
                per_expert[f"{base}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                per_expert[f"{name.removesuffix('down_proj')}{e}.down_proj.weight"] = t[e]
        else:
            per_expert[name] = t
    np.testing.assert_allclose(gdn.hybrid_logits(fields, per_expert, ids), got, rtol=1e-12,
                               atol=1e-12)
