"""The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens).

Through the official `anthropic` client against the real server over the fake model
(tests/native/fake_model.h; letters are tokens): create, stream, count_tokens, system
prompts, stop sequences, max_tokens, the API key and the error shapes. The translation
between Anthropic's and OpenAI's shapes (server/anthropic.h) is tested on hand-made JSON
through the ninfer_anthropic_ext module: content blocks (tool_use, tool_result,
thinking), tools and tool_choice, and the event stream made from OpenAI chunks that carry
reasoning_content and tool_calls, read back by the official client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

import native_build
from test_fake_server import MANIFEST

KEY = "test-key-1234"

# The fake chat format with a system role; every marker is one letter-token.
def _chat_manifest() -> dict[str, Any]:
    from chat_suite import ROLE_LETTERS_TEMPLATE
    from ninfer.frontend.chat_template import ChatTemplate, manifest_entry

    return {**MANIFEST, "chat_template": manifest_entry(
        (ChatTemplate("default", ROLE_LETTERS_TEMPLATE),), {})}


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ninfer.artifact import write_artifact
    from ninfer.runtime import Server

    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    artifact = tmp_path_factory.mktemp("anthropic") / "model.ninfer"
    write_artifact(artifact, _chat_manifest(), [])
    srv = Server(binary, extra_args=("--artifact", str(artifact), "--api-key", KEY,
                                     "--served-model-name", "fake", "claude-alias"),
                 startup_timeout=60).start()
    yield srv
    assert srv.alive(), "\n".join(srv.output)
    srv.stop()


@pytest.fixture
def client(chat_server: Any) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=chat_server.base_url, api_key=KEY, max_retries=0) as c:
        yield c


USER = [{"role": "user", "content": "hello"}]
# This client (anthropic 2.x) no longer has a `temperature` argument; the API still takes it.
GREEDY = {"temperature": 0}


def _openai_chat(srv: Any, body: dict[str, Any]) -> dict[str, Any]:
    r = srv.client.post("/v1/chat/completions", json=body,
                        headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_create_is_the_chat_completion_in_anthropic_shape(chat_server: Any,
                                                          client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model="claude-alias", max_tokens=8, messages=USER,
                                 system="abc", extra_body=GREEDY)
    ref = _openai_chat(chat_server, {"messages": [{"role": "system", "content": "abc"}, *USER],
                                     "max_tokens": 8, "temperature": 0})
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == "fake"  # the first served name, as the OpenAI routes answer
    [block] = msg.content
    assert block.type == "text" and block.text == ref["choices"][0]["message"]["content"]
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    # "s"+"abc" + "u"+"hello" + "a": the system prompt is in the prompt
    assert msg.usage.input_tokens == ref["usage"]["prompt_tokens"] == 11
    # the OpenAI request after it found the prompt's first blocks in the prefix cache;
    # Anthropic's input_tokens are the tokens not read from it
    assert msg.usage.cache_read_input_tokens == 0
    assert ref["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    assert msg.usage.output_tokens == 8


def test_system_as_text_blocks_and_merged_turns(client: anthropic.Anthropic) -> None:
    plain = client.messages.count_tokens(model="fake", system="abcd",
                                         messages=[{"role": "user", "content": "hello"}])
    blocks = client.messages.count_tokens(
        model="fake", system=[{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}],
        messages=[{"role": "user", "content": "hel"}, {"role": "user", "content": "lo"}])
    # text blocks are joined, and consecutive user turns are one turn (one "u" marker)
    assert plain.input_tokens == blocks.input_tokens == 1 + 4 + 1 + 5 + 1


def test_stream_events_and_final_message(client: anthropic.Anthropic) -> None:
    body: dict[str, Any] = dict(model="fake", max_tokens=8, messages=USER, extra_body=GREEDY)
    full = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text",)]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [e.delta.text for e in events
              if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert len(deltas) == 8 and "".join(deltas) == full.content[0].text
    assert final.content[0].text == full.content[0].text
    assert final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens + final.usage.cache_read_input_tokens
            == full.usage.input_tokens + full.usage.cache_read_input_tokens)
    assert final.usage.cache_read_input_tokens > 0  # the same prompt: its blocks were cached
    assert final.usage.output_tokens == 8


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence(client: anthropic.Anthropic, stream: bool) -> None:
    body: dict[str, Any] = dict(model="fake", max_tokens=20, messages=USER, extra_body=GREEDY)
    text = client.messages.create(**body).content[0].text
    assert len(text) >= 20  # letters with a space between tokens
    stops = [text[12:15], text[6:9]]
    if stream:
        with client.messages.stream(**body, stop_sequences=stops) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**body, stop_sequences=stops)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == text[6:9]
    assert msg.content[0].text == text[:text.find(text[6:9])]


def test_count_tokens_is_the_chat_prompt(chat_server: Any, client: anthropic.Anthropic) -> None:
    n = client.messages.count_tokens(model="fake", messages=USER, system="xyz")
    r = chat_server.client.post("/tokenize", headers={"x-api-key": KEY}, json={
        "messages": [{"role": "system", "content": "xyz"}, *USER]})
    assert n.input_tokens == r.json()["count"] == 11


def test_api_key(chat_server: Any) -> None:
    with anthropic.Anthropic(base_url=chat_server.base_url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError) as e:
            c.messages.create(model="fake", max_tokens=2, messages=USER)
    assert e.value.status_code == 401
    assert e.value.body["type"] == "error"  # type: ignore[index]
    assert e.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # A bearer token is the other way to send it (anthropic's auth_token).
    with anthropic.Anthropic(base_url=chat_server.base_url, auth_token=KEY, api_key=None,
                             max_retries=0) as c:
        # (unseeded sampling may draw the end token first: the key is what is checked here)
        out = c.messages.create(model="fake", max_tokens=2, messages=USER)
        assert out.type == "message" and 1 <= out.usage.output_tokens <= 2


def _raw(srv: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return srv.client.post(path, json=body, headers={"x-api-key": KEY})  # type: ignore[no-any-return]


@pytest.mark.parametrize(("body", "status", "kind", "says"), [
    ({"messages": USER}, 400, "invalid_request_error", "'max_tokens' is required"),
    ({"messages": USER, "max_tokens": 4, "container": "c1"}, 400, "invalid_request_error",
     "'container' is not supported"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}],
      "max_tokens": 4}, 400, "invalid_request_error", "type 'image' are not supported"),
    ({"messages": [*USER, {"role": "assistant", "content": "ab"}], "max_tokens": 4}, 400,
     "invalid_request_error", "prefill"),
    ({"messages": USER, "max_tokens": 4, "model": "gpt-x"}, 404, "not_found_error",
     "'gpt-x' does not exist"),
    ({"messages": USER, "max_tokens": 100}, 400, "invalid_request_error", "64"),  # context
])
def test_errors_are_anthropic_shaped(chat_server: Any, body: dict[str, Any], status: int,
                                     kind: str, says: str) -> None:
    r = _raw(chat_server, "/v1/messages", body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind
    assert says in err["error"]["message"]


def test_client_sees_bad_request(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        client.messages.create(model="fake", max_tokens=4, messages=USER,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=USER)


# ---- the translation, on hand-made JSON -------------------------------------------------


@pytest.fixture(scope="module")
def ext() -> Any:
    return native_build.extension("ninfer_anthropic_ext")


def _to_openai(ext: Any, body: dict[str, Any], count: bool = False) -> dict[str, Any]:
    return json.loads(ext.to_openai_request(json.dumps(body), count))  # type: ignore[no-any-return]


def test_request_blocks_become_openai_messages(ext: Any) -> None:
    body = {
        "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "be brief",
                                                    "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather",
                 "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                 "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "data"}]},
                {"type": "text", "text": "and tomorrow?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_3", "name": "forecast", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_3"}]},
        ],
        "tools": [{"name": "weather", "description": "current weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                  {"name": "forecast", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 5,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "metadata": {"user_id": "u1"}, "stream": True,
    }
    out = _to_openai(ext, body)
    assert out["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "two calls",
         "tool_calls": [
             {"id": "toolu_1", "type": "function",
              "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
             {"id": "toolu_2", "type": "function",
              "function": {"name": "weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2",
         "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "data"}]},
        {"role": "user", "content": "and tomorrow?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_3", "type": "function",
             "function": {"name": "forecast", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_3", "content": ""},
    ]
    assert out["tools"] == [
        {"type": "function", "function": {
            "name": "weather", "description": "current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "forecast",
                                          "parameters": {"type": "object"}}}]
    assert out["tool_choice"] == "required" and out["parallel_tool_calls"] is False
    assert out["chat_template_kwargs"] == {"enable_thinking": True}
    assert out["thinking_budget"] == 2048
    assert out["stop"] == ["END"] and out["max_tokens"] == 50
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.5, 0.9, 5)
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert "metadata" not in out


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"), ({"type": "any"}, "required"),
    ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
])
def test_tool_choice(ext: Any, choice: dict[str, Any], expected: Any) -> None:
    out = _to_openai(ext, {"messages": USER, "max_tokens": 1, "tool_choice": choice})
    assert out["tool_choice"] == expected and "parallel_tool_calls" not in out


def test_thinking_off_count_tokens_and_output_format(ext: Any) -> None:
    out = _to_openai(ext, {"messages": USER, "max_tokens": 1, "thinking": {"type": "disabled"}})
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    assert "thinking_budget" not in out
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = _to_openai(ext, {"messages": USER, "system": "s", "output_config": {
        "format": {"type": "json_schema", "schema": schema}}}, count=True)
    assert out["messages"][0] == {"role": "system", "content": "s"} and "max_tokens" not in out
    assert out["response_format"] == {"type": "json_schema",
                                      "json_schema": {"name": "output", "schema": schema}}


# Properties out of alphabetical order: a sorted (std::map) JSON would reorder them.
UNSORTED = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {
    "type": "object", "properties": {"yak": {"type": "integer"}, "bee": {"type": "string"}}}},
    "required": ["zeta"]}


def test_key_order_is_kept(ext: Any) -> None:
    """Tool schemas reach the chat template, and an output schema the grammar, as written."""
    out = _to_openai(ext, {"messages": USER, "max_tokens": 1, "tools": [
        {"name": "f", "description": "d", "input_schema": UNSORTED}],
        "output_config": {"format": {"type": "json_schema", "schema": UNSORTED}}})
    fn = out["tools"][0]["function"]
    assert list(fn) == ["name", "description", "parameters"]
    for schema in (fn["parameters"], out["response_format"]["json_schema"]["schema"]):
        assert json.dumps(schema) == json.dumps(UNSORTED)  # every level in the same order


def test_tool_schema_order_reaches_the_prompt(tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the server: /v1/messages renders the same prompt as the chat endpoint given
    the same tools in the same order (the fake model's output follows its whole prompt),
    under the official Qwen3 template, which writes each tool with tojson."""
    from ninfer.runtime import Server
    from test_fake_server import tool_use_artifact

    binary, artifact, _ = tool_use_artifact(tmp_path, monkeypatch)
    msgs = [{"role": "user", "content": "what is the weather"}]

    def openai_tools(schema: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function",
                 "function": {"name": "weather", "description": "d", "parameters": schema}}]

    reordered = {**UNSORTED, "properties": dict(reversed(UNSORTED["properties"].items()))}
    greedy = {"max_tokens": 12, "temperature": 0}
    with Server(binary, extra_args=("--artifact", str(artifact)), startup_timeout=60) as srv:
        def chat(schema: dict[str, Any]) -> tuple[list[int], str]:
            r = srv.client.post("/v1/chat/completions", json={
                "messages": msgs, "tools": openai_tools(schema), "return_token_ids": True,
                **greedy})
            assert r.status_code == 200, r.text
            return r.json()["prompt_token_ids"], r.json()["choices"][0]["message"]["content"]

        r = srv.client.post("/v1/messages", json={
            "messages": msgs, "tools": [{"name": "weather", "description": "d",
                                         "input_schema": UNSORTED}], **greedy})
        assert r.status_code == 200, r.text
        text = "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")
        (ids, same), (other_ids, other) = chat(UNSORTED), chat(reordered)
        assert ids != other_ids and same != other  # the prompt, and so the output, shows it
        assert text == same
        count = srv.client.post("/v1/messages/count_tokens", json={
            "messages": msgs, "tools": [{"name": "weather", "description": "d",
                                         "input_schema": UNSORTED}]})
        assert count.json()["input_tokens"] == len(ids)


@pytest.mark.parametrize(("body", "says"), [
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}, *USER]},
     "'tool_result' block belongs in a user message"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "'tool_use' block belongs in an assistant message"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "'document' are not supported"),
    ({"messages": [{"role": "system", "content": "x"}]}, "top-level 'system'"),
    ({"messages": USER, "thinking": {"type": "enabled"}}, "budget_tokens is required"),
    ({"messages": USER, "tools": [{"name": "f"}]}, "tools[0].input_schema is required"),
    ({"messages": USER, "tool_choice": {"type": "tool"}}, "tool_choice.name is required"),
    ({"messages": USER, "stop_sequences": "END"}, "array of strings"),
    ({"messages": USER, "mcp_servers": []}, "'mcp_servers' is not supported"),
    ({"messages": USER, "output_config": {"effort": "high"}}, "effort is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     "'x' is not supported"),
])
def test_request_refusals(ext: Any, body: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=r"^400 ") as e:
        ext.to_openai_request(json.dumps({"max_tokens": 1, **body}), False)
    assert says in str(e.value)


def _completion(message: dict[str, Any], finish: str, **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}


TOOL_MESSAGE = {"content": "Let me look.", "reasoning_content": "need the weather",
                "tool_calls": [
                    {"id": "call_a1", "type": "function",
                     "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
                    {"id": "call_b2", "type": "function",
                     "function": {"name": "time", "arguments": ""}}]}


def test_response_content_blocks(ext: Any) -> None:
    msg = json.loads(ext.from_openai_response(
        json.dumps(_completion(TOOL_MESSAGE, "tool_calls")), "msg_1"))
    assert msg == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "thinking", "thinking": "need the weather", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_a1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_b2", "name": "time", "input": {}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 5}}


@pytest.mark.parametrize(("finish", "extra", "reason", "sequence"), [
    ("stop", {"stop_reason": None}, "end_turn", None),
    ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
    ("length", {}, "max_tokens", None),
])
def test_stop_reasons(ext: Any, finish: str, extra: dict[str, Any], reason: str,
                      sequence: str | None) -> None:
    msg = json.loads(ext.from_openai_response(
        json.dumps(_completion({"content": "hi"}, finish, **extra)), "msg_1"))
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)


def _chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}]}


# The stream an output parser makes of TOOL_MESSAGE, in small pieces.
TOOL_CHUNKS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning_content": "need the "}), _chunk({"reasoning_content": "weather"}),
    _chunk({"content": "Let me "}), _chunk({"content": "look."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_a1", "type": "function",
                            "function": {"name": "weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_b2", "type": "function",
                            "function": {"name": "time"}}]}),
    _chunk({}, "tool_calls", stop_reason=None),
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [],
     "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}},
]


def test_stream_event_sequence(ext: Any) -> None:
    events = json.loads(ext.stream_events(json.dumps(TOOL_CHUNKS), 7))
    summary = []
    for name, data in events:
        assert data["type"] == name
        if name == "content_block_start":
            summary.append((name, data["index"], data["content_block"]["type"]))
        elif name == "content_block_delta":
            d = data["delta"]
            summary.append((name, data["index"], d["type"],
                            d.get("text", d.get("thinking", d.get("partial_json")))))
        elif name == "content_block_stop":
            summary.append((name, data["index"]))
        else:
            summary.append((name,))
    assert summary == [
        ("message_start",), ("ping",),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta", "need the "),
        ("content_block_delta", 0, "thinking_delta", "weather"),
        ("content_block_stop", 0),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta", "Let me "),
        ("content_block_delta", 1, "text_delta", "look."),
        ("content_block_stop", 1),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta", '{"city": '),
        ("content_block_delta", 2, "input_json_delta", '"Paris"}'),
        ("content_block_stop", 2),
        ("content_block_start", 3, "tool_use"),
        ("content_block_stop", 3),
        ("message_delta",), ("message_stop",)]
    assert events[0][1]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert events[10][1]["content_block"] == {"type": "tool_use", "id": "toolu_a1",
                                              "name": "weather", "input": {}}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # the final usage (the Anthropic client takes its input and cache fields over
    # message_start's): this chunk stream carried no prompt_tokens_details
    assert events[-2][1]["usage"] == {"input_tokens": 7, "cache_creation_input_tokens": 0,
                                      "cache_read_input_tokens": 0, "output_tokens": 5}


def _sse(events: list[list[Any]]) -> bytes:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n"
                   for name, data in events).encode()


def _client_over(body: bytes, content_type: str) -> anthropic.Anthropic:
    """The official client over a transport that answers every request with `body`."""
    import httpx2  # the HTTP library of anthropic 2.x

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return anthropic.Anthropic(api_key="x", base_url="http://test",
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_official_client_reassembles_the_stream(ext: Any) -> None:
    """The streamed events, read by the official client, give the non-streamed message."""
    events = json.loads(ext.stream_events(json.dumps(TOOL_CHUNKS), 7))
    full = json.loads(ext.from_openai_response(
        json.dumps(_completion(TOOL_MESSAGE, "tool_calls")), "msg_test"))
    with _client_over(_sse(events), "text/event-stream") as c:
        with c.messages.stream(model="m", max_tokens=9, messages=USER) as s:
            streamed = s.get_final_message().to_dict()
    with _client_over(json.dumps(full).encode(), "application/json") as c:
        created = c.messages.create(model="m", max_tokens=9, messages=USER).to_dict()
    # (the stream's message_delta sets stop_details, an optional field, to None)
    def set_fields(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if v is not None}

    assert set_fields(streamed) == set_fields(created)
    assert created["content"][3] == {"type": "tool_use", "id": "toolu_b2", "name": "time",
                                     "input": {}}


def test_stream_error_and_stop_sequence(ext: Any) -> None:
    chunks = [_chunk({"role": "assistant", "content": "ab"}),
              _chunk({}, "stop", stop_reason="END")]
    events = json.loads(ext.stream_events(json.dumps(chunks), 1))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    chunks = [_chunk({"content": "ab"}),
              {"error": {"message": "The server is shutting down", "type": "server_error",
                         "code": "shutting_down"}}]
    events = json.loads(ext.stream_events(json.dumps(chunks), 1))
    assert events[-1] == ["error", {"type": "error", "error": {
        "type": "overloaded_error", "message": "The server is shutting down"}}]
    assert "message_stop" not in [name for name, _ in events]

