"""The OpenAI-compatible API: official client, streaming, errors, timings."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(qwen3_server):
    return openai.OpenAI(base_url=qwen3_server.openai_base_url, api_key="unused")


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["qwen3-tiny"]


def test_chat_non_streaming(client, qwen3_model):
    r = client.chat.completions.create(model="qwen3-tiny", max_tokens=12, temperature=0,
                                       messages=[{"role": "user", "content": "Hello there"}])
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12
    tok = qwen3_model.hf_tokenizer()
    from ninfer.demo.chat_templates import DEMO_TEMPLATE
    from ninfer.frontend.chat_template import render

    prompt = render(DEMO_TEMPLATE, {"messages": [{"role": "user", "content": "Hello there"}],
                                    "add_generation_prompt": True})
    assert r.usage.prompt_tokens == len(tok.encode(prompt))


def test_chat_streaming_matches_non_streaming(client):
    kwargs = dict(model="qwen3-tiny", max_tokens=20, temperature=0,
                  messages=[{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Count: 1 2 3"}])
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full


def test_stream_usage_chunk(client):
    chunks = list(client.chat.completions.create(
        model="qwen3-tiny", max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 5


def test_completions_and_stream(client):
    r = client.completions.create(model="qwen3-tiny", prompt="Once upon a time", max_tokens=8,
                                  temperature=0)
    text = r.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="qwen3-tiny", prompt="Once upon a time", max_tokens=8, temperature=0,
        stream=True))
    assert streamed == text
    assert r.usage.completion_tokens <= 8


def test_sse_wire_format_ends_with_done(qwen3_server):
    with qwen3_server.client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    json.loads(lines[0][len("data: "):])


def test_timings_reported(qwen3_server):
    r = qwen3_server.client.post("/v1/completions", json={
        "prompt": "Speed test", "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    t = r.json()["timings"]
    assert t["predicted_n"] == 6 and t["predicted_per_second"] > 0
    assert t["prompt_n"] > 0 and t["prompt_per_second"] > 0


def test_sampling_seed_is_reproducible(qwen3_server):
    body = {"prompt": "Random", "max_tokens": 16, "temperature": 1.0, "top_p": 0.9,
            "top_k": 50, "seed": 42, "ignore_eos": True}
    a = qwen3_server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    b = qwen3_server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    c = qwen3_server.client.post("/v1/completions", json={**body, "seed": 7}).json()
    assert a == b
    assert c["choices"][0]["text"] != a


def test_stop_string_cuts_reply(qwen3_server):
    body = {"prompt": "Stop test", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = qwen3_server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert len(full) > 4
    stop = full[2:4]
    r = qwen3_server.client.post("/v1/completions", json={**body, "stop": [stop]}).json()
    assert r["choices"][0]["text"] == full[: full.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"


BAD_REQUESTS = [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "temperature": 9}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "model": "gpt-4"}, 404, "model"),
    ("/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("/v1/completions", {"prompt": [999999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_input_gets_openai_error_and_server_keeps_serving(qwen3_server, path, body,
                                                              status, param):
    c = qwen3_server.client
    if isinstance(body, bytes):
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = c.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if param:
        assert err["param"] == param
    ok = c.post("/v1/completions", json={"prompt": "still alive?", "max_tokens": 2})
    assert ok.status_code == 200
    assert qwen3_server.alive()


def test_prompt_longer_than_context_states_both_numbers(qwen3_server):
    from conftest import MAX_CONTEXT

    r = qwen3_server.client.post("/v1/completions", json={"prompt": [1] * (MAX_CONTEXT + 5)})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert str(MAX_CONTEXT) in msg and str(MAX_CONTEXT + 5) in msg
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_route_is_json_404(qwen3_server):
    r = qwen3_server.client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_health(qwen3_server):
    assert qwen3_server.client.get("/health").json() == {"status": "ok"}


LONG_PROMPT = "Once upon a time there was a little model that counted " * 4  # > 1 KV block


def test_n_choices_equal_seeded_single_requests(client):
    """n choices share the prompt's prefill and blocks, and choice i is the request seeded
    seed + i (the CPU kernels are batch invariant)."""
    kw = dict(model="qwen3-tiny", prompt=LONG_PROMPT, max_tokens=8, temperature=1.0,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    singles = [client.completions.create(seed=30 + i, **kw).choices[0].model_extra["token_ids"]
               for i in range(3)]
    r = client.completions.create(seed=30, n=3, **kw)
    assert [c.model_extra["token_ids"] for c in r.choices] == singles
    assert r.usage.completion_tokens == 24
    assert len(set(map(tuple, singles))) > 1


def test_logprobs_are_the_models(client, qwen3_model):
    """logprobs equal the log-softmax of the model's logits (computed by the model's Python
    module), also when a penalty changes the picks."""
    import numpy as np

    r = client.chat.completions.create(
        model="qwen3-tiny", messages=[{"role": "user", "content": "Count: 1 2 3"}],
        max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, frequency_penalty=1.5,
        extra_body={"ignore_eos": True, "return_token_ids": True})
    prompt = r.model_extra["prompt_token_ids"]
    tokens = r.choices[0].model_extra["token_ids"]
    engine = qwen3_model.engine()
    for i, entry in enumerate(r.choices[0].logprobs.content):
        logits = np.asarray(engine.forward(prompt + tokens[:i]), dtype=np.float64)
        lsm = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(entry.logprob - lsm[tokens[i]]) < 1e-4
        assert [abs(t.logprob - v) < 1e-4 for t, v in
                zip(entry.top_logprobs, np.sort(lsm)[::-1][:3])] == [True] * 3


def test_logprob_tokens_as_token_ids(qwen3_server):
    """return_tokens_as_token_ids (vLLM's): every logprobs token is "token_id:ID" (tokens of
    one text, or of no valid UTF-8, told apart), chat and completions; refused without
    logprobs."""
    c = qwen3_server.client
    body = {"prompt": "Count: 1 2 3", "max_tokens": 4, "temperature": 0, "logprobs": 3,
            "ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    r = c.post("/v1/completions", json=body).json()
    ids, lp = r["choices"][0]["token_ids"], r["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids]
    for t, top in zip(ids, lp["top_logprobs"], strict=True):
        assert f"token_id:{t}" in top and all(k.startswith("token_id:") for k in top)
        assert max(top.values()) == top[f"token_id:{t}"]  # greedy: the top one
    chat = c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
        "top_logprobs": 2, "return_token_ids": True, "return_tokens_as_token_ids": True,
        "ignore_eos": True}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}"
                                             for t in chat["choices"][0]["token_ids"]]
    assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])
    del body["logprobs"]
    err = c.post("/v1/completions", json=body)
    assert err.status_code == 400
    assert err.json()["error"]["param"] == "return_tokens_as_token_ids"
