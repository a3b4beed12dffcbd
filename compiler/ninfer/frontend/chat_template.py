"""Compile a checkpoint's Jinja chat template into a `ChatFormat` the C++ server can apply.

The server cannot run Jinja, so at compile time we render the template with jinja2 exactly as
transformers does, using sentinel message contents, and read off a simple format:

    prefix
    [roles.system.before + default_system + roles.system.after]   if default_system and no
                                                                  leading system message
    for each message: roles[role].before + content + roles[role].after
                      (content stripped like Python str.strip() when roles[role].trim)
    generation_prompt (or generation_prompt_no_thinking when enable_thinking=False)

The derived format is then verified against jinja2 on many random conversations; any difference
raises `ChatTemplateError`. Contents are always treated literally: a template that inspects or
rewrites message contents (beyond trimming whitespace) is rejected, never approximated.
`ChatFormat.render` is the reference for `runtime_cpp/text/chat_format.cpp`; keep them in sync.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FORMAT_VERSION = 1
_CANONICAL_ROLES = ("system", "user", "assistant")

Message = Mapping[str, str] | tuple[str, str]


class ChatTemplateError(ValueError):
    """The chat template is invalid or cannot be represented as a `ChatFormat`."""


@dataclass(frozen=True)
class RoleFormat:
    before: str
    after: str
    trim: bool = False


@dataclass(frozen=True)
class ChatFormat:
    prefix: str
    roles: dict[str, RoleFormat] = field(hash=False)
    generation_prompt: str
    default_system: str | None = None
    generation_prompt_no_thinking: str | None = None
    system_must_be_first: bool = False
    alternate_user_assistant: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "prefix": self.prefix,
            "roles": {
                name: {"before": r.before, "after": r.after, "trim": r.trim}
                for name, r in self.roles.items()
            },
            "default_system": self.default_system,
            "generation_prompt": self.generation_prompt,
            "generation_prompt_no_thinking": self.generation_prompt_no_thinking,
            "system_must_be_first": self.system_must_be_first,
            "alternate_user_assistant": self.alternate_user_assistant,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChatFormat:
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported chat format version {d.get('version')!r}")
        return cls(
            prefix=str(d["prefix"]),
            roles={
                str(name): RoleFormat(str(r["before"]), str(r["after"]), bool(r.get("trim", False)))
                for name, r in d["roles"].items()
            },
            generation_prompt=str(d["generation_prompt"]),
            default_system=d.get("default_system"),
            generation_prompt_no_thinking=d.get("generation_prompt_no_thinking"),
            system_must_be_first=bool(d.get("system_must_be_first", False)),
            alternate_user_assistant=bool(d.get("alternate_user_assistant", False)),
        )

    def allowed_roles(self) -> list[str]:
        """Role names in the order error messages list them (canonical first, then sorted)."""
        canon = [r for r in _CANONICAL_ROLES if r in self.roles]
        return canon + sorted(r for r in self.roles if r not in _CANONICAL_ROLES)

    def validate(self, roles: Sequence[str]) -> None:
        """Raise ValueError (OpenAI-style message) if the role sequence is not accepted."""
        if not roles:
            raise ValueError("messages must contain at least one message.")
        expected = "user"
        for i, role in enumerate(roles):
            if role not in self.roles:
                names = [f"'{r}'" for r in self.allowed_roles()]
                last = names.pop()
                listed = f"{', '.join(names)}{',' if len(names) > 1 else ''} and {last}"
                listed = listed if names else last
                raise ValueError(
                    f"Invalid value for messages[{i}].role: '{role}'. "
                    f"Supported values are: {listed}."
                )
            if role == "system":
                if self.system_must_be_first and i != 0:
                    raise ValueError(
                        f"Invalid messages[{i}]: a system message is only allowed as the first "
                        "message for this model."
                    )
                continue
            if self.alternate_user_assistant:
                if role != expected:
                    raise ValueError(
                        f"Invalid messages[{i}]: conversation roles must alternate "
                        "user/assistant/user/assistant/... after an optional leading system "
                        f"message, but got '{role}' where '{expected}' was expected."
                    )
                expected = "assistant" if role == "user" else "user"

    def render(
        self, messages: Sequence[Message], add_generation_prompt: bool, enable_thinking: bool = True
    ) -> str:
        """Apply the format; `messages` are {"role", "content"} dicts or (role, content) pairs."""
        pairs = [_pair(m) for m in messages]
        self.validate([role for role, _ in pairs])
        out = [self.prefix]
        if self.default_system is not None and pairs[0][0] != "system":
            system = self.roles["system"]
            out += [system.before, self.default_system, system.after]
        for role, content in pairs:
            fmt = self.roles[role]
            out += [fmt.before, content.strip() if fmt.trim else content, fmt.after]
        if add_generation_prompt:
            no_think = self.generation_prompt_no_thinking
            out.append(self.generation_prompt if enable_thinking or no_think is None else no_think)
        return "".join(out)


def _pair(m: Message) -> tuple[str, str]:
    if isinstance(m, Mapping):
        return str(m["role"]), str(m["content"])
    role, content = m
    return str(role), str(content)


# --------------------------------------------------------------------------- jinja2 rendering


class _GenerationTag(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` tag; renders its body unchanged."""

    tags: set[str] = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it so)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_passthrough")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _passthrough(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _Renderer:
    """A chat template compiled in transformers' environment."""

    def __init__(
        self,
        template: str,
        bos_token: str,
        eos_token: str,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
        try:
            self.template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template is not valid Jinja: {e}") from e
        self.tokens = {"bos_token": bos_token, "eos_token": eos_token}

    def __call__(
        self, messages: Sequence[Message], gen: bool, thinking: bool | None = None, **extra: Any
    ) -> str:
        variables = {"tools": None, "documents": None, **self.tokens, **extra}
        if thinking is not None:
            variables["enable_thinking"] = thinking
        msgs = [
            dict(m) if isinstance(m, Mapping) else dict(zip(("role", "content"), m))
            for m in messages
        ]
        return self.template.render(messages=msgs, add_generation_prompt=gen, **variables)


def render_template(
    template: str,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = False,
    bos_token: str = "",
    eos_token: str = "",
    **variables: Any,
) -> str:
    """Render a chat template with jinja2 the way transformers' apply_chat_template does."""
    return _Renderer(template, bos_token, eos_token)(messages, add_generation_prompt, **variables)


# --------------------------------------------------------------------------- derivation

_ROLE_LETTERS = {"s": "system", "u": "user", "a": "assistant"}
_PAD = " \n"


def _sentinel(i: int) -> str:
    # Lowercase letters so content rewrites such as `upper` or `title` are caught.
    return f"ninfer{i}sentinelq"


def _cannot(reason: str) -> ChatTemplateError:
    return ChatTemplateError(f"chat template cannot be represented as a ChatFormat: {reason}")


def _clip(text: str, limit: int = 600) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


class _Prober:
    def __init__(self, render: _Renderer) -> None:
        self.render = render

    def ok(self, spec: str) -> bool:
        """Whether the template accepts a conversation with roles `spec` (e.g. "sua")."""
        try:
            self.render([(_ROLE_LETTERS[c], _sentinel(i)) for i, c in enumerate(spec)], False)
        except Exception:
            return False
        return True

    def segments(self, spec: str, pad_at: int = -1) -> list[str]:
        """Render roles `spec` with sentinel contents; return the text around the contents.

        Message `pad_at` gets whitespace around its sentinel (to detect trimming).
        """
        msgs = []
        for i, letter in enumerate(spec):
            content = _sentinel(i)
            msgs.append((_ROLE_LETTERS[letter], _PAD + content + _PAD if i == pad_at else content))
        try:
            text = self.render(msgs, False)
        except Exception as e:
            raise _cannot(f"the template rejects the conversation {msgs!r}: {e}") from e
        out, pos = [], 0
        for i in range(len(spec)):
            s = _sentinel(i)
            at = text.find(s, pos)
            if at < 0 or text.count(s) != 1:
                raise _cannot(
                    "message contents are not emitted exactly once and unchanged "
                    f"(probe {msgs!r} rendered as {_clip(text)})"
                )
            out.append(text[pos:at])
            pos = at + len(s)
        out.append(text[pos:])
        return out


# Derivation is lenient: where probes disagree it keeps a best guess, and verification then
# reports a concrete conversation the format renders differently.
def _minus_prefix(text: str, prefix: str) -> str:
    return text[len(prefix) :] if text.startswith(prefix) else text


def _minus_suffix(text: str, suffix: str) -> str:
    return text[: len(text) - len(suffix)] if suffix and text.endswith(suffix) else text


def _accepts_system_anywhere(probe: _Prober) -> bool:
    return all(probe.ok(spec) for spec in ("su", "usa", "uasu", "sus"))


def _derive(render: _Renderer, bos_token: str, system_anywhere_ok: bool) -> ChatFormat:
    probe = _Prober(render)
    uau = probe.segments("uau")
    after_u = uau[3]
    after_a = probe.segments("ua")[-1]
    roles = {
        "user": RoleFormat(_minus_prefix(uau[2], after_a), after_u),
        "assistant": RoleFormat(_minus_prefix(uau[1], after_u), after_a),
    }
    start_u = probe.segments("u")[0]
    has_system = probe.ok("su")
    system_anywhere = system_anywhere_ok and _accepts_system_anywhere(probe)
    alternate = not all(probe.ok(s) for s in ("uu", "au", "uaa", "a"))
    prefix = _minus_suffix(start_u, roles["user"].before)
    default_system = None
    if has_system:
        su = probe.segments("su")
        start_s = su[0]
        after_s = _minus_suffix(su[1], roles["user"].before)
        if system_anywhere:
            jn_us = probe.segments("usa")[1]
            before_s = _minus_prefix(jn_us, after_u)
            prefix = _minus_suffix(start_s, before_s)
        elif start_s.startswith(prefix):
            before_s = start_s[len(prefix) :]
        else:  # only a leading system message: the prefix/before split is arbitrary
            prefix = bos_token if start_s.startswith(bos_token) else ""
            before_s = start_s[len(prefix) :]
        roles["system"] = RoleFormat(before_s, after_s)
        head, tail = prefix + before_s, after_s + roles["user"].before
        injected = start_u != prefix + roles["user"].before
        if injected and start_u.startswith(head) and start_u[len(head) :].endswith(tail):
            default_system = start_u[len(head) : len(start_u) - len(tail)]

    for spec, at in (("su", 0), ("u", 0), ("ua", 1)):
        role = _ROLE_LETTERS[spec[at]]
        if role not in roles:
            continue
        seg = probe.segments(spec, pad_at=at)
        if not seg[at].endswith(_PAD) and not seg[at + 1].startswith(_PAD):  # content trimmed
            r = roles[role]
            roles[role] = RoleFormat(r.before, r.after, True)

    gen_prompts = []
    for thinking in (None, False):
        base = render([("user", "x")], False, thinking)
        with_gen = render([("user", "x")], True, thinking)
        gen_prompts.append(_minus_prefix(with_gen, base))
    return ChatFormat(
        prefix=prefix,
        roles={r: roles[r] for r in _CANONICAL_ROLES if r in roles},
        generation_prompt=gen_prompts[0],
        default_system=default_system,
        generation_prompt_no_thinking=gen_prompts[1] if gen_prompts[1] != gen_prompts[0] else None,
        system_must_be_first=has_system and not system_anywhere,
        alternate_user_assistant=alternate,
    )


# --------------------------------------------------------------------------- verification

_FRAGMENTS = (
    "hello", "Hello, world!", "x", "1 + 1 = 2", "\n", "\n\n", " ", "  ", "\t", "{", "}",
    "{{ messages }}", "{% if true %}", "{#", "%}", "é", "naïve", "中文", "🙂", "\u00a0", "\u3000",
    "\u2028", "'", '"', "\\", "<b>", "None", "user", "assistant", "system", "0",
)  # fmt: skip
_EDGE_CONTENTS = (
    "", " ", "\n", "  lead", "trail  ", "\n\nboth\n\n", "\u3000wide\u00a0", "\u2003\x1f",
    "a\nb", "{{ raw }}", "🙂",
)  # fmt: skip


def _markup(template: str) -> list[str]:
    """Tag-like strings in the template (e.g. <think>), which templates may look for in contents."""
    found = re.findall(r"</?[A-Za-z_|][^<>\s'\"]{0,40}>|\[/?[A-Z_]{2,20}\]", template)
    return sorted(set(found))


_Sample = tuple[list[tuple[str, str]], bool, bool | None]  # messages, generation prompt, thinking


def _samples(fmt: ChatFormat, template: str, count: int, seed: int) -> Iterator[_Sample]:
    rng = random.Random(seed)
    markup = _markup(template)
    pool = list(_FRAGMENTS) + markup
    has_system = "system" in fmt.roles

    def content() -> str:
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 4)))
        if rng.random() < 0.2:
            text = rng.choice(" \n\t") + text
        if rng.random() < 0.2:
            text += rng.choice([" ", "\n", "\u00a0"])
        return text

    def roles() -> list[str]:
        out = ["system"] if has_system and rng.random() < 0.5 else []
        for i in range(rng.randint(1, 6)):
            if fmt.alternate_user_assistant:
                out.append("user" if i % 2 == 0 else "assistant")
            else:
                out.append(rng.choice(["user", "assistant"]))
        if has_system and not fmt.system_must_be_first and rng.random() < 0.3:
            out.insert(rng.randint(1, len(out)), "system")
        return out

    edge = list(_EDGE_CONTENTS) + markup + [f"a{m}b" for m in markup]
    bases = [("user", ["user"]), ("assistant", ["user", "assistant", "user"])]
    bases += [("assistant", ["user", "assistant"])]
    if has_system:
        bases.append(("system", ["system", "user"]))
    for role, spec in bases:
        at = spec.index(role)
        for text in edge:
            msgs = [(r, text if i == at else "ok") for i, r in enumerate(spec)]
            yield msgs, True, None
    for _ in range(count):
        msgs = [(r, content()) for r in roles()]
        yield msgs, rng.random() < 0.5, rng.choice([None, False])


def _mismatch(
    msgs: list[tuple[str, str]],
    gen: bool,
    thinking: bool | None,
    want: str,
    got: str,
    template: str,
) -> str:
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    lo = max(0, at - 120)

    def window(s: str) -> str:
        return ("..." if lo else "") + _clip(s[lo : at + 120], 400)

    hint = ""
    if "strftime_now" in template:
        hint = "\nnote: the template calls strftime_now; a format cannot follow the current date"
    return (
        "chat template cannot be represented as a ChatFormat: rendering differs for "
        f"conversation {_clip(repr(msgs), 600)} (add_generation_prompt={gen}, "
        f"enable_thinking={'unset' if thinking is None else thinking}); "
        f"first difference at character {at}\n  jinja2: {window(want)}\n  format: {window(got)}"
        + hint
    )


def _verify(fmt: ChatFormat, template: str, render: _Renderer, samples: int, seed: int) -> None:
    for msgs, gen, thinking in _samples(fmt, template, samples, seed):
        try:
            want = render(msgs, gen, thinking)
        except Exception as e:
            raise _cannot(
                f"the template rejects the conversation {_clip(repr(msgs))} that the derived "
                f"format accepts: {e}"
            ) from e
        got = fmt.render(msgs, gen, enable_thinking=thinking is not False)
        if got != want:
            raise ChatTemplateError(_mismatch(msgs, gen, thinking, want, got, template))


def compile_chat_template(
    template: str, *, bos_token: str = "", eos_token: str = "", samples: int = 200, seed: int = 0
) -> ChatFormat:
    """Derive a `ChatFormat` from a Jinja chat template and verify it; raise ChatTemplateError.

    If the template accepts system messages anywhere but the format cannot represent that (e.g.
    the leading system message gets extra text), retry with `system_must_be_first`: the server
    then rejects later system messages instead of rendering them differently.
    """
    render = _Renderer(template, bos_token, eos_token)
    # Verify under a different clock, so templates that embed the current date are rejected.
    frozen = _Renderer(template, bos_token, eos_token, clock=lambda: datetime(2001, 2, 3, 4, 5, 6))
    try:
        fmt = _derive(render, bos_token, system_anywhere_ok=True)
        _verify(fmt, template, frozen, samples, seed)
        return fmt
    except ChatTemplateError:
        if not _accepts_system_anywhere(_Prober(render)):
            raise
    fmt = _derive(render, bos_token, system_anywhere_ok=False)
    _verify(fmt, template, frozen, samples, seed)
    return fmt
