"""Training of the demo model on its bundled corpus (torch, CPU, deterministic).

`corpus.txt` holds conversations (see its header). Each is rendered with the demo's chat
template by jinja2 (as Hugging Face's `apply_chat_template` renders it) and tokenized; the
loss is taken on the assistant turns only (their content and the end-of-turn token
`<|im_end|>`, so the model learns to stop). The model is a small Qwen3 written here in
plain torch (same tensor names and math as transformers' Qwen3ForCausalLM), trained with
AdamW from the seeded random initialization of `checkpoint.random_tensors`.

Cost: about 90 s of one CPU core (24 epochs over ~12k tokens, a 1.05M-parameter model);
one thread, since torch's thread pool slows down badly when the cores are shared.

Determinism: fixed seeds, `torch.use_deterministic_algorithms(True)`, one thread whatever
the caller set, and a seeded example order make the weights bit-identical run to run on
the same machine and torch build. Another CPU (other SIMD width, other BLAS kernels) or
torch version may round differently; `checkpoint.demo_digest` includes the torch version,
so a new torch retrains.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib import resources
from typing import Any

import numpy as np

# Everything that decides the weights (with the corpus, config and tokenizer): part of the
# cache digest through this module's source.
SEED = 0
THREADS = 1
EPOCHS = 24
BATCH = 8
LR = 3e-3
WARMUP_STEPS = 30
WEIGHT_DECAY = 0.0

Message = dict[str, str]


def corpus_text() -> str:
    return resources.files("ninfer.demo").joinpath("corpus.txt").read_text(encoding="utf-8")


def conversations(text: str | None = None) -> list[list[Message]]:
    """The corpus's conversations: blocks of `role: content` lines between blank lines."""
    text = corpus_text() if text is None else text
    convs: list[list[Message]] = []
    current: list[Message] = []
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                convs.append(current)
                current = []
            continue
        role, sep, content = line.partition(": ")
        expected: tuple[str, ...] = (
            "assistant" if current and current[-1]["role"] == "user" else "user",)
        if not current:
            expected = ("system", "user")
        elif current[-1]["role"] == "system":
            expected = ("user",)
        if not sep or role not in expected or not content.strip():
            raise ValueError(f"corpus line {number}: expected '{' or '.join(expected)}: "
                             f"text', got {line!r}")
        current.append({"role": role, "content": content.strip()})
    for conv in convs:
        if conv[-1]["role"] != "assistant":
            raise ValueError(f"corpus conversation {conv[0]['content']!r} ends without an "
                             "assistant message")
    return convs


def render(template: str, messages: list[Message], add_generation_prompt: bool) -> str:
    """`apply_chat_template(messages, tokenize=False)` with Hugging Face's jinja2 settings."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt)


def examples(convs: list[list[Message]], template: str, encode: Callable[[str], list[int]],
             eos: int) -> list[tuple[list[int], list[bool]]]:
    """(token ids, loss mask) per conversation. The mask marks the tokens the model must
    predict: each assistant turn from its first content token through `eos`. Each
    generation prompt must tokenize to a prefix of the whole conversation (what the server
    sends the model equals what it was trained on)."""
    out = []
    for conv in convs:
        ids = encode(render(template, conv, add_generation_prompt=False))
        mask = [False] * len(ids)
        for i, message in enumerate(conv):
            if message["role"] != "assistant":
                continue
            prompt = encode(render(template, conv[:i], add_generation_prompt=True))
            turn = encode(render(template, conv[:i + 1], add_generation_prompt=False))
            if ids[:len(prompt)] != prompt or ids[:len(turn)] != turn:
                raise ValueError(f"the chat template's prompt for {conv[:i]!r} does not "
                                 "tokenize to a prefix of the conversation")
            end = turn.index(eos, len(prompt))
            mask[len(prompt):end + 1] = [True] * (end + 1 - len(prompt))
        out.append((ids, mask))
    return out


class _Qwen3:
    """Qwen3ForCausalLM's forward pass over a dict of named parameters (tied embeddings)."""

    def __init__(self, cfg: dict[str, Any], params: dict[str, Any]) -> None:
        import torch

        self.cfg, self.p = cfg, params
        d = cfg["head_dim"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        pos = torch.arange(cfg["max_position_embeddings"], dtype=torch.float64)
        freqs = torch.outer(pos, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().float(), emb.sin().float()

    def _norm(self, x: Any, w: Any) -> Any:
        import torch

        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.cfg["rms_norm_eps"]) * w

    def _rope(self, x: Any, cos: Any, sin: Any) -> Any:
        import torch

        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def logits(self, ids: Any) -> Any:
        return self.head(self.hidden(ids))

    def head(self, x: Any) -> Any:
        return self._norm(x, self.p["model.norm.weight"]) @ self.p["model.embed_tokens.weight"].T

    def hidden(self, ids: Any) -> Any:
        """The last layer's output (before the final norm) at every position."""
        import torch.nn.functional as F

        cfg, p = self.cfg, self.p
        b, t = ids.shape
        nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        cos, sin = self.cos[:t], self.sin[:t]
        x = p["model.embed_tokens.weight"][ids]
        for i in range(cfg["num_hidden_layers"]):
            L = f"model.layers.{i}."
            h = self._norm(x, p[L + "input_layernorm.weight"])
            q = (h @ p[L + "self_attn.q_proj.weight"].T).view(b, t, nh, d)
            k = (h @ p[L + "self_attn.k_proj.weight"].T).view(b, t, nkv, d)
            v = (h @ p[L + "self_attn.v_proj.weight"].T).view(b, t, nkv, d)
            q = self._rope(self._norm(q, p[L + "self_attn.q_norm.weight"]).transpose(1, 2),
                           cos, sin)
            k = self._rope(self._norm(k, p[L + "self_attn.k_norm.weight"]).transpose(1, 2),
                           cos, sin)
            v = v.transpose(1, 2)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(b, t, nh * d) @ p[L + "self_attn.o_proj.weight"].T
            h = self._norm(x, p[L + "post_attention_layernorm.weight"])
            gate = F.silu(h @ p[L + "mlp.gate_proj.weight"].T)
            up = h @ p[L + "mlp.up_proj.weight"].T
            x = x + (gate * up) @ p[L + "mlp.down_proj.weight"].T
        return x


def train(cfg: dict[str, Any], init: dict[str, np.ndarray],
          data: list[tuple[list[int], list[bool]]], pad: int,
          progress: Callable[[str], None] | None = None,
          epochs: int = EPOCHS) -> dict[str, np.ndarray]:
    """`init` trained on `data` (see the module docstring); returns the new tensors."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(SEED)
        params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
        model = _Qwen3(cfg, params)
        decay = [v for k, v in params.items() if v.dim() > 1]
        other = [v for k, v in params.items() if v.dim() <= 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                 {"params": other, "weight_decay": 0.0}],
                                lr=LR, betas=(0.9, 0.98), eps=1e-8, foreach=False)
        steps_per_epoch = math.ceil(len(data) / BATCH)
        total = epochs * steps_per_epoch
        gen = torch.Generator().manual_seed(SEED)
        step = 0
        for epoch in range(epochs):
            epoch_loss, epoch_tokens = 0.0, 0
            for batch in _batches(data, gen):
                width = max(len(ids) for ids, _ in batch)
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                at = torch.zeros((len(batch), width), dtype=torch.bool)  # predicts a target
                targets = []
                for r, (seq, mask) in enumerate(batch):
                    ids[r, :len(seq)] = torch.tensor(seq)
                    for c in range(len(seq) - 1):
                        if mask[c + 1]:
                            at[r, c] = True
                            targets.append(seq[c + 1])
                warm = min(1.0, (step + 1) / WARMUP_STEPS)
                cosine = 0.5 * (1 + math.cos(math.pi * step / total))
                for group in opt.param_groups:
                    group["lr"] = LR * warm * (0.05 + 0.95 * cosine)
                logits = model.head(model.hidden(ids)[at])  # the LM head only where it counts
                loss = F.cross_entropy(logits, torch.tensor(targets), reduction="sum")
                n = len(targets)
                opt.zero_grad()
                (loss / n).backward()
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0, foreach=False)
                opt.step()
                epoch_loss += float(loss.detach())
                epoch_tokens += n
                step += 1
            if progress is not None and (epoch + 1) % 4 == 0:
                progress(f"epoch {epoch + 1}/{epochs}: loss {epoch_loss / epoch_tokens:.4f}")
        return {k: v.detach().numpy().copy() for k, v in params.items()}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _batches(data: list[tuple[list[int], list[bool]]],
             gen: Any) -> list[list[tuple[list[int], list[bool]]]]:
    """One epoch's batches: a seeded shuffle, then windows of 8 batches sorted by length
    (little padding) and split into batches of BATCH, in a shuffled order."""
    import torch

    order = torch.randperm(len(data), generator=gen).tolist()
    batches = []
    window = 8 * BATCH
    for w in range(0, len(order), window):
        chunk = sorted(order[w:w + window], key=lambda j: len(data[j][0]))
        batches += [[data[j] for j in chunk[b:b + BATCH]] for b in range(0, len(chunk), BATCH)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


def greedy(cfg: dict[str, Any], tensors: dict[str, np.ndarray], prompt: list[int],
           eos: set[int], max_tokens: int = 64) -> list[int]:
    """Greedy continuation of `prompt` with the torch model (no KV cache; for checks)."""
    import torch

    with torch.no_grad():
        model = _Qwen3(cfg, {k: torch.from_numpy(v) for k, v in tensors.items()})
        ids = list(prompt)
        for _ in range(max_tokens):
            token = int(model.logits(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)
            if token in eos:
                break
        return ids[len(prompt):]
