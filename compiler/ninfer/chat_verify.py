"""Compile-time verification of generated chat templates against jinja2.

After the build, ninfer-compile renders generated conversations through jinja2 (as
transformers does: ninfer.frontend.chat_template) and through the generated C++ in the
built server (`ninfer-server --render-chat-template FILE`, one process for all of them),
and fails on the first difference, showing the conversation and where the texts part. A
conversation jinja2 refuses must be refused by the C++ with the same message.

`sample_contexts` draws the conversations: system, user, assistant and tool turns; tools;
assistant tool calls with arguments as a JSON string and as an object; reasoning_content
and `<think>` in contents; contents with markup the template itself contains; with and
without add_generation_prompt and enable_thinking.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.frontend.chat_template import ChatTemplate, ChatTemplateError, Renderer

_WORDS = ("hello", "Hello, world!", "x", "1 + 1 = 2", "é", "naïve", "中文", "🙂", "'", '"',
          "\\", "{", "}", "{{ messages }}", "{% if true %}", "None", "user", "assistant",
          "system", "tool", "0", "<b>", "\u00a0", "\u3000", "\u2028")
_SPACES = ("", " ", "\n", "\n\n", "  ", "\t")

_TOOLS = (
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "description": "second"}},
            "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object", "properties": {"safe": {"type": "boolean"}}}},
            "required": ["query"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
)


def _markup(source: str) -> list[str]:
    """Tag-like strings in the template (<think>, <tool_call>, [INST]...) contents may hold."""
    found = re.findall(r"</?[A-Za-z_|][^<>\s'\"]{0,40}>|\[/?[A-Z_]{2,20}\]", source)
    return sorted(set(found))


class _Sampler:
    def __init__(self, source: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = list(_WORDS) + _markup(source)
        self.calls = 0

    def text(self, max_parts: int = 4) -> str:
        r = self.rng
        parts = [r.choice(self.pool) for _ in range(r.randint(0, max_parts))]
        return r.choice(_SPACES[:3]) + " ".join(parts) + r.choice(_SPACES)

    def arguments(self, tool: Mapping[str, Any]) -> Any:
        r = self.rng
        props = tool["function"]["parameters"]["properties"]
        args: dict[str, Any] = {}
        for name, schema in props.items():
            if r.random() < 0.3 and name not in tool["function"]["parameters"].get("required", []):
                continue
            t = schema.get("type")
            args[name] = (self.text(2) if t == "string" else r.randint(-5, 99) if t == "integer"
                          else r.choice([1.5, 2, -0.25, 1e21]) if t == "number"
                          else [self.text(1)] if t == "array"
                          else {"safe": r.random() < 0.5} if t == "object" else None)
        return json.dumps(args) if r.random() < 0.4 else args

    def tool_calls(self, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        r = self.rng
        out = []
        for _ in range(r.choice([1, 1, 2])):
            tool = r.choice(tools)
            self.calls += 1
            out.append({"id": f"call_{self.calls}", "type": "function",
                        "function": {"name": tool["function"]["name"],
                                     "arguments": self.arguments(tool)}})
        return out

    def assistant(self, tools: Sequence[Mapping[str, Any]], last: bool) -> list[dict[str, Any]]:
        r = self.rng
        msg: dict[str, Any] = {"role": "assistant", "content": self.text()}
        if r.random() < 0.25:
            msg["reasoning_content"] = self.text()
        elif r.random() < 0.15:
            msg["content"] = f"<think>{self.text()}</think>{self.text()}"
        out = [msg]
        if tools and r.random() < 0.5:
            msg["tool_calls"] = self.tool_calls(tools)
            if r.random() < 0.5:
                msg["content"] = None if r.random() < 0.5 else ""
            if not last or r.random() < 0.7:
                for call in msg["tool_calls"]:
                    out.append({"role": "tool", "tool_call_id": call["id"],
                                "name": call["function"]["name"],
                                "content": self.rng.choice(['{"ok": true}', self.text(), "42"])})
        return out

    def context(self) -> dict[str, Any]:
        r = self.rng
        tools = list(r.sample(_TOOLS, r.randint(1, len(_TOOLS)))) if r.random() < 0.5 else []
        msgs: list[dict[str, Any]] = []
        if r.random() < 0.5:
            msgs.append({"role": "system", "content": self.text()})
        turns = r.randint(1, 4)
        for t in range(turns):
            msgs.append({"role": "user", "content": self.text()})
            if t < turns - 1 or r.random() < 0.3:
                msgs += self.assistant(tools, last=t == turns - 1)
        if r.random() < 0.05:  # the unusual: consecutive users, a late system message
            msgs.insert(r.randint(0, len(msgs)), {"role": r.choice(["user", "system"]),
                                                  "content": self.text()})
        ctx: dict[str, Any] = {"messages": msgs, "add_generation_prompt": r.random() < 0.7}
        if tools:
            ctx["tools"] = tools
        thinking = r.choice([None, True, False])
        if thinking is not None:
            ctx["enable_thinking"] = thinking
        return ctx


def sample_contexts(source: str, count: int, seed: int = 0,
                    special_tokens: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """`count` random render contexts for `source` (seeded), special tokens included."""
    s = _Sampler(source, seed)
    out = []
    for _ in range(count):
        ctx = s.context()
        out.append({**(special_tokens or {}), **ctx})
    return out


@dataclass(frozen=True)
class Rendered:
    """One context's result: the text, or the exception (type, message)."""

    text: str | None
    error_type: str = ""
    error: str = ""


def reference(source: str, contexts: Sequence[Mapping[str, Any]]) -> list[Rendered]:
    """What jinja2 (in transformers' environment) renders for each context."""
    render = Renderer(source)
    out = []
    for ctx in contexts:
        try:
            out.append(Rendered(render(ctx)))
        except Exception as e:
            out.append(Rendered(None, type(e).__name__, str(e)))
    return out


def render_with_server(server: Path, template: str, contexts: Sequence[Mapping[str, Any]]
                       ) -> list[Rendered]:
    """Render through `ninfer-server --render-chat-template` (needs no model artifact)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "contexts.jsonl"
        path.write_text("".join(json.dumps({"template": template, "context": c}) + "\n"
                                for c in contexts))
        proc = subprocess.run([str(server), "--render-chat-template", str(path)],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise ChatTemplateError(f"{server} --render-chat-template failed "
                                f"(exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = []
    for line in proc.stdout.split("\n"):  # not splitlines(): U+2028 & co. are in the texts
        if not line:
            continue
        r = json.loads(line)
        out.append(Rendered(r.get("text"), r.get("error_type", ""), r.get("error", "")))
    return out


def _clip(text: str, limit: int = 400) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def first_difference(template: ChatTemplate, contexts: Sequence[Mapping[str, Any]],
                     want: Sequence[Rendered], got: Sequence[Rendered]) -> str | None:
    """A description of the first context whose results differ, or None."""
    if len(want) != len(got):
        return f"{len(got)} results for {len(want)} conversations"
    for k, (ctx, w, g) in enumerate(zip(contexts, want, got, strict=True)):
        if w == g:
            continue
        head = (f"chat template '{template.name}': the generated C++ differs from jinja2 on "
                f"conversation {k}: {_clip(json.dumps(ctx, ensure_ascii=False), 1200)}\n")
        if w.text is None or g.text is None:
            def show(r: Rendered) -> str:
                return _clip(r.text) if r.text is not None else f"raises {r.error_type}: {r.error}"
            return head + f"  jinja2: {show(w)}\n  C++:    {show(g)}"
        at = next((i for i, (a, b) in enumerate(zip(w.text, g.text)) if a != b),
                  min(len(w.text), len(g.text)))
        lo = max(0, at - 80)
        return (head + f"  first difference at character {at}\n"
                f"  jinja2: {_clip(w.text[lo:at + 80])}\n  C++:    {_clip(g.text[lo:at + 80])}")
    return None


def verify_server(server: Path, templates: Sequence[ChatTemplate],
                  special_tokens: Mapping[str, str], count: int = 300, seed: int = 0) -> int:
    """Render `count` conversations per template both ways; raise ChatTemplateError on the
    first difference. Returns the number of conversations checked."""
    checked = 0
    for t in templates:
        contexts = sample_contexts(t.source, count, seed, special_tokens)
        want = reference(t.source, contexts)
        got = render_with_server(server, t.name, contexts)
        problem = first_difference(t, contexts, want, got)
        if problem:
            raise ChatTemplateError(problem)
        checked += len(contexts)
    return checked
