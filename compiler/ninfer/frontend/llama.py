"""Dense Llama-family decoders: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (and
the dispatch to the hybrid ones, frontend.hybrid).

All three are pre-norm GQA decoders with RoPE and a SwiGLU MLP; they differ only in the
traits below. The Hugging Face weight-name mapping is data.
"""

from __future__ import annotations

import dataclasses

from ninfer.frontend.checkpoint import Checkpoint
from ninfer.frontend.config import FrontendError, ModelConfig
from ninfer.frontend.graph import DenseBlockTraits, ModelGraph, dense_decoder_weights
from ninfer.frontend.hybrid import (
    HYBRID_ARCHITECTURES,
    fused_experts,
    hybrid_traits,
    hybrid_weights,
    mtp_weights,
    text_prefix,
)

HF_NAMES = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "input_norm": "model.layers.{i}.input_layernorm.weight",
    "q": "model.layers.{i}.self_attn.q_proj.weight",
    "k": "model.layers.{i}.self_attn.k_proj.weight",
    "v": "model.layers.{i}.self_attn.v_proj.weight",
    "q_bias": "model.layers.{i}.self_attn.q_proj.bias",
    "k_bias": "model.layers.{i}.self_attn.k_proj.bias",
    "v_bias": "model.layers.{i}.self_attn.v_proj.bias",
    "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "o": "model.layers.{i}.self_attn.o_proj.weight",
    "post_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.weight",
    "up": "model.layers.{i}.mlp.up_proj.weight",
    "down": "model.layers.{i}.mlp.down_proj.weight",
}

ARCHITECTURES = {
    "LlamaForCausalLM": lambda cfg: DenseBlockTraits(qk_norm=False, qkv_bias=cfg.attention_bias),
    "Qwen2ForCausalLM": lambda cfg: DenseBlockTraits(qk_norm=False, qkv_bias=True),
    "Qwen3ForCausalLM": lambda cfg: DenseBlockTraits(qk_norm=True, qkv_bias=cfg.attention_bias),
    "MistralForCausalLM": lambda cfg: DenseBlockTraits(qk_norm=False, qkv_bias=False),
}


def build_graph(ckpt: Checkpoint) -> ModelGraph:
    cfg = ckpt.config
    if cfg.architecture in HYBRID_ARCHITECTURES:
        prefix = text_prefix(ckpt)
        graph = config_graph(cfg, prefix, fused_experts(ckpt, prefix))
        graph = dataclasses.replace(graph, weights=(*graph.weights, *mtp_weights(ckpt)))
    else:
        graph = config_graph(cfg)
    return _checked(ckpt, graph)


def config_graph(cfg: ModelConfig, prefix: str = "model.",
                 fused: bool = False) -> ModelGraph:
    """The graph of the model `cfg` describes, its weights named as a checkpoint under
    `prefix` would hold them (`fused`: fused [E, ...] expert tensors); a config alone
    gives every shape (occupancy.explain routes a config's projections with it)."""
    if cfg.architecture in HYBRID_ARCHITECTURES:
        hybrid = hybrid_traits(cfg)
        return ModelGraph(cfg, hybrid, tuple(hybrid_weights(cfg, hybrid, prefix, fused)))
    make_traits = ARCHITECTURES.get(cfg.architecture)
    if make_traits is None:
        raise FrontendError(
            f"architecture '{cfg.architecture}' is not supported "
            f"(supported: {', '.join(sorted((*ARCHITECTURES, *HYBRID_ARCHITECTURES)))})")
    if cfg.architecture == "MistralForCausalLM" and cfg.extra.get("sliding_window"):
        raise FrontendError("MistralForCausalLM with sliding_window attention is not supported")
    if cfg.attention_bias and cfg.architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        # There attention_bias also adds a bias to o_proj, which our block lacks.
        raise FrontendError(f"{cfg.architecture} with attention_bias=true is not supported")
    if cfg.rope.partial_factor != 1.0:
        raise FrontendError(f"{cfg.architecture} with partial_rotary_factor "
                            f"{cfg.rope.partial_factor} is not supported (it rotates whole heads)")
    traits = make_traits(cfg)
    return ModelGraph(cfg, traits, tuple(dense_decoder_weights(cfg, traits, HF_NAMES)))


def _checked(ckpt: Checkpoint, graph: ModelGraph) -> ModelGraph:
    missing = sorted({s for w in graph.weights for s in w.sources} - set(ckpt.tensors))
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5
                                          else "")
        raise FrontendError(f"{ckpt.directory}: checkpoint is missing tensor(s) {shown}")
    return graph
