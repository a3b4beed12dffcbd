"""Template parity with the real world (issue 13's acceptance): llama.cpp's corpus of
official chat templates, rendered by the C++ ninfer generates from them and tokenized by
ninfer's C++ tokenizer loaded from the real tokenizer, give exactly the token ids of
transformers' `apply_chat_template(..., tokenize=True)` on 200 generated conversations per
template (tools, tool calls with string and object arguments, tool results, reasoning,
system messages, enable_thinking on and off). A conversation transformers refuses must be
refused with the same message. And once through a running server: `prompt_token_ids` of
the fake server serving the real Qwen3 template with tools are the same ids.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import chat_suite
import native_build
import real_world
from ninfer.chat_verify import sample_contexts
from ninfer.frontend.chat_template import ChatTemplate, manifest_entry

pytestmark = pytest.mark.unit

CONVERSATIONS = 200

# Corpus templates ninfer's compiler refuses, and why (README.md "Chat templates" lists them).
REFUSED = {
    "deepseek-ai-DeepSeek-V3.2": "the filter 'from_json'",
    "deepseek-ai-DeepSeek-V4": "the filter 'from_json'",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "the filter 'from_json'",
    "tencent-Hy3": "the method '.format()'",
}


@pytest.fixture(scope="module")
def ext() -> Any:
    real_world.models_dir()  # the corpus first: the module carries its templates
    return native_build.extension("ninfer_chat_ext")


@cache
def hf_tokenizer(vocab: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_world.tokenizer_dir(vocab)))


def special_tokens(tok: Any) -> dict[str, Any]:
    return {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}


def hf_ids(tok: Any, source: str, ctx: dict[str, Any]) -> tuple[list[int] | None, str]:
    kwargs = {k: v for k, v in ctx.items()
              if k not in ("messages", "tools", "add_generation_prompt")}
    try:
        ids = tok.apply_chat_template(ctx["messages"], tools=ctx.get("tools"), tokenize=True,
                                      add_generation_prompt=ctx["add_generation_prompt"],
                                      chat_template=source, return_dict=False, **kwargs)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    return list(ids), ""


def test_refused_corpus_templates_are_the_listed_ones():
    refused = {n: e for n, e in chat_suite.corpus_compiles().items() if e}
    assert set(refused) == set(REFUSED)
    for name, what in REFUSED.items():
        assert what in refused[name]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in REFUSED:
        assert name in readme


@pytest.mark.parametrize("name", sorted(chat_suite.PARITY))
def test_corpus_template_token_parity(ext, name):
    source = real_world.corpus_templates()[name]
    vocab = chat_suite.PARITY[name]
    tok = hf_tokenizer(vocab)
    ours = ext.Tokenizer(json.dumps(real_world.tokenizer_json(vocab)))
    contexts = sample_contexts(source, CONVERSATIONS, seed=13, special_tokens=special_tokens(tok))
    rendered = ext.render_chat_template(f"corpus/{name}", [json.dumps(c) for c in contexts])
    raised = 0
    for k, (ctx, (ok, text, msg)) in enumerate(zip(contexts, rendered, strict=True)):
        want, want_error = hf_ids(tok, source, ctx)
        where = f"{name}, conversation {k}: {json.dumps(ctx, ensure_ascii=False)[:1500]}"
        if want is None:
            raised += 1
            assert not ok, f"{where}\ntransformers raised {want_error}, ninfer rendered {text!r}"
            assert want_error == f"{text}: {msg}", where
            continue
        assert ok, f"{where}\nninfer raised {text}: {msg}"
        got = ours.encode(text, False)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                      min(len(got), len(want)))
            pytest.fail(f"{where}\nfirst differing token at {at}: ours "
                        f"{tok.decode(got[at:at + 8])!r}, "
                        f"transformers {tok.decode(want[at:at + 8])!r}")
    # the conversations are not mostly ones the template refuses
    assert raised < CONVERSATIONS // 2, f"{name}: {raised} of {CONVERSATIONS} refused"


def test_server_prompt_token_ids_match_apply_chat_template(ext, monkeypatch, tmp_path):
    from ninfer.artifact import write_artifact
    from ninfer.runtime import Server

    real_world.models_dir()
    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    source = real_world.corpus_templates()["Qwen-Qwen3-0.6B"]
    tok = hf_tokenizer("qwen2")
    special = special_tokens(tok)
    manifest = {"model": {"id": "fake"}, "target": {"name": "fake", "hash": "0"},
                "tokenizer": real_world.tokenizer_json("qwen2"),
                "chat_template": manifest_entry((ChatTemplate("default", source),), special),
                "eos_token_ids": [tok.convert_tokens_to_ids("<|im_end|>")]}
    artifact = tmp_path / "model.ninfer"
    write_artifact(artifact, manifest, [])
    monkeypatch.setenv("NINFER_FAKE_MAX_CONTEXT", "4096")
    monkeypatch.delenv("NINFER_FAKE_GATE", raising=False)
    contexts = [c for c in sample_contexts(source, 40, seed=5) if c.get("tools")][:8]
    assert contexts
    with Server(binary, extra_args=("--artifact", str(artifact)), startup_timeout=60) as srv:
        for ctx in contexts:
            body = {"messages": ctx["messages"], "tools": ctx["tools"], "max_tokens": 1,
                    "return_token_ids": True, "add_generation_prompt": True}
            if "enable_thinking" in ctx:
                body["chat_template_kwargs"] = {"enable_thinking": ctx["enable_thinking"]}
            r = srv.client.post("/v1/chat/completions", json=body)
            # the server parses string tool-call arguments to objects, as vLLM does
            msgs = json.loads(json.dumps(ctx["messages"]))
            for m in msgs:
                for call in m.get("tool_calls") or []:
                    if isinstance(call["function"]["arguments"], str):
                        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            want, err = hf_ids(tok, source,
                               {**ctx, "messages": msgs, "add_generation_prompt": True})
            if want is None:
                assert r.status_code == 400
                assert err.split(": ", 1)[1] in r.json()["error"]["message"]
                continue
            assert r.status_code == 200, r.text
            assert r.json()["prompt_token_ids"] == want
        # continue_final_message: the prompt ends inside the last assistant message, with
        # no end of turn after it, as transformers renders it (Qwen3's history rewriting
        # and thinking on and off included).
        for ctx in ({"messages": [{"role": "user", "content": "Name a prime."},
                                  {"role": "assistant", "content": "Sure: the first is"}]},
                    {"messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "2+2?"},
                                  {"role": "assistant", "content": "It is"}],
                     "enable_thinking": False},
                    {"messages": [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello"},
                                  {"role": "user", "content": "Count to three."},
                                  {"role": "assistant", "content": "One, two,"}],
                     "enable_thinking": True}):
            body = {"messages": ctx["messages"], "max_tokens": 1, "return_token_ids": True,
                    "continue_final_message": True, "add_generation_prompt": False}
            if "enable_thinking" in ctx:
                body["chat_template_kwargs"] = {"enable_thinking": ctx["enable_thinking"]}
            r = srv.client.post("/v1/chat/completions", json=body)
            want, err = hf_ids(tok, source, {**ctx, "add_generation_prompt": False,
                                             "continue_final_message": True})
            assert want is not None, err
            assert r.status_code == 200, r.text
            assert r.json()["prompt_token_ids"] == want
            assert tok.decode(want).endswith(ctx["messages"][-1]["content"])


def test_server_uses_the_tool_use_template_when_tools_are_given(ext, monkeypatch, tmp_path):
    """A checkpoint's named templates: "tool_use" renders requests with tools (as
    transformers' get_chat_template and vLLM pick it), "default" the others."""
    from chat_suite import FAKE_TEMPLATE
    from ninfer.frontend.chat_template import render
    from ninfer.runtime import Server
    from test_fake_server import MANIFEST, tool_use_artifact

    binary, artifact, qwen3 = tool_use_artifact(tmp_path, monkeypatch)
    letters = ext.Tokenizer(json.dumps(MANIFEST["tokenizer"]))
    msgs = [{"role": "user", "content": "what is the weather"}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    with Server(binary, extra_args=("--artifact", str(artifact)), startup_timeout=60) as srv:
        for body, source in (({"messages": msgs}, FAKE_TEMPLATE),
                             ({"messages": msgs, "tools": tools}, qwen3)):
            r = srv.client.post("/v1/chat/completions", json={
                **body, "max_tokens": 1, "return_token_ids": True})
            assert r.status_code == 200, r.text
            text = render(source, {**body, "add_generation_prompt": True})
            assert r.json()["prompt_token_ids"] == letters.encode(text, False)
