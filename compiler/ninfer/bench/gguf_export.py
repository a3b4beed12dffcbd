"""Hugging Face checkpoint -> GGUF, for running the same weights through llama.cpp.

`export_gguf(checkpoint_dir, out_path, qtype)` converts a Llama / Mistral / Qwen2 / Qwen3
checkpoint (config.json + safetensors + tokenizer.json, read with the frontend) into a GGUF
file that llama.cpp loads: its architecture metadata, a gpt2-style BPE vocabulary (tokens,
merges, token types, special ids, chat template) and the tensors under llama.cpp's names.

qtype: F32, F16, BF16, Q8_0 or Q4_0. Norm weights, biases and rope factors stay F32 (as
llama.cpp's converter keeps them); every 2-D matrix, token embedding and output head
included, gets `qtype` ("pure" quantization: llama-quantize would give the output head
Q6_K; here every matrix shares the format, so a comparison against one of our weight
formats is like for like). A matrix whose rows do not split into whole quantization blocks
falls back to F16, as llama.cpp's converter does.

Rotary conventions: Hugging Face rotates pairs (i, i + d/2) of each head ("NEOX" rope).
llama.cpp's `llama` architecture rotates adjacent pairs (2i, 2i + 1), so for it the rows of
q and k (and their biases) are permuted per head, as convert_hf_to_gguf.py does; `qwen2`
and `qwen3` use NEOX rope in llama.cpp and take the weights as they are. Llama-3 rope
scaling is written as a `rope_freqs` tensor of per-frequency divisors; linear scaling as
the rope scaling metadata.

Needs the `gguf` package (`pip install -e .[bench]`); imported on call, not with ninfer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.frontend.checkpoint import Checkpoint, open_checkpoint
from ninfer.frontend.config import FrontendError, ModelConfig
from ninfer.frontend.llama import HF_NAMES

QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")

# Hugging Face architecture -> llama.cpp architecture name.
GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# Our frontend's weight roles (frontend/llama.py HF_NAMES) -> llama.cpp tensor names.
GGUF_NAMES = {
    "embed": "token_embd.weight",
    "final_norm": "output_norm.weight",
    "lm_head": "output.weight",
    "input_norm": "blk.{i}.attn_norm.weight",
    "q": "blk.{i}.attn_q.weight",
    "k": "blk.{i}.attn_k.weight",
    "v": "blk.{i}.attn_v.weight",
    "q_bias": "blk.{i}.attn_q.bias",
    "k_bias": "blk.{i}.attn_k.bias",
    "v_bias": "blk.{i}.attn_v.bias",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "o": "blk.{i}.attn_output.weight",
    "post_norm": "blk.{i}.ffn_norm.weight",
    "gate": "blk.{i}.ffn_gate.weight",
    "up": "blk.{i}.ffn_up.weight",
    "down": "blk.{i}.ffn_down.weight",
}
GLOBAL_ROLES = ("embed", "final_norm", "lm_head")
LAYER_ROLES = tuple(r for r in GGUF_NAMES if r not in GLOBAL_ROLES)

# llama.cpp token types (gguf.TokenType).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def _permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of each head from HF's (i, i + d/2) rotary pairing to llama.cpp's (2i, 2i+1)."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg: ModelConfig) -> np.ndarray:
    """Per-frequency divisors for Llama-3 rope scaling (llama.cpp's rope_freqs tensor)."""
    rope, dim = cfg.rope, cfg.head_dim
    freqs = 1.0 / (rope.theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(rope.factor)
        else:
            smooth = ((rope.original_max_position / wavelen - rope.low_freq_factor)
                      / (rope.high_freq_factor - rope.low_freq_factor))
            factors.append(1.0 / ((1 - smooth) / rope.factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _tensors(ckpt: Checkpoint, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(llama.cpp name, float32 array) for every tensor, in llama.cpp's usual order."""
    cfg = ckpt.config

    def present(role: str, i: int = 0) -> str | None:
        name = HF_NAMES[role].format(i=i)
        return name if name in ckpt.tensors else None

    yield GGUF_NAMES["embed"], ckpt.load(HF_NAMES["embed"])
    if arch == "llama" and cfg.rope.kind == "llama3":
        yield "rope_freqs.weight", llama3_rope_factors(cfg)
    for i in range(cfg.num_layers):
        for role in LAYER_ROLES:
            src = present(role, i)
            if src is None:
                continue
            data = ckpt.load(src)
            if arch == "llama" and role in ("q", "q_bias"):
                data = _permute_rope_rows(data, cfg.num_heads)
            elif arch == "llama" and role in ("k", "k_bias"):
                data = _permute_rope_rows(data, cfg.num_kv_heads)
            yield GGUF_NAMES[role].format(i=i), data
    yield GGUF_NAMES["final_norm"], ckpt.load(HF_NAMES["final_norm"])
    if not cfg.tie_word_embeddings and present("lm_head"):
        yield GGUF_NAMES["lm_head"], ckpt.load(HF_NAMES["lm_head"])


def _merges(model: dict[str, Any]) -> list[str]:
    # tokenizers >= 0.20 writes merges as [left, right] pairs, older ones as "left right".
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def _pre_tokenizer_name(tok: dict[str, Any]) -> str:
    """llama.cpp's pre-tokenizer for the split regex of tokenizer.json (default if unknown)."""
    patterns: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "Split" and isinstance(node.get("pattern"), dict):
                patterns.append(str(node["pattern"].get("Regex", "")))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tok.get("pre_tokenizer"))
    for pattern in patterns:
        if r"\p{N}{1,3}" in pattern:
            return "llama-bpe"
        if r"\p{N}|" in pattern or pattern.endswith(r"\p{N}"):
            return "qwen2"
    return "default"


def _template_adds_bos(post: Any) -> bool:
    """Whether a TemplateProcessing post-processor (alone or in a Sequence) starts a single
    sequence with a special token, as Llama 3's prepends <|begin_of_text|>."""
    if not isinstance(post, dict):
        return False
    if post.get("type") == "Sequence":
        return any(_template_adds_bos(p) for p in post.get("processors", []))
    single = post.get("single") or [] if post.get("type") == "TemplateProcessing" else []
    return bool(single) and "SpecialToken" in single[0]


def vocabulary(ckpt: Checkpoint) -> dict[str, Any]:
    """The gpt2-style vocabulary llama.cpp reads: tokens, types and merges over the model's
    whole vocab (ids the tokenizer never produces become [PADn] tokens), special ids."""
    tok = ckpt.tokenizer_json
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise FrontendError(f"{ckpt.directory}: GGUF export needs a BPE tokenizer.json "
                            f"(got {model.get('type')!r})")
    n_vocab = ckpt.config.vocab_size
    tokens: list[str | None] = [None] * n_vocab
    types = [TOKEN_UNUSED] * n_vocab
    for text, idx in model["vocab"].items():
        if idx < n_vocab:
            tokens[idx], types[idx] = text, TOKEN_NORMAL
    by_content: dict[str, int] = {}
    for added in tok.get("added_tokens", []):
        idx, text = int(added["id"]), str(added["content"])
        by_content[text] = idx
        if idx < n_vocab:
            tokens[idx] = text
            types[idx] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    names = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]

    tcfg = ckpt.tokenizer_config

    def special_id(key: str) -> int | None:
        value = tcfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return by_content.get(value) if isinstance(value, str) else None

    cfg = ckpt.config
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else special_id("eos_token")
    pad = special_id("pad_token")
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else special_id("bos_token")
    add_bos = bool(tcfg["add_bos_token"]) if "add_bos_token" in tcfg else _template_adds_bos(
        tok.get("post_processor"))
    if bos is None:  # llama.cpp would otherwise assume id 11; Qwen's GGUFs use the pad token
        bos = pad if pad is not None else eos
    return {"tokens": names, "types": types, "merges": _merges(model),
            "pre": _pre_tokenizer_name(tok), "bos": bos, "eos": eos, "pad": pad,
            "add_bos": add_bos, "chat_template": tcfg.get("chat_template")}


def export_gguf(checkpoint_dir: str | Path, out_path: str | Path, qtype: str = "F16") -> Path:
    """Write `checkpoint_dir` as a llama.cpp GGUF file at `out_path`; return the path."""
    import gguf

    if qtype not in QTYPES:
        raise ValueError(f"qtype {qtype!r} is not one of {', '.join(QTYPES)}")
    ckpt = open_checkpoint(Path(checkpoint_dir))
    cfg = ckpt.config
    arch = GGUF_ARCH.get(cfg.architecture)
    if arch is None:
        raise FrontendError(f"GGUF export: architecture '{cfg.architecture}' is not supported "
                            f"(supported: {', '.join(sorted(GGUF_ARCH))})")
    if cfg.attention_bias and arch in ("llama", "qwen3"):
        raise FrontendError(f"GGUF export: {cfg.architecture} with attention_bias=true is not "
                            "supported")
    if cfg.extra.get("sliding_window") and cfg.architecture == "MistralForCausalLM":
        raise FrontendError("GGUF export: sliding-window attention is not supported")
    if cfg.rope.kind == "yarn":  # llama.cpp derives its own attention factor
        raise FrontendError("GGUF export: yarn rope scaling is not supported")

    qt = gguf.GGMLQuantizationType
    target = {"F32": qt.F32, "F16": qt.F16, "BF16": qt.BF16, "Q8_0": qt.Q8_0,
              "Q4_0": qt.Q4_0}[qtype]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "BF16": gguf.LlamaFileType.MOSTLY_BF16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype]

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(ckpt.raw_config.get("_name_or_path") or ckpt.directory.name)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope.theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.rope.kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope.factor)

    vocab = vocabulary(ckpt)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    if vocab["bos"] is not None:
        writer.add_bos_token_id(vocab["bos"])
    if vocab["eos"] is not None:
        writer.add_eos_token_id(vocab["eos"])
    if vocab["pad"] is not None:
        writer.add_pad_token_id(vocab["pad"])
    writer.add_add_bos_token(vocab["add_bos"])
    if isinstance(vocab["chat_template"], str):
        writer.add_chat_template(vocab["chat_template"])

    block = gguf.GGML_QUANT_SIZES[target][0]
    for name, data in _tensors(ckpt, arch):
        if data.ndim < 2 or target == qt.F32:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        elif target == qt.F16 or data.shape[-1] % block:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, target), raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def weight_bytes_per_token(gguf_path: str | Path) -> int:
    """Bytes of weights one decode step reads from a GGUF: every tensor but the token
    embedding, of which it reads one row (the whole table when it doubles as the head)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    if "output.weight" in sizes:
        sizes.pop("token_embd.weight", None)
    return sum(sizes.values())
