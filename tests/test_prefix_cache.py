"""Prefix caching on real compiled models (the tiny Qwen3 and the tiny hybrid Qwen3.5, CPU
backend): a request served from the cache gives bitwise the tokens and logprobs it gets
from a cold server (--no-prefix-caching), in a multi-turn conversation and with four
streams sharing a prefix at once; the usage and timings say how much of the prompt was
cached (OpenAI's prompt_tokens_details.cached_tokens as the official client reads it,
llama.cpp's timings.cache_n, Anthropic's cache_read_input_tokens), /metrics counts queries
and hits, and the flags that do not apply are refused.

The engine's own tests (tests/native/test_prefix.cpp, run by test_scheduler_native.py)
cover eviction, preemption, cancellation, n > 1, speculation and a soak against a fake
model that checks every block it reads.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import CompiledModel, read_response, send_completion
from ninfer.runtime import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["qwen3_model", "qwen35_model"],
                ids=["qwen3-dense", "qwen35-hybrid"])
def model(request: pytest.FixtureRequest) -> CompiledModel:
    return request.getfixturevalue(request.param)


def _completion(srv: Server, ids: list[int], max_tokens: int) -> dict[str, Any]:
    r = srv.client.post("/v1/completions", json={
        "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()


def _answer(body: dict[str, Any]) -> tuple[list[int], list[float]]:
    choice = body["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _conversation(seed: int) -> tuple[list[int], list[list[int]]]:
    rng = np.random.default_rng(seed)
    system = rng.integers(3, 2000, 70).tolist()  # a system prompt of 4+ blocks of 16
    return system, [rng.integers(3, 2000, int(n)).tolist() for n in rng.integers(3, 12, 4)]


def test_multi_turn_matches_a_cold_server(model: CompiledModel) -> None:
    system, messages = _conversation(5)
    runs: dict[bool, list[dict[str, Any]]] = {}
    for caching in (False, True):
        args = () if caching else ("--no-prefix-caching",)
        with Server(model.out_dir, threads=2, extra_args=args) as srv:
            prompt, turns = list(system), []
            for msg in messages:
                prompt += msg
                body = _completion(srv, prompt, 6)
                turns.append(body)
                prompt += body["choices"][0]["token_ids"]
            metrics = srv.client.get("/metrics").text
        runs[caching] = turns
        if caching:
            assert "ninfer:prefix_cache_hits_total" in metrics
            hits = float(re.search(r"^ninfer:prefix_cache_hits_total (\S+)$", metrics,
                                   re.M).group(1))
            assert hits == sum(t["usage"]["prompt_tokens_details"]["cached_tokens"]
                               for t in turns)
        else:
            assert "prefix_cache" not in metrics
    for i, (cold, warm) in enumerate(zip(runs[False], runs[True], strict=True)):
        assert _answer(warm) == _answer(cold), f"turn {i}"  # tokens and logprobs, bitwise
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert warm["timings"]["cache_n"] == cached
        if i == 0:
            assert cached == 0
        else:  # at least the last turn's prompt, whole blocks of 16
            last = runs[True][i - 1]["usage"]["prompt_tokens"]
            assert cached % 16 == 0 and (last - 1) // 16 * 16 <= cached < warm["usage"][
                "prompt_tokens"]


def test_four_streams_sharing_a_prefix(model: CompiledModel) -> None:
    rng = np.random.default_rng(9)
    prefix = rng.integers(3, 2000, 50).tolist()
    prompts = [prefix + rng.integers(3, 2000, 2 + i).tolist() for i in range(8)]
    answers: dict[bool, list[tuple[list[int], list[float]]]] = {}
    cached: list[int] = []
    for caching in (False, True):
        args = ("--max-concurrency", "4") + (() if caching else ("--no-prefix-caching",))
        with Server(model.out_dir, threads=2, extra_args=args) as srv:
            if not caching:
                answers[caching] = [_answer(_completion(srv, p, 5)) for p in prompts]
                continue
            got = []
            for batch in (prompts[:4], prompts[4:]):  # an empty cache, then a warm one
                assert srv.proc is not None
                os.kill(srv.proc.pid, signal.SIGSTOP)  # four at once, whatever the speed
                try:
                    socks = [send_completion(srv, {
                        "prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                        "return_token_ids": True, "logprobs": 1}) for p in batch]
                finally:
                    os.kill(srv.proc.pid, signal.SIGCONT)
                bodies = [read_response(s) for s in socks]
                got += [_answer(b) for b in bodies]
                cached += [b["usage"]["prompt_tokens_details"]["cached_tokens"]
                           for b in bodies]
            answers[caching] = got
    assert answers[True] == answers[False]
    assert all(c >= 48 for c in cached[4:]), cached  # the prefix's 3 blocks, from batch 1


def test_official_clients_read_the_cached_tokens(qwen3_model: CompiledModel) -> None:
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    long_text = " ".join(f"fact {i}: the value is {i * 7}." for i in range(12))
    with Server(qwen3_model.out_dir, threads=2) as srv:
        base = srv.base_url
        client = openai.OpenAI(base_url=srv.openai_base_url, api_key="none")
        messages = [{"role": "system", "content": long_text},
                    {"role": "user", "content": "hello"}]
        first = client.chat.completions.create(model=qwen3_model.name, messages=messages,
                                               max_tokens=4, temperature=0)
        second = client.chat.completions.create(model=qwen3_model.name, messages=messages,
                                                max_tokens=4, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert second.usage.prompt_tokens - 16 < cached < second.usage.prompt_tokens
        assert second.choices[0].message.content == first.choices[0].message.content
        stream = client.chat.completions.create(
            model=qwen3_model.name, messages=messages, max_tokens=4, temperature=0,
            stream=True, stream_options={"include_usage": True})
        usage = [c.usage for c in stream if c.usage is not None]
        assert usage[-1].prompt_tokens_details.cached_tokens == cached

        ac = anthropic.Anthropic(base_url=base, api_key="none")
        msg = ac.messages.create(model=qwen3_model.name, max_tokens=4, system=long_text,
                                 messages=[{"role": "user", "content": "hi"}])
        again = ac.messages.create(model=qwen3_model.name, max_tokens=4, system=long_text,
                                   messages=[{"role": "user", "content": "hi"}])
        total = msg.usage.input_tokens + msg.usage.cache_read_input_tokens
        # the system prompt's blocks, cached by the chat requests; then the turn's whole blocks
        assert 0 < msg.usage.cache_read_input_tokens <= again.usage.cache_read_input_tokens
        assert again.usage.cache_read_input_tokens > total - 16
        assert again.usage.input_tokens + again.usage.cache_read_input_tokens == total
        with ac.messages.stream(model=qwen3_model.name, max_tokens=4, system=long_text,
                                messages=[{"role": "user", "content": "hi"}]) as s:
            final = s.get_final_message()
        assert final.usage.cache_read_input_tokens == again.usage.cache_read_input_tokens
        assert final.usage.input_tokens == again.usage.input_tokens


def _server_error(model: CompiledModel, *args: str) -> str:
    from ninfer.runtime.server import ServerError

    srv = Server(model.out_dir, threads=2, extra_args=args)
    with pytest.raises(ServerError) as exc:
        srv.start()
    return str(exc.value)


def test_checkpoint_flags_refused_where_they_do_not_apply(qwen3_model: CompiledModel,
                                                          qwen35_model: CompiledModel) -> None:
    assert "no recurrent state" in _server_error(qwen3_model, "--state-checkpoint-interval",
                                                 "64")
    assert "not a multiple of 16" in _server_error(qwen35_model, "--state-checkpoint-interval",
                                                   "24")
    assert "--no-prefix-caching turned off" in _server_error(
        qwen35_model, "--no-prefix-caching", "--state-checkpoint-interval", "32")


def test_compile_refuses_checkpoints_for_a_dense_model(qwen3_model: CompiledModel,
                                                       tmp_path: Path) -> None:
    from ninfer.pipeline import CompileOptions, compile_model

    with pytest.raises(ValueError, match="no recurrent state"):
        compile_model(CompileOptions(model_dir=qwen3_model.checkpoint, target="cpu",
                                     out_dir=tmp_path / "out", state_checkpoints=2,
                                     build=False))
