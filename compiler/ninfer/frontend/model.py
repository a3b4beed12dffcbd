"""The frontend stage: a checkpoint directory -> everything later stages read of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ninfer.frontend.chat_template import ChatFormat, compile_chat_template
from ninfer.frontend.checkpoint import Checkpoint, open_checkpoint
from ninfer.frontend.graph import ModelGraph
from ninfer.frontend.llama import build_graph
from ninfer.frontend.tokenizer import TokenizerInfo, tokenizer_info


@dataclass(frozen=True)
class FrontendModel:
    """The typed graph, the checkpoint its weights are read from (lazily), the tokenizer
    facts and the chat template compiled into a ChatFormat (None: the model has none)."""

    checkpoint: Checkpoint
    graph: ModelGraph
    tokenizer: TokenizerInfo
    chat: ChatFormat | None

    def graph_json(self) -> dict[str, Any]:
        """The graph as `--dump` writes it (graph.json)."""
        g = self.graph
        return {"config": asdict(g.config), "traits": asdict(g.traits),
                "weights": [asdict(w) for w in g.weights]}


def read_model(model_dir: Path) -> FrontendModel:
    """Open the checkpoint, build its graph, check its tokenizer and chat template."""
    ckpt = open_checkpoint(model_dir)
    graph = build_graph(ckpt)
    tok = tokenizer_info(ckpt)
    chat = None
    if tok.chat_template is not None:
        chat = compile_chat_template(tok.chat_template, bos_token=tok.bos_token or "",
                                     eos_token=tok.eos_token or "")
    return FrontendModel(ckpt, graph, tok, chat)
