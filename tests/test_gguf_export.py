"""GGUF export (ninfer.bench.gguf_export) for the llama.cpp peer benchmark.

The unit tests need only the `gguf` package; the parity tests load the exported F32 GGUF
with llama-cpp-python and compare it with transformers on the tiny test checkpoints.
Both come with the `bench` extra (`pip install -e .[bench]`); without it they are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ninfer.bench.gguf_export import export_gguf, llama3_rope_factors, weight_bytes_per_token
from ninfer.demo.checkpoint import write_demo_checkpoint

LOGIT_TOL = 1e-4  # relative to the largest reference logit (observed ~1.4e-6)
GREEDY_STEPS = 16
PROMPT = "The quick brown fox jumps over the lazy dog. def f(x): return x * 2"


def _fields(path: Path) -> tuple[dict, dict]:
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    return fields, tensors


@pytest.fixture(scope="module")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo"), trained=False)


@pytest.mark.unit
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0"])
def test_metadata_and_tensor_names(demo_checkpoint: Path, tmp_path: Path, qtype: str) -> None:
    pytest.importorskip("gguf")
    cfg = json.loads((demo_checkpoint / "config.json").read_text())
    path = export_gguf(demo_checkpoint, tmp_path / f"demo-{qtype}.gguf", qtype)
    fields, tensors = _fields(path)

    assert fields["general.architecture"] == "qwen3"
    file_types = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "BF16": 32}
    assert fields["general.file_type"] == file_types[qtype]
    expect = {
        "qwen3.block_count": cfg["num_hidden_layers"],
        "qwen3.context_length": cfg["max_position_embeddings"],
        "qwen3.embedding_length": cfg["hidden_size"],
        "qwen3.feed_forward_length": cfg["intermediate_size"],
        "qwen3.attention.head_count": cfg["num_attention_heads"],
        "qwen3.attention.head_count_kv": cfg["num_key_value_heads"],
        "qwen3.attention.key_length": cfg["head_dim"],
        "qwen3.attention.value_length": cfg["head_dim"],
        "qwen3.rope.freq_base": cfg["rope_theta"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.eos_token_id": cfg["eos_token_id"][0],
        "tokenizer.ggml.add_bos_token": False,
    }
    for key, value in expect.items():
        assert fields[key] == pytest.approx(value), key
    assert fields["qwen3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6, rel=1e-6)

    tok = json.loads((demo_checkpoint / "tokenizer.json").read_text())
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == len(fields["tokenizer.ggml.token_type"]) == cfg["vocab_size"]
    for text, idx in list(tok["model"]["vocab"].items())[:50]:
        assert tokens[idx] == text
    for added in tok["added_tokens"]:
        assert tokens[added["id"]] == added["content"]
        assert fields["tokenizer.ggml.token_type"][added["id"]] == (3 if added["special"] else 4)
    assert len(fields["tokenizer.ggml.merges"]) == len(tok["model"]["merges"])
    assert all(isinstance(m, str) and m.count(" ") == 1 for m in fields["tokenizer.ggml.merges"])

    per_layer = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                 "attn_k_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
    names = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{t}.weight" for i in range(cfg["num_hidden_layers"]) for t in per_layer}
    assert set(tensors) == names  # tied embeddings: no output.weight
    matrix_type = qtype
    for name, t in tensors.items():
        expect_type = "F32" if len(t.shape) == 1 else matrix_type
        assert t.tensor_type.name == expect_type, name
    # GGUF lists dims innermost first: [in, out] for a [out, in] Hugging Face matrix.
    h, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    assert [int(d) for d in tensors["blk.0.attn_q.weight"].shape] == [h, q]
    assert [int(d) for d in tensors["token_embd.weight"].shape] == [h, cfg["vocab_size"]]
    # tied: the embedding table is read whole as the output head each token
    assert weight_bytes_per_token(path) == sum(int(t.n_bytes) for t in tensors.values())


@pytest.mark.unit
def test_values_round_trip(demo_checkpoint: Path, tmp_path: Path) -> None:
    """F32 is exact, the quantized formats dequantize to within their step size."""
    gguf = pytest.importorskip("gguf")
    from ninfer.frontend.checkpoint import open_checkpoint

    ref = open_checkpoint(demo_checkpoint).load("model.layers.1.mlp.down_proj.weight")
    for qtype, tol in (("F32", 0.0), ("F16", 1e-3), ("BF16", 8e-3), ("Q8_0", 1e-2),
                       ("Q4_0", 0.2)):
        path = export_gguf(demo_checkpoint, tmp_path / f"{qtype}.gguf", qtype)
        t = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}["blk.1.ffn_down.weight"]
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ref.shape)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err <= tol, f"{qtype}: {err:.2e}"


@pytest.mark.unit
def test_llama3_rope_factors_match_transformers() -> None:
    """rope_freqs = original inverse frequencies / transformers' llama3-scaled ones."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ninfer.frontend.config import ModelConfig

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    raw = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=128,
               intermediate_size=256, num_hidden_layers=1, num_attention_heads=4, head_dim=32,
               rope_theta=5e5, rope_scaling=scaling)
    hf_cfg = LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    base = 1.0 / (5e5 ** (np.arange(0, 32, 2, dtype=np.float64) / 32))
    factors = llama3_rope_factors(ModelConfig.from_dict(raw))
    np.testing.assert_allclose(base / factors, scaled.double().numpy(), rtol=1e-5)


# ---------------------------------------------------------------- llama.cpp parity


def _llama(path: Path, n_ctx: int = 256):
    llama_cpp = pytest.importorskip("llama_cpp")
    # f32 KV cache: the default f16 cache alone costs ~1e-3 of relative logit error
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2,
                           logits_all=True, type_k=0, type_v=0, seed=0, verbose=False)


@pytest.mark.e2e
@pytest.mark.parametrize("fixture", ["qwen3_model", "llama_model", "qwen2_model"])
def test_llamacpp_matches_transformers(request: pytest.FixtureRequest, tmp_path: Path,
                                       fixture: str) -> None:
    """The F32 GGUF run by llama.cpp gives transformers' logits and greedy tokens: the
    names, shapes, q/k rope permutation (llama) and rope scaling (llama3) are right."""
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    import torch

    model = request.getfixturevalue(fixture)
    hf, tok = model.hf_model(), model.hf_tokenizer()
    path = export_gguf(model.checkpoint, tmp_path / f"{model.name}-F32.gguf", "F32")
    llm = _llama(path)

    ids = tok.encode(PROMPT)
    assert llm.tokenize(PROMPT.encode(), add_bos=True, special=True) == ids

    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < LOGIT_TOL, f"relative logit error {err:.2e}"

    out: list[int] = []
    for _ in range(GREEDY_STEPS):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    with torch.no_grad():
        gen = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                          dtype=torch.long), max_new_tokens=GREEDY_STEPS, do_sample=False,
                          pad_token_id=0)
    assert out == gen[0, len(ids):].tolist()


@pytest.mark.e2e
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_llamacpp_quantized_matches_dequantized_weights(qwen3_model, tmp_path: Path,
                                                        qtype: str) -> None:
    """Quantized blocks are laid out as llama.cpp reads them: its logits match transformers
    run on the GGUF's own dequantized weights up to llama.cpp's 8-bit activation rounding
    (observed ~3%; a wrong block layout gives ~100%)."""
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    import torch

    from ninfer.bench.gguf_export import GGUF_NAMES
    from ninfer.frontend.llama import HF_NAMES

    path = export_gguf(qwen3_model.checkpoint, tmp_path / f"{qtype}.gguf", qtype)
    hf, tok = qwen3_model.hf_model(), qwen3_model.hf_tokenizer()
    to_hf = {g.format(i=i): HF_NAMES[role].format(i=i)
             for role, g in GGUF_NAMES.items() for i in range(hf.config.num_hidden_layers)}
    state = hf.state_dict()
    types = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        state[to_hf[t.name]] = torch.from_numpy(np.array(w, dtype=np.float32)).reshape(
            state[to_hf[t.name]].shape)
        types.add(t.tensor_type.name)
    assert qtype in types
    hf.load_state_dict(state)

    ids = tok.encode(PROMPT)
    llm = _llama(path)
    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 0.1, f"relative logit error {err:.2e}"
