"""Hybrid linear-attention decoders: Qwen3.5 (dense, and its multimodal twin's text model)
and Qwen3-Next, dense MLPs.

Layers are Gated DeltaNet (`linear_attention`) or gated full attention (`full_attention`)
per `layer_types` (else every `full_attention_interval`-th layer is full attention). What
the step program computes, per layer kind (the float64 reference is
kernels.gdn_reference.hybrid_logits):

- GDN: [q|k|v] = in_proj_qkv(h), z = in_proj_z(h), [b|a] = in_proj_ba(h); SiLU(causal
  conv1d) over [q|k|v] with a carried state; the gates; the delta rule over a per-sequence
  state; the gated RMSNorm by z; out_proj.
- Full attention: q_proj holds query and output gate interleaved per head, split here into
  `q` and `q_gate` matmuls; zero-centred q/k norms; partial rotary; the attention output
  times sigmoid(gate) before o_proj.

Every RMSNorm but the GDN output norm is zero-centred (x / rms(x) * (1 + w)): the `1 + w`
is folded into the stored weight at load, in float32 as transformers computes it, so the
step program's RMSNorm kernel serves both. Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`
(rows grouped per key head) are regrouped at load into the same [q|k|v], z and [b|a].

Weight-name mapping is data; a checkpoint of the multimodal class keeps its text model
under `model.language_model.` and its vision tower (skipped, with a notice) under
`model.visual.`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ninfer.frontend.checkpoint import Checkpoint
from ninfer.frontend.config import FrontendError, ModelConfig
from ninfer.frontend.graph import DenseBlockTraits, ModelGraph, WeightSpec

HYBRID_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
                        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                        "Qwen3NextForCausalLM")
LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridTraits(DenseBlockTraits):
    """A hybrid decoder's layer kinds and Gated DeltaNet shapes (the attention layers'
    q/k norms are always on, their projections without bias)."""

    layer_types: tuple[str, ...] = ()
    k_heads: int = 0  # linear_num_key_heads
    v_heads: int = 0  # linear_num_value_heads
    k_dim: int = 0  # linear_key_head_dim
    v_dim: int = 0  # linear_value_head_dim
    conv_kernel: int = 0  # linear_conv_kernel_dim
    fused_projections: bool = False  # Qwen3-Next: in_proj_qkvz / in_proj_ba
    # sparse MoE blocks (Qwen3-Next, Qwen3.5-MoE): the layers that have one, the experts,
    # the experts per token, their and the shared expert's intermediate sizes, and whether
    # the chosen experts' probabilities are renormalised (norm_topk_prob)
    sparse_layers: tuple[int, ...] = ()
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    shared_inter: int = 0
    norm_topk: bool = True

    @property
    def dense_mlp(self) -> bool:
        """Some layer has a dense MLP."""
        return len(self.sparse_layers) < len(self.layer_types)

    family: ClassVar[str] = "hybrid"

    def transform(self, transform: str, parts: list[np.ndarray],
                  config: ModelConfig) -> np.ndarray:
        return transform_weight(transform, parts, config, self)

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: [q | k | v]."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def value_width(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)


def layer_types(cfg: ModelConfig) -> tuple[str, ...]:
    types = cfg.extra.get("layer_types")
    if not types:
        every = int(cfg.extra.get("full_attention_interval", 4))
        types = [FULL if (i + 1) % every == 0 else LINEAR for i in range(cfg.num_layers)]
    if len(types) != cfg.num_layers:
        raise FrontendError(f"config.json: layer_types has {len(types)} entries for "
                            f"{cfg.num_layers} layers")
    unknown = sorted(set(types) - {LINEAR, FULL})
    if unknown:
        raise FrontendError(f"config.json: layer type(s) {', '.join(unknown)} are not "
                            f"supported (supported: {LINEAR}, {FULL})")
    return tuple(types)


def _int(cfg: ModelConfig, key: str) -> int:
    v = cfg.extra.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise FrontendError(f"config.json: '{key}' must be a positive integer, got {v!r}")
    return v


def hybrid_traits(cfg: ModelConfig) -> HybridTraits:
    types = layer_types(cfg)
    sparse: tuple[int, ...] = ()
    moe: dict[str, int | bool] = {}
    if cfg.extra.get("num_experts"):
        sparse = tuple(i for i in range(cfg.num_layers)
                       if i not in (cfg.extra.get("mlp_only_layers") or [])
                       and (i + 1) % int(cfg.extra.get("decoder_sparse_step") or 1) == 0)
    if sparse:
        moe = {"experts": _int(cfg, "num_experts"), "top_k": _int(cfg, "num_experts_per_tok"),
               "moe_inter": _int(cfg, "moe_intermediate_size"),
               "shared_inter": _int(cfg, "shared_expert_intermediate_size"),
               # Qwen3.5-MoE always renormalises; Qwen3-Next when norm_topk_prob
               "norm_topk": bool(cfg.extra.get("norm_topk_prob", True))}
        if moe["top_k"] > moe["experts"]:
            raise FrontendError(f"config.json: num_experts_per_tok {moe['top_k']} exceeds "
                                f"num_experts {moe['experts']}")
    if cfg.attention_bias:
        raise FrontendError(f"{cfg.architecture} with attention_bias=true is not supported")
    factor = cfg.rope.partial_factor
    rotary = int(cfg.head_dim * factor)
    if rotary % 2 or not 0 < rotary <= cfg.head_dim:
        raise FrontendError(f"config.json: partial_rotary_factor {factor} gives {rotary} "
                            f"rotated dims of head_dim {cfg.head_dim}; it must be an even "
                            "number in (0, head_dim]")
    traits = HybridTraits(
        qk_norm=True, qkv_bias=False, layer_types=types,
        k_heads=_int(cfg, "linear_num_key_heads"), v_heads=_int(cfg, "linear_num_value_heads"),
        k_dim=_int(cfg, "linear_key_head_dim"), v_dim=_int(cfg, "linear_value_head_dim"),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim"), rotary=rotary,
        fused_projections=cfg.architecture == "Qwen3NextForCausalLM",
        sparse_layers=sparse, **moe)  # type: ignore[arg-type]
    if traits.v_heads % traits.k_heads:
        raise FrontendError(f"config.json: linear_num_value_heads {traits.v_heads} is not a "
                            f"multiple of linear_num_key_heads {traits.k_heads}")
    if traits.conv_kernel < 2:
        raise FrontendError(f"config.json: linear_conv_kernel_dim {traits.conv_kernel} must "
                            "be at least 2")
    return traits


def fused_experts(ckpt: Checkpoint, prefix: str) -> bool:
    """Whether the MoE experts are stored fused per layer ([E, ...] tensors)."""
    return any(n.startswith(prefix) and n.endswith(".mlp.experts.gate_up_proj")
               for n in ckpt.tensors)


def text_prefix(ckpt: Checkpoint) -> str:
    """Where the text model's tensors live: `model.` or, in a multimodal checkpoint,
    `model.language_model.`."""
    return ("model.language_model." if "model.language_model.embed_tokens.weight"
            in ckpt.tensors else "model.")


def skipped_tensor_notes(ckpt: Checkpoint, mtp: bool = False) -> tuple[str, ...]:
    """Notices for checkpoint parts that are not compiled: a multimodal checkpoint's vision
    tower, a multi-token-prediction head (unless `mtp`: compiled for --spec mtp)."""
    notes = []
    vision = [n for n in ckpt.tensors if n.startswith(("model.visual.", "visual."))]
    if vision:
        notes.append(f"the vision tower ({len(vision)} tensors under model.visual.) is "
                     "skipped: ninfer serves the text model")
    head = mtp_weights(ckpt)
    if head and not mtp:
        notes.append(f"the multi-token-prediction head ({len(head)} mtp.* tensors) is stored "
                     "in the artifact as the checkpoint holds it, not compiled: compile with "
                     "--spec mtp to draft with it")
    return tuple(notes)


def mtp_weights(ckpt: Checkpoint) -> list[WeightSpec]:
    """The checkpoint's multi-token-prediction head (`mtp.*`: fc, its two pre-norms, the
    decoder layer, the final norm), each tensor under its own name and shape, role "mtp":
    written into the artifact for speculative decoding, not read by the step program."""
    return [WeightSpec(name, tuple(ckpt.tensors[name].shape), (name,), "mtp")
            for name in sorted(ckpt.tensors) if name.startswith("mtp.")]


def hybrid_weights(cfg: ModelConfig, t: HybridTraits, prefix: str,
                   fused_experts: bool = False) -> list[WeightSpec]:
    """The weight list of a hybrid decoder. `transform` names how the checkpoint tensors
    become ours (graph.load_weight): `one_plus` folds a zero-centred norm's 1 + w,
    `query` / `gate` take the halves of a gated q_proj, `qkv` / `z` / `ba` regroup
    Qwen3-Next's fused projections, `conv` drops the conv weight's unit axis."""
    h = cfg.hidden_size
    P = prefix
    out = [WeightSpec("embed", (cfg.vocab_size, h), (P + "embed_tokens.weight",), "embedding")]
    for i, kind in enumerate(t.layer_types):
        p, src = f"layers.{i}.", f"{P}layers.{i}."
        out.append(WeightSpec(p + "input_norm", (h,), (src + "input_layernorm.weight",),
                              "norm", "one_plus"))
        if kind == LINEAR:
            la = src + "linear_attn."
            if t.fused_projections:
                qkvz, ba = la + "in_proj_qkvz.weight", la + "in_proj_ba.weight"
                proj = [WeightSpec(p + "gdn_qkv", (t.conv_dim, h), (qkvz,), "linear", "qkv"),
                        WeightSpec(p + "gdn_z", (t.value_width, h), (qkvz,), "linear", "z"),
                        WeightSpec(p + "gdn_ba", (2 * t.v_heads, h), (ba,), "linear", "ba")]
            else:
                proj = [WeightSpec(p + "gdn_qkv", (t.conv_dim, h), (la + "in_proj_qkv.weight",),
                                   "linear"),
                        WeightSpec(p + "gdn_z", (t.value_width, h), (la + "in_proj_z.weight",),
                                   "linear"),
                        WeightSpec(p + "gdn_ba", (2 * t.v_heads, h),
                                   (la + "in_proj_b.weight", la + "in_proj_a.weight"), "linear")]
            out += [
                *proj,
                WeightSpec(p + "gdn_conv", (t.conv_dim, t.conv_kernel), (la + "conv1d.weight",),
                           "param", "conv"),
                WeightSpec(p + "gdn_a_log", (t.v_heads,), (la + "A_log",), "param"),
                WeightSpec(p + "gdn_dt_bias", (t.v_heads,), (la + "dt_bias",), "param"),
                WeightSpec(p + "gdn_norm", (t.v_dim,), (la + "norm.weight",), "norm"),
                WeightSpec(p + "gdn_out", (h, t.value_width), (la + "out_proj.weight",),
                           "linear"),
            ]
        else:
            out += _attention_weights(cfg, p, src)
        out += _mlp_weights(cfg, t, p, src, i in t.sparse_layers, fused_experts)
    out.append(WeightSpec("final_norm", (h,), (P + "norm.weight",), "norm", "one_plus"))
    lm_src = P + "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    out.append(WeightSpec("lm_head", (cfg.vocab_size, h), (lm_src,), "lm_head"))
    return out


def _attention_weights(cfg: ModelConfig, p: str, src: str) -> list[WeightSpec]:
    """A gated full-attention block's tensors (`src` + self_attn.*) under our prefix `p`."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_dim, kv_dim = cfg.num_heads * d, cfg.num_kv_heads * d
    sa = src + "self_attn."
    return [
        WeightSpec(p + "q", (q_dim, h), (sa + "q_proj.weight",), "linear", "query"),
        WeightSpec(p + "q_gate", (q_dim, h), (sa + "q_proj.weight",), "linear", "gate"),
        WeightSpec(p + "k", (kv_dim, h), (sa + "k_proj.weight",), "linear"),
        WeightSpec(p + "v", (kv_dim, h), (sa + "v_proj.weight",), "linear"),
        WeightSpec(p + "q_norm", (d,), (sa + "q_norm.weight",), "norm", "one_plus"),
        WeightSpec(p + "k_norm", (d,), (sa + "k_norm.weight",), "norm", "one_plus"),
        WeightSpec(p + "o", (h, q_dim), (sa + "o_proj.weight",), "linear"),
    ]


def _mlp_weights(cfg: ModelConfig, t: HybridTraits, p: str, src: str, sparse: bool,
                 fused: bool) -> list[WeightSpec]:
    """The post-attention norm and the MLP (sparse MoE, or dense SwiGLU) of a layer."""
    h, m = cfg.hidden_size, src + "mlp."
    out = [WeightSpec(p + "post_norm", (h,), (src + "post_attention_layernorm.weight",),
                      "norm", "one_plus")]
    if sparse:
        return out + _moe_weights(h, t, p, m, fused)
    return [*out,
            WeightSpec(p + "gate_up", (2 * cfg.intermediate_size, h),
                       (m + "gate_proj.weight", m + "up_proj.weight"), "linear"),
            WeightSpec(p + "down", (h, cfg.intermediate_size), (m + "down_proj.weight",),
                       "linear")]


MTP_LAYER = "mtp.layers.0."


def mtp_sparse(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint's MTP decoder layer has a sparse MoE block."""
    return f"{MTP_LAYER}mlp.gate.weight" in ckpt.tensors


def with_mtp_head(graph: ModelGraph, ckpt: Checkpoint) -> ModelGraph:
    """`graph` with the checkpoint's MTP head compiled (mtp_head_weights) instead of
    stored as the checkpoint holds it; FrontendError when there is none."""
    if not isinstance(graph.traits, HybridTraits) or not mtp_weights(ckpt):
        raise FrontendError(f"--spec mtp: {ckpt.directory} has no multi-token-prediction head "
                            "(mtp.* tensors, as Qwen3.5 and Qwen3-Next checkpoints hold it); "
                            "use --spec ngram")
    head = mtp_head_weights(graph.config, graph.traits, ckpt)
    missing = sorted({s for w in head for s in w.sources} - set(ckpt.tensors))
    if missing:
        raise FrontendError(f"{ckpt.directory}: the MTP head lacks tensor(s) "
                            f"{', '.join(missing[:5])}")
    kept = tuple(w for w in graph.weights if w.role != "mtp")
    return dataclasses.replace(graph, weights=(*kept, *head))


def mtp_head_weights(cfg: ModelConfig, t: HybridTraits, ckpt: Checkpoint) -> list[WeightSpec]:
    """The multi-token-prediction head compiled for `--spec mtp` (what
    kernels.gdn_reference.mtp_hidden computes): the two pre-fc norms, fc's [H, 2H] matrix
    as two [H, H] matmuls (`mtp.embed.mtp_fc` over the normed embedding, `mtp.hidden.mtp_fc`
    over the normed hidden state, summed), one gated full-attention decoder layer whose
    roles are the main layers' (the same kernels and weight formats), and the final norm.
    The LM head and the embedding are the model's."""
    h = cfg.hidden_size
    sparse = mtp_sparse(ckpt)
    if (sparse and not t.sparse_layers) or (not sparse and not t.dense_mlp):
        raise FrontendError(f"the MTP layer's MLP is {'sparse' if sparse else 'dense'} but "
                            f"no layer of the model's is: --spec mtp needs the same kernels")
    P = MTP_LAYER
    return [
        WeightSpec("mtp.embed_norm", (h,), ("mtp.pre_fc_norm_embedding.weight",), "norm",
                   "one_plus"),
        WeightSpec("mtp.hidden_norm", (h,), ("mtp.pre_fc_norm_hidden.weight",), "norm",
                   "one_plus"),
        WeightSpec("mtp.embed.mtp_fc", (h, h), ("mtp.fc.weight",), "linear", "fc_embed"),
        WeightSpec("mtp.hidden.mtp_fc", (h, h), ("mtp.fc.weight",), "linear", "fc_hidden"),
        WeightSpec(P + "input_norm", (h,), (P + "input_layernorm.weight",), "norm", "one_plus"),
        *_attention_weights(cfg, P, P),
        *_mlp_weights(cfg, t, P, P, sparse, fused_experts(ckpt, "mtp.")),
        WeightSpec("mtp.norm", (h,), ("mtp.norm.weight",), "norm", "one_plus"),
    ]


def _moe_weights(h: int, t: HybridTraits, p: str, m: str, fused: bool) -> list[WeightSpec]:
    """A sparse MoE block's tensors: the router, each expert's gate/up and down (per-expert
    checkpoint tensors, or slices of the fused ones), the shared expert and its gate."""
    out = [WeightSpec(p + "router", (t.experts, h), (m + "gate.weight",), "linear")]
    for e in range(t.experts):
        x = f"{m}experts.{e}."
        if fused:  # transformers' layout: experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]
            out += [WeightSpec(f"{p}experts.{e}.expert_gate_up", (2 * t.moe_inter, h),
                               (m + "experts.gate_up_proj",), "linear", f"expert:{e}"),
                    WeightSpec(f"{p}experts.{e}.expert_down", (h, t.moe_inter),
                               (m + "experts.down_proj",), "linear", f"expert:{e}")]
            continue
        out += [WeightSpec(f"{p}experts.{e}.expert_gate_up", (2 * t.moe_inter, h),
                           (x + "gate_proj.weight", x + "up_proj.weight"), "linear"),
                WeightSpec(f"{p}experts.{e}.expert_down", (h, t.moe_inter),
                           (x + "down_proj.weight",), "linear")]
    s = m + "shared_expert."
    return [*out,
            WeightSpec(p + "shared_gate_up", (2 * t.shared_inter, h),
                       (s + "gate_proj.weight", s + "up_proj.weight"), "linear"),
            WeightSpec(p + "shared_down", (h, t.shared_inter), (s + "down_proj.weight",),
                       "linear"),
            WeightSpec(p + "shared_expert_gate", (h,), (m + "shared_expert_gate.weight",),
                       "param", "row")]


def split_qkvz(qkvz: np.ndarray, ba: np.ndarray, k_heads: int, v_heads: int, k_dim: int,
               v_dim: int) -> dict[str, np.ndarray]:
    """Qwen3-Next's `in_proj_qkvz` [Hk * (2 dk + 2 r dv), hidden] and `in_proj_ba`
    [Hk * 2r, hidden] (rows grouped per key head: q, k, v, z and b, a; r = Hv / Hk) as
    Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`."""
    r = v_heads // k_heads
    per = 2 * k_dim + 2 * r * v_dim
    if qkvz.shape[0] != k_heads * per or ba.shape[0] != k_heads * 2 * r:
        raise ValueError(f"in_proj_qkvz {qkvz.shape} / in_proj_ba {ba.shape} do not match "
                         f"{k_heads} key heads of {per} and {2 * r} rows")
    g = qkvz.reshape(k_heads, per, -1)
    q, k = g[:, :k_dim], g[:, k_dim:2 * k_dim]
    v = g[:, 2 * k_dim:2 * k_dim + r * v_dim]
    z = g[:, 2 * k_dim + r * v_dim:]
    gb = ba.reshape(k_heads, 2 * r, -1)
    hidden = qkvz.shape[1]
    return {
        "in_proj_qkv": np.concatenate([q.reshape(-1, hidden), k.reshape(-1, hidden),
                                       v.reshape(-1, hidden)]),
        "in_proj_z": z.reshape(-1, hidden),
        "in_proj_b": gb[:, :r].reshape(-1, hidden),
        "in_proj_a": gb[:, r:].reshape(-1, hidden),
    }


def split_gated_query(q_proj: np.ndarray, heads: int, head_dim: int) -> tuple[np.ndarray,
                                                                                 np.ndarray]:
    """A gated-attention `q_proj` [heads * 2 * head_dim, hidden] (per head: query rows, then
    gate rows) as (query [heads * head_dim, hidden], gate [same]): two matmuls whose outputs
    are contiguous, for the rope and SigmoidGateSpec kernels."""
    if q_proj.shape[0] != heads * 2 * head_dim:
        raise ValueError(f"q_proj has {q_proj.shape[0]} rows, not {heads} heads x 2 x "
                         f"{head_dim}")
    per = q_proj.reshape(heads, 2, head_dim, -1)
    return per[:, 0].reshape(heads * head_dim, -1), per[:, 1].reshape(heads * head_dim, -1)


def transform_weight(transform: str, parts: list[np.ndarray], cfg: ModelConfig,
                     traits: DenseBlockTraits) -> np.ndarray:
    """One of hybrid_weights' transforms over the loaded source tensors (float32)."""
    if transform == "one_plus":
        return (np.float32(1.0) + parts[0].astype(np.float32)).astype(np.float32)
    if transform == "conv":
        return parts[0].reshape(parts[0].shape[0], -1)
    if transform == "row":  # a [1, n] weight as [n]
        return parts[0].reshape(-1)
    if transform in ("fc_embed", "fc_hidden"):  # the MTP fc's [H, 2H]: embedding columns first
        h = cfg.hidden_size
        if parts[0].shape != (h, 2 * h):
            raise FrontendError(f"mtp.fc.weight has shape {parts[0].shape}, expected "
                                f"{(h, 2 * h)}")
        return parts[0][:, :h] if transform == "fc_embed" else parts[0][:, h:]
    if transform in ("query", "gate"):
        q, g = split_gated_query(parts[0], cfg.num_heads, cfg.head_dim)
        return q if transform == "query" else g
    if transform in ("qkv", "z", "ba"):
        assert isinstance(traits, HybridTraits)
        t = traits
        r = t.v_heads // t.k_heads
        if transform == "ba":  # in_proj_ba alone: b, a grouped per key head
            gb = parts[0].reshape(t.k_heads, 2 * r, -1)
            return np.concatenate([gb[:, :r].reshape(t.v_heads, -1),
                                   gb[:, r:].reshape(t.v_heads, -1)])
        per = 2 * t.k_dim + 2 * r * t.v_dim
        dummy = np.zeros((t.k_heads * 2 * r, parts[0].shape[1]), parts[0].dtype)
        if parts[0].shape[0] != t.k_heads * per:
            raise FrontendError(f"in_proj_qkvz has {parts[0].shape[0]} rows, not "
                                f"{t.k_heads} key heads x {per}")
        split = split_qkvz(parts[0], dummy, t.k_heads, t.v_heads, t.k_dim, t.v_dim)
        return split["in_proj_qkv"] if transform == "qkv" else split["in_proj_z"]
    raise ValueError(f"unknown weight transform {transform!r}")
