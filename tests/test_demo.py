"""The embedded demo model: its corpus, its deterministic training and its cache.

The trained demo itself answering is checked end to end by
test_cli.test_default_compile_then_chat_prints_reply_and_timings (the quickstart path).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ninfer.demo import checkpoint, train
from ninfer.demo.chat_templates import DEMO_TRAIN_TEMPLATE, QWEN_EOS


@pytest.mark.unit
def test_corpus_parses_into_conversations_that_end_with_the_assistant() -> None:
    convs = train.conversations()
    assert len(convs) >= 300
    firsts = {conv[0]["content"] for conv in convs if conv[0]["role"] == "user"}
    assert "Hello! What can you do?" in firsts  # the question scripts/demo.sh asks
    assert "Hello! Who are you?" in firsts  # ninfer-chat's default question
    for conv in convs:
        roles = [m["role"] for m in conv if m["role"] != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        assert all(m["content"] == m["content"].strip() and m["content"] for m in conv)
    assert any(conv[0]["role"] == "system" for conv in convs)
    assert any(len(conv) > 3 for conv in convs)


@pytest.mark.unit
@pytest.mark.parametrize(("text", "message"), [
    ("user: a\nuser: b\n", "corpus line 2: expected 'assistant: text'"),
    ("assistant: a\n", "corpus line 1: expected 'system or user: text'"),
    ("user: a\nassistant:\n", "corpus line 2"),
    ("user: a\nassistant: b\nuser: c\n", "ends without an assistant message"),
])
def test_corpus_mistakes_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        train.conversations(text)


def _tiny_data() -> tuple[dict, dict[str, np.ndarray], list, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(checkpoint.make_tokenizer("qwen")))
    eos = tok.token_to_id(QWEN_EOS)
    data = train.examples(train.conversations()[:12], DEMO_TRAIN_TEMPLATE,
                          lambda text: tok.encode(text).ids, eos)
    cfg = {**checkpoint.DEMO_CONFIG, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 16, "vocab_size": tok.get_vocab_size()}
    return cfg, checkpoint.random_tensors(cfg, seed=3), data, tok.token_to_id("<|endoftext|>")


@pytest.mark.unit
def test_loss_mask_covers_assistant_turns_through_end_of_turn() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(json.dumps(checkpoint.make_tokenizer("qwen")))
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Goodbye."}]
    ((ids, mask),) = train.examples([conv], DEMO_TRAIN_TEMPLATE, lambda t: tok.encode(t).ids,
                                    tok.token_to_id(QWEN_EOS))
    learned = [tok.decode([i], skip_special_tokens=False) for i, m in zip(ids, mask) if m]
    assert "".join(learned) == "Hello.<|im_end|>Goodbye.<|im_end|>"


@pytest.mark.unit
def test_training_is_deterministic_and_learns() -> None:
    """Two trainings from the same inputs give bit-identical tensors (whatever thread count
    the caller set: training pins its own), and the loss falls."""
    import torch

    cfg, init, data, pad = _tiny_data()
    losses: list[str] = []
    a = train.train(cfg, init, data, pad, progress=losses.append, epochs=40)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        b = train.train(cfg, init, data, pad, epochs=40)
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    assert a.keys() == b.keys() == init.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert not np.array_equal(a["model.embed_tokens.weight"], init["model.embed_tokens.weight"])
    first, last = (float(line.rsplit(" ", 1)[1]) for line in (losses[0], losses[-1]))
    assert last < first - 1.0


@pytest.mark.unit
def test_checkpoint_is_cached_by_digest_and_rebuilt_when_the_corpus_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = checkpoint.write_demo_checkpoint(tmp_path / "demo", trained=False)
    assert checkpoint.is_cached(ckpt, trained=False)
    assert not checkpoint.is_cached(ckpt, trained=True)  # random weights never pass as trained
    stamp = json.loads((ckpt / checkpoint.STAMP).read_text())
    assert stamp == {"digest": checkpoint.demo_digest(trained=False), "trained": False, "seed": 0}
    before = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}
    checkpoint.write_demo_checkpoint(ckpt, trained=False)  # cached: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == before

    original = train.corpus_text()
    edited = original.replace("assistant: The capital of France is Paris.",
                              "assistant: Paris is the capital of France.")
    assert edited != original
    monkeypatch.setattr(train, "corpus_text", lambda: edited)
    assert checkpoint.demo_digest(trained=True) != stamp["digest"]
    assert not checkpoint.is_cached(ckpt, trained=False)
    checkpoint.write_demo_checkpoint(ckpt, trained=False)
    assert checkpoint.is_cached(ckpt, trained=False)
    assert json.loads((ckpt / checkpoint.STAMP).read_text())["digest"] != stamp["digest"]
