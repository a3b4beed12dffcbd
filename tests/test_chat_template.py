"""Chat template -> ChatFormat compilation, the Python/C++ renderers, and parity with jinja2."""

from __future__ import annotations

import json
import random

import pytest

import native_build
from ninfer.demo import chat_templates as T
from ninfer.frontend.chat_template import (
    ChatFormat,
    ChatTemplateError,
    compile_chat_template,
    render_template,
)

pytestmark = pytest.mark.unit

# name -> (template, bos_token, eos_token)
DEMO = {
    "qwen3_simple": (T.QWEN3_SIMPLE_TEMPLATE, "", T.QWEN_EOS),
    "qwen2": (T.QWEN2_TEMPLATE, "", T.QWEN_EOS),
    "llama3": (T.LLAMA3_TEMPLATE, T.LLAMA3_BOS, T.LLAMA3_EOS),
}

# Not the compiler's fragment list: unicode whitespace (Python str.strip() set), braces, markup.
_POOL = (
    "word", "Two words.", "\n", "\r\n", " ", "\t", "{", "}}", "{{ bos_token }}", "{%- endfor %}",
    "ü", "日本語", "🚀", "\u00a0", "\u3000", "\u2028", "\x85", "\x1c", "\u200b", "\u2009", "'",
    '"', "\\n", "<|im_end|>", "<|eot_id|>", "<think>", "%s", "\x00",
)  # fmt: skip


def conversations(fmt: ChatFormat, count: int, seed: int):
    """Fresh random conversations within the format's constraints: (messages, gen, thinking)."""
    rng = random.Random(seed)
    for _ in range(count):
        roles = ["system"] if "system" in fmt.roles and rng.random() < 0.4 else []
        n = rng.randint(1, 7)
        if fmt.alternate_user_assistant:
            roles += ["user" if i % 2 == 0 else "assistant" for i in range(n)]
        else:
            roles += [rng.choice(["user", "assistant"]) for _ in range(n)]
        if "system" in fmt.roles and not fmt.system_must_be_first and rng.random() < 0.2:
            roles.insert(rng.randint(1, len(roles)), "system")
        msgs = []
        for role in roles:
            text = "".join(rng.choice(_POOL) for _ in range(rng.randint(0, 6)))
            text = rng.choice(["", " ", "\n", "\u3000"]) + text + rng.choice(["", " ", "\n\n"])
            msgs.append({"role": role, "content": text})
        yield msgs, rng.random() < 0.5, rng.choice([True, False])


def jinja(name: str, msgs, gen: bool, thinking: bool) -> str:
    template, bos, eos = DEMO[name]
    extra = {} if thinking else {"enable_thinking": False}
    return render_template(
        template, msgs, add_generation_prompt=gen, bos_token=bos, eos_token=eos, **extra
    )


@pytest.fixture(scope="module")
def formats() -> dict[str, ChatFormat]:
    return {
        name: compile_chat_template(t, bos_token=bos, eos_token=eos)
        for name, (t, bos, eos) in DEMO.items()
    }


@pytest.fixture(scope="session")
def chat_ext():
    return native_build.extension("ninfer_chat_ext")


@pytest.mark.parametrize("name", sorted(DEMO))
def test_python_render_matches_jinja(formats, name):
    fmt = formats[name]
    for msgs, gen, thinking in conversations(fmt, 150, seed=1234):
        assert fmt.render(msgs, gen, enable_thinking=thinking) == jinja(name, msgs, gen, thinking)


@pytest.mark.parametrize("name", sorted(DEMO))
def test_cpp_render_matches_python(formats, chat_ext, name):
    fmt = formats[name]
    doc = json.dumps(fmt.to_json())
    for msgs, gen, thinking in conversations(fmt, 150, seed=99):
        pairs = [(m["role"], m["content"]) for m in msgs]
        want = fmt.render(msgs, gen, enable_thinking=thinking)
        assert chat_ext.render_chat(doc, pairs, gen, thinking) == want


def test_derived_formats(formats):
    qwen3, qwen2, llama3 = formats["qwen3_simple"], formats["qwen2"], formats["llama3"]
    assert qwen3.roles["user"].before == "<|im_start|>user\n"
    assert qwen3.roles["assistant"].after == "<|im_end|>\n"
    assert qwen3.default_system is None
    assert qwen3.generation_prompt == "<|im_start|>assistant\n"
    assert qwen3.generation_prompt_no_thinking == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert qwen2.default_system == T.QWEN_DEFAULT_SYSTEM
    assert qwen2.generation_prompt_no_thinking is None
    assert llama3.prefix == T.LLAMA3_BOS
    assert all(r.trim for r in llama3.roles.values())
    assert not any(r.trim for r in qwen2.roles.values())
    for fmt in formats.values():
        assert set(fmt.roles) == {"system", "user", "assistant"}
        assert not fmt.system_must_be_first and not fmt.alternate_user_assistant
        assert ChatFormat.from_json(json.loads(json.dumps(fmt.to_json()))) == fmt


def test_real_qwen3_template_is_rejected():
    with pytest.raises(ChatTemplateError, match="cannot be represented") as err:
        compile_chat_template(T.QWEN3_TEMPLATE, eos_token=T.QWEN_EOS)
    assert "jinja2:" in str(err.value) and "format:" in str(err.value)


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ loop.index }}. {{ m.role }}: {{ m.content }}\n{% endfor %}",
        "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}</s>{% endfor %}",
        "{% for m in messages %}<{{ m.role }}>{{ m.content | replace('{', '(') }}{% endfor %}",
        "{% for m in messages %}{{ m.role }}: {{ m.content.lstrip() }}\n{% endfor %}",
        "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}{% endfor %}",
        "Today is {{ strftime_now('%d %b %Y') }}."
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    ],
    ids=["loop_index", "upper", "replace", "lstrip", "last_message", "date"],
)
def test_unrepresentable_templates_are_rejected(template):
    with pytest.raises(ChatTemplateError, match="cannot be represented"):
        compile_chat_template(template, samples=100)


def test_invalid_jinja_is_rejected():
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        compile_chat_template("{% for m in messages %}{{ m.content }}")


# Mistral-like: system only first, user/assistant must alternate, both enforced by the template.
STRICT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(i=0) %}{% for m in messages %}"
    "{% if m.role == 'system' %}"
    "{% if not loop.first %}{{ raise_exception('system must be first') }}{% endif %}"
    "<<SYS>>{{ m.content }}<</SYS>>"
    "{% else %}"
    "{% if (m.role == 'user') != (ns.i % 2 == 0) %}{{ raise_exception('alternate!') }}{% endif %}"
    "{% set ns.i = ns.i + 1 %}"
    "{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% else %} {{ m.content }}</s>{% endif %}"
    "{% endif %}{% endfor %}"
)


def test_constraints_detected_and_enforced(chat_ext):
    fmt = compile_chat_template(STRICT_TEMPLATE, bos_token="<s>", eos_token="</s>")
    assert fmt.system_must_be_first and fmt.alternate_user_assistant
    assert fmt.prefix == "<s>" and fmt.generation_prompt == ""
    doc = json.dumps(fmt.to_json())
    ok = [("system", "S"), ("user", "u"), ("assistant", "a"), ("user", "v")]
    want = render_template(STRICT_TEMPLATE, ok, bos_token="<s>")
    assert fmt.render(ok, False) == want == chat_ext.render_chat(doc, ok, False)
    for bad, match in [
        ([("user", "u"), ("system", "S")], "system message is only allowed as the first"),
        ([("user", "u"), ("user", "v")], "must alternate"),
        ([("assistant", "a")], "must alternate"),
        ([], "at least one message"),
    ]:
        with pytest.raises(ValueError, match=match) as py_err:
            fmt.render(bad, True)
        with pytest.raises(ValueError, match=match) as cpp_err:
            chat_ext.render_chat(doc, bad, True)
        assert str(py_err.value) == str(cpp_err.value)


def test_cpp_unknown_role(formats, chat_ext):
    doc = json.dumps(formats["qwen2"].to_json())
    with pytest.raises(ValueError, match=r"messages\[1\]\.role: 'tool'") as err:
        chat_ext.render_chat(doc, [("user", "hi"), ("tool", "42")], True)
    assert "'system', 'user', and 'assistant'" in str(err.value)
    with pytest.raises(ValueError) as py_err:
        formats["qwen2"].render([("user", "hi"), ("tool", "42")], True)
    assert str(py_err.value) == str(err.value)


def test_transformers_apply_chat_template_agrees():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, T.LLAMA3_BOS: 1, T.LLAMA3_EOS: 2, T.QWEN_EOS: 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    cases = [("llama3", T.LLAMA3_BOS, T.LLAMA3_EOS), ("qwen3_simple", None, T.QWEN_EOS)]
    for name, bos, eos in cases:
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token=bos,
            eos_token=eos,
            unk_token="[UNK]",
            chat_template=DEMO[name][0],
        )
        fmt = compile_chat_template(DEMO[name][0], bos_token=bos or "", eos_token=eos)
        for msgs, gen, thinking in conversations(fmt, 30, seed=7):
            extra = {} if thinking else {"enable_thinking": False}
            hf = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **extra)
            assert hf == jinja(name, msgs, gen, thinking) == fmt.render(msgs, gen, thinking)


# Llama-3.1-like: the leading system message (or an empty one) gets a date header; later system
# messages would not, so the format is restricted to a leading system message.
LEADING_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% if messages[0].role == 'system' %}"
    "{% set sys = messages[0].content | trim %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024\n\n{{ sys }}<|eot_id|>"
    "{% for m in msgs %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_leading_system_only_with_injected_header(chat_ext):
    fmt = compile_chat_template(LEADING_SYSTEM_TEMPLATE, bos_token=T.LLAMA3_BOS)
    assert fmt.system_must_be_first and fmt.default_system == ""
    assert fmt.prefix == T.LLAMA3_BOS and fmt.roles["system"].trim
    doc = json.dumps(fmt.to_json())
    for msgs, gen, _ in conversations(fmt, 50, seed=3):
        pairs = [(m["role"], m["content"]) for m in msgs]
        want = render_template(
            LEADING_SYSTEM_TEMPLATE, msgs, add_generation_prompt=gen, bos_token=T.LLAMA3_BOS
        )
        assert fmt.render(pairs, gen) == want == chat_ext.render_chat(doc, pairs, gen)


def test_cpp_rejects_bad_format_json(chat_ext):
    with pytest.raises(ValueError, match="version"):
        chat_ext.render_chat(json.dumps({"version": 99}), [("user", "x")], True)
    with pytest.raises(ValueError, match="invalid chat format"):
        chat_ext.render_chat(json.dumps({"version": 1, "prefix": ""}), [("user", "x")], True)
