"""Every documented request parameter of /v1/chat/completions and /v1/completions is
honoured (its effect asserted) or refused with a 400 naming it; none is accepted and
ignored, except metadata that cannot change the output (asserted: same tokens).

The server is the real ninfer-server over the fake paged model (tests/native/fake_model.h),
whose logits tests/fake_logits.py recomputes in Python, so greedy outputs, penalties,
logit_bias, min_tokens, stop_token_ids and logprobs are checked token for token and value
for value. Requests go through the official `openai` client (vLLM's extensions through
`extra_body`); the table is checked against the parameters of the installed client.

Statuses: "honoured" (a test of its effect), "noop" (metadata: the output is unchanged),
"refused" (400 with `param` naming it), "elsewhere" (honoured, and checked by the named
test of the module that owns it: tools and reasoning in test_output_parsers.py, structured
output in test_structured_output.py; the table asserts those tests exist).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import fake_logits as fl
import native_build
from fake_logits import Params, greedy

HANG = 60.0
PROMPT = [4, 5, 6]  # token ids: the fake vocabulary is 'a'..'z' and <eos> = 26


@pytest.fixture(scope="module")
def fake_binary() -> Path:
    from ninfer.artifact import write_artifact
    from test_fake_server import MANIFEST

    binary = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    write_artifact(binary.parent / "model.ninfer", MANIFEST, [])
    return binary


def _start(binary: Path, *args: str) -> Any:
    from ninfer.runtime import Server

    return Server(binary, extra_args=args, startup_timeout=HANG).start()


@pytest.fixture(scope="module")
def srv(fake_binary: Path) -> Iterator[Any]:
    s = _start(fake_binary)
    yield s
    assert s.alive(), "\n".join(s.output)  # no CHECK of the fake model failed
    s.stop()


@pytest.fixture(scope="module")
def client(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_base_url, api_key="unused", max_retries=0)


def _complete(client: openai.OpenAI, **kw: Any) -> Any:
    extra = {"return_token_ids": True, **kw.pop("extra_body", {})}
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("max_tokens", 12)
    return client.completions.create(model="fake", extra_body=extra, **kw)


def _ids(choice: Any) -> list[int]:
    return list(choice.model_extra["token_ids"])


def _chat(client: openai.OpenAI, **kw: Any) -> Any:
    extra = {"return_token_ids": True, **kw.pop("extra_body", {})}
    kw.setdefault("messages", [{"role": "user", "content": "hello"}])
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model="fake", extra_body=extra, **kw)


def _refused(call: Callable[[], Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400
    body = e.value.body
    assert isinstance(body, dict) and body.get("param") == param, body


# ---------------------------------------------------------------------------------------
# The effects


def check_greedy_reference(client: openai.OpenAI) -> None:
    """temperature 0 is greedy; the reference recomputes it exactly."""
    r = _complete(client, temperature=0, extra_body={"ignore_eos": True})
    want = greedy(PROMPT, 12, Params(ignore_eos=True))
    assert _ids(r.choices[0]) == want.tokens and r.usage.completion_tokens == 12


def check_temperature(client: openai.OpenAI) -> None:
    check_greedy_reference(client)
    hot = [_ids(_complete(client, temperature=2.0, seed=s).choices[0]) for s in range(3)]
    cold = greedy(PROMPT, 12).tokens
    assert any(h != cold for h in hot)


def _penalty(client: openai.OpenAI, name: str, value: float) -> None:
    p = Params(ignore_eos=True, **{name: value})
    want = greedy(PROMPT, 40, p)
    assert want.tokens != greedy(PROMPT, 40, Params(ignore_eos=True)).tokens  # it shows
    kw: dict[str, Any] = {"temperature": 0, "max_tokens": 40}
    extra: dict[str, Any] = {"ignore_eos": True}
    if name == "repetition_penalty":
        extra[name] = value
    else:
        kw[name] = value
    for chat in (False, True):
        if chat:
            base = _chat(client, max_tokens=1, temperature=0)
            prompt = list(base.model_extra["prompt_token_ids"])
            r = _chat(client, extra_body=extra, **kw)
            assert _ids(r.choices[0]) == greedy(prompt, 40, p).tokens
        else:
            r = _complete(client, extra_body=extra, **kw)
            assert _ids(r.choices[0]) == want.tokens


def check_presence_penalty(client: openai.OpenAI) -> None:
    _penalty(client, "presence_penalty", 1.5)
    _penalty(client, "presence_penalty", -2.0)
    _refused(lambda: _complete(client, presence_penalty=2.5), "presence_penalty")


def check_frequency_penalty(client: openai.OpenAI) -> None:
    _penalty(client, "frequency_penalty", 0.7)
    _refused(lambda: _complete(client, frequency_penalty=-3), "frequency_penalty")


def check_repetition_penalty(client: openai.OpenAI) -> None:
    _penalty(client, "repetition_penalty", 1.8)
    _penalty(client, "repetition_penalty", 0.6)
    _refused(lambda: _complete(client, extra_body={"repetition_penalty": 0}),
             "repetition_penalty")


def check_logit_bias(client: openai.OpenAI) -> None:
    r = _complete(client, temperature=1.0, seed=3, logit_bias={"7": 100})
    assert _ids(r.choices[0]) == [7] * 12
    bias = {9: 2.5, 2: -1.0}
    want = greedy(PROMPT, 20, Params(logit_bias=bias, ignore_eos=True))
    r = _complete(client, temperature=0, max_tokens=20,
                  logit_bias={str(k): v for k, v in bias.items()}, extra_body={"ignore_eos": True})
    assert _ids(r.choices[0]) == want.tokens
    _refused(lambda: _complete(client, logit_bias={"27": 1}), "logit_bias")  # not a token
    _refused(lambda: _complete(client, logit_bias={"3": 101}), "logit_bias")


def _check_chat_logprobs(content: list[Any], prompt: list[int], tokens: list[int],
                         top: int) -> None:
    assert len(content) == len(tokens)
    for i, (entry, t) in enumerate(zip(content, tokens)):
        lp = fl.logprobs(fl.logits(prompt + tokens[:i]))
        assert entry.token == chr(ord("a") + t)
        assert entry.bytes == [ord("a") + t]
        assert math.isclose(entry.logprob, float(lp[t]), abs_tol=1e-5)
        order = sorted(range(fl.VOCAB), key=lambda v: (-lp[v], v))[:top]
        assert [e.token for e in entry.top_logprobs] == [
            "<eos>" if v == fl.EOS else chr(ord("a") + v) for v in order]
        for e, v in zip(entry.top_logprobs, order):
            assert math.isclose(e.logprob, float(lp[v]), abs_tol=1e-5)


def check_logprobs_chat(client: openai.OpenAI) -> None:
    # Sampled (temperature 1), with a bias that changes the picks: the logprobs are the
    # model's raw ones all the same (vLLM's default).
    r = _chat(client, logprobs=True, top_logprobs=4, temperature=1.0, seed=5,
              logit_bias={"0": 3.0}, max_tokens=10)
    prompt = list(r.model_extra["prompt_token_ids"])
    tokens = _ids(r.choices[0])
    _check_chat_logprobs(r.choices[0].logprobs.content, prompt, tokens, 4)
    plain = _chat(client, logprobs=True, max_tokens=3, temperature=0)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert _chat(client, max_tokens=3).choices[0].logprobs is None
    # Streamed: the same, chunk by chunk.
    chunks = list(_chat(client, logprobs=True, top_logprobs=4, temperature=1.0, seed=5,
                        logit_bias={"0": 3.0}, max_tokens=10, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    _check_chat_logprobs(streamed, prompt, tokens, 4)
    _refused(lambda: _chat(client, logprobs=True, top_logprobs=21), "top_logprobs")
    _refused(lambda: _chat(client, top_logprobs=2), "top_logprobs")


def check_logprobs_completions(client: openai.OpenAI) -> None:
    r = _complete(client, logprobs=3, temperature=0, extra_body={"ignore_eos": True})
    want = greedy(PROMPT, 12, Params(ignore_eos=True))
    lp = r.choices[0].logprobs
    assert lp.tokens == [chr(ord("a") + t) for t in want.tokens]
    for i, t in enumerate(want.tokens):
        assert math.isclose(lp.token_logprobs[i], want.logprobs[i], abs_tol=1e-5)
        assert len(lp.top_logprobs[i]) == 3  # greedy: the pick is the first of them
        assert max(lp.top_logprobs[i].values()) == lp.token_logprobs[i]
    # vLLM's text_offset: the characters of the tokens before (each decoded alone).
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)]
    chunks = list(_complete(client, logprobs=3, temperature=0, stream=True,
                            extra_body={"ignore_eos": True}))
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs
               for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset
    _refused(lambda: _complete(client, logprobs=True), "logprobs")
    _refused(lambda: _complete(client, logprobs=21), "logprobs")


def check_top_p(client: openai.OpenAI) -> None:
    r = _complete(client, temperature=1.0, top_p=0.01, seed=9, extra_body={"ignore_eos": True})
    assert _ids(r.choices[0]) == greedy(PROMPT, 12, Params(ignore_eos=True)).tokens
    _refused(lambda: _complete(client, top_p=0), "top_p")


def _path_ok(tokens: list[int], ok: Callable[[Any, int], bool]) -> bool:
    return all(ok(fl.logits(PROMPT + tokens[:i]), t) for i, t in enumerate(tokens))


def check_top_k(client: openai.OpenAI) -> None:
    def in_top3(row: Any, t: int) -> bool:
        return sorted(range(fl.VOCAB), key=lambda v: -row[v]).index(t) < 3

    for s in range(4):
        r = _complete(client, temperature=2.0, seed=s, max_tokens=30,
                      extra_body={"top_k": 3, "ignore_eos": True})
        assert _path_ok(_ids(r.choices[0]), in_top3)
    r = _complete(client, temperature=2.0, seed=0, max_tokens=30, extra_body={"ignore_eos": True})
    assert not _path_ok(_ids(r.choices[0]), in_top3)  # without it, others come
    for off in (0, -1):
        a = _complete(client, temperature=1.0, seed=4, extra_body={"top_k": off})
        b = _complete(client, temperature=1.0, seed=4)
        assert _ids(a.choices[0]) == _ids(b.choices[0])
    _refused(lambda: _complete(client, extra_body={"top_k": -2}), "top_k")


def check_min_p(client: openai.OpenAI) -> None:
    def above(row: Any, t: int) -> bool:
        p = fl.logprobs(row)
        return math.exp(p[t]) >= 0.8 * math.exp(p.max()) * (1 - 1e-6)

    for s in range(4):
        r = _complete(client, temperature=1.0, seed=s, max_tokens=30,
                      extra_body={"min_p": 0.8, "ignore_eos": True})
        assert _path_ok(_ids(r.choices[0]), above)
    r = _complete(client, temperature=1.0, seed=0, max_tokens=30, extra_body={"ignore_eos": True})
    assert not _path_ok(_ids(r.choices[0]), above)
    _refused(lambda: _complete(client, extra_body={"min_p": 1.5}), "min_p")


def check_seed(client: openai.OpenAI) -> None:
    a, b, c = (_ids(_complete(client, temperature=1.0, seed=s).choices[0]) for s in (42, 42, 7))
    assert a == b and a != c


def check_n(client: openai.OpenAI) -> None:
    """n choices = n requests seeded seed, seed + 1, ...; streamed the same; usage sums."""
    kw: dict[str, Any] = {"temperature": 1.0, "max_tokens": 10}
    singles = [_ids(_complete(client, seed=20 + i, **kw).choices[0]) for i in range(3)]
    r = _complete(client, seed=20, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [_ids(c) for c in r.choices] == singles
    assert r.usage.completion_tokens == sum(
        len(s) + (c.finish_reason == "stop") for s, c in zip(singles, r.choices))
    assert r.usage.prompt_tokens == len(PROMPT)
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finishes: dict[int, str] = {}
    for chunk in _complete(client, seed=20, n=3, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.model_extra.get("token_ids") or []
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == singles
    assert finishes == {i: c.finish_reason for i, c in enumerate(r.choices)}
    # Chat, streamed: every choice's deltas, the role first.
    chat = list(_chat(client, n=2, seed=1, temperature=1.0, stream=True))
    roles = [c.choices[0].index for c in chat if c.choices and c.choices[0].delta.role]
    assert sorted(roles) == [0, 1]
    full = _chat(client, n=2, seed=1, temperature=1.0)
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chat
                       if c.choices and c.choices[0].index == i)
        assert text == full.choices[i].message.content
    _refused(lambda: _complete(client, n=5), "n")  # above --max-concurrency (4)
    _refused(lambda: _complete(client, n=0), "n")


def check_best_of(client: openai.OpenAI) -> None:
    a = _complete(client, n=2, best_of=2, seed=3, temperature=1.0)
    b = _complete(client, n=2, seed=3, temperature=1.0)
    assert [_ids(c) for c in a.choices] == [_ids(c) for c in b.choices]
    _refused(lambda: _complete(client, n=1, best_of=3), "best_of")


def check_min_tokens(client: openai.OpenAI) -> None:
    # A bias makes <eos> win early; min_tokens holds it off.
    early = Params(logit_bias={fl.EOS: 3.0})
    short = greedy(PROMPT, 30, early)
    assert short.finish == "stop" and len(short.tokens) < 10
    p = Params(logit_bias={fl.EOS: 3.0}, min_tokens=12)
    want = greedy(PROMPT, 30, p)
    assert len(want.tokens) >= 12
    r = _complete(client, temperature=0, max_tokens=30, logit_bias={str(fl.EOS): 3.0},
                  extra_body={"min_tokens": 12})
    assert _ids(r.choices[0]) == want.tokens
    assert r.choices[0].finish_reason == want.finish
    _refused(lambda: _complete(client, max_tokens=3, extra_body={"min_tokens": 4}), "min_tokens")


def check_stop_token_ids(client: openai.OpenAI) -> None:
    full = greedy(PROMPT, 30, Params(ignore_eos=True))
    stop = full.tokens[5]
    want = greedy(PROMPT, 30, Params(ignore_eos=True, stop_token_ids=(stop,)))
    assert want.finish == "stop" and len(want.tokens) <= 5
    r = _complete(client, temperature=0, max_tokens=30,
                  extra_body={"stop_token_ids": [stop], "ignore_eos": True})
    assert _ids(r.choices[0]) == want.tokens and r.choices[0].finish_reason == "stop"
    assert chr(ord("a") + stop) not in r.choices[0].text[-1:]
    assert r.usage.completion_tokens == want.generated
    _refused(lambda: _complete(client, extra_body={"stop_token_ids": [99]}), "stop_token_ids")


def check_ignore_eos(client: openai.OpenAI) -> None:
    bias = {str(fl.EOS): 3.0}
    ends = _complete(client, temperature=0, max_tokens=30, logit_bias=bias)
    assert ends.choices[0].finish_reason == "stop"
    r = _complete(client, temperature=0, max_tokens=30, logit_bias=bias,
                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 30


def check_max_tokens(client: openai.OpenAI) -> None:
    r = _complete(client, max_tokens=7, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    c = _chat(client, max_tokens=None, max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 5


def check_stop(client: openai.OpenAI) -> None:
    full = _complete(client, temperature=0, max_tokens=20, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    cut = _complete(client, temperature=0, max_tokens=20, stop=[text[6:9]],
                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[:text.index(text[6:9])]
    assert cut.choices[0].finish_reason == "stop"


def check_stream(client: openai.OpenAI) -> None:
    full = _chat(client, temperature=0).choices[0].message.content
    chunks = list(_chat(client, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full


def check_stream_options(client: openai.OpenAI) -> None:
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True},
                        max_tokens=4, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    _refused(lambda: list(_chat(client, stream=True,
                                stream_options={"include_obfuscation": True})), "stream_options")


def check_messages(client: openai.OpenAI) -> None:
    r = _chat(client, messages=[{"role": "user", "content": "abc"}], max_tokens=2)
    assert list(r.model_extra["prompt_token_ids"]) == [0, 1, 2]


def check_model(client: openai.OpenAI) -> None:
    assert _complete(client, max_tokens=1).model == "fake"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="a", max_tokens=1)


def check_prompt(client: openai.OpenAI) -> None:
    a = _complete(client, prompt="efg", temperature=0)
    b = _complete(client, prompt=PROMPT, temperature=0)
    assert _ids(a.choices[0]) == _ids(b.choices[0])


def check_echo(client: openai.OpenAI) -> None:
    assert _complete(client, echo=False, max_tokens=1).choices
    _refused(lambda: _complete(client, echo=True), "echo")


def check_modalities(client: openai.OpenAI) -> None:
    assert _chat(client, modalities=["text"], max_tokens=1).choices
    _refused(lambda: _chat(client, modalities=["text", "audio"]), "modalities")


def check_return_token_ids(client: openai.OpenAI) -> None:
    r = client.completions.create(model="fake", prompt=PROMPT, max_tokens=3,
                                  extra_body={"return_token_ids": True})
    assert r.model_extra["prompt_token_ids"] == PROMPT and len(_ids(r.choices[0])) <= 3


NOOP_VALUES: dict[str, Any] = {
    "user": "someone", "metadata": {"k": "v"}, "store": True, "service_tier": "auto",
    "safety_identifier": "abc", "prompt_cache_key": "key", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"ttl": "30m"}}

REFUSED_VALUES: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"}, "function_call": "auto",
    "functions": [{"name": "f", "parameters": {}}], "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "x"}, "verbosity": "low",
    "web_search_options": {}, "moderation": {"input": {"mode": "block"}}, "suffix": "end"}

H, N, R, L = "honoured", "noop", "refused", "elsewhere"

# name -> the test that checks an "elsewhere" parameter (module::function)
ELSEWHERE = {
    "reasoning_effort": "test_output_parsers::test_thinking_off_has_no_reasoning",
    "chat_template_kwargs": "test_output_parsers::test_thinking_off_has_no_reasoning",
    "tools": "test_output_parsers::test_hermes_tool_calls",
    "tool_choice": "test_output_parsers::test_hermes_tool_calls",
    "parallel_tool_calls": "test_output_parsers::test_hermes_tool_calls",
    "response_format": "test_structured_output::test_json_schema_20_of_20",
    "structured_outputs": "test_structured_output::test_fake_server_choice",
    "guided_json": "test_structured_output::test_fake_server_accepts_the_plain_forms",
    "guided_regex": "test_structured_output::test_fake_server_regex_streamed",
    "guided_choice": "test_structured_output::test_fake_server_choice",
    "guided_grammar": "test_structured_output::test_fake_server_accepts_the_plain_forms",
}

# name -> (status, effect check for both endpoints or per endpoint)
CHAT: dict[str, tuple[str, Callable[[openai.OpenAI], None] | None]] = {
    "messages": (H, check_messages), "model": (H, check_model), "audio": (R, None),
    "frequency_penalty": (H, check_frequency_penalty), "function_call": (R, None),
    "functions": (R, None), "logit_bias": (H, check_logit_bias),
    "logprobs": (H, check_logprobs_chat), "max_completion_tokens": (H, check_max_tokens),
    "max_tokens": (H, check_max_tokens), "metadata": (N, None), "modalities": (H, check_modalities),
    "moderation": (R, None), "n": (H, check_n), "parallel_tool_calls": (L, None),
    "prediction": (R, None), "presence_penalty": (H, check_presence_penalty),
    "prompt_cache_key": (N, None), "prompt_cache_options": (N, None),
    "prompt_cache_retention": (N, None), "reasoning_effort": (L, None),
    "response_format": (L, None), "safety_identifier": (N, None), "seed": (H, check_seed),
    "service_tier": (N, None), "stop": (H, check_stop), "store": (N, None),
    "stream": (H, check_stream), "stream_options": (H, check_stream_options),
    "temperature": (H, check_temperature), "tool_choice": (L, None), "tools": (L, None),
    "top_logprobs": (H, check_logprobs_chat), "top_p": (H, check_top_p), "user": (N, None),
    "verbosity": (R, None), "web_search_options": (R, None),
    # vLLM's extensions
    "top_k": (H, check_top_k), "min_p": (H, check_min_p),
    "repetition_penalty": (H, check_repetition_penalty), "min_tokens": (H, check_min_tokens),
    "stop_token_ids": (H, check_stop_token_ids), "ignore_eos": (H, check_ignore_eos),
    "return_token_ids": (H, check_return_token_ids), "chat_template_kwargs": (L, None),
    "structured_outputs": (L, None), "guided_json": (L, None), "guided_regex": (L, None),
    "guided_choice": (L, None), "guided_grammar": (L, None),
}
COMPLETIONS: dict[str, tuple[str, Callable[[openai.OpenAI], None] | None]] = {
    "best_of": (H, check_best_of), "echo": (H, check_echo),
    "frequency_penalty": (H, check_frequency_penalty), "logit_bias": (H, check_logit_bias),
    "logprobs": (H, check_logprobs_completions), "max_tokens": (H, check_max_tokens),
    "model": (H, check_model), "n": (H, check_n), "presence_penalty": (H, check_presence_penalty),
    "prompt": (H, check_prompt), "seed": (H, check_seed), "stop": (H, check_stop),
    "stream": (H, check_stream), "stream_options": (H, check_stream_options),
    "suffix": (R, None), "temperature": (H, check_temperature), "top_p": (H, check_top_p),
    "user": (N, None),
    "top_k": (H, check_top_k), "min_p": (H, check_min_p),
    "repetition_penalty": (H, check_repetition_penalty), "min_tokens": (H, check_min_tokens),
    "stop_token_ids": (H, check_stop_token_ids), "ignore_eos": (H, check_ignore_eos),
    "return_token_ids": (H, check_return_token_ids), "response_format": (L, None),
    "structured_outputs": (L, None), "guided_json": (L, None), "guided_regex": (L, None),
    "guided_choice": (L, None), "guided_grammar": (L, None),
}


def test_table_covers_every_documented_parameter() -> None:
    """Every parameter the installed openai client can send (and those of OpenAI's API
    reference at the time of writing) has a row."""
    from openai.types import completion_create_params as cp
    from openai.types.chat import completion_create_params as ccp

    chat_doc = set(ccp.CompletionCreateParamsBase.__annotations__) | {"stream"}
    completions_doc = set(cp.CompletionCreateParamsBase.__annotations__) | {"stream"}
    reference_chat = {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions",
        "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata",
        "modalities", "n", "parallel_tool_calls", "prediction", "presence_penalty",
        "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature",
        "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity",
        "web_search_options"}
    reference_completions = {
        "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix",
        "temperature", "top_p", "user", "model"}
    assert chat_doc | reference_chat <= set(CHAT)
    assert completions_doc | reference_completions <= set(COMPLETIONS)


def _rows() -> list[Any]:
    rows = []
    for endpoint, table in (("chat", CHAT), ("completions", COMPLETIONS)):
        for name, (status, _check) in table.items():
            rows.append(pytest.param(endpoint, name, id=f"{endpoint}-{name}"))
    return rows


_done: set[Any] = set()


@pytest.mark.parametrize(("endpoint", "name"), _rows())
def test_parameter(client: openai.OpenAI, endpoint: str, name: str) -> None:
    status, check = (CHAT if endpoint == "chat" else COMPLETIONS)[name]
    send = _chat if endpoint == "chat" else _complete
    if status == H:
        assert check is not None
        if check not in _done:  # a check shared by both endpoints or two rows runs once
            check(client)
            _done.add(check)
    elif status == N:
        # Metadata: accepted, and the tokens are exactly those without it.
        base = send(client, temperature=1.0, seed=11)
        with_it = send(client, temperature=1.0, seed=11, extra_body={name: NOOP_VALUES[name]})
        assert _ids(with_it.choices[0]) == _ids(base.choices[0])
    elif status == L:
        import importlib

        module, function = ELSEWHERE[name].split("::")
        assert callable(getattr(importlib.import_module(module), function))
    else:
        assert status == R
        _refused(lambda: send(client, extra_body={name: REFUSED_VALUES[name]}), name)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_unknown_parameter_is_refused(client: openai.OpenAI, endpoint: str) -> None:
    send = _chat if endpoint == "chat" else _complete
    _refused(lambda: send(client, extra_body={"no_such_parameter": 1}), "no_such_parameter")
    other = "best_of" if endpoint == "chat" else "top_logprobs"  # the other endpoint's
    _refused(lambda: send(client, extra_body={other: 1}), other)


# ---------------------------------------------------------------------------------------
# generation_config.json defaults


@pytest.fixture(scope="module")
def gen_config_artifact(fake_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer.artifact import write_artifact
    from test_fake_server import MANIFEST

    path = tmp_path_factory.mktemp("genconf") / "model.ninfer"
    write_artifact(path, {**MANIFEST, "generation_config": {
        "temperature": 0.0, "repetition_penalty": 1.8, "max_tokens": 9}}, [])
    return path


@pytest.mark.parametrize("mode", ["auto", "ninfer"])
def test_generation_config_defaults(fake_binary: Path, gen_config_artifact: Path,
                                    mode: str) -> None:
    s = _start(fake_binary, "--artifact", str(gen_config_artifact), "--generation-config", mode)
    try:
        c = openai.OpenAI(base_url=s.openai_base_url, api_key="unused", max_retries=0)
        body: dict[str, Any] = {"prompt": PROMPT, "model": "fake",
                                "extra_body": {"ignore_eos": True, "return_token_ids": True}}
        left_out = c.completions.create(**body)
        if mode == "auto":
            assert any("temperature=0 repetition_penalty=1.8 max_tokens=9" in line
                       for line in s.output)
            want = greedy(PROMPT, 9, Params(repetition_penalty=1.8, ignore_eos=True))
            assert _ids(left_out.choices[0]) == want.tokens  # greedy, penalised, 9 tokens
            # What a request sets wins over the defaults.
            mine = c.completions.create(
                prompt=PROMPT, model="fake", temperature=0, max_tokens=20,
                extra_body={"repetition_penalty": 1.0, "ignore_eos": True,
                            "return_token_ids": True})
            assert _ids(mine.choices[0]) == greedy(PROMPT, 20, Params(ignore_eos=True)).tokens
        else:  # ninfer's own defaults: temperature 1, no penalty, up to the context
            assert left_out.usage.completion_tokens == 64 - len(PROMPT)
    finally:
        s.stop()


def test_generation_config_in_the_manifest() -> None:
    from ninfer.frontend.generation_config import generation_defaults

    qwen3 = {"bos_token_id": 1, "do_sample": True, "eos_token_id": [2, 3], "pad_token_id": 2,
             "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}
    assert generation_defaults(qwen3) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    # transformers' defaults are not in to_diff_dict(), so vLLM ignores them; so do we.
    assert generation_defaults({"top_k": 50, "temperature": 1.0, "max_new_tokens": 512,
                                "min_p": 0.05}) == {"max_tokens": 512, "min_p": 0.05}
    from ninfer.frontend.config import FrontendError

    with pytest.raises(FrontendError, match="temperature"):
        generation_defaults({"temperature": "hot"})


def test_sse_chunks_of_n_carry_their_index(srv: Any) -> None:
    with srv.client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4,
            "stream": True, "ignore_eos": True, "return_token_ids": True}) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and "[DONE]" not in line]
    per = {i: [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
           for i in range(3)}
    for i in range(3):
        assert per[i][0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in per[i][1:])
        assert per[i][-1]["finish_reason"] == "length"
        # Four sampled tokens, then the finish. A sampled end-of-sequence token (kept by
        # ignore_eos) has no text and rides with the next chunk, so count tokens, not chunks.
        body = per[i][:-1]
        assert all(c["finish_reason"] is None and c["token_ids"] for c in body)
        assert sum(len(c["token_ids"]) for c in body) == 4
