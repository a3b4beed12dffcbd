"""Small deterministic checkpoints the project makes itself (no downloads).

`write_demo_checkpoint` writes the embedded default model: a random-weight Qwen3-style
decoder (numpy, fixed seed) with a trained byte-level BPE tokenizer and a Qwen chat
template. Its replies are random text; it exists to exercise the whole pipeline.
`write_tokenizer_files` is shared with the tests, which build their checkpoints with
transformers and attach the same tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ninfer.demo import chat_templates
from ninfer.demo.tokenizer import make_tokenizer

Style = Literal["qwen", "llama3"]

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}


def write_tokenizer_files(directory: Path, style: Style, vocab_size: int = 2048) -> dict[str, Any]:
    """Write tokenizer.json + tokenizer_config.json; return special-token facts
    (`bos_token_id`, `eos_token_id` list, `vocab_size`) for the model config."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(style, vocab_size)
    (directory / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    total = max([*tok["model"]["vocab"].values(), *ids.values()]) + 1
    config: dict[str, Any]
    if style == "qwen":
        config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "chat_template": chat_templates.DEMO_TEMPLATE}
        facts = {"bos_token_id": None, "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    else:
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                  "chat_template": chat_templates.LLAMA3_TEMPLATE}
        facts = {"bos_token_id": ids["<|begin_of_text|>"],
                 "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]]}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = 131072
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return {**facts, "vocab_size": total}


def write_demo_checkpoint(directory: Path, seed: int = 0) -> Path:
    """The embedded default checkpoint; byte-identical for a given seed."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    facts = write_tokenizer_files(directory, "qwen")
    vocab = (facts["vocab_size"] + 63) // 64 * 64
    cfg = {**DEMO_CONFIG, "vocab_size": vocab, "bos_token_id": facts["bos_token_id"],
           "eos_token_id": facts["eos_token_id"]}
    rng = np.random.default_rng(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": mat(vocab, h),
               "model.norm.weight": np.ones(h, np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": mat(q, h),
            p + "self_attn.k_proj.weight": mat(kv, h),
            p + "self_attn.v_proj.weight": mat(kv, h),
            p + "self_attn.o_proj.weight": mat(h, q),
            p + "self_attn.q_norm.weight": np.ones(d, np.float32),
            p + "self_attn.k_norm.weight": np.ones(d, np.float32),
            p + "mlp.gate_proj.weight": mat(inter, h),
            p + "mlp.up_proj.weight": mat(inter, h),
            p + "mlp.down_proj.weight": mat(h, inter),
        })
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": facts["eos_token_id"], "bos_token_id": facts["bos_token_id"]}, indent=2))
    return directory
