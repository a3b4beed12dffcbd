"""The float64 reference `ninfer-check` uses where torch and transformers are not installed
(a serving machine often has neither): the model in numpy, read straight from the
checkpoint's safetensors (bf16 included), computing what transformers' modelling code
does, in float64.

Dense Llama / Mistral / Qwen2 / Qwen3: GQA attention with q/k/v biases (Qwen2) and
per-head q/k RMSNorm (Qwen3), rotary embeddings with `default`, `linear` and `llama3`
scaling, SiLU-gated MLPs, tied or separate LM heads. The hybrids (Qwen3.5 dense and MoE,
the multimodal Qwen3.5's text model, Qwen3-Next): kernels.gdn_reference's float64 model
(Gated DeltaNet and gated attention layers, sparse MoE blocks). Anything else (sliding
windows, other rope scalings) is refused with the reason: its reference is transformers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM")
HYBRID_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
                        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                        "Qwen3NextForCausalLM")


class ReferenceError(ValueError):
    """The checkpoint is outside what this reference computes."""


def read_weights(checkpoint: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as float64 (frontend.checkpoint's reader: shards,
    bf16 and f16 widened exactly). Tensors under `model.` (and a multimodal model's
    `model.language_model.`) lose that prefix."""
    from ninfer.frontend.checkpoint import open_checkpoint

    ckpt = open_checkpoint(checkpoint)
    return {name.removeprefix("model.").removeprefix("language_model."):
            ckpt.load(name).astype(np.float64) for name in ckpt.tensors}


def _inv_freq(cfg: dict[str, Any], head_dim: int) -> np.ndarray:
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope["factor"])
    if kind == "llama3":
        factor, low, high = (float(rope[k]) for k in
                             ("factor", "low_freq_factor", "high_freq_factor"))
        old = float(rope["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    raise ReferenceError(f"rope type {kind!r}: not in the float64 reference (its reference "
                         "is transformers)")


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


class HybridFloat64Reference:
    """Log-probabilities of a hybrid checkpoint's text model (kernels.gdn_reference)."""

    def __init__(self, checkpoint: Path, cfg: dict[str, Any]) -> None:
        self.cfg = {**cfg, **cfg.get("text_config", {})}
        self.w = read_weights(checkpoint)
        self.name = f"float64 numpy {cfg['architectures'][0]} (kernels.gdn_reference)"

    def logprobs(self, ids: Sequence[int], start: int) -> np.ndarray:
        from ninfer.kernels.gdn_reference import hybrid_logits

        x = hybrid_logits(self.cfg, self.w, np.asarray(ids))
        return _log_softmax(x[start - 1:len(ids) - 1])


def float64_reference(checkpoint: Path) -> Float64Reference | HybridFloat64Reference:
    """The float64 reference of the checkpoint's architecture, or ReferenceError."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch in HYBRID_ARCHITECTURES:
        return HybridFloat64Reference(checkpoint, cfg)
    return Float64Reference(checkpoint)


class Float64Reference:
    """Log-probabilities of a dense checkpoint's model, in float64 numpy."""

    def __init__(self, checkpoint: Path) -> None:
        cfg = json.loads((checkpoint / "config.json").read_text())
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ReferenceError(f"{arch}: the float64 reference covers "
                                 f"{', '.join(ARCHITECTURES + HYBRID_ARCHITECTURES)}; "
                                 "install torch and transformers for this model's reference")
        if cfg.get("use_sliding_window") or (arch == "MistralForCausalLM"
                                             and cfg.get("sliding_window")):
            raise ReferenceError("sliding-window attention: not in the float64 reference")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ReferenceError(f"activation {cfg['hidden_act']!r}: not in the reference")
        self.cfg = cfg
        self.w = read_weights(checkpoint)
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.inv_freq = _inv_freq(cfg, self.head_dim)
        self.eps = cfg["rms_norm_eps"]
        self.name = f"float64 numpy {arch}"

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        freqs = pos[:, None] * self.inv_freq[None, :]
        cos = np.concatenate([np.cos(freqs)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(freqs)] * 2, axis=-1)[:, None, :]
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def _proj(self, h: np.ndarray, name: str) -> np.ndarray:
        y = h @ self.w[name + ".weight"].T
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """[len(ids), vocab] logits at every position."""
        w, T = self.w, len(ids)
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        pos = np.arange(T, dtype=np.float64)
        x = w["embed_tokens.weight"][np.asarray(ids)]
        causal = np.tril(np.ones((T, T), dtype=bool))
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            h = _rmsnorm(x, w[p + "input_layernorm.weight"], self.eps)
            q = self._proj(h, p + "self_attn.q_proj").reshape(T, H, D)
            k = self._proj(h, p + "self_attn.k_proj").reshape(T, KV, D)
            v = self._proj(h, p + "self_attn.v_proj").reshape(T, KV, D)
            if p + "self_attn.q_norm.weight" in w:  # Qwen3: per-head RMSNorm of q and k
                q = _rmsnorm(q, w[p + "self_attn.q_norm.weight"], self.eps)
                k = _rmsnorm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q, k = self._rope(q, pos), self._rope(k, pos)
            k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
            s = np.einsum("thd,shd->hts", q, k) * D ** -0.5
            s = np.where(causal[None], s, -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", a, v).reshape(T, H * D)
            x = x + self._proj(o, p + "self_attn.o_proj")
            h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            gate = self._proj(h, p + "mlp.gate_proj")
            x = x + self._proj(gate / (1 + np.exp(-gate)) * self._proj(h, p + "mlp.up_proj"),
                               p + "mlp.down_proj")
        x = _rmsnorm(x, w["norm.weight"], self.eps)
        head = w.get("lm_head.weight", w["embed_tokens.weight"])
        return x @ head.T

    def logprobs(self, ids: Sequence[int], start: int) -> np.ndarray:
        """Log-probabilities predicting ids[start:], each having read the ids before it."""
        return _log_softmax(self.logits(ids)[start - 1:len(ids) - 1])
