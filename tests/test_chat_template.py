"""Chat templates compiled to C++: the generated code against jinja2 (transformers' env).

The templates of tests/chat_suite.py (demo, unit, and corpus ones) are generated into the
ninfer_chat_ext test module; each render context goes through both and must give the same
text, or the same exception type and message.
"""

from __future__ import annotations

import json

import pytest

import chat_suite
import native_build
from ninfer.chat_verify import Rendered, first_difference, reference, sample_contexts
from ninfer.frontend.chat_codegen import generate
from ninfer.frontend.chat_codegen_expr import (
    SUPPORTED_FILTERS,
    SUPPORTED_METHODS,
    SUPPORTED_TESTS,
)
from ninfer.frontend.chat_template import ChatTemplate, ChatTemplateError, checkpoint_templates

pytestmark = pytest.mark.unit


@pytest.fixture(scope="session")
def chat_ext():
    return native_build.extension("ninfer_chat_ext")


def cpp(ext, name: str, contexts) -> list[Rendered]:
    out = ext.render_chat_template(name, [json.dumps(c) for c in contexts])
    return [Rendered(text, "", "") if ok else Rendered(None, text, msg) for ok, text, msg in out]


def check(ext, name: str, source: str, contexts) -> None:
    want = reference(source, contexts)
    got = cpp(ext, name, contexts)
    problem = first_difference(ChatTemplate(name, source), contexts, want, got)
    assert problem is None, problem


def test_builtin_tables_agree(chat_ext):
    b = chat_ext.jinja_builtins()
    assert set(b["filters"]) == SUPPORTED_FILTERS
    assert set(b["tests"]) == SUPPORTED_TESTS
    implemented = {m.split(".")[1] for m in b["methods"]}
    assert implemented <= SUPPORTED_METHODS
    # the rest are the container-changing methods the sandbox refuses
    assert SUPPORTED_METHODS - implemented == {"append", "pop", "update", "extend", "insert",
                                               "remove", "clear", "setdefault", "sort",
                                               "reverse", "popitem"}


USERS = [{"name": "ann", "age": 31, "admin": True}, {"name": "bob", "age": 19},
         {"name": "cy", "age": 25, "admin": False}]
X = {"b": [1, 2.5, None, True, "é\n\u2028"], "a": {"z": {}, "y": []}, "c": "x"}


@pytest.mark.parametrize("name", sorted(chat_suite.UNIT))
def test_unit_templates_match_jinja(chat_ext, name):
    contents = ["hi", "attr", "add", "none", "index", "iter", "json", "cmp", "ns", "append",
                "undef", "naïve 🙂"]
    contexts = [{"messages": [{"role": "user", "content": c}], "x": X, "users": USERS}
                for c in contents]
    contexts.append({"messages": [{"role": "user", "content": "a"},
                                  {"role": "assistant", "content": "b"}], "x": X, "users": USERS})
    check(chat_ext, f"unit/{name}", chat_suite.UNIT[name], contexts)
    if name == "raises":  # every branch raised where jinja2 does
        kinds = {r.error_type for r in reference(chat_suite.UNIT[name], contexts)}
        assert {"TemplateError", "UndefinedError", "TypeError", "SecurityError"} <= kinds


@pytest.mark.parametrize("name", sorted(chat_suite.DEMO))
def test_demo_templates_match_jinja(chat_ext, name):
    source = chat_suite.DEMO[name]
    contexts = sample_contexts(source, 300, seed=7,
                               special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    check(chat_ext, f"demo/{name}", source, contexts)


def test_difference_is_reported_with_position():
    t = ChatTemplate("default", "x")
    ctx = [{"messages": [{"role": "user", "content": "hi"}]}]
    msg = first_difference(t, ctx, [Rendered("abcdef")], [Rendered("abcXef")])
    assert msg is not None and "first difference at character 3" in msg and '"hi"' in msg
    msg = first_difference(t, ctx, [Rendered(None, "TemplateError", "no")], [Rendered("a")])
    assert msg is not None and "raises TemplateError: no" in msg


@pytest.mark.parametrize(("source", "what", "line"), [
    ("{% include 'x.jinja' %}", "'Include' statement", 1),
    ("hi\n{{ messages | from_json }}", "the filter 'from_json'", 2),
    ("{% macro m() %}{{ caller() }}{% endmacro %}\n\n{% call m() %}x{% endcall %}",
     "'caller' in a macro", 1),
    ("{{ '{}'.format(1) }}", "the method '.format()'", 1),
    ("{% for m in messages recursive %}{{ loop(m) }}{% endfor %}", "a recursive for loop", 1),
    ("{{ x is sameas_not_a_test }}", "the test 'sameas_not_a_test'", 1),
    ("{% for m in messages %}{{ loop.changed(m) }}{% endfor %}", "'loop.changed()'", 1),
])
def test_unsupported_constructs_name_themselves_and_their_line(source, what, line):
    with pytest.raises(ChatTemplateError) as err:
        generate(ChatTemplate("default", source), "t", "t")
    assert what in str(err.value) and f"line {line}" in str(err.value)


def test_invalid_jinja_is_refused():
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        generate(ChatTemplate("default", "{% for m in messages %}{{ m.content }}"), "t", "t")


def test_checkpoint_template_forms():
    assert checkpoint_templates(None) == ()
    assert checkpoint_templates("x") == (ChatTemplate("default", "x"),)
    named = checkpoint_templates([{"name": "tool_use", "template": "t"},
                                  {"name": "default", "template": "d"},
                                  {"name": "rag", "template": "r"}])
    assert named == (ChatTemplate("default", "d"), ChatTemplate("tool_use", "t"))
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        checkpoint_templates([{"name": "tool_use", "template": "t"}])


def test_generated_source_names_template_and_hash():
    t = ChatTemplate("default", "{{ messages[0].content }}")
    cpp_text = generate(t, "ns1", "default")
    assert cpp_text.startswith("// generated by ninfer-compile")
    assert t.sha256 in cpp_text and "namespace ninfer::chat_templates::ns1" in cpp_text
    assert generate(t, "ns1", "default") == cpp_text  # deterministic
