"""A checkpoint's chat templates, and jinja2 rendering them exactly as transformers does.

The server renders chat templates with C++ generated from each template's jinja2 AST
(ninfer.frontend.chat_codegen); `render` here is the reference it is verified against at
compile time (ninfer.chat_verify): transformers' environment (ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks, loopcontrols and the `{% generation %}` tag; its `tojson`,
`raise_exception`, `strftime_now`, `namespace` and `dict`) and what apply_chat_template does
to the inputs (None values dropped from messages, reasoning fields aliased, tools and
documents None when not given).

Checkpoint sources: `tokenizer_config.json` `chat_template` as a string or a named list
([{name, template}]: "default", and "tool_use" which transformers picks when tools are
given), or `chat_template.jinja`; `--chat-template FILE` replaces them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The chat template is invalid, or uses what ninfer's template compiler does not support."""


@dataclass(frozen=True)
class ChatTemplate:
    """One named template of a checkpoint ("default" or "tool_use")."""

    name: str
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def checkpoint_templates(raw: Any) -> tuple[ChatTemplate, ...]:
    """`tokenizer_config.json`'s chat_template (a string or [{name, template}]) as templates."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (ChatTemplate("default", raw),)
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        if "default" not in named:
            raise ChatTemplateError("tokenizer_config.json: the named chat templates have no "
                                    f"'default' (names: {sorted(map(str, named))})")
        return tuple(ChatTemplate(n, str(named[n])) for n in ("default", "tool_use")
                     if isinstance(named.get(n), str))
    raise ChatTemplateError("tokenizer_config.json: chat_template must be a string or a list "
                            f"of {{name, template}}, got {type(raw).__name__}")


def manifest_entry(templates: tuple[ChatTemplate, ...], special_tokens: Mapping[str, str]
                   ) -> dict[str, Any] | None:
    """What the artifact manifest records (the server checks the hashes against its own)."""
    if not templates:
        return None
    return {"templates": [{"name": t.name, "source": t.source, "sha256": t.sha256}
                          for t in templates],
            "special_tokens": dict(special_tokens)}


# --------------------------------------------------------------------------- transformers' env


class GenerationTag(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (AssistantTracker): renders its
    body unchanged."""

    tags: set[str] = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it so)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body
                               ).set_lineno(lineno)

    def _generation_support(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateNamespace(Namespace):
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                f"got {name!r}. Please rename the attribute.")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment(clock: Callable[[], datetime] = datetime.now) -> ImmutableSandboxedEnvironment:
    """transformers' chat template environment (`_compile_jinja_template`)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = _TemplateNamespace
    return env


def parse(source: str) -> nodes.Template:
    """The template's AST (jinja2's own parser), or ChatTemplateError."""
    try:
        return environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template is not valid Jinja (line {e.lineno}): {e.message}"
                                ) from e


def normalized_messages(messages: Any) -> list[Any]:
    """apply_chat_template's message normalization: keys whose value is None dropped, then
    `{"thinking": r, **message, "reasoning_content": r}` where a reasoning field is set."""
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(m)
            continue
        m = {k: v for k, v in m.items() if v is not None}
        r = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        out.append({"thinking": r, **m, "reasoning_content": r} if r is not None else m)
    return out


class Renderer:
    """A template compiled once in transformers' environment; renders contexts."""

    def __init__(self, source: str, clock: Callable[[], datetime] = datetime.now) -> None:
        try:
            self.template = environment(clock).from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template is not valid Jinja (line {e.lineno}): "
                                    f"{e.message}") from e

    def __call__(self, context: Mapping[str, Any]) -> str:
        """`context` as the server builds it: messages, tools, add_generation_prompt, special
        tokens, chat_template_kwargs merged (the C++ ChatTemplate::render contract)."""
        variables = {"tools": None, "documents": None, "add_generation_prompt": False,
                     **context}
        variables["messages"] = normalized_messages(context.get("messages", []))
        return self.template.render(**variables)


def render(source: str, context: Mapping[str, Any]) -> str:
    """Render one context with jinja2 as transformers does."""
    return Renderer(source)(context)
