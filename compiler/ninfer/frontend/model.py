"""The frontend stage: a checkpoint directory -> everything later stages read of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ninfer.frontend.chat_template import ChatTemplate
from ninfer.frontend.checkpoint import Checkpoint, open_checkpoint
from ninfer.frontend.graph import ModelGraph
from ninfer.frontend.hybrid import skipped_tensor_notes, with_mtp_head
from ninfer.frontend.llama import build_graph
from ninfer.frontend.tokenizer import TokenizerInfo, tokenizer_info


@dataclass(frozen=True)
class FrontendModel:
    """The typed graph, the checkpoint its weights are read from (lazily), the tokenizer
    facts and the chat templates (none: the model has none; codegen compiles them)."""

    checkpoint: Checkpoint
    graph: ModelGraph
    tokenizer: TokenizerInfo
    chat_templates: tuple[ChatTemplate, ...]
    notes: tuple[str, ...] = ()  # what of the checkpoint is not compiled, and why

    def native_weight_format(self) -> str:
        """The weight format that stores the checkpoint's matmul weights as they are:
        f16 or bf16 when all of them are that dtype, else f32 (lossless for any mix)."""
        dtypes = {self.checkpoint.tensors[src].dtype
                  for w in self.graph.weights if w.role in ("linear", "lm_head")
                  for src in w.sources}
        return {frozenset({"F16"}): "f16", frozenset({"BF16"}): "bf16"}.get(
            frozenset(dtypes), "f32")

    def graph_json(self) -> dict[str, Any]:
        """The graph as `--dump` writes it (graph.json)."""
        g = self.graph
        return {"config": asdict(g.config), "traits": asdict(g.traits),
                "weights": [asdict(w) for w in g.weights]}


def read_model(model_dir: Path, chat_template: Path | None = None,
               mtp: bool = False) -> FrontendModel:
    """Open the checkpoint, build its graph, read its tokenizer and chat templates
    (`chat_template`: a Jinja file replacing the checkpoint's; `mtp`: compile its
    multi-token-prediction head, for --spec mtp)."""
    ckpt = open_checkpoint(model_dir)
    graph = build_graph(ckpt)
    if mtp:
        graph = with_mtp_head(graph, ckpt)
    tok = tokenizer_info(ckpt)
    templates = tok.chat_templates
    if chat_template is not None:
        templates = (ChatTemplate("default", chat_template.read_text()),)
    return FrontendModel(ckpt, graph, tok, templates, skipped_tensor_notes(ckpt, mtp))
