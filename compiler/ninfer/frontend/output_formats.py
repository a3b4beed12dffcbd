"""Which output parsers the server uses for a chat template: how reasoning and tool calls
are split back out of the generated text (runtime_cpp/server/output_parser.h).

The template says how the model was taught to write them, so the choice is read off its
source, by the marks each format leaves (checked over llama.cpp's corpus of real
templates in tests/test_output_parsers.py):

    reasoning   think         the template writes or strips `<think>` / `</think>`
                none          otherwise
    tool calls  qwen3_coder   `<tool_call>` holding `<function=...>` / `<parameter=...>`
                              (Qwen3-Coder, Qwen3.5)
                hermes        `<tool_call>` holding JSON (Qwen2.5, Qwen3, QwQ, Hermes 2/3);
                              not GLM's `<arg_key>` form inside `<tool_call>`
                llama3_json   a bare `{"name": ..., "parameters": ...}` object in a Llama 3
                              header format (Llama 3.1, 3.2, 3.3)
                none          otherwise (Mistral's [TOOL_CALLS], DeepSeek's tool tokens:
                              their calls stay in the content)

The choice is stored in the manifest under "output_parsers"; the server's
--reasoning-parser / --tool-call-parser override it.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONING_PARSERS = ("none", "think")
TOOL_CALL_PARSERS = ("none", "hermes", "qwen3_coder", "llama3_json")


@dataclass(frozen=True)
class OutputParsers:
    reasoning: str = "none"
    tool_calls: str = "none"

    def __post_init__(self) -> None:
        if self.reasoning not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {self.reasoning!r} "
                             f"(known: {', '.join(REASONING_PARSERS)})")
        if self.tool_calls not in TOOL_CALL_PARSERS:
            raise ValueError(f"unknown tool-call parser {self.tool_calls!r} "
                             f"(known: {', '.join(TOOL_CALL_PARSERS)})")

    def to_json(self) -> dict[str, str]:
        return {"reasoning": self.reasoning, "tool_calls": self.tool_calls}


def _reasoning_parser(template: str) -> str:
    return "think" if "<think>" in template or "</think>" in template else "none"


def _tool_call_parser(template: str) -> str:
    if "<tool_call>" in template:
        if "<function=" in template and "<parameter=" in template:
            return "qwen3_coder"
        if "<arg_key>" in template:  # GLM 4.x: a name and key/value tags, not JSON
            return "none"
        return "hermes"
    if "<|start_header_id|>" in template and '"parameters": ' in template:
        return "llama3_json"
    return "none"


def detect_output_parsers(template: str | None) -> OutputParsers:
    """The parsers for a chat template's output (none for a model without a template)."""
    if template is None:
        return OutputParsers()
    return OutputParsers(_reasoning_parser(template), _tool_call_parser(template))
