"""Speculative decoding end to end on the CPU backend (issue 16, n-gram drafts).

One compile with `--spec ngram --max-draft-tokens 4` serves both sides: the server
started with `--spec none` decodes plainly, the default serves what was compiled. Greedy
outputs must be the same token for token at every batch size from 1 to the compiled
concurrency, with prompts that invite n-gram matches (copying), and the acceptance shows
in `timings` and in vLLM's `spec_decode_*` metrics. Dense (tiny Qwen3) and hybrid (tiny
Qwen3.5, Gated DeltaNet with the chunked prefill): the hybrid keeps the recurrent state
after each draft row in its sequence's scratch slots and makes the accepted one current,
so a rejected draft leaves no trace in the state either. The engine's own cases (oracle,
partly wrong and random drafts, preemption, cancellation inside a verify step, a soak,
each also with recurrent state) run against the fake model in
tests/native/test_speculate.cpp.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    MAX_CONTEXT,
    PREFILL_CHUNK,
    TEST_MODELS,
    CompiledModel,
    clean_soak,
    compile_once,
)
from ninfer.runtime.client import parse_metrics

CONCURRENCY = 4
DRAFTS = 4


def _compile_spec(base: CompiledModel, model_id: str, **extra: Any) -> CompiledModel:
    from ninfer.pipeline import CompileOptions

    out = TEST_MODELS / f"{model_id}-spec-cpu"
    compile_once(CompileOptions(model_dir=base.checkpoint, target="cpu", out_dir=out,
                                model_id=model_id, max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, max_concurrency=CONCURRENCY,
                                kv_dtype="f32", spec="ngram", max_draft_tokens=DRAFTS,
                                **{"python_module": False, **extra}))
    return CompiledModel(model_id, base.checkpoint, out, base.eos_token_ids)


@pytest.fixture(scope="module")
def spec_model(qwen3_model: CompiledModel) -> CompiledModel:
    return _compile_spec(qwen3_model, "qwen3-tiny")


@pytest.fixture(scope="module")
def hybrid_spec_model(qwen35_model: CompiledModel) -> CompiledModel:
    # the chunked GDN prefill (8-row chunks here): a verify step's 5 rows would otherwise
    # form a chunked segment; its saved rows end segments instead
    return _compile_spec(qwen35_model, "qwen35-tiny", gdn_prefill="chunked",
                         python_module=True)


@pytest.fixture(params=["dense", "hybrid"])
def any_spec_model(request: pytest.FixtureRequest) -> CompiledModel:
    return request.getfixturevalue("spec_model" if request.param == "dense"
                                   else "hybrid_spec_model")


def _prompts(model: CompiledModel) -> list[str]:
    """Texts that repeat themselves, as code edits and summaries of given text do."""
    tok = model.hf_tokenizer()
    words = [tok.decode([i]).strip() for i in range(40, 400, 7)]
    words = [w for w in words if w.isalpha()][:24]
    out = []
    for i in range(2 * CONCURRENCY):
        chunk = " ".join(words[i:i + 6 + i % 5])
        out.append(f"{chunk}. {chunk}. {chunk}." + (" Again:" if i % 2 else ""))
    return out


def _complete(srv: Any, prompt: str, **extra: Any) -> dict[str, Any]:
    r = srv.client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": 40, "temperature": 0,
        "return_token_ids": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


# Outputs held to five tokens (logit_bias, applied in verification like every processor):
# they repeat their own n-grams, so a model that does not copy on its own (the random tiny
# Qwen3.5) still gets drafts both accepted and rejected.
NARROW = {"logit_bias": {str(t): 60 for t in range(40, 45)}}


def _cases(model: CompiledModel) -> list[tuple[str, dict[str, Any]]]:
    prompts = _prompts(model)
    return [(p, {}) for p in prompts] + [(p, NARROW) for p in prompts[:CONCURRENCY]]


def _batch(srv: Any, cases: list[tuple[str, dict[str, Any]]], n: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda c: _complete(srv, c[0], **c[1]), cases))


def test_greedy_outputs_are_the_same_with_and_without_drafts(any_spec_model):
    from ninfer.runtime import Server

    spec_model = any_spec_model
    cases = _cases(spec_model)
    with Server(spec_model.out_dir, threads=2, extra_args=("--spec", "none")) as srv:
        plain = [_complete(srv, p, **extra) for p, extra in cases]
        assert "draft_n" not in plain[0]["timings"]  # no speculation, no draft counts
    assert set(plain[-1]["choices"][0]["token_ids"]) <= set(range(40, 45))
    drafted = accepted = 0
    with Server(spec_model.out_dir, threads=2) as srv:
        for n in range(1, CONCURRENCY + 1):
            got = _batch(srv, cases, n)
            for p, a, b in zip(cases, plain, got, strict=True):
                assert b["choices"][0]["token_ids"] == a["choices"][0]["token_ids"], (n, p)
                assert b["choices"][0]["text"] == a["choices"][0]["text"]
                t = b["timings"]
                assert 0 <= t["draft_accepted_n"] <= t["draft_n"]
                drafted += t["draft_n"]
                accepted += t["draft_accepted_n"]
        metrics = parse_metrics(srv.client.get("/metrics").text)
    # some drafts accepted, others rejected: both the kept and the rolled-back paths ran
    assert drafted > accepted > 0, (drafted, accepted)
    assert metrics.value("ninfer:spec_decode_num_draft_tokens_total") == drafted
    assert metrics.value("ninfer:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [metrics.value("ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                             position=str(i)) for i in range(DRAFTS)]
    # a proposal accepts at position 0 at most once
    assert sum(per_pos) == accepted
    assert per_pos[0] <= metrics.value("ninfer:spec_decode_num_drafts_total")
    assert metrics.value("ninfer:kv_blocks_used") == 0
    if spec_model.name == "qwen35-tiny":  # each sequence slot: the state and 4 scratch slots
        assert metrics.value("ninfer:state_slots_total") == CONCURRENCY * (1 + DRAFTS)
        assert metrics.value("ninfer:state_slots_used") == 0


def test_two_builds_of_one_model_load_side_by_side_in_one_process(qwen35_model, hybrid_spec_model):
    """CPython keeps one extension module per name: the module of each build is named
    after its build digest, so a process that loaded one build's engine and then another's
    (a test run, a notebook) gets each its own program."""
    from ninfer.runtime.engine import load_engine

    a = load_engine(qwen35_model.out_dir).info()
    b = load_engine(hybrid_spec_model.out_dir).info()
    assert (a["spec"], b["spec"]) == ("none", "ngram")
    assert a["build_digest"] != b["build_digest"]
    assert (a["state_group"], b["state_group"]) == (1, 1 + DRAFTS)


def test_hybrid_verify_steps_continue_with_the_bits_of_plain_decoding(hybrid_spec_model):
    """The step contract of speculative decoding on the real hybrid kernels (the tiny
    Qwen3.5, Gated DeltaNet with the chunked prefill), driven as the engine drives it: a
    verify step runs a sequence's last token and 4 drafts, saving the recurrent state after
    each row but the last in the sequence's scratch state slots; the drafts are the plain
    continuation with one token wrong at a position that moves from step to step (so
    verification stops at every position, and sometimes accepts all), and the state after
    the last accepted row becomes current by index. Every logits row of an accepted
    position is bitwise the one plain decoding (one row per step) gives there, and the
    tokens are the same, while another sequence decodes beside it in the same steps."""
    import numpy as np

    from ninfer.runtime.engine import load_engine

    eng = load_engine(hybrid_spec_model.out_dir, threads=2)
    info = eng.info()
    conc, bps, group = info["max_concurrency"], info["blocks_per_seq"], info["state_group"]
    assert info["state_slots"] == conc * group and group == 1 + DRAFTS
    assert info["kv_blocks"] > 3 * bps
    tables = np.zeros((conc, bps), np.int32)
    for s in range(3):  # slots 0..2, each its own blocks
        tables[s] = np.arange(1 + s * bps, 1 + (s + 1) * bps)
    tables = tables.ravel().tolist()
    prompt = [int(t) for t in np.random.default_rng(3).integers(5, 1000, 21)]
    other = [7, 8, 9, 10, 11]  # slot 2: a sequence decoding beside it

    def prefill(slot: int, tokens: list[int], state: int) -> np.ndarray:
        last = None
        for i in range(0, len(tokens), PREFILL_CHUNK):
            part = tokens[i:i + PREFILL_CHUNK]
            last = eng.step(part, list(range(i, i + len(part))), [slot] * len(part), tables,
                            [len(part) - 1], [state] * len(part))
        return last[0]

    # plain decoding in slot 0 (state slot 0): one row per step
    steps = 30
    plain_logits, plain = [], []
    row = prefill(0, prompt, 0)
    for p in range(len(prompt), len(prompt) + steps):
        plain_logits.append(row)
        plain.append(int(row.argmax()))
        row = eng.step([plain[-1]], [p], [0], tables, [0], [0])[0]

    # speculative decoding in slot 1 (state slots 5..9), slot 2 decoding beside it
    base = 1 * group
    cur = 0  # which of the group's slots holds the state
    row = prefill(1, prompt, base + cur)
    other_row = prefill(2, other, 2 * group)
    other_tok, other_pos = int(other_row.argmax()), len(other)
    assert np.array_equal(row, plain_logits[0])
    got, n, miss, stops = [int(row.argmax())], 0, 0, set()
    while len(got) < steps:
        pos = len(prompt) + len(got) - 1  # the pending token's position
        k = min(DRAFTS, steps - 1 - len(got))
        drafts = plain[len(got):len(got) + k]
        miss = (miss + 1) % (DRAFTS + 1)
        if miss < k:
            drafts[miss] = (drafts[miss] + 1) % info["vocab_size"]
        rows = [got[-1], *drafts]
        saves = [base + (cur + 1 + j) % group for j in range(k)] + [-1]
        logits = eng.step([*rows, other_tok], [*range(pos, pos + k + 1), other_pos],
                          [1] * (k + 1) + [2], tables, list(range(k + 2)),
                          [base + cur] * (k + 1) + [2 * group], [*saves, -1])
        other_tok, other_pos = int(logits[-1].argmax()), other_pos + 1
        accepted = 0
        for j in range(k + 1):
            assert np.array_equal(logits[j], plain_logits[len(got)]), (len(got), j)
            token = int(logits[j].argmax())
            got.append(token)
            if j == k or token != drafts[j]:
                break
            accepted += 1
        stops.add(accepted)
        if accepted < k:
            cur = (cur + 1 + accepted) % group
        n += 1
    assert got == plain
    assert stops >= set(range(DRAFTS + 1)), stops  # stopped at every position, and none
    assert n < steps - 5  # fewer steps than tokens


def test_seeded_sampled_requests_give_the_tokens_of_plain_decoding(any_spec_model):
    """A draft proposed with certainty is decided by the position's own draw (rejection
    sampling against a point mass; its distribution is checked in test_speculate.cpp), so
    a seeded request samples the same tokens with drafts as without, alone or batched."""
    from ninfer.runtime import Server

    spec_model = any_spec_model
    prompts = _prompts(spec_model)[:CONCURRENCY]
    body = {"temperature": 0.8, "top_p": 0.9, "top_k": 30, "frequency_penalty": 0.2,
            "ignore_eos": True}

    def run(srv: Any, n: int) -> list[list[int]]:
        with ThreadPoolExecutor(n) as pool:  # every other one held to five tokens (NARROW)
            out = list(pool.map(lambda ip: _complete(srv, ip[1], seed=ip[0], **body,
                                                     **(NARROW if ip[0] % 2 else {})),
                                enumerate(prompts)))
        return [r["choices"][0]["token_ids"] for r in out]

    with Server(spec_model.out_dir, threads=2, extra_args=("--spec", "none")) as srv:
        plain = run(srv, 1)
    with Server(spec_model.out_dir, threads=2) as srv:
        for n in (1, CONCURRENCY):
            assert run(srv, n) == plain, n
    assert all(len(t) == 40 for t in plain)


@pytest.mark.parametrize(("args", "message"), [
    (("--draft-tokens", "5"), "--draft-tokens 5 exceeds the compiled maximum 4; recompile with "
                              "--max-draft-tokens 5"),
    (("--spec", "mtp"), "--spec mtp: the model was compiled for --spec ngram"),
    (("--spec", "none", "--draft-tokens", "2"), "--draft-tokens needs speculative decoding: "
                                                 "--spec none turned it off"),
    (("--ngram-min", "5", "--ngram-max", "3"), "--ngram-min 5 exceeds --ngram-max 3"),
])
def test_speculation_flags_are_checked(spec_model, args, message):
    r = subprocess.run([str(spec_model.server), "--port", "0", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_model_compiled_without_speculation_refuses_it(qwen3_model):
    r = subprocess.run([str(qwen3_model.server), "--port", "0", "--spec", "ngram"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert ("--spec ngram: the model was compiled without speculative decoding; recompile "
            "with ninfer-compile --spec ngram") in r.stderr


def test_the_compile_sizes_the_step_for_drafts(spec_model):
    src = (Path(spec_model.out_dir) / "src" / "model.cpp").read_text()
    # 4 sequences x (1 + 4 drafts) = 20 logits rows, capped by the 16-row step
    assert "constexpr int kMaxLogitRows = 16;" in src
    assert '"ngram", /*max_draft_tokens=*/4' in src


def test_soak_with_drafts_answers_everything_and_leaks_nothing(any_spec_model, tmp_path):
    """The crash shape of the report, on the CPU: concurrent streams decoding with drafts,
    mixed lengths, a quarter of the clients hanging up mid-stream; every answer checked,
    the server drains, no KV block left, RSS flat (ninfer-bench soak). The long run is for
    a lent GPU."""
    res = clean_soak(
        any_spec_model.out_dir, tmp_path, 40, "--concurrency", str(CONCURRENCY),
        "--disconnect-rate", "0.25", "--max-tokens-range", "1,40",
        "--prompt-len-range", "1,100", "--seed", "5", "--threads", "2",
        "--vocab-size", "12", "--narrow-rate", "0.5",  # outputs that repeat themselves
        "--server-arg=--ngram-min", "--server-arg=1")  # many matches
    assert res["draft_tokens"] > 0 and 0 < res["accepted_tokens"] <= res["draft_tokens"]
