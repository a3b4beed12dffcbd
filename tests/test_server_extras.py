"""What else users expect of a server, over the fake model (tests/test_fake_server.py):
--api-key, /tokenize and /detokenize, /v1/models/{id}, --served-model-name, and /health
answering 503 while the model loads and while the server stops.

Nothing here depends on the machine's speed: loading waits for the test's byte on a FIFO
(NINFER_FAKE_LOAD_GATE), and a request held at the step gate keeps a stopping server
from closing its port until the test lets that step pass.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import test_fake_server as fake
from test_fake_server import (
    HANG,
    LONG,
    Gate,
    _post_in_background,
    _running,
    _stop_taking_work,
    _wait_for,
)

# The fake server's fixtures, used here too.
fake_server, gate, serve = fake.fake_server, fake.gate, fake.serve

KEY = "s3cret"


def test_api_key_guards_every_route_but_health(serve: Callable[..., Any]) -> None:
    srv = serve("--api-key", KEY)
    c = srv.client
    assert c.get("/health").status_code == 200
    body = {"prompt": "ab", "max_tokens": 2}
    for method, path in [("GET", "/v1/models"), ("GET", "/v1/models/fake"), ("GET", "/metrics"),
                         ("POST", "/v1/completions"), ("POST", "/tokenize")]:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": KEY[:-1]},
                        {"Authorization": KEY}):
            r = c.request(method, path, json=body if method == "POST" else None,
                          headers=headers)
            assert r.status_code == 401, (path, headers)
            err = r.json()["error"]
            assert err["code"] == "invalid_api_key" and "x-api-key" in err["message"]
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"},
                    {"x-api-key": KEY}):
        assert c.post("/v1/completions", json=body, headers=headers).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.openai_base_url, api_key="wrong",
                      max_retries=0).completions.create(model="fake", prompt="ab", max_tokens=1)
    ok = openai.OpenAI(base_url=srv.openai_base_url, api_key=KEY, max_retries=0)
    done = ok.completions.create(model="fake", prompt="ab", max_tokens=1)
    assert done.usage is not None and done.usage.completion_tokens == 1


def test_api_key_from_the_environment(serve: Callable[..., Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_API_KEY", KEY)
    srv = serve()
    assert srv.client.get("/v1/models").status_code == 401
    assert srv.client.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200


def test_tokenize_and_detokenize(serve: Callable[..., Any]) -> None:
    srv = serve()
    c = srv.client
    r = c.post("/tokenize", json={"prompt": "hello"}).json()
    assert r == {"tokens": [7, 4, 11, 11, 14], "count": 5, "max_model_len": 64}
    # The chat form is the prompt a chat request gets (the fake format adds nothing).
    chat = c.post("/tokenize", json={"model": "fake", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"}]}).json()
    done = c.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hiyook"}], "max_tokens": 1,
        "return_token_ids": True}).json()
    assert chat["tokens"] == done["prompt_token_ids"] == [7, 8, 24, 14, 14, 10]
    assert c.post("/detokenize", json={"tokens": [7, 4, 11]}).json() == {"prompt": "h e l"}
    assert c.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/detokenize", {"tokens": [1, 27]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, "tokens"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
    ("/tokenize", {"prompt": [1, 2]}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": "a"}],
                   "add_generation_prompt": False}, "add_generation_prompt"),
    ("/tokenize", {"prompt": "a", "return_token_strs": True}, "return_token_strs"),
])
def test_tokenize_refusals(serve: Callable[..., Any], path: str, body: dict[str, Any],
                           param: str) -> None:
    r = serve().client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_served_model_names(serve: Callable[..., Any]) -> None:
    srv = serve("--served-model-name", "qwen-small", "alias-b")
    c = srv.client
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["qwen-small", "alias-b"]
    for name in ("qwen-small", "alias-b"):
        m = c.get(f"/v1/models/{name}").json()
        assert (m["id"], m["object"], m["max_model_len"]) == (name, "model", 64)
    # The compiled id is no longer a name this server answers to.
    for name in ("fake", "other"):
        r = c.get(f"/v1/models/{name}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = c.post("/v1/completions", json={"model": name, "prompt": "ab", "max_tokens": 1})
        assert r.status_code == 404 and "'qwen-small', 'alias-b'" in r.json()["error"]["message"]
    # Responses carry the first name, whichever one was asked for.
    r = c.post("/v1/completions", json={"model": "alias-b", "prompt": "ab", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "qwen-small"


def test_model_by_id_on_the_default_name(serve: Callable[..., Any]) -> None:
    c = serve().client
    assert c.get("/v1/models/fake").json()["id"] == "fake"
    assert c.get("/v1/models/fake2").status_code == 404


def test_health_is_503_while_loading(fake_server: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ninfer.runtime import Server

    load = Gate(tmp_path / "load")
    monkeypatch.setenv("NINFER_FAKE_LOAD_GATE", str(load.path))
    monkeypatch.delenv("NINFER_FAKE_GATE", raising=False)
    srv = Server(fake_server, startup_timeout=HANG).start(ready=False)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=HANG) as c:
            r = c.get("/health")
            assert r.status_code == 503 and r.json() == {"status": "loading"}
            r = c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
            assert r.headers["retry-after"] == "1"
            load.allow(1)
            deadline = time.monotonic() + HANG
            while c.get("/health").status_code != 200:
                assert time.monotonic() < deadline and srv.alive(), "\n".join(srv.output)
                time.sleep(0.01)
            assert c.post("/v1/completions",
                          json={"prompt": "ab", "max_tokens": 1}).status_code == 200
    finally:
        load.open()
        srv.stop()


def test_sigterm_while_loading_exits_cleanly(fake_server: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ninfer.runtime import Server

    load = Gate(tmp_path / "load")
    monkeypatch.setenv("NINFER_FAKE_LOAD_GATE", str(load.path))
    srv = Server(fake_server, startup_timeout=HANG).start(ready=False)
    try:
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + HANG
        while not any("SIGTERM, stopping" in line for line in srv.output):
            assert time.monotonic() < deadline, "\n".join(srv.output)
            time.sleep(0.01)
        load.allow(1)  # the load finishes; the server does not start serving
        assert srv.proc.wait(HANG) == 0
        assert not any("ready" in line for line in srv.output)
    finally:
        load.open()
        srv.stop()


def test_health_is_503_while_stopping(fake_server: Path, gate: Gate,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After SIGTERM the port stays open until the request in flight is answered (it is
    held at the step gate), and /health says 503 shutting_down meanwhile."""
    from ninfer.runtime import Server

    monkeypatch.setenv("NINFER_FAKE_GATE", str(gate.path))
    srv = Server(fake_server, startup_timeout=HANG).start()
    try:
        ta, ra = _post_in_background(srv, LONG)
        _wait_for(srv, _running(1))  # held at its first step: it cannot finish
        _stop_taking_work(srv)
        with httpx.Client(base_url=srv.base_url, timeout=HANG) as c:
            r = c.get("/health")
            assert r.status_code == 503 and r.json() == {"status": "shutting_down"}
            r = c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        gate.allow(1)  # the step in flight passes; the request ends with 503
        ta.join(HANG)
        assert ra[0].status_code == 503 and ra[0].json()["error"]["code"] == "shutting_down"
        assert srv.proc.wait(HANG) == 0
    finally:
        gate.open()
        srv.stop()
