"""Invariant 1: the compiled server matches transformers (fp32).

Greedy continuations must be token-identical; last-position logits must agree within
LOGIT_TOL relative to the largest reference logit (float32 with a different summation
order: observed ~1e-6).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.e2e

LOGIT_TOL = 1e-4
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "東京は日本の首都です。人口は約1400万人。",
    "Numbers: 3.14159 2.71828 1.41421 and emoji 🙂🚀 in one line",
    "a",
]


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float().numpy()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def hf(any_model):
    return any_model.hf_model(), any_model.hf_tokenizer(), any_model.engine()


def test_checkpoint_dtype_is_the_default_weight_format(any_model):
    """Compiled without --weights, a bf16 checkpoint is served in bf16 and an f16 one in
    f16 (the fixtures' checkpoints: conftest._make_checkpoint)."""
    report = json.loads((any_model.out_dir / "compile_report.json").read_text())
    expected = {"qwen3-tiny": "f32", "llama-tiny": "bf16", "qwen2-tiny": "f16",
                "qwen35-tiny": "f32", "qwen35vl-tiny": "bf16",
                "qwen3next-tiny": "f16"}[any_model.name]
    assert set(report["plan"]["weights"].values()) == {expected}
    assert f"--weights not given: {expected}, the checkpoint's own dtype" in report["notes"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_last_logits_match_transformers(any_model, hf, prompt):
    model, tok, engine = hf
    ids = tok.encode(prompt)
    ref = hf_logits(model, ids)
    got = np.asarray(engine.forward(ids, 0))
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < LOGIT_TOL, f"relative logit error {err:.2e} for {prompt!r}"


def test_decode_step_logits_match_transformers(any_model, hf):
    """Prefill all but the last token, then one decode step (the GEMV path)."""
    model, tok, engine = hf
    ids = tok.encode(PROMPTS[1])  # long enough for several prefill chunks
    assert len(ids) > 16
    engine.forward(ids[:-1], 0)
    got = np.asarray(engine.forward(ids[-1:], len(ids) - 1))
    ref = hf_logits(model, ids)
    assert np.abs(got - ref).max() / np.abs(ref).max() < LOGIT_TOL


@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_greedy_32_tokens_identical_through_server(any_model, hf, prompt):
    from ninfer.runtime import Server

    model, tok, _ = hf
    ids = tok.encode(prompt)
    expected = hf_greedy(model, ids, 32)
    eos = set(any_model.eos_token_ids)
    if expected and expected[-1] in eos:  # the server does not return the eos token
        expected = expected[:-1]
    with Server(any_model.out_dir, threads=2) as srv:
        r = srv.client.post("/v1/completions", json={
            "prompt": ids, "max_tokens": 32, "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == ids
    assert body["choices"][0]["token_ids"] == expected
    assert body["choices"][0]["text"] == tok.decode(expected, skip_special_tokens=True)


def test_text_prompt_tokenized_as_hugging_face_does(any_model, hf):
    """The server applies the tokenizer's post-processor (e.g. Llama's BOS) like HF."""
    from ninfer.runtime import Server

    _, tok, _ = hf
    with Server(any_model.out_dir, threads=1) as srv:
        for prompt in PROMPTS:
            r = srv.client.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": 1, "return_token_ids": True})
            assert r.json()["prompt_token_ids"] == tok.encode(prompt)


def test_yarn_rope_scaling_matches_transformers(qwen3_yarn_model):
    """YaRN (rope_type yarn): logits at positions past the original context, where the
    interpolated frequencies and the attention factor matter, prefill and decode."""
    model = qwen3_yarn_model.hf_model()
    assert model.model.rotary_emb.rope_type == "yarn"
    tok = qwen3_yarn_model.hf_tokenizer()
    engine = qwen3_yarn_model.engine()
    ids = (tok.encode(" ".join(PROMPTS)) * 8)[:200]
    assert len(ids) == 200  # > 64 original positions, < 256 compiled
    ref = hf_logits(model, ids)
    got = np.asarray(engine.forward(ids, 0))
    assert np.abs(got - ref).max() / np.abs(ref).max() < LOGIT_TOL
    got = np.asarray(engine.forward(ids[-1:], len(ids) - 1))  # rewrite the last position
    assert np.abs(got - ref).max() / np.abs(ref).max() < LOGIT_TOL
