"""Artifact stage: `model.ninfer`, the weights and everything the server needs besides its
code, for a plan (the file format itself: ninfer.artifact_format).

Weights are written in the plan's formats: float32, or packed once by
ninfer.quantize.weight_formats when their first part is written. The manifest records the
model, the target, the compiled serve limits, the tokenizer, the chat templates (source,
SHA-256, special tokens), the output parsers chosen from the chat template (reasoning,
tool calls) and generation_config defaults; the server refuses an artifact whose target,
limits or chat template hashes are not its own. Needs no TVM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ninfer import __version__
from ninfer.artifact_format import (
    ARTIFACT_DTYPES,
    HEADER,
    ArtifactError,
    PendingTensor,
    read_manifest,
    write_artifact,
)
from ninfer.frontend.chat_template import manifest_entry
from ninfer.frontend.generation_config import generation_defaults
from ninfer.frontend.graph import ModelGraph, WeightSpec, rope_tables
from ninfer.frontend.model import FrontendModel
from ninfer.frontend.output_formats import detect_output_parsers
from ninfer.plan import FORMAT_WDTYPES, Plan, weight_format, weight_layout
from ninfer.quantize.weight_formats import pack, part_layout
from ninfer.runtime.tolerance import manifest_entry as check_entry
from ninfer.targets import Target

__all__ = ["HEADER", "ArtifactError", "PendingTensor", "manifest", "pending_tensors",
           "read_manifest", "write_artifact", "write_model"]


def write_model(path: Path, model: FrontendModel, plan: Plan, target: Target,
                model_id: str) -> Path:
    """Write the model artifact of `plan` to `path`."""
    write_artifact(path, manifest(model, plan, target, model_id),
                   pending_tensors(model, plan))
    return path


def manifest(model: FrontendModel, plan: Plan, target: Target, model_id: str
             ) -> dict[str, Any]:
    graph, tok = model.graph, model.tokenizer
    return {
        "model": {"id": model_id, "architecture": graph.config.architecture,
                  "config": {k: v for k, v in asdict(graph.config).items() if k != "extra"}},
        "target": {"name": target.name, "kind": target.kind, "hash": target.stable_hash(),
                   "arch": target.arch, "sm_count": target.sm_count},
        "limits": asdict(plan.limits),
        "build": {"digest": plan.build_digest(graph.config, target, model_id)},
        "weights": plan.to_json()["weights"],
        "check": check_entry(plan.to_json()["weights"], plan.limits.kv_dtype, target.kind),
        "tokenizer": tok.tokenizer_json,
        "chat_template": manifest_entry(model.chat_templates, tok.special_tokens),
        "output_parsers": detect_output_parsers(
            model.chat_templates[0].source if model.chat_templates else None).to_json(),
        "eos_token_ids": list(tok.eos_token_ids),
        "generation_config": generation_defaults(model.checkpoint.generation_config),
        "ninfer_version": __version__,
    }


def pending_tensors(model: FrontendModel, plan: Plan) -> list[PendingTensor]:
    """Every stored tensor, loaded (and packed) only when it is written."""
    graph, ckpt = model.graph, model.checkpoint

    def loader(w: WeightSpec) -> Callable[[], np.ndarray]:
        return lambda: graph.load_weight(ckpt, w)

    per_weight: list[list[PendingTensor]] = []
    for w in graph.weights:
        if w.role == "mtp":  # as the checkpoint holds it: a 16-bit matrix stays 16-bit
            native = {"F16": "f16", "BF16": "bf16"}.get(ckpt.tensors[w.name].dtype)
            if native and len(w.shape) == 2:
                per_weight.append(_packed_tensors(w, native, "rows", loader(w)))
            else:
                per_weight.append([PendingTensor(w.name, w.shape, loader(w))])
            continue
        fmt = weight_format(w, plan.weights)
        layout = weight_layout(w, plan)
        if fmt == "f32" and layout == "rows":
            per_weight.append([PendingTensor(w.name, w.shape, loader(w))])
        else:
            per_weight.append(_packed_tensors(w, FORMAT_WDTYPES[fmt], layout, loader(w)))
    tensors = [t for group in _qkv_parts_together(per_weight) for t in group]
    return tensors + _rope_tensors(graph, plan.limits.max_context)


def _qkv_parts_together(per_weight: list[list[PendingTensor]]) -> list[list[PendingTensor]]:
    """The tensors of each weight, except that a layer's q, k and v (listed one after the
    other with the same parts) are written part by part: q's values, k's, v's, then their
    scales. Each part of the three then lies back to back in the file (where their sizes
    are whole multiples of the alignment), and the model can read the three as one matrix
    (plan.qkv_fusable), as it reads q_bias, k_bias and v_bias, already in a row."""
    out: list[list[PendingTensor]] = []
    i = 0
    while i < len(per_weight):
        trio = per_weight[i:i + 3]
        names = [_weight_name(g[0].name, len(g)) for g in trio]
        base = names[0].rsplit(".", 1)[0]
        if names == [f"{base}.{r}" for r in "qkv"] and len({len(g) for g in trio}) == 1:
            out.append([t for parts in zip(*trio, strict=True) for t in parts])
            i += 3
        else:
            out.append(per_weight[i])
            i += 1
    return out


def _weight_name(tensor: str, parts: int) -> str:
    """The weight a tensor stores (a packed weight's tensors are `name.part`)."""
    return tensor if parts == 1 else tensor.rsplit(".", 1)[0]


def _rope_tensors(graph: ModelGraph, ctx: int) -> list[PendingTensor]:
    rope, dims = graph.config.rope, graph.rope_dims
    half = (ctx, dims // 2)
    return [PendingTensor("rope_cos", half, lambda: rope_tables(rope, dims, ctx)[0]),
            PendingTensor("rope_sin", half, lambda: rope_tables(rope, dims, ctx)[1])]


def _packed_tensors(w: WeightSpec, wdtype: str, layout: str, load: Callable[[], np.ndarray]
                    ) -> list[PendingTensor]:
    """The stored parts of a weight in a format other than row-major float32; packed once,
    when its first part is written (parts are written one after the other, so one packed
    weight is held)."""
    n_out, k = w.shape
    parts = part_layout(wdtype, n_out, k, layout)
    cache: dict[str, np.ndarray] = {}

    def part(name: str) -> Callable[[], np.ndarray]:
        def get() -> np.ndarray:
            if not cache:
                cache.update(pack(load(), wdtype, layout))
            return cache.pop(name)
        return get

    single = len(parts) == 1
    return [PendingTensor(w.name if single else f"{w.name}.{name}", tuple(shape), part(name),
                          ARTIFACT_DTYPES[str(np.dtype(dtype))])
            for name, dtype, shape in parts]
