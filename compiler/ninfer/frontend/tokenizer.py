"""Tokenizer facts the compiler needs: special tokens, eos ids, the chat templates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.frontend.chat_template import ChatTemplate, checkpoint_templates
from ninfer.frontend.checkpoint import Checkpoint
from ninfer.frontend.config import FrontendError

SUPPORTED_MODELS = ("BPE",)


@dataclass(frozen=True)
class TokenizerInfo:
    tokenizer_json: dict[str, Any]
    bos_token: str | None
    eos_token: str | None
    eos_token_ids: tuple[int, ...]
    chat_templates: tuple[ChatTemplate, ...]  # "default" first, then "tool_use" if any
    special_tokens: dict[str, str]  # what transformers passes templates (special_tokens_map)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _token_id(tok_json: dict[str, Any], text: str) -> int | None:
    for added in tok_json.get("added_tokens", []):
        if added.get("content") == text:
            return int(added["id"])
    vocab = tok_json.get("model", {}).get("vocab", {})
    return vocab.get(text) if isinstance(vocab, dict) else None


def tokenizer_info(ckpt: Checkpoint) -> TokenizerInfo:
    tj, tc = ckpt.tokenizer_json, ckpt.tokenizer_config
    model_type = tj.get("model", {}).get("type")
    if model_type not in SUPPORTED_MODELS:
        raise FrontendError(f"tokenizer.json: model type '{model_type}' is not supported "
                            f"(supported: {', '.join(SUPPORTED_MODELS)})")
    templates = checkpoint_templates(tc.get("chat_template"))
    if not templates and (ckpt.directory / "chat_template.jinja").exists():
        templates = (ChatTemplate("default", (ckpt.directory / "chat_template.jinja").read_text()),)
    bos, eos = _token_text(tc.get("bos_token")), _token_text(tc.get("eos_token"))
    special = {key: text for key in ("bos_token", "eos_token", "unk_token", "pad_token")
               if (text := _token_text(tc.get(key))) is not None}

    eos_ids: list[int] = []
    gen_eos = ckpt.generation_config.get("eos_token_id")
    for value in (gen_eos if isinstance(gen_eos, list) else [gen_eos]):
        if isinstance(value, int):
            eos_ids.append(value)
    eos_ids += ckpt.config.eos_token_ids
    if eos is not None:
        eos_id = _token_id(tj, eos)
        if eos_id is None:
            raise FrontendError(f"tokenizer_config.json: eos_token '{eos}' is not in the "
                                "vocabulary")
        eos_ids.append(eos_id)
    return TokenizerInfo(tj, bos, eos, tuple(dict.fromkeys(eos_ids)), templates, special)
