"""`ninfer-bench accuracy`: how far each weight and KV-cache format drifts from float32.

A format is a weight format (`q8g32`), a KV-cache format (`kv:int8`, float32 weights),
or both (`q4g64+kv:int4`). Every format is compiled for the CPU (one build per format,
cached under the output directory) and run teacher-forced over a fixed text set: the
same token sequence is fed one token at a time, and at every position the format's
next-token distribution is compared with the float32 build's:

- top-1 agreement: the fraction of positions whose argmax is the same;
- mean KL(float32 || format) of the next-token distributions, in nats;
- perplexity of the text under each build, and its change against float32.

Each build runs in its own process (each is a Python extension module of its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.runtime.tolerance import parse_format

TEXT_SEED = 7  # fixed text set: paragraphs of the demo corpus generator with this seed


@dataclass
class FormatAccuracy:
    format: str
    positions: int
    top1_agreement: float
    mean_kl: float
    max_kl: float
    perplexity: float
    perplexity_delta: float  # relative to float32


def text_tokens(checkpoint: Path, tokens: int) -> list[list[int]]:
    """The fixed text set, tokenized with the checkpoint's tokenizer, cut into sequences."""
    from tokenizers import Tokenizer

    from ninfer.demo.tokenizer import corpus

    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    ids: list[int] = []
    for paragraph in corpus(seed=TEXT_SEED, paragraphs=400):
        ids += tok.encode(paragraph).ids
        if len(ids) >= tokens:
            break
    seq = 128
    return [ids[i:i + seq] for i in range(0, min(tokens, len(ids)) - 1, seq)]


def build(checkpoint: Path, fmt: str, out_root: Path, model_id: str) -> Path:
    from ninfer.pipeline import CompileOptions, compile_model

    weights, kv = parse_format(fmt)
    name = f"{model_id}-{fmt.replace(':', '-').replace('+', '-')}"
    out = out_root / name
    compile_model(CompileOptions(model_dir=checkpoint, target="cpu", out_dir=out,
                                 model_id=name, max_context=256, prefill_chunk=16,
                                 max_concurrency=1, weights=weights, kv_dtype=kv))
    return out


def log_probs(build_dir: Path, sequences: list[list[int]], threads: int) -> np.ndarray:
    """Next-token log-probabilities at every position (teacher forcing), in a child
    process: [positions, vocab] float32."""
    out = build_dir / "accuracy-logprobs.npy"
    code = (
        "import sys, json, numpy as np\n"
        "from pathlib import Path\n"
        "from ninfer.runtime.engine import load_engine\n"
        "d, threads, seqs = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])\n"
        "e = load_engine(d, threads)\n"
        "rows = []\n"
        "for s in seqs:\n"
        "    for t in range(len(s) - 1):\n"
        "        x = np.asarray(e.forward([s[t]], t), np.float64)\n"
        "        x = x - x.max()\n"
        "        rows.append((x - np.log(np.exp(x).sum())).astype(np.float32))\n"
        "np.save(d / 'accuracy-logprobs.npy', np.stack(rows))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(build_dir), str(threads),
                    json.dumps(sequences)], check=True)
    return np.load(out)


def compare(fmt: str, ref: np.ndarray, got: np.ndarray, sequences: list[list[int]],
            ref_ppl: float) -> FormatAccuracy:
    p = np.exp(ref.astype(np.float64))
    kl = (p * (ref.astype(np.float64) - got.astype(np.float64))).sum(axis=1)
    targets = np.array([s[t + 1] for s in sequences for t in range(len(s) - 1)])
    nll = -got[np.arange(len(targets)), targets].astype(np.float64)
    ppl = float(np.exp(nll.mean()))
    return FormatAccuracy(fmt, len(targets), float((ref.argmax(1) == got.argmax(1)).mean()),
                          float(kl.mean()), float(kl.max()), ppl, ppl / ref_ppl - 1)


def run_accuracy(checkpoint: Path, formats: list[str], out_root: Path, tokens: int = 512,
                 threads: int = 2, log: Any = lambda s: None) -> list[FormatAccuracy]:
    model_id = "acc-" + checkpoint.resolve().name
    sequences = text_tokens(checkpoint, tokens)
    log(f"text set: {sum(len(s) - 1 for s in sequences)} positions in {len(sequences)} "
        "sequences")
    lps = {}
    for fmt in ["f32", *[f for f in formats if f != "f32"]]:
        log(f"compiling and running {fmt}")
        try:
            built = build(checkpoint, fmt, out_root, model_id)
        except ValueError as e:  # the format does not suit this model's shapes
            if fmt == "f32":
                raise
            log(f"skipping {fmt}: {e}")
            continue
        lps[fmt] = log_probs(built, sequences, threads)
    ref = lps["f32"]
    targets = np.array([s[t + 1] for s in sequences for t in range(len(s) - 1)])
    ref_ppl = float(np.exp(-ref[np.arange(len(targets)), targets].astype(np.float64).mean()))
    return [compare(fmt, ref, lp, sequences, ref_ppl) for fmt, lp in lps.items()]


def format_table(rows: list[FormatAccuracy]) -> list[str]:
    lines = [f"{'format':<14}{'positions':>10}{'top-1 agree':>13}{'mean KL':>11}"
             f"{'max KL':>10}{'ppl':>10}{'ppl delta':>11}"]
    for r in rows:
        lines.append(f"{r.format:<14}{r.positions:>10}{r.top1_agreement:>13.4f}"
                     f"{r.mean_kl:>11.2e}{r.max_kl:>10.2e}{r.perplexity:>10.2f}"
                     f"{r.perplexity_delta:>+11.2%}")
    return lines


def to_json(rows: list[FormatAccuracy]) -> dict[str, Any]:
    return {"formats": [asdict(r) for r in rows]}
