"""Speculative decoding on copy-heavy work: n-gram drafts against plain decoding, and
llama.cpp's prompt lookup on the same prompts.

    .venv/bin/python benchmarks/bench_spec.py --threads 2 --rounds 3

The model: the embedded demo's architecture (ninfer.demo: a 1M-parameter Qwen3 with its
tokenizer and chat template) trained here (ninfer.demo.train, torch, one CPU thread,
--epochs; cached under build/bench/spec-copy) on chat turns of three copy-heavy kinds, as
an editor or a summariser sends them: repeat a given text, summarise it (its first
sentences), rename an identifier in given code. The texts are the demo tokenizer's
generated prose and code (ninfer.demo.tokenizer.corpus), so the words carry no meaning
the model could have memorised: it copies only if it learned to look back at the prompt.

It is compiled once with `--spec ngram --max-draft-tokens K`; the same server runs with
`--spec none` and with n-gram drafts, alternating round by round, over held-out prompts of
the three kinds (another seed), greedy, one request at a time. Decode rate = completion
tokens / decode time from the server's own timings (first token to last, prefill apart).
Printed per kind and overall: both rates and their ratio, tokens per verify step,
acceptance per draft position, and how many answers are exactly right (n-gram drafts
only help a model that copies). llama.cpp (llama-cpp-python) decodes the same prompt
texts from an F32 GGUF of the same weights with and without its
LlamaPromptLookupDecoding (num_pred_tokens K, max_ngram_size --ngram-max), timed from the
first streamed token to the last. Only llama.cpp's own ratio (lookup / plain) means
anything: its figures go through llama-cpp-python's Python-level generate loop, which on
a model this small costs more than the model; the two engines' absolute rates are not
compared.

`--inflate-ffn N` serves the trained model with every MLP widened to N columns whose
output weights are ~1e-6 (inflate_ffn): its tokens stay the trained model's while a decode
step reads the weights of a model ~N/384 times larger, so decode is bound by memory
bandwidth, as a real model's is, rather than by the per-step overhead of a 1M-parameter
model; speculation pays where one weight read serves several tokens.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import random
import re
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("repeat", "summarise", "rename")
TRAIN_SEED, TEST_SEED = 11, 12345


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts per kind")
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument("--examples", type=int, default=1500, help="training conversations")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--inflate-ffn", type=int, default=0, metavar="N",
                   help="widen every MLP to N columns whose output weights are ~1e-6 (the "
                        "trained model's function, read at a real model's bandwidth)")
    return p.parse_args()


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?;:])\s+", text.strip()) if s.strip()]


def _task(kind: str, text: str, rng: random.Random) -> tuple[str, str] | None:
    """(user message, expected answer) of one kind over one generated text."""
    if kind == "repeat":
        return f"Repeat this text exactly.\n\n{text.strip()}", text.strip()
    if kind == "summarise":
        s = _sentences(text)
        if len(s) < 3:
            return None
        return f"Summarise this text.\n\n{text.strip()}", " ".join(s[:2])
    m = re.search(r"def \w+\((\w+):|const int \*(\w+)", text)
    if not m:
        return None
    old = m.group(1) or m.group(2)
    new = rng.choice(["items", "values", "xs", "batch", "rows", "data", "seq", "buf"])
    if new == old:
        return None
    return (f"Rename {old} to {new} in this code.\n\n{text.strip()}",
            re.sub(rf"\b{re.escape(old)}\b", new, text.strip()))


def tasks(seed: int, per_kind: int) -> list[tuple[str, str, str]]:
    """(kind, user message, expected answer), per_kind of each kind."""
    from ninfer.demo.tokenizer import corpus

    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    count = dict.fromkeys(KINDS, 0)
    for text in corpus(seed=seed, paragraphs=per_kind * 40):
        if len(text) > 420 or len(text) < 60:
            continue
        code = text.startswith(("def ", "static "))
        for kind in (("rename", "repeat") if code else ("repeat", "summarise")):
            if count[kind] >= per_kind:
                continue
            t = _task(kind, text, rng)
            if t:
                out.append((kind, *t))
                count[kind] += 1
        if all(c >= per_kind for c in count.values()):
            break
    return out


def build_model(directory: Path, examples: int, epochs: int) -> Path:
    """The copy model's checkpoint (cached: a directory with its stamp is reused)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    from ninfer.demo import chat_templates, train
    from ninfer.demo import tokenizer as demo_tokenizer
    from ninfer.demo.checkpoint import DEMO_CONFIG, random_tensors, write_tokenizer_files

    source = "".join(inspect.getsource(f) for f in (tasks, _task, _sentences, train,
                                                      demo_tokenizer))
    stamp = {"examples": examples, "epochs": epochs, "seed": TRAIN_SEED,
             "source": hashlib.sha256(source.encode()).hexdigest()}
    tmp = unless_cached(directory, stamp)
    if tmp is None:
        return directory
    facts = write_tokenizer_files(tmp, "qwen")
    vocab = (facts["vocab_size"] + 63) // 64 * 64
    cfg = {**DEMO_CONFIG, "vocab_size": vocab, "bos_token_id": facts["bos_token_id"],
           "eos_token_id": facts["eos_token_id"]}
    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    eos, pad = tok.token_to_id(chat_templates.QWEN_EOS), tok.token_to_id("<|endoftext|>")
    convs = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
             for _, q, a in tasks(TRAIN_SEED, examples // len(KINDS))]
    data = train.examples(convs, chat_templates.DEMO_TRAIN_TEMPLATE,
                          lambda text: tok.encode(text).ids, eos)
    t0 = time.time()
    tensors = train.train(cfg, random_tensors(cfg, 0), data, pad,
                          lambda line: print(f"  train: {line}", flush=True), epochs=epochs)
    print(f"trained on {len(data)} conversations, {epochs} epochs, in {time.time() - t0:.0f} s")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": facts["eos_token_id"]}, indent=2))
    return seal(tmp, directory, stamp)


def unless_cached(directory: Path, stamp: dict[str, Any]) -> Path | None:
    """None when `directory` holds what `stamp` describes; else an empty directory beside
    it to build into, which seal() then puts in its place."""
    if (directory / "stamp.json").exists() and json.loads(
            (directory / "stamp.json").read_text()) == stamp:
        return None
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def seal(tmp: Path, directory: Path, stamp: dict[str, Any]) -> Path:
    (tmp / "stamp.json").write_text(json.dumps(stamp))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def inflate_ffn(trained: Path, directory: Path, width: int) -> Path:
    """`trained` with every MLP widened to `width` columns: the new gate/up rows are random
    (the scale of the trained ones), the new down_proj columns ~1e-6 of that, so each adds
    ~1e-5 to the residual and the model's greedy tokens stay the trained model's, while a
    decode step reads `width / intermediate_size` times the MLP bytes: the bytes per token of
    a bandwidth-bound model (as a real one is) around the behaviour of this one (cached)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((trained / "config.json").read_text())
    stamp = {"trained": json.loads((trained / "stamp.json").read_text()), "width": width,
             "source": hashlib.sha256(inspect.getsource(inflate_ffn).encode()).hexdigest()}
    if (directory / "stamp.json").exists() and json.loads(
            (directory / "stamp.json").read_text()) == stamp:
        return directory
    inter = cfg["intermediate_size"]
    if width <= inter:
        raise SystemExit(f"--inflate-ffn {width}: not wider than the model's {inter}")
    rng = np.random.default_rng(7)
    tensors = load_file(str(trained / "model.safetensors"))
    for name in list(tensors):
        w = tensors[name]
        extra = width - inter
        if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            new = rng.standard_normal((extra, w.shape[1])).astype(w.dtype) * w.std()
            tensors[name] = np.concatenate([w, new], axis=0)
        elif name.endswith("mlp.down_proj.weight"):
            new = rng.standard_normal((w.shape[0], extra)).astype(w.dtype) * w.std() * 1e-6
            tensors[name] = np.concatenate([w, new], axis=1)
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(trained, directory)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({**cfg, "intermediate_size": width},
                                                      indent=2))
    (directory / "stamp.json").write_text(json.dumps(stamp))
    return directory


def _prompt_text(user: str) -> str:
    from ninfer.demo import chat_templates, train

    return train.render(chat_templates.DEMO_TEMPLATE, [{"role": "user", "content": user}],
                        add_generation_prompt=True)


def ninfer_round(out_dir: Path, spec: str, prompts: list[str], threads: int,
                 max_tokens: int) -> tuple[list[dict[str, Any]], Any]:
    """The responses, one per prompt, and the server's metrics after them."""
    from ninfer.runtime import Server
    from ninfer.runtime.client import parse_metrics

    with Server(out_dir, threads=threads, extra_args=("--spec", spec)) as srv:
        model = srv.client.get("/v1/models").json()["data"][0]["id"]
        res = []
        for p in prompts:
            r = srv.client.post("/v1/completions", json={
                "model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0},
                timeout=600)
            r.raise_for_status()
            res.append(r.json())
        return res, parse_metrics(srv.client.get("/metrics").text)


def llamacpp_round(gguf: Path, prompts: list[str], threads: int, max_tokens: int,
                   lookup: tuple[int, int] | None) -> list[tuple[str, int, float]]:
    """(text, tokens, decode seconds first->last token) per prompt."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = (LlamaPromptLookupDecoding(max_ngram_size=lookup[1], num_pred_tokens=lookup[0])
             if lookup else None)
    llm = Llama(model_path=str(gguf), n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                draft_model=draft, verbose=False)
    out = []
    for p in prompts:
        first = last = 0.0
        text, n = "", 0
        for chunk in llm.create_completion(p, max_tokens=max_tokens, temperature=0.0,
                                           stream=True):
            now = time.perf_counter()
            if n == 0:
                first = now
            last = now
            text += chunk["choices"][0]["text"]
            n += 1
        out.append((text, n, last - first))
    return out


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


class Tally:
    """Decode rates of each side over the rounds, overall and per kind, and exact answers."""

    def __init__(self, held: list[tuple[str, str, str]], sides: Sequence[str]) -> None:
        self.held, self.sides = held, list(sides)
        self.rates: dict[str, list[float]] = {s: [] for s in sides}
        self.kind_rates: dict[tuple[str, str], list[float]] = {}
        self.exact: dict[str, int] = {}

    def add(self, side: str, items: list[tuple[str, int, float]]) -> None:
        """One round of `side`: (text, tokens, decode seconds) per held-out prompt."""
        held = self.held
        self.rates[side].append(_rate(sum(n for _, n, _ in items), sum(t for _, _, t in items)))
        for kind in KINDS:
            sel = [i for i, (k, _, _) in enumerate(held) if k == kind]
            self.kind_rates.setdefault((side, kind), []).append(_rate(
                sum(items[i][1] for i in sel), sum(items[i][2] for i in sel)))
        self.exact[side] = sum(items[i][0].strip() == held[i][2] for i in range(len(held)))

    def round_line(self, rnd: int) -> str:
        return (f"round {rnd + 1}: " + ", ".join(f"{s} {self.rates[s][-1]:.1f}"
                                                  for s in self.sides) + " tok/s")

    def median(self, side: str) -> float:
        return statistics.median(self.rates[side])

    def table(self, args: argparse.Namespace) -> str:
        held, w = self.held, max(len(s) for s in self.sides) + 2
        lines = [f"\n{len(held)} held-out prompts ({args.prompts} per kind), greedy, "
                 f"{args.threads} threads, medians of {args.rounds} rounds, decode tok/s:",
                 f"{'':{w}}" + "".join(f"{k:>12}" for k in (*KINDS, "all")) + "   exact answers"]
        for s in self.sides:
            cells = [statistics.median(self.kind_rates[(s, k)]) for k in KINDS]
            lines.append(f"{s:{w}}" + "".join(f"{c:12.1f}" for c in cells)
                         + f"{self.median(s):12.1f}   {self.exact[s]}/{len(held)}")
        return "\n".join(lines)


def response_items(res: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(text, completion tokens, decode seconds) of each server response."""
    return [(r["choices"][0]["text"], r["usage"]["completion_tokens"],
             r["timings"]["predicted_ms"] / 1000) for r in res]


def main() -> None:
    args = _parse()
    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model

    base = DEFAULT_BUILD_DIR / "bench"
    ckpt = build_model(base / "spec-copy", args.examples, args.epochs)
    name = "spec-copy"
    if args.inflate_ffn:
        name = f"spec-copy-ffn{args.inflate_ffn}"
        ckpt = inflate_ffn(ckpt, base / name, args.inflate_ffn)
    out = base / f"{name}-cpu"
    compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=name,
                                 max_context=1024, prefill_chunk=256, max_concurrency=1,
                                 spec="ngram", max_draft_tokens=args.draft_tokens,
                                 kv_dtype="f16", python_module=False))
    held = tasks(TEST_SEED, args.prompts)
    prompts = [_prompt_text(q) for _, q, _ in held]
    gguf = None
    if not args.no_llamacpp:
        from ninfer.bench.gguf_export import export_gguf

        gguf = export_gguf(ckpt, base / f"{name}-F32.gguf", "F32")
    sides = ["plain", "ngram"] + (["llama.cpp", "llama.cpp lookup"] if gguf else [])
    tally = Tally(held, sides)
    accept_line = ""
    for rnd in range(args.rounds):
        for side in sides:
            if side in ("plain", "ngram"):
                res, metrics = ninfer_round(out, "none" if side == "plain" else "ngram",
                                            prompts, args.threads, args.max_tokens)
                items = response_items(res)
                if side == "ngram":
                    t = [r["timings"] for r in res]
                    d, a = sum(x["draft_n"] for x in t), sum(x["draft_accepted_n"] for x in t)
                    pos = [metrics.value(
                        "ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                        position=str(i)) for i in range(args.draft_tokens)]
                    n_tok = sum(r["usage"]["completion_tokens"] for r in res)
                    accept_line = (f"{n_tok} tokens, drafts {d}, accepted {a} "
                                   f"({100 * a / max(d, 1):.0f}%), per position " + " ".join(
                                       f"{v / max(pos[0] if pos else 1, 1):.2f}" for v in pos))
            else:
                assert gguf is not None
                items = llamacpp_round(gguf, prompts, args.threads, args.max_tokens,
                                       (args.draft_tokens, args.ngram_max)
                                       if side.endswith("lookup") else None)
            tally.add(side, items)
        print(tally.round_line(rnd), flush=True)
    print(tally.table(args))
    plain, spec = tally.median("plain"), tally.median("ngram")
    print(f"ninfer n-gram / plain: {spec / plain:.2f}x; {accept_line}")
    if gguf:
        lp, ll = tally.median("llama.cpp"), tally.median("llama.cpp lookup")
        print(f"llama.cpp lookup / plain: {ll / lp:.2f}x (through llama-cpp-python's Python "
              "loop: only this ratio compares)")


if __name__ == "__main__":
    main()
