"""Small deterministic checkpoints the project makes itself (no downloads).

`write_demo_checkpoint` writes the embedded default model: a small Qwen3-style decoder
trained (torch, CPU, about a minute; see `ninfer.demo.train`) on the conversations of the
bundled `corpus.txt`, rendered with its Qwen chat template, with a byte-level BPE
tokenizer that also learned the corpus's words. It answers the corpus's questions in
English. The training is deterministic and cached: a directory whose `ninfer-demo.json`
records the current `demo_digest` (corpus, config, tokenizer, template, training code,
torch version) is returned as it is. `trained=False` writes the seeded random
initialization instead (no torch needed; tests that want random weights).
`write_tokenizer_files` is shared with the tests, which build their checkpoints with
transformers and attach the same tokenizers.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ninfer.demo import chat_templates
from ninfer.demo.tokenizer import make_tokenizer

Style = Literal["qwen", "llama3"]

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}


def write_tokenizer_files(directory: Path, style: Style, vocab_size: int = 2048,
                          extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write tokenizer.json + tokenizer_config.json; return special-token facts
    (`bos_token_id`, `eos_token_id` list, `vocab_size`) for the model config. `extra`:
    more tokenizer training text (see `make_tokenizer`)."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(style, vocab_size, extra)
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


# The demo's words weigh this many times in the tokenizer's training (against the generated
# corpus's few hundred KB), so that nearly every corpus word is one token.
TOKENIZER_CORPUS_WEIGHT = 32
STAMP = "ninfer-demo.json"


def _corpus_texts() -> tuple[str, ...]:
    from ninfer.demo.train import conversations

    return tuple(m["content"] for conv in conversations() for m in conv)


def random_tensors(cfg: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """The seeded random initialization (normal, std 0.02; norms at 1) of a Qwen3 config
    with tied embeddings."""
    rng = np.random.default_rng(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    vocab = cfg["vocab_size"]

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
    return tensors


def demo_digest(seed: int = 0, trained: bool = True) -> str:
    """What the demo checkpoint's files are made from: the corpus, this module and the
    training code (config, tokenizer, template, recipe), the seed, and for trained weights
    the torch version."""
    from ninfer.demo import tokenizer, train

    h = hashlib.sha256()
    parts = [train.corpus_text(), inspect.getsource(chat_templates), inspect.getsource(tokenizer),
             inspect.getsource(train), json.dumps(DEMO_CONFIG, sort_keys=True), f"seed {seed}",
             f"trained {trained}"]
    if trained:
        try:
            parts.append(f"torch {version('torch')}")
        except PackageNotFoundError:
            parts.append("torch missing")
    for part in (*parts, _module_source()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _module_source() -> str:
    return Path(__file__).read_text(encoding="utf-8")


def is_cached(directory: Path, seed: int = 0, trained: bool = True) -> bool:
    """Whether `directory` holds the demo checkpoint of the current digest."""
    stamp = Path(directory) / STAMP
    if not stamp.exists() or not (Path(directory) / "model.safetensors").exists():
        return False
    return bool(json.loads(stamp.read_text()).get("digest") == demo_digest(seed, trained))


def write_demo_checkpoint(directory: Path, seed: int = 0, trained: bool = True,
                          progress: Callable[[str], None] | None = None) -> Path:
    """The embedded default checkpoint (see the module docstring); byte-identical for a given
    seed (and, trained, the same machine and torch). Returns at once when cached."""
    directory = Path(directory)
    if is_cached(directory, seed, trained):
        return directory
    if trained:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "the embedded demo model is trained on first use and needs torch: install "
                "ninfer's 'demo' extra (scripts/setup.sh does), or pass --model") from exc
    # One writer at a time (training takes minutes): a second caller waits, then finds the
    # first one's checkpoint. A failed or interrupted write leaves no partial directory.
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(f"{directory.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_cached(directory, seed, trained):
            return directory
        tmp = directory.with_name(f"{directory.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _write(tmp, seed, trained, progress)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
    return directory


def _write(tmp: Path, seed: int, trained: bool,
           progress: Callable[[str], None] | None) -> None:
    from safetensors.numpy import save_file

    texts = _corpus_texts()
    facts = write_tokenizer_files(tmp, "qwen", extra=texts * TOKENIZER_CORPUS_WEIGHT)
    vocab = (facts["vocab_size"] + 63) // 64 * 64
    cfg = {**DEMO_CONFIG, "vocab_size": vocab, "bos_token_id": facts["bos_token_id"],
           "eos_token_id": facts["eos_token_id"]}
    tensors = random_tensors(cfg, seed)
    if trained:
        tensors = _train(tmp, cfg, tensors, progress)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": facts["eos_token_id"], "bos_token_id": facts["bos_token_id"]}, indent=2))
    (tmp / STAMP).write_text(json.dumps({"digest": demo_digest(seed, trained),
                                         "trained": trained, "seed": seed}, indent=2))


def _train(directory: Path, cfg: dict[str, Any], init: dict[str, np.ndarray],
           progress: Callable[[str], None] | None) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    from ninfer.demo import train

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    eos, pad = tok.token_to_id(chat_templates.QWEN_EOS), tok.token_to_id("<|endoftext|>")
    assert eos is not None and pad is not None
    data = train.examples(train.conversations(), chat_templates.DEMO_TRAIN_TEMPLATE,
                          lambda text: tok.encode(text).ids, eos)
    return train.train(cfg, init, data, pad, progress)
