"""Prefix caching on a multi-turn agent workload (issue 18): time to first token and the
prompt tokens each turn computes, with and without caching, dense and hybrid.

    .venv/bin/python benchmarks/bench_prefix.py --threads 2
    bash benchmarks/install_llamacpp.sh   # first, for the llama.cpp column

The workload is an agent conversation: a system prompt of ~4K tokens (tool definitions as
JSON schemas and instructions, tokenized by the checkpoint's own tokenizer), then `--turns`
turns, each a new user message (a tool result of ~48 tokens) after the history: the last
prompt and the model's own reply to it (`--reply` greedy tokens, the end-of-sequence token
ignored). So each turn's prompt extends the last one, as an agent harness sends it.

Models: ninfer.bench.checkpoints' "medium" Qwen3 (16 layers, hidden 1024) and "hybrid"
~0.5B Qwen3.5 (18 Gated DeltaNet and 6 gated-attention layers), random weights, their
config's max_position_embeddings raised to 8192 in a copy that links the weights (rotary
positions only; a random model has no trained range), compiled for the cpu target with f16
weights and a context of 6144. Each is served twice, one conversation each: with prefix
caching (the default) and with --no-prefix-caching. TTFT is measured by the client (request
sent -> first streamed token); "computed" is prompt_tokens - cached_tokens from the usage.

llama.cpp (llama-cpp-python, when installed): the same conversation driven through
`Llama.create_completion` on token ids, streamed, which keeps the context and evaluates only
what follows the longest common prefix with the last call (llama-server's cache_prompt); the
cold side calls `reset()` first. The GGUF is F16 (ninfer.bench.gguf_export for the dense
model, llama.cpp's own converter for the hybrid).

Not a test: record the output in benchmarks/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 6144
POSITIONS = 8192


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--models", default="medium,hybrid")
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--message", type=int, default=48, help="tokens of each user message")
    ap.add_argument("--reply", type=int, default=32, help="tokens of each reply")
    ap.add_argument("--no-llamacpp", action="store_true")
    return ap.parse_args()


def checkpoint(size: str) -> Path:
    """The bench checkpoint `size` (built once) in a copy whose config allows POSITIONS."""
    from ninfer.bench.checkpoints import build_checkpoint
    from ninfer.paths import DEFAULT_BUILD_DIR

    root = DEFAULT_BUILD_DIR / "bench"
    base = root / f"qwen3-{size}"
    build_checkpoint(base, size)
    long = root / f"qwen3-{size}-pos{POSITIONS}"
    long.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.name == "config.json":
            cfg = json.loads(f.read_text())
            target = cfg.get("text_config", cfg)
            target["max_position_embeddings"] = POSITIONS
            (long / f.name).write_text(json.dumps(cfg, indent=2))
        elif not (long / f.name).exists():
            (long / f.name).symlink_to(f.resolve())
    return long


def compiled(size: str, ckpt: Path) -> Path:
    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model

    out = DEFAULT_BUILD_DIR / "bench" / f"prefix-{size}-cpu"
    compile_model(CompileOptions(model_dir=ckpt, out_dir=out, model_id=f"qwen3-{size}",
                                 max_context=CONTEXT, weights="f16", python_module=False))
    return out


TOOLS = ["read_file", "write_file", "list_directory", "search_code", "run_tests",
         "run_command", "git_diff", "git_commit", "open_issue", "web_search", "fetch_url",
         "apply_patch", "format_code", "lint", "build_project", "query_database"]


def system_tokens(ckpt: Path, n: int) -> list[int]:
    """An agent's system prompt (instructions and tool schemas) cut to n tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    parts = ["You are a coding agent working in a repository. Use the tools below; answer "
             "with a tool call as JSON or with a final message. Think step by step."]
    i = 0
    ids: list[int] = []
    while len(ids) < n:
        name = TOOLS[i % len(TOOLS)]
        parts.append(json.dumps({"type": "function", "function": {
            "name": f"{name}_{i // len(TOOLS)}",
            "description": f"Calls {name.replace('_', ' ')} with the given arguments and "
                           "returns its output as text; fails with a message when the "
                           "arguments are invalid or the operation is not permitted.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "a path in the repository"},
                "query": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer", "description": "at most this many results"}},
                "required": ["path"]}}}))
        ids = tok.encode("\n".join(parts)).ids
        i += 1
    return ids[:n]


def messages(seed: int, turns: int, length: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, min(vocab, 2000), length).tolist() for _ in range(turns)]


def ninfer_conversation(out: Path, system: list[int], msgs: list[list[int]], reply: int,
                        threads: int, caching: bool) -> list[dict[str, float]]:
    from ninfer.runtime import Server

    args = () if caching else ("--no-prefix-caching",)
    rows = []
    with Server(out, threads=threads, extra_args=args) as srv:
        prompt = list(system)
        for msg in msgs:
            prompt += msg
            body = {"prompt": prompt, "max_tokens": reply, "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            ttft = 0.0
            ids: list[int] = []
            usage: dict[str, Any] = {}
            with srv.client.stream("POST", "/v1/completions", json=body, timeout=3600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for c in chunk.get("choices", []):
                        if c.get("token_ids"):
                            if not ids:
                                ttft = time.perf_counter() - t0
                            ids += c["token_ids"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            rows.append({"prompt": len(prompt), "ttft": ttft,
                         "computed": usage["prompt_tokens"] - cached})
            prompt += ids
    return rows


def llamacpp_conversation(gguf: Path, system: list[int], msgs: list[list[int]], reply: int,
                          threads: int, caching: bool, eos: list[int]) -> list[dict[str, float]]:
    """Through `Llama.generate`, which evaluates only what follows the longest common
    prefix of the prompt and the context it holds (llama-server's cache_prompt)."""
    from llama_cpp import Llama, LogitsProcessorList

    llm = Llama(model_path=str(gguf), n_ctx=CONTEXT, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)

    def no_eos(_ids: Any, scores: Any) -> Any:  # the reply's length is fixed, as ignore_eos
        scores[eos] = -np.inf
        return scores

    rows = []
    prompt = list(system)
    for msg in msgs:
        prompt += msg
        if not caching:
            llm.reset()
        held = llm._input_ids.tolist()
        common = 0
        for a, b in zip(held, prompt, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)  # generate() recomputes the last token
        t0 = time.perf_counter()
        ttft = 0.0
        ids: list[int] = []
        for token in llm.generate(prompt, temp=0.0,
                                  logits_processor=LogitsProcessorList([no_eos])):
            if not ids:
                ttft = time.perf_counter() - t0
            ids.append(int(token))
            if len(ids) == reply:
                break
        rows.append({"prompt": len(prompt), "ttft": ttft, "computed": len(prompt) - common})
        prompt += ids
    return rows


def gguf_for(size: str, ckpt: Path) -> Path:
    from ninfer.bench import llamacpp_convert
    from ninfer.bench.gguf_export import export_gguf

    path = ckpt.parent / f"{ckpt.name}-F16.gguf"
    if not path.exists():
        if size == "hybrid":
            llamacpp_convert.convert(ckpt, path, "F16")
        else:
            export_gguf(ckpt, path, "F16")
    return path


def table(name: str, sides: dict[str, dict[bool, list[dict[str, float]]]]) -> str:
    head = f"{name}: turn  prompt"
    for side in sides:
        head += (f" | {side} TTFT cold / cached (computed cold / cached) "
                 "cached/cold")
    lines = [head]
    n = len(next(iter(sides.values()))[True])
    for t in range(n):
        line = f"{t + 1:>{len(name) + 6}}  {int(next(iter(sides.values()))[True][t]['prompt']):>6}"
        for runs in sides.values():
            cold, warm = runs[False][t], runs[True][t]
            line += (f" | {cold['ttft'] * 1000:8.0f} ms / {warm['ttft'] * 1000:7.0f} ms "
                     f"({int(cold['computed']):>5} / {int(warm['computed']):>5}) "
                     f"{warm['ttft'] / cold['ttft']:6.1%}")
        lines.append(line)
    for side, runs in sides.items():
        ratios = [runs[True][t]["ttft"] / runs[False][t]["ttft"] for t in range(1, n)]
        lines.append(f"  {side}: turns 2-{n} cached/cold TTFT median "
                     f"{statistics.median(ratios):.1%}, max {max(ratios):.1%}")
    return "\n".join(lines)


def main() -> None:
    args = _parse()
    llamacpp = not args.no_llamacpp
    if llamacpp:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama-cpp-python is not installed (bash benchmarks/install_llamacpp.sh): "
                  "ninfer only")
            llamacpp = False
    for size in args.models.split(","):
        ckpt = checkpoint(size)
        out = compiled(size, ckpt)
        cfg = json.loads((ckpt / "config.json").read_text())
        vocab = cfg.get("text_config", cfg)["vocab_size"]
        eos = cfg.get("text_config", cfg).get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos]
        system = system_tokens(ckpt, args.system_tokens)
        msgs = messages(7, args.turns, args.message, vocab)
        sides: dict[str, dict[bool, list[dict[str, float]]]] = {"ninfer": {}}
        for caching in (False, True):
            sides["ninfer"][caching] = ninfer_conversation(out, system, msgs, args.reply,
                                                           args.threads, caching)
        if llamacpp:
            gguf = gguf_for(size, ckpt)
            sides["llama.cpp"] = {}
            for caching in (False, True):
                sides["llama.cpp"][caching] = llamacpp_conversation(
                    gguf, system, msgs, args.reply, args.threads, caching, eos)
        print(table(f"qwen3-{size}", sides), flush=True)


if __name__ == "__main__":
    main()
