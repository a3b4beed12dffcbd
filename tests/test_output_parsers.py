"""Reasoning and tool calls parsed back out of the model's output.

- The parser for each real chat template (llama.cpp's corpus) is the expected one
  (ninfer.frontend.output_formats).
- The native parser test (tests/native/test_output_parser.cpp): every format, every way
  of splitting an output into deltas, malformed calls, the thinking budget.
- Over HTTP, through the official `openai` client, the real server over the fake model
  scripted to write a given output (NINFER_FAKE_SCRIPT, tests/native/fake_server_model.cpp)
  with a byte-level vocabulary: reasoning_content / content, tool_calls with
  finish_reason tool_calls, streamed deltas that reassemble to the non-streamed message,
  reasoning_tokens, the thinking budget, and the 400s; structured output that starts after
  the reasoning (vLLM's order), and n > 1 choices with their own grammar and budget.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

import native_build
from chat_suite import SCRIPTED_PROMPTS
from ninfer.frontend.output_formats import OutputParsers, detect_output_parsers

HANG = 60.0

def _corpus_template(name: str) -> str:
    """One of llama.cpp's real templates (tests/real_world.py fetches and caches them)."""
    import real_world

    return real_world.corpus_templates()[name]


EXPECTED_PARSERS = {
    "Qwen-Qwen3-0.6B": ("think", "hermes"),
    "Qwen3.5-4B": ("think", "qwen3_coder"),
    "Qwen-Qwen2.5-7B-Instruct": ("none", "hermes"),
    "Qwen-QwQ-32B": ("think", "hermes"),
    "Qwen3-Coder": ("none", "qwen3_coder"),
    "meta-llama-Llama-3.1-8B-Instruct": ("none", "llama3_json"),
    "meta-llama-Llama-3.2-3B-Instruct": ("none", "llama3_json"),
    "meta-llama-Llama-3.3-70B-Instruct": ("none", "llama3_json"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("none", "none"),
    "Mistral-Small-3.2-24B-Instruct-2506": ("none", "none"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("think", "none"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("think", "none"),
    "HuggingFaceTB-SmolLM3-3B": ("think", "none"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("none", "hermes"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("none", "hermes"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("think", "qwen3_coder"),
    "GLM-4.6": ("think", "none"),  # <tool_call> with <arg_key> tags: not hermes
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARSERS))
def test_corpus_template_picks_its_parsers(name: str) -> None:
    reasoning, tool_calls = EXPECTED_PARSERS[name]
    assert detect_output_parsers(_corpus_template(name)) == OutputParsers(reasoning, tool_calls)


def test_no_template_no_parsers() -> None:
    assert detect_output_parsers(None).to_json() == {"reasoning": "none", "tool_calls": "none"}
    with pytest.raises(ValueError, match="known: none, hermes"):
        OutputParsers("none", "mistral")


def test_native_output_parsers() -> None:
    binary = native_build.build("test_output_parser") / "test_output_parser"
    r = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "output parsers ok" in r.stdout


# ---------------------------------------------------------------------------------------
# Over HTTP: the scripted fake model


def _byte_char(b: int) -> str:
    """GPT-2's byte-to-character mapping (as tests/native/byte_vocab.h)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


ADDED = ["<eos>", "<gen>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
SPECIAL = {"<eos>", "<gen>"}


def _byte_tokenizer() -> dict[str, Any]:
    return {"model": {"type": "BPE", "vocab": {_byte_char(b): b for b in range(256)},
                      "merges": []},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
            "decoder": {"type": "ByteLevel"},
            "added_tokens": [{"id": 256 + i, "content": t, "special": t in SPECIAL}
                             for i, t in enumerate(ADDED)]}


def _manifest(generation_prompt: str, parsers: tuple[str, str]) -> dict[str, Any]:
    from chat_suite import scripted_template
    from ninfer.frontend.chat_template import ChatTemplate, manifest_entry

    template = ChatTemplate("default", scripted_template(generation_prompt))
    return {
        "model": {"id": "fake"},
        "target": {"name": "fake", "hash": "0"},
        "tokenizer": _byte_tokenizer(),
        # enable_thinking=false renders Qwen3's closed think block
        "chat_template": manifest_entry((template,), {}),
        "eos_token_ids": [256],
        "output_parsers": {"reasoning": parsers[0], "tool_calls": parsers[1]},
    }


@pytest.fixture(scope="session")
def fake_server() -> Path:
    return native_build.build("fake_server") / "fake-server" / "ninfer-server"


@pytest.fixture
def scripted(fake_server: Path, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """start(script, *flags, generation_prompt=, parsers=): a server whose model writes
    `script` after the generation prompt."""
    from ninfer.artifact import write_artifact
    from ninfer.runtime import Server

    started: list[Any] = []

    def start(script: str, *flags: str, generation_prompt: str = "<gen>",
              parsers: tuple[str, str] = ("think", "hermes")) -> Any:
        artifact = tmp_path / f"model{len(started)}.ninfer"
        write_artifact(artifact, _manifest(generation_prompt, parsers), [])
        monkeypatch.setenv("NINFER_FAKE_SCRIPT", script)
        monkeypatch.delenv("NINFER_FAKE_GATE", raising=False)
        srv = Server(fake_server, extra_args=("--artifact", str(artifact), *flags),
                     startup_timeout=HANG).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.alive(), "\n".join(srv.output)
        srv.stop()


USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}}]


def _client(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_base_url, api_key="unused", timeout=HANG,
                         max_retries=0)


def _plain(srv: Any, **kw: Any) -> dict[str, Any]:
    """A non-streamed chat completion: the message, finish_reason and usage as dicts."""
    extra = kw.pop("extra_body", {})
    r = _client(srv).chat.completions.create(model="fake", messages=kw.pop("messages", USER),
                                             temperature=0, extra_body=extra, **kw)
    d = r.model_dump(exclude_none=True)
    return {"message": d["choices"][0]["message"], "finish": d["choices"][0]["finish_reason"],
            "usage": d["usage"]}


def _streamed(srv: Any, **kw: Any) -> dict[str, Any]:
    """The same request streamed, its deltas reassembled; checks the chunks' shapes."""
    extra = kw.pop("extra_body", {})
    stream = _client(srv).chat.completions.create(
        model="fake", messages=kw.pop("messages", USER), temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra, **kw)
    msg: dict[str, Any] = {"role": "assistant"}
    calls: list[dict[str, Any]] = []
    finish, usage, first = None, None, True
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(exclude_none=True)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta.model_dump(exclude_none=True)
        assert (delta.get("role") == "assistant") == first, delta
        first = False
        for key in ("reasoning_content", "content"):
            if key in delta:
                msg[key] = msg.get(key, "") + delta[key]
        for tc in delta.get("tool_calls", []):
            if "id" in tc:  # a call's first chunk: id, type, name, empty arguments
                assert tc["index"] == len(calls) and tc["type"] == "function", tc
                assert tc["function"]["arguments"] == "", tc
                calls.append({"id": tc["id"], "type": "function",
                              "function": {"name": tc["function"]["name"], "arguments": ""}})
            else:
                assert set(tc) == {"index", "function"} and "name" not in tc["function"], tc
                calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
        finish = choice.finish_reason or finish
    if calls:
        msg["tool_calls"] = calls
    return {"message": msg, "finish": finish, "usage": usage}


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    m = dict(message)
    for c in m.get("tool_calls", []):
        assert c["id"].startswith("call_") and len(c["id"]) == 29, c
    m["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in m.get("tool_calls", [])]
    return m


def _both(srv: Any, **kw: Any) -> dict[str, Any]:
    """The non-streamed result, checked equal to the streamed one (ids aside)."""
    plain, streamed = _plain(srv, **kw), _streamed(srv, **kw)
    want = _without_ids(plain["message"])
    if want.get("content") is None:
        want.pop("content", None)  # a stream sends no content for a call-only message
    assert _without_ids(streamed["message"]) == want, (streamed, plain)
    assert streamed["finish"] == plain["finish"]
    assert streamed["usage"].get("completion_tokens_details") == \
        plain["usage"].get("completion_tokens_details")
    return plain


def _reasoning_tokens(r: dict[str, Any]) -> int:
    return int(r["usage"]["completion_tokens_details"]["reasoning_tokens"])


THINK = "<think>\nThe user asks about the weather.\n</think>\n\nIt is sunny in Paris."


def test_reasoning_and_content_split(scripted: Callable[..., Any]) -> None:
    srv = scripted(THINK)
    r = _both(srv)
    assert r["message"]["reasoning_content"] == "The user asks about the weather."
    assert r["message"]["content"] == "It is sunny in Paris."
    assert r["finish"] == "stop"
    # byte tokens from after <think> to before </think>
    assert _reasoning_tokens(r) == len("\nThe user asks about the weather.\n")
    # one token per byte, <think> and </think> one each, and <eos>
    assert r["usage"]["completion_tokens"] == len(THINK) - len("<think></think>") + 3


def test_thinking_off_has_no_reasoning(scripted: Callable[..., Any]) -> None:
    srv = scripted(THINK)
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}},
                  {"reasoning_effort": "none"}):
        r = _both(srv, extra_body=extra)
        assert r["message"] == {"role": "assistant", "content": "It is sunny in Paris."}, extra
        assert _reasoning_tokens(r) == 0
    r = _both(srv, extra_body={"include_reasoning": False})
    assert r["message"] == {"role": "assistant", "content": "It is sunny in Paris."}
    assert _reasoning_tokens(r) > 0  # still split off and counted, only left out


def test_generation_prompt_that_opens_think(scripted: Callable[..., Any]) -> None:
    """QwQ / DeepSeek-R1 distills: the prompt ends in `<think>\\n`, the output starts inside."""
    srv = scripted("<think>\nHmm, 2 + 2.\n</think>\n\n4", generation_prompt="<gen><think>\n")
    r = _both(srv, messages=[{"role": "user", "content": "2+2?"}])
    assert r["message"]["reasoning_content"] == "Hmm, 2 + 2."
    assert r["message"]["content"] == "4"
    assert _reasoning_tokens(r) == len("Hmm, 2 + 2.\n")


HERMES = ("<think>\nI need the weather and the time.\n</think>\n\n<tool_call>\n"
          '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


def test_hermes_tool_calls(scripted: Callable[..., Any]) -> None:
    srv = scripted(HERMES)
    r = _both(srv, tools=TOOLS)
    m = r["message"]
    assert r["finish"] == "tool_calls"
    assert m.get("content") is None
    assert m["reasoning_content"] == "I need the weather and the time."
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in m["tool_calls"]]
    assert calls == [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "CET"})]
    assert len({c["id"] for c in m["tool_calls"]}) == 2
    # parallel_tool_calls false: the first call only
    r = _both(srv, tools=TOOLS, parallel_tool_calls=False)
    assert [c["function"]["name"] for c in r["message"]["tool_calls"]] == ["get_weather"]
    # tool_choice none: no parsing, the calls stay text
    r = _both(srv, tools=TOOLS, tool_choice="none")
    assert r["finish"] == "stop" and "tool_calls" not in r["message"]
    assert r["message"]["content"] == HERMES.split("</think>\n\n")[1]
    # no tools: no parsing either
    assert _plain(srv)["message"]["content"] == HERMES.split("</think>\n\n")[1]
    # tool_choice required: the grammar (xgrammar) lets the scripted calls through
    r = _both(srv, tools=TOOLS, tool_choice="required")
    assert r["finish"] == "tool_calls"
    names = [c["function"]["name"] for c in r["message"]["tool_calls"]]
    assert names == ["get_weather", "get_time"]


def test_malformed_tool_call_is_content(scripted: Callable[..., Any]) -> None:
    text = 'Let me look.\n<tool_call>\n{"name": get_weather}\n</tool_call>'
    srv = scripted(text)
    r = _both(srv, tools=TOOLS)
    assert r["finish"] == "stop" and "tool_calls" not in r["message"]
    assert r["message"]["content"] == text


def test_qwen3_coder_tool_calls(scripted: Callable[..., Any]) -> None:
    text = ("I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
            "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n"
            "</parameter>\n</function>\n</tool_call>")
    srv = scripted(text, "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "none")
    r = _both(srv, tools=TOOLS)
    assert r["finish"] == "tool_calls"
    assert r["message"]["content"] == "I will check."
    [call] = r["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "New York", "days": 3,
                                                         "metric": True}
    assert "completion_tokens_details" not in r["usage"]  # no reasoning parser


def test_llama3_json_tool_call(scripted: Callable[..., Any]) -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    srv = scripted(text, parsers=("none", "llama3_json"))
    r = _both(srv, tools=TOOLS)
    assert r["finish"] == "tool_calls"
    [call] = r["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == \
        ("get_weather", {"city": "Paris"})
    assert r["message"].get("content") is None


BUDGET = "<think>\nLet me think about this for a long while.\n</think>\n\nThe answer."


def test_thinking_budget_closes_the_block(scripted: Callable[..., Any]) -> None:
    srv = scripted(BUDGET)
    r = _both(srv, extra_body={"thinking_budget": 5})
    # "\n", "L", "e", "t" written, then the forced "\n" makes 5; "</think>\n\n" follows
    assert _reasoning_tokens(r) == 5
    assert r["message"]["reasoning_content"] == "Let"
    assert r["message"]["content"] == "The answer."
    assert r["finish"] == "stop"
    r = _plain(srv, extra_body={"thinking_token_budget": 0})
    assert _reasoning_tokens(r) == 0 and "reasoning_content" not in r["message"]
    assert r["message"]["content"] == "The answer."
    # the server's default, and a request lifting it
    srv = scripted(BUDGET, "--reasoning-budget", "9")
    r = _plain(srv)
    assert _reasoning_tokens(r) == 9
    assert r["message"]["reasoning_content"] == "Let me"  # "\nLet me " + "\n"
    r = _plain(srv, extra_body={"thinking_budget": -1})
    assert r["message"]["reasoning_content"] == "Let me think about this for a long while."


def _status(srv: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = srv.client.post("/v1/chat/completions", json={"messages": USER, **body})
    return r.status_code, r.json()


def test_refusals_name_the_field(scripted: Callable[..., Any]) -> None:
    srv = scripted(THINK)
    for body, param in [({"tool_choice": "required"}, "tool_choice"),
                        ({"tool_choice": "auto"}, "tool_choice"),
                        ({"tools": [{"type": "function"}]}, "tools[0].function"),
                        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
                        ({"thinking_budget": -2}, "thinking_budget"),
                        ({"thinking_budget": 4, "thinking_token_budget": 5},
                         "thinking_token_budget"),
                        ({"include_reasoning": "no"}, "include_reasoning"),
                        ({"parallel_tool_calls": 1}, "parallel_tool_calls")]:
        status, err = _status(srv, body)
        assert status == 400 and err["error"]["param"] == param, (body, err)
    plain = scripted(THINK, "--reasoning-parser", "none")
    status, err = _status(plain, {"thinking_budget": 10})
    assert status == 400 and err["error"]["param"] == "thinking_budget", err
    r = _plain(plain)  # no reasoning parser: the text as written
    assert r["message"]["content"] == THINK


def test_unknown_parser_flag_is_refused(fake_server: Path) -> None:
    r = subprocess.run([str(fake_server), "--tool-call-parser", "mistral"], capture_output=True,
                       text=True, timeout=HANG)
    assert r.returncode == 2
    assert "--tool-call-parser" in r.stderr and "qwen3_coder" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# Structured output on a thinking model, and n > 1 with constraints (each choice its own)

COLORS = ["red", "green", "blue", "cyan", "gray", "pink", "gold", "teal"]
WEATHER_SCHEMA = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 12},
                                 "color": {"enum": COLORS}},
                  "required": ["city", "color"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema",
               "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True}}


@pytest.mark.parametrize("generation_prompt", SCRIPTED_PROMPTS)
def test_thinking_then_json(scripted: Any, generation_prompt: str) -> None:
    """The reasoning is free; the answer after it follows the schema (vLLM's order)."""
    answer = '{"city": "Paris", "color": "blue"}'
    srv = scripted(f"<think>\nThe user wants JSON [not this].\n</think>\n\n{answer}",
                   generation_prompt=generation_prompt)
    r = _both(srv, response_format=JSON_SCHEMA)
    assert r["message"]["reasoning_content"] == "The user wants JSON [not this]."
    assert r["message"]["content"] == answer
    assert r["finish"] == "stop"


def test_json_after_thinking_is_enforced(scripted: Any) -> None:
    srv = scripted('<think>\nPurple, I think.\n</think>\n\n{"city": "Paris", "color": "purple"}')
    r = _both(srv, response_format=JSON_SCHEMA)
    assert r["message"]["reasoning_content"] == "Purple, I think."
    obj = json.loads(r["message"]["content"])
    jsonschema.validate(obj, WEATHER_SCHEMA)
    assert obj["city"] == "Paris" and obj["color"] == "pink"  # "p", then the grammar's pick
    # thinking off: no block, the grammar from the first token
    r = _both(srv, response_format=JSON_SCHEMA,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert "reasoning_content" not in r["message"]
    jsonschema.validate(json.loads(r["message"]["content"]), WEATHER_SCHEMA)


def test_completions_grammar_from_the_first_token(scripted: Any) -> None:
    """No reasoning parser on completions: the grammar masks the <think> the model wants."""
    srv = scripted('<think>\nno\n</think>\n\n{"city": "Rome", "color": "red"}')
    c = _client(srv).completions.create(model="fake", prompt="Weather?\n<gen>", temperature=0,
                                        max_tokens=60, extra_body={"guided_json": WEATHER_SCHEMA})
    assert "think" not in c.choices[0].text
    jsonschema.validate(json.loads(c.choices[0].text), WEATHER_SCHEMA)


def _n_choices(srv: Any, n: int, stream: bool, **kw: Any) -> list[dict[str, Any]]:
    """The n choices' messages and finish reasons, streamed deltas reassembled by index."""
    client = _client(srv)
    extra = kw.pop("extra_body", {})
    if not stream:
        r = client.chat.completions.create(model="fake", messages=USER, n=n, extra_body=extra,
                                           **kw)
        out = [{**c.message.model_dump(exclude_none=True), "finish": c.finish_reason}
               for c in sorted(r.choices, key=lambda c: c.index)]
        assert r.usage is not None
        out.append({"usage": r.usage.model_dump(exclude_none=True)})
        return out
    got: list[dict[str, Any]] = [{"role": "assistant"} for _ in range(n)]
    usage: dict[str, Any] = {}
    for chunk in client.chat.completions.create(model="fake", messages=USER, n=n, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body=extra, **kw):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(exclude_none=True)
        for choice in chunk.choices:
            m = got[choice.index]
            for key, value in choice.delta.model_dump(exclude_none=True).items():
                if key in ("reasoning_content", "content"):
                    m[key] = m.get(key, "") + value
            if choice.finish_reason:
                m["finish"] = choice.finish_reason
    return [*got, {"usage": usage}]


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_each_follow_the_schema(scripted: Any, stream: bool) -> None:
    srv = scripted('<think>\nA colour.\n</think>\n\n{"city": "Oslo", "color": "violet"}')
    *choices, _ = _n_choices(srv, 3, stream, response_format=JSON_SCHEMA, temperature=1.0,
                             seed=3)
    colors = []
    for m in choices:
        assert m["reasoning_content"] == "A colour." and m["finish"] == "stop", m
        obj = json.loads(m["content"])
        jsonschema.validate(obj, WEATHER_SCHEMA)
        assert obj["city"] == "Oslo"
        colors.append(obj["color"])
    assert len(set(colors)) > 1, colors  # "violet" is masked: each choice samples its own
    # the same seed streamed or not: the same choices (choice i samples with seed + i)
    assert _n_choices(srv, 3, not stream, response_format=JSON_SCHEMA, temperature=1.0,
                      seed=3)[:3] == choices


def test_n_choices_completions_json(scripted: Any) -> None:
    srv = scripted('{"city": "Lima", "color": "violet"}')
    c = _client(srv).completions.create(model="fake", prompt="Weather?\n<gen>", n=3, seed=5,
                                        temperature=1.0, max_tokens=60,
                                        extra_body={"guided_json": WEATHER_SCHEMA})
    objs = [json.loads(ch.text) for ch in sorted(c.choices, key=lambda ch: ch.index)]
    for obj in objs:
        jsonschema.validate(obj, WEATHER_SCHEMA)
    assert len({o["color"] for o in objs}) > 1


BUDGET_SCRIPT = "<think>\nLet me think about this for a long while.\n</think>\n\n"


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_with_a_thinking_budget(scripted: Any, stream: bool) -> None:
    srv = scripted(BUDGET_SCRIPT + "The answer.")
    *choices, usage = _n_choices(srv, 2, stream, temperature=0,
                                 extra_body={"thinking_budget": 5})
    for m in choices:  # each choice's own budget: "\n", "L", "e", "t" and the forced "\n"
        assert (m["reasoning_content"], m["content"], m["finish"]) == \
            ("Let", "The answer.", "stop"), m
    assert usage["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2 * 5
    # a budget and a schema: the forced "</think>\n\n" passes the gate, then the JSON
    srv = scripted(BUDGET_SCRIPT + '{"city": "Bern", "color": "gold"}')
    *choices, _ = _n_choices(srv, 2, stream, temperature=0, response_format=JSON_SCHEMA,
                             extra_body={"thinking_budget": 5})
    for m in choices:
        assert m["reasoning_content"] == "Let", m
        jsonschema.validate(json.loads(m["content"]), WEATHER_SCHEMA)
