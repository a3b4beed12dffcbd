"""The typed model graph every architecture file produces, and the blocks they share."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ninfer.frontend.checkpoint import Checkpoint
from ninfer.frontend.config import FrontendError, ModelConfig, RopeConfig


@dataclass(frozen=True)
class WeightSpec:
    """One tensor of the compiled model: our name, its shape, and where it comes from.

    `sources` are checkpoint tensor names; several sources are concatenated along axis 0
    (e.g. gate and up projections become one `gate_up` matrix).
    """

    name: str
    shape: tuple[int, ...]
    sources: tuple[str, ...]
    # embedding | norm | linear | bias | lm_head | param (f32, no matmul) | mtp (stored in
    # the artifact for speculative decoding, not read by the step program)
    role: str
    transform: str = ""  # how the sources become this tensor (the traits' transform)


@dataclass(frozen=True)
class DenseBlockTraits:
    """What distinguishes dense Llama-family decoders from each other."""

    family: ClassVar[str] = "dense"
    qk_norm: bool  # Qwen3: RMSNorm over each q/k head before RoPE
    qkv_bias: bool  # Qwen2: bias on q, k and v projections
    rotary: int = 0  # rotated dims per head (partial rotary); 0: the whole head

    def transform(self, transform: str, parts: list[np.ndarray],
                  config: ModelConfig) -> np.ndarray:
        """A WeightSpec.transform over its loaded sources (a dense decoder has none)."""
        raise ValueError(f"unknown weight transform {transform!r}")


@dataclass(frozen=True)
class ModelGraph:
    config: ModelConfig
    traits: DenseBlockTraits
    weights: tuple[WeightSpec, ...]

    @property
    def family(self) -> str:
        return self.traits.family

    @property
    def rope_dims(self) -> int:
        """Rotated dims per attention head: the rope tables hold half as many columns."""
        return self.traits.rotary or self.config.head_dim

    def weight(self, name: str) -> WeightSpec:
        for w in self.weights:
            if w.name == name:
                return w
        raise KeyError(name)

    def load_weight(self, ckpt: Checkpoint, spec: WeightSpec) -> np.ndarray:
        if spec.transform.startswith("expert:"):  # one expert of a fused [E, ...] tensor
            parts = [ckpt.load_index(spec.sources[0], int(spec.transform.split(":")[1]))]
            spec = dataclasses.replace(spec, transform="")
        else:
            parts = [ckpt.load(src) for src in spec.sources]
        if spec.transform:
            out = np.ascontiguousarray(
                self.traits.transform(spec.transform, parts, self.config), dtype=np.float32)
            if out.shape != spec.shape:
                raise FrontendError(f"{spec.name}: tensor(s) {', '.join(spec.sources)} of "
                                    f"shape(s) {', '.join(str(p.shape) for p in parts)} give "
                                    f"{out.shape}, expected {spec.shape}")
            return out
        for src, part in zip(spec.sources, parts, strict=True):
            expected = spec.shape if len(parts) == 1 else (None, *spec.shape[1:])
            if any(e is not None and e != s for e, s in zip(expected, part.shape, strict=True)):
                raise FrontendError(f"tensor '{src}' has shape {part.shape}, expected "
                                    f"{spec.shape} for {spec.name}")
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        if out.shape != spec.shape:
            raise FrontendError(f"{spec.name}: assembled shape {out.shape} != {spec.shape}")
        return np.ascontiguousarray(out, dtype=np.float32)


def dense_decoder_weights(cfg: ModelConfig, traits: DenseBlockTraits,
                          names: dict[str, str]) -> list[WeightSpec]:
    """The weight list of a pre-norm GQA decoder with a SwiGLU MLP.

    `names` maps our per-layer roles to checkpoint names with `{i}` for the layer index.
    """
    h, d = cfg.hidden_size, cfg.head_dim
    q_dim, kv_dim, inter = cfg.num_heads * d, cfg.num_kv_heads * d, cfg.intermediate_size
    out = [WeightSpec("embed", (cfg.vocab_size, h), (names["embed"],), "embedding")]
    for i in range(cfg.num_layers):
        def src(role: str, i: int = i) -> str:
            return names[role].format(i=i)

        p = f"layers.{i}."
        out += [
            WeightSpec(p + "input_norm", (h,), (src("input_norm"),), "norm"),
            WeightSpec(p + "q", (q_dim, h), (src("q"),), "linear"),
            WeightSpec(p + "k", (kv_dim, h), (src("k"),), "linear"),
            WeightSpec(p + "v", (kv_dim, h), (src("v"),), "linear"),
        ]
        if traits.qkv_bias:
            out += [
                WeightSpec(p + "q_bias", (q_dim,), (src("q_bias"),), "bias"),
                WeightSpec(p + "k_bias", (kv_dim,), (src("k_bias"),), "bias"),
                WeightSpec(p + "v_bias", (kv_dim,), (src("v_bias"),), "bias"),
            ]
        if traits.qk_norm:
            out += [
                WeightSpec(p + "q_norm", (d,), (src("q_norm"),), "norm"),
                WeightSpec(p + "k_norm", (d,), (src("k_norm"),), "norm"),
            ]
        out += [
            WeightSpec(p + "o", (h, q_dim), (src("o"),), "linear"),
            WeightSpec(p + "post_norm", (h,), (src("post_norm"),), "norm"),
            WeightSpec(p + "gate_up", (2 * inter, h), (src("gate"), src("up")), "linear"),
            WeightSpec(p + "down", (h, inter), (src("down"),), "linear"),
        ]
    out.append(WeightSpec("final_norm", (h,), (names["final_norm"],), "norm"))
    lm_src = names["embed"] if cfg.tie_word_embeddings else names["lm_head"]
    out.append(WeightSpec("lm_head", (cfg.vocab_size, h), (lm_src,), "lm_head"))
    return out


def rope_tables(rope: RopeConfig, head_dim: int, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_pos, head_dim/2] computed the way transformers computes them:
    every step in float32, so the tables are bit-identical to its rotary embedding."""
    exponent = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / (np.float32(rope.theta) ** exponent)
    if rope.kind == "linear":
        inv_freq = (inv_freq / rope.factor).astype(np.float32)
    elif rope.kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope)
    elif rope.kind == "yarn":
        inv_freq = _yarn_inv_freq(rope, head_dim)
    pos = np.arange(max_pos, dtype=np.float32)
    angles = np.outer(pos, inv_freq).astype(np.float32)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    if rope.kind == "yarn":  # transformers scales cos and sin (its attention_scaling)
        scale = np.float32(rope.attention_factor)
        cos, sin = cos * scale, sin * scale
    return cos, sin


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> np.ndarray:
    """transformers' _compute_yarn_parameters: the frequencies that turn fewer than
    beta_slow times over the original context are interpolated (divided by the factor),
    those that turn more than beta_fast times kept, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers does, against a division by zero
    pos_freqs = np.float32(rope.theta) ** (
        np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
    extrapolation = (np.float32(1.0) / pos_freqs).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(rope.factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    keep = (np.float32(1) - ramp).astype(np.float32)
    return (interpolation * (np.float32(1) - keep) + extrapolation * keep).astype(np.float32)


def _llama3_inv_freq(inv_freq: np.ndarray, rope: RopeConfig) -> np.ndarray:
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)
