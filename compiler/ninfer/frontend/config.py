"""Hugging Face `config.json` -> frozen `ModelConfig` (unknown keys kept aside, never lost)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


class FrontendError(ValueError):
    """The checkpoint cannot be compiled: unsupported, incomplete or inconsistent."""


ROPE_KINDS = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # one of ROPE_KINDS
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn (transformers' _compute_yarn_parameters): the ramp between extrapolated and
    # interpolated frequencies, and the factor cos and sin are scaled by.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    # the fraction of each head that is rotated (Qwen3.5's partial_rotary_factor)
    partial_factor: float = 1.0

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> RopeConfig:
        # transformers >= 5 writes `rope_parameters`; older checkpoints `rope_theta`
        # plus an optional `rope_scaling` dict.
        params = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        merged = {**scaling, **params}
        theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
        kind = merged.get("rope_type", merged.get("type", "default"))
        if kind not in ROPE_KINDS:
            raise FrontendError(
                f"config.json: rope type '{kind}' is not supported (supported: "
                f"{', '.join(ROPE_KINDS)})")
        partial = float(merged.get("partial_rotary_factor",
                                   cfg.get("partial_rotary_factor", 1.0)))
        if not 0 < partial <= 1:
            raise FrontendError(f"config.json: partial_rotary_factor {partial} must be in (0, 1]")
        if kind == "yarn":
            return dataclasses.replace(cls._yarn(float(theta), merged, cfg),
                                       partial_factor=partial)
        return cls(
            partial_factor=partial,
            theta=float(theta),
            kind=kind,
            factor=float(merged.get("factor", 1.0)),
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            original_max_position=int(merged.get("original_max_position_embeddings", 8192)),
        )

    @classmethod
    def _yarn(cls, theta: float, p: dict[str, Any], cfg: dict[str, Any]) -> RopeConfig:
        """The parameters as transformers resolves them (standardize_rope_params, then
        _compute_yarn_parameters)."""
        max_pos = int(cfg.get("max_position_embeddings", 4096))
        # A top-level original_max_position_embeddings (Phi-3 style) takes priority.
        original = int(cfg.get("original_max_position_embeddings")
                       or p.get("original_max_position_embeddings") or max_pos)
        if p.get("factor") is None:  # transformers refuses it too
            raise FrontendError("config.json: yarn rope scaling needs a 'factor'")
        factor = float(p["factor"])
        if factor < 1.0:
            raise FrontendError(f"config.json: yarn rope factor {factor} must be at least 1")

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = p.get("attention_factor")
        if attention is None:
            m, m_all = p.get("mscale"), p.get("mscale_all_dim")
            attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        return cls(theta=theta, kind="yarn", factor=factor, original_max_position=original,
                   beta_fast=float(p.get("beta_fast") or 32.0),
                   beta_slow=float(p.get("beta_slow") or 1.0),
                   truncate=bool(p.get("truncate", True)), attention_factor=float(attention))


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    hidden_act: str
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if isinstance(cfg.get("text_config"), dict) and archs and str(archs[0]).endswith(
                "ForConditionalGeneration"):
            # a multimodal checkpoint (Qwen3.5): the language model's fields are nested
            cfg = {**cfg["text_config"], "architectures": archs,
                   **{k: cfg[k] for k in ("tie_word_embeddings",) if k in cfg}}
        if len(archs) != 1:
            raise FrontendError(f"config.json: expected exactly one entry in 'architectures', "
                                f"got {archs!r}")

        def need(key: str) -> Any:
            if key not in cfg:
                raise FrontendError(f"config.json: missing required field '{key}'")
            return cfg[key]

        heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        values: dict[str, Any] = dict(
            architecture=archs[0],
            model_type=str(cfg.get("model_type", "")),
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            # a model whose every MLP is a sparse MoE block (Qwen3.5-MoE) has no dense size
            intermediate_size=int(cfg["intermediate_size"] if "intermediate_size" in cfg
                                  else need("moe_intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            hidden_act=str(cfg.get("hidden_act", "silu")),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
        consumed = {"architectures", "num_attention_heads", "num_hidden_layers",
                    "num_key_value_heads", "eos_token_id", "rope_theta", "rope_scaling",
                    "rope_parameters", "dtype", *values}
        values["extra"] = {k: v for k, v in cfg.items() if k not in consumed}
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if self.hidden_act != "silu":
            raise FrontendError(f"config.json: hidden_act '{self.hidden_act}' is not supported "
                                "(supported: silu)")
        if self.num_heads % self.num_kv_heads:
            raise FrontendError(f"config.json: num_attention_heads ({self.num_heads}) is not a "
                                f"multiple of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise FrontendError(f"config.json: head_dim ({self.head_dim}) must be even for RoPE")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and f.name.endswith(
                    ("_size", "_layers", "_heads", "head_dim")) and v <= 0:
                raise FrontendError(f"config.json: '{f.name}' must be positive, got {v}")
