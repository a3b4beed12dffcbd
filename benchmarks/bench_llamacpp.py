"""Peer benchmark: ninfer against llama.cpp on the same checkpoint, per weight format.

    bash benchmarks/install_llamacpp.sh      # gguf + llama-cpp-python, built for this host
    .venv/bin/python benchmarks/bench_llamacpp.py --threads 2
    .venv/bin/python benchmarks/bench_llamacpp.py --model qwen35 --threads 2   # the hybrid

Builds once (cached under build/bench/) a ~0.5B-parameter random-weight Qwen3 checkpoint
with transformers (fixed seed, fp16 safetensors, the demo tokenizer padded to the model's
vocab), converts it with ninfer.bench.gguf_export to GGUF F32 / F16 / BF16 / Q8_0 / Q4_0, and times,
each in its own process with the same thread count, the two engines alternating round by
round (--rounds; medians are reported, and each round's ratio):
  - llama.cpp through llama-cpp-python's low-level API, as its own llama-bench drives it:
    `llama_decode` on `llama_batch_get_one` batches, `llama_synchronize`, the memory cleared
    between runs (n_ctx 1024, logits of the last token only). The same loop through
    `Llama.eval` is timed too and printed as its cost per token;
  - ninfer in the matching format (f32, f16, bf16, q8g32, q4g64, and q4g128 beside Q4_0),
    see `ninfer_rates`;
  - decode: tokens/s of single-token steps after a 128-token prefill (context 128..192;
    the best 16-step window, see `_measure`);
  - prefill: tokens/s of one 256-token prompt.
The roofline comes from ninfer.roofline: a multi-threaded C read loop over a buffer of
the model's weight size (same threads, best pass of a plain and of prefetched multi-stream
read patterns, with and without huge pages) and the FMA peak (the widest vectors the host
has), measured before the first round and again after every engine run. Each decode
figure is printed with the fraction of the read bandwidth it reaches: bytes read per token
(the weights, plus what a step reads besides them in both engines alike: the KV cache at
the timed steps' mean context and a hybrid's recurrent state, read and written; see
`state_bytes_per_token`) x tokens/s / bandwidth, against the best probe of the whole run
("of bw") and, as the median over rounds, against the bandwidth of the best window's own
seconds ("loc"): inside each run a short probe (huge pages, every pattern once, over
roofline.probe_bytes(0)) is taken before the first window and after every window, and the
best window is set against the better of the two beside it. This VM's bandwidth moves
between two levels in spells of seconds to minutes (RESULTS, sessions 12-31); probes
before and after a whole run (~10 s) often caught a spell the timed window did not, or
the other way round (fractions of 49-102% in one table, session 31). Those levels are
where the VM puts its two vCPUs (RESULTS session 32: SMT siblings of one core, two cores
of one CCD, two CCDs, told apart by a cache-line round trip between them,
placement_probe.c); with two threads each probe also names the placement right before and
after it, and "pl" sets the best window of a known placement (the probes on both sides of
it agree) against the median probe of that placement in its run; a line per format
after the table gives the same for each placement alone. Each prefill figure
is printed with the fraction of the FMA peak (2 x parameters read x tokens/s / peak).

`--model qwen35`: the ~0.5B Qwen3.5 hybrid of ninfer.bench.checkpoints (18 Gated DeltaNet
and 6 gated-attention layers, fp32 safetensors), converted by llama.cpp's own converter
(ninfer.bench.llamacpp_convert: F32 / F16 / BF16 / Q8_0 directly, Q4_0 requantized from
F16 by llama_model_quantize, every matrix in the type) and timed the same way.

Not a test: numbers depend on the machine; record them in benchmarks/RESULTS.md with the
command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# (llama.cpp GGUF type, ninfer --weights format) compared side by side; q4g128 has no
# llama.cpp type of its own and is set beside Q4_0 (32-weight groups) as q4g64 is
FORMATS = [("F32", "f32"), ("F16", "f16"), ("BF16", "bf16"), ("Q8_0", "q8g32"),
           ("Q4_0", "q4g64"), ("Q4_0", "q4g128")]
# ~0.5B Qwen3: Qwen3-0.6B's shapes with a 32k vocab and an untied head
MODEL: dict[str, Any] = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=32768)
PREFILL_TOKENS = 256
DECODE_CONTEXT = 128
DECODE_WINDOW = 16
N_CTX = 1024
PROMPT = [10 + (i * 37) % 2000 for i in range(PREFILL_TOKENS)]


@dataclasses.dataclass
class Rates:
    decode: float  # tokens/s
    prefill: float  # tokens/s
    bytes_per_token: float  # weight bytes one decode step reads
    note: str = ""
    eval_decode: float = 0.0  # llama.cpp only: the same decode through Llama.eval
    window_gbps: float = 0.0  # read bandwidth probed beside the best decode window (_measure)
    # per known placement of the VM's threads (placement_probe.c: PLACES) seen by both a
    # decode window and a probe: [the best window's tokens/s, the median probe's GB/s]
    placed: dict[str, list[float]] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------ setup


def bench_dir() -> Path:
    from ninfer.paths import DEFAULT_BUILD_DIR

    return DEFAULT_BUILD_DIR / "bench"


def build_checkpoint(directory: Path) -> Path:
    if (directory / "config.json").exists():
        return directory
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ninfer.demo.checkpoint import write_tokenizer_files

    facts = write_tokenizer_files(directory, "qwen", vocab_size=2048)
    config = Qwen3Config(**MODEL, max_position_embeddings=4096, tie_word_embeddings=False,
                         rope_theta=1e6, rms_norm_eps=1e-6, bos_token_id=None,
                         eos_token_id=facts["eos_token_id"])
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.float16).save_pretrained(directory)
    return directory


def param_counts(ckpt: Path) -> tuple[int, int]:
    """(all parameters, parameters a decode step reads: all but the embedding table)."""
    from ninfer.frontend.checkpoint import open_checkpoint

    c = open_checkpoint(ckpt)
    sizes = {n: int(_prod(t.shape)) for n, t in c.tensors.items()}
    total = sum(sizes.values())
    read = total - (0 if c.config.tie_word_embeddings else sizes["model.embed_tokens.weight"])
    return total, read


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def state_bytes_per_token(cfg: dict[str, Any], context: float, kv_bytes: int = 2) -> float:
    """Bytes a decode step moves besides the weights, the same in both engines: the K and V
    of every attention layer up to `context` (f16, both engines' default KV type), and each
    Gated DeltaNet layer's recurrent and conv state (float32 in both), read and written."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["full_attention"] * layers
    attn = sum(t == "full_attention" for t in types)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = attn * 2 * cfg["num_key_value_heads"] * head_dim * context * kv_bytes
    gdn = sum(t == "linear_attention" for t in types)
    if not gdn:
        return kv
    kd, vd = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kh, vh = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    recurrent = vh * kd * vd * 4
    conv = (2 * kh * kd + vh * vd) * (cfg["linear_conv_kernel_dim"] - 1) * 4
    return kv + gdn * 2 * (recurrent + conv)


HYBRID_NAME = "qwen3-hybrid"  # ninfer.bench.checkpoints' "hybrid" size, as bench_decode


def export_all(ckpt: Path, qtypes: list[str], hybrid: bool = False,
               threads: int = 2) -> dict[str, Path]:
    from ninfer.bench import llamacpp_convert
    from ninfer.bench.gguf_export import export_gguf

    def export(path: Path, q: str) -> None:
        if not hybrid:
            export_gguf(ckpt, path, q)
        elif q in llamacpp_convert.OUTTYPES:
            llamacpp_convert.convert(ckpt, path, q)
        else:  # Q4_0: requantized from the F16 conversion
            f16 = ckpt.parent / f"{ckpt.name}-F16.gguf"
            if not f16.exists():
                llamacpp_convert.convert(ckpt, f16, "F16")
            llamacpp_convert.quantize(f16, path, q, threads)

    paths = {}
    for q in qtypes:
        path = ckpt.parent / f"{ckpt.name}-{q}.gguf"
        if not path.exists() or path.stat().st_mtime < (ckpt / "config.json").stat().st_mtime:
            t0 = time.perf_counter()
            export(path, q)
            print(f"exported {path.name} ({path.stat().st_size / 1e9:.2f} GB) in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        paths[q] = path
    return paths


# ------------------------------------------------------------------ timing (worker processes)


# Placements of a 2-core VM's two threads by a cache-line round trip between them, ns
# (bench_placement.py): SMT siblings of one core, two cores of one CCD, two CCDs
PLACES = (("smt", 110.0), ("ccd", 350.0), ("far", float("inf")))
PLACEMENT_SOURCE = Path(__file__).with_name("placement_probe.c")


def placement_binary() -> Path:
    """placement_probe.c compiled for this host (rebuilt when the source changes)."""
    import hashlib
    import shutil

    src = PLACEMENT_SOURCE.read_bytes()
    exe = bench_dir() / f"placement-{hashlib.sha256(src).hexdigest()[:12]}"
    if not exe.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise SystemExit("no C compiler (cc) for placement_probe.c")
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        subprocess.run([cc, "-O2", "-march=native", "-pthread", "-o", str(tmp),
                        str(PLACEMENT_SOURCE)], check=True)
        tmp.rename(exe)
    return exe


def placement(rtt_ns: float) -> str:
    return next(name for name, limit in PLACES if rtt_ns < limit)


def window_probe(threads: int) -> Callable[[], tuple[float, str, str]]:
    """A short read probe for between decode windows: GB/s of the best read pattern
    (ninfer.roofline, huge pages, each pattern once) over roofline.probe_bytes(0) (four
    times the last-level cache, at least 256 MB; ~0.5 s here), with the placement of the
    threads (PLACES) right before and after it ("" where there are not two CPUs to ask)."""
    from ninfer.roofline import probe_bytes, read_patterns

    nbytes = probe_bytes(0)
    exe = placement_binary() if threads == 2 and (os.cpu_count() or 1) >= 2 else None

    def where() -> str:
        if exe is None:
            return ""
        out = subprocess.run([str(exe), "rtt"], capture_output=True, text=True, check=True)
        return placement(float(out.stdout))

    def probe() -> tuple[float, str, str]:
        time.sleep(0.02)  # the engines' idle threads spin a little after a step; let them park
        before = where()
        gbps = max(read_patterns(nbytes, threads, 1, huge=True).values())
        return gbps, before, where()

    return probe


def _measure(forward: Callable[[list[int], int], object], reset: Callable[[], None],
             n_dec: int, repeats: int, prefill: bool = True,
             probe: Callable[[], float | tuple[float, str, str]] | None = None
             ) -> tuple[float, float, float, dict[str, list[float]]]:
    """(decode tok/s, prefill tok/s, the decode's local read GB/s, {placement: [decode
    tok/s, GB/s]}), best of `repeats`; forward(ids, pos).

    Decode is timed in windows of DECODE_WINDOW steps and the best window counts: on a
    machine shared with other work, one descheduled thread stalls every step it takes
    part in (llama.cpp's OpenMP barriers most), and a shorter window is likelier to fall
    between such bursts. On a quiet machine the windows agree with the whole run. With a
    `probe`, it runs before each repeat's first window and after every window (outside the
    timing), and the best window's local bandwidth is the better of the two beside it.
    Where the probe also names the placement of the threads before and after it (gbps,
    before, after), a window between two probes that name the same placement is in it,
    as is a probe whose two ends agree; the last item gives, for each placement that both
    a window and a probe of the run saw, the best such window and the median such probe.
    """
    reset()
    forward(PROMPT[:32], 0)  # warm up
    dec = pre = dec_bw = 0.0
    windows: list[tuple[float, str]] = []
    probes: dict[str, list[float]] = {}

    def take() -> tuple[float, str, str]:
        got = probe() if probe else 0.0
        gbps, first, last = got if isinstance(got, tuple) else (got, "", "")
        if first and first == last:
            probes.setdefault(first, []).append(gbps)
        return gbps, first, last

    for _ in range(repeats):
        reset()
        forward(PROMPT[:DECODE_CONTEXT], 0)
        before = take()
        for w in range(0, n_dec, DECODE_WINDOW):
            steps = min(DECODE_WINDOW, n_dec - w)
            t0 = time.perf_counter()
            for i in range(w, w + steps):
                forward([7], DECODE_CONTEXT + i)
            rate = steps / (time.perf_counter() - t0)
            after = take()
            if rate > dec:
                dec, dec_bw = rate, max(before[0], after[0])
            if before[2] and before[2] == after[1]:
                windows.append((rate, before[2]))
            before = after
    placed: dict[str, list[float]] = {}
    for rate, where in windows:
        if where in probes and rate > placed.get(where, [0.0])[0]:
            placed[where] = [rate, statistics.median(probes[where])]
    for _ in range(repeats if prefill else 0):
        reset()
        t0 = time.perf_counter()
        forward(PROMPT, 0)
        pre = max(pre, len(PROMPT) / (time.perf_counter() - t0))
    return dec, pre, dec_bw, placed


def llamacpp_rates(gguf_path: Path, threads: int, n_dec: int, repeats: int) -> Rates:
    import ctypes

    import llama_cpp as lc
    from llama_cpp import Llama

    from ninfer.bench.gguf_export import weight_bytes_per_token

    llm = Llama(model_path=str(gguf_path), n_ctx=N_CTX, n_batch=PREFILL_TOKENS,
                n_ubatch=PREFILL_TOKENS, n_threads=threads, n_threads_batch=threads,
                logits_all=False, verbose=False)
    ctx = llm._ctx.ctx
    memory = lc.llama_get_memory(ctx)
    buffers = {n: (lc.llama_token * n)() for n in (1, DECODE_CONTEXT, 32, PREFILL_TOKENS)}

    def decode(ids: list[int], pos: int) -> None:  # llama-bench's loop
        buf = buffers[len(ids)]
        ctypes.memmove(buf, (lc.llama_token * len(ids))(*ids), ctypes.sizeof(buf))
        if lc.llama_decode(ctx, lc.llama_batch_get_one(buf, len(ids))) != 0:
            raise RuntimeError(f"llama_decode failed at position {pos}")
        lc.llama_synchronize(ctx)

    def clear() -> None:
        lc.llama_memory_clear(memory, True)

    dec, pre, dec_bw, placed = _measure(decode, clear, n_dec, repeats,
                                        probe=window_probe(threads))

    def through_eval(ids: list[int], pos: int) -> None:
        assert pos == llm.n_tokens
        llm.eval(ids)

    def reset() -> None:
        llm.reset()
        clear()

    eval_dec, _, _, _ = _measure(through_eval, reset, n_dec, repeats, prefill=False)
    return Rates(dec, pre, weight_bytes_per_token(gguf_path), eval_decode=eval_dec,
                 window_gbps=dec_bw, placed=placed)


def ninfer_rates(fmt: str, ckpt: Path, threads: int, n_dec: int, repeats: int) -> Rates:
    """ninfer's numbers for weight format `fmt` (f32, f16, bf16, q8g32, q4g64, q4g128), with
    the default f16 KV cache, as llama.cpp's default. Times the compiled model's Python engine (same
    runtime and kernels as the server). Weight bytes per token: the memory plan's weight
    bytes less the embedding table (of which a step reads one row).
    """
    from ninfer.pipeline import CompileOptions, compile_model
    from ninfer.runtime.engine import load_engine

    out = bench_dir() / f"{ckpt.name}-cpu-{fmt}"
    result = compile_model(CompileOptions(model_dir=ckpt, out_dir=out,
                                          model_id=f"{ckpt.name}-{fmt}", max_context=N_CTX,
                                          prefill_chunk=PREFILL_TOKENS, weights=fmt,
                                          kv_dtype="f16"))
    engine = load_engine(out, threads=threads)
    # engine.forward(ids, pos) overwrites the KV cache from pos on: nothing to reset
    dec, pre, dec_bw, placed = _measure(engine.forward, lambda: None, n_dec, repeats,
                                        probe=window_probe(threads))
    return Rates(dec, pre, decode_weight_bytes(result.report.plan.to_json(), ckpt),
                 window_gbps=dec_bw, placed=placed)


def decode_weight_bytes(plan: dict[str, Any], ckpt: Path) -> float:
    """Weight bytes a decode step of a ninfer build reads: its memory plan's (Plan.to_json)
    less an untied embedding table, of which a step reads one row."""
    cfg = json.loads((ckpt / "config.json").read_text())
    embed = 0.0
    if not cfg.get("tie_word_embeddings"):
        embed = cfg["vocab_size"] * cfg["hidden_size"] * _bytes_per_weight(
            plan["weights"].get("embed", "f32"))
    return float(plan["memory"]["weights_bytes"]) - embed


def _bytes_per_weight(fmt: str) -> float:
    plain = {"f32": 4.0, "float32": 4.0, "f16": 2.0, "bf16": 2.0}
    if fmt in plain:
        return plain[fmt]
    from ninfer.quantize.weight_formats import bytes_per_weight  # the quantized formats' layouts

    return float(bytes_per_weight(fmt))


def _worker(args: argparse.Namespace) -> None:
    rates: Rates
    if args.worker == "llamacpp":
        rates = llamacpp_rates(Path(args.target), args.threads, args.decode_tokens, args.repeats)
    else:
        ckpt = bench_dir() / args.model_name
        rates = ninfer_rates(args.target, ckpt, args.threads, args.decode_tokens, args.repeats)
    print("RESULT " + json.dumps(dataclasses.asdict(rates)))


def run_worker(kind: str, target: str, args: argparse.Namespace) -> Rates:
    cmd = [sys.executable, __file__, "--worker", kind, "--target", target,
           "--threads", str(args.threads), "--decode-tokens", str(args.decode_tokens),
           "--repeats", str(args.repeats), "--model-name", args.model_name]
    env = {**os.environ, "TVM_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[len("RESULT "):])
            return Rates(**data)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    why = f"rc {proc.returncode}"
    if proc.returncode < 0:
        import signal

        why = f"killed by {signal.Signals(-proc.returncode).name}"
        if proc.returncode == -signal.SIGILL and kind == "llamacpp":
            why += (": llama.cpp was built for instructions this host does not run (AMX that"
                    " the hypervisor does not enable?); rebuild it with"
                    " `bash benchmarks/install_llamacpp.sh`")
    print(f"  {kind} {target}: failed ({why}): " + " | ".join(tail), flush=True)
    return Rates(0.0, 0.0, 0.0, note="failed")


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating llama.cpp / ninfer rounds per format (medians reported)")
    ap.add_argument("--formats", default=",".join(q for q, _ in FORMATS),
                    help="comma-separated GGUF types or ninfer formats to run "
                         "(F32,F16,BF16,Q8_0,Q4_0; q4g64 or q4g128 picks one Q4_0 pairing)")
    ap.add_argument("--no-ninfer", action="store_true", help="time llama.cpp only")
    ap.add_argument("--model", choices=["qwen3", "qwen35"], default="qwen3",
                    help="qwen3: the dense ~0.5B Qwen3; qwen35: the ~0.5B Qwen3.5 hybrid")
    ap.add_argument("--model-name", default="qwen3-0.5b", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["llamacpp", "ninfer"], help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return

    from ninfer.roofline import best_of, measure

    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.1f} before starting: other work on this machine "
              "skews every number below", flush=True)
    picked = args.formats.split(",")
    wanted = [f for f in FORMATS if f[0] in picked or f[1] in picked]
    known = {name for pair in FORMATS for name in pair}
    if unknown := [f for f in picked if f not in known]:
        ap.error(f"--formats: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    hybrid = args.model == "qwen35"
    if hybrid:
        from ninfer.bench.checkpoints import build_checkpoint as build_bench_checkpoint

        args.model_name = HYBRID_NAME
        ckpt = bench_dir() / HYBRID_NAME
        build_bench_checkpoint(ckpt, "hybrid")
    else:
        ckpt = build_checkpoint(bench_dir() / args.model_name)
    total, read = param_counts(ckpt)
    paths = export_all(ckpt, sorted({q for q, _ in wanted}), hybrid, args.threads)
    from ninfer.bench.gguf_export import weight_bytes_per_token

    roof_bytes = int(max(weight_bytes_per_token(paths[q]) for q, _ in wanted))
    # The VM's bandwidth moves by a third over minutes: the roofline is measured between
    # every two engine runs and the best of them all counts for "of bw" ("loc" comes from
    # the probes beside each run's best decode window, _measure).
    roofs = [measure(roof_bytes, args.threads)]
    print(roofs[-1].describe(), flush=True)

    def then_probe(run: Callable[[], Rates]) -> Rates:
        rates = run()
        roofs.append(measure(roof_bytes, args.threads))
        return rates

    rows = []
    for qtype, fmt in wanted:
        refs: list[Rates] = []
        ours: list[Rates] = []
        for _ in range(args.rounds):
            refs.append(then_probe(lambda: run_worker("llamacpp", str(paths[qtype]), args)))
            if not args.no_ninfer:
                ours.append(then_probe(lambda: run_worker("ninfer", fmt, args)))
        rows.append((qtype, fmt, refs, ours))
        print(f"  measured {qtype} / {fmt}; {roofs[-1].describe()}", flush=True)
    roof = best_of(roofs)

    m = json.loads((ckpt / "config.json").read_text())
    kind = ("Qwen3.5 hybrid (Gated DeltaNet x "
            f"{sum(t == 'linear_attention' for t in m['layer_types'])} + gated attention x "
            f"{sum(t == 'full_attention' for t in m['layer_types'])})" if hybrid else "Qwen3")
    print(f"model: random {kind}, {total / 1e6:.0f}M params ({m['num_hidden_layers']} layers, "
          f"hidden {m['hidden_size']}, heads {m['num_attention_heads']}/"
          f"{m['num_key_value_heads']} x {m['head_dim']}, ffn {m['intermediate_size']}, vocab "
          f"{m['vocab_size']}, untied; {read / 1e6:.0f}M read per token); threads="
          f"{args.threads}")
    print(f"decode: {args.decode_tokens} steps from context {DECODE_CONTEXT}, best "
          f"{DECODE_WINDOW}-step window of {args.repeats} runs; prefill: {PREFILL_TOKENS} "
          f"tokens in one batch, best of {args.repeats}; {args.rounds} alternating rounds, "
          f"medians; load average at the end {os.getloadavg()[0]:.1f}")
    print(f"best of {len(roofs)} rooflines, one per round: {roof.describe()}")
    # The bandwidth moves between two levels in time (RESULTS, session 12): the median says
    # which level the run mostly saw; the fractions below are of the best.
    print(f"median of the {len(roofs)} rooflines' read: "
          f"{statistics.median(r.best_read_gbps for r in roofs):.1f} GB/s")
    bw, peak = roof.best_read_gbps, roof.fma_gflops
    # the mean context of the timed decode steps
    state = state_bytes_per_token(m, DECODE_CONTEXT + args.decode_tokens / 2)
    print(f"bytes a decode step reads besides the weights (KV cache at context "
          f"{DECODE_CONTEXT + args.decode_tokens // 2}, recurrent state read and written): "
          f"{state / 1e6:.1f} MB, counted in GB/tok for both engines")
    print(f"{'llama.cpp':<10}{'GB/tok':>7}{'decode':>9}{'of bw':>6}{'loc':>5}{'pl':>5}"
          f"{'prefill':>9}{'of pk':>6}   {'ninfer':<7}{'GB/tok':>7}{'decode':>9}{'of bw':>6}"
          f"{'loc':>5}{'pl':>5}{'prefill':>9}{'of pk':>6}   {'dec x':>6}{'pre x':>6}  "
          "per-round dec x")

    def cells(r: Rates | None, runs: list[Rates]) -> str:
        if r is None:
            return f"{'(not run)':>53}"
        if r.note:
            return f"{'(' + r.note + ')':>53}"
        frac = (r.bytes_per_token + state) * r.decode / 1e9 / bw
        local = _local_fraction(runs, state)
        placed = _placed_fraction(runs, state)
        pl = f"{placed:>5.0%}" if placed else f"{'-':>5}"  # no window of a known placement
        flops = 2.0 * read * r.prefill / 1e9 / peak
        return (f"{(r.bytes_per_token + state) / 1e9:>7.3f}{r.decode:>7.1f}/s{frac:>6.0%}"
                f"{local:>5.0%}{pl}{r.prefill:>7.0f}/s{flops:>6.0%}")

    for qtype, fmt, refs, ours in rows:
        ref, mine = _median(refs), _median(ours)
        ratio = per_round = ""
        if ref and mine and not ref.note and not mine.note:
            ratio = f"{mine.decode / ref.decode:>6.2f}{mine.prefill / ref.prefill:>6.2f}"
            per_round = " ".join(f"{o.decode / r.decode:.2f}" for r, o in zip(refs, ours,
                                                                                  strict=True)
                                 if r.decode and o.decode)
        print(f"{qtype:<10}{cells(ref, refs)}   {fmt:<7}{cells(mine, ours)}"
              f"   {ratio}  {per_round}")
    for qtype, _, refs, *_ in rows:
        ref = _median(refs)
        if ref and ref.decode and ref.eval_decode:
            cost = 1e6 / ref.eval_decode - 1e6 / ref.decode
            print(f"llama.cpp {qtype} through Llama.eval: {ref.eval_decode:.1f} tok/s "
                  f"({cost:+.0f} us per token against llama_decode)")
    for qtype, fmt, refs, ours in rows:
        print(f"pl by placement, {qtype} / {fmt} (rounds with a window there): " + "; ".join(
            f"{name} " + " / ".join(_placed_cell(runs, state, name) for runs in (refs, ours))
            for name, _ in PLACES))
    print("ratios: ninfer / llama.cpp; of bw: bytes read per token x tokens/s / the best "
          "read bandwidth of the run; loc: the median over rounds of the same against the "
          "better of the two short probes taken right before and after the best decode "
          "window; pl: the median over rounds of the best decode window of a known placement "
          "of the two threads (SMT siblings, one CCD, two CCDs: a cache-line round trip "
          "before and after it) against the median probe of that placement in its run; of "
          "pk: 2 x parameters read x tokens/s / FMA peak")


def _local_fraction(runs: list[Rates], state: float) -> float:
    """The median over runs of (GB/s read: weights and `state` bytes a token) / (the read
    bandwidth probed beside the best decode window), failed runs left out."""
    fracs = [(r.bytes_per_token + state) * r.decode / 1e9 / r.window_gbps
             for r in runs if not r.note and r.window_gbps > 0]
    return statistics.median(fracs) if fracs else 0.0


def _placed_fraction(runs: list[Rates], state: float, where: str | None = None) -> float:
    """The median over runs of the best decode window of a known placement (GB/s read:
    weights and `state` bytes a token) / the median read probe of that placement in the
    run (_measure), runs without one left out. `where`: that placement's best window; None:
    the best window of any placement."""
    fracs = []
    for r in runs:
        got = r.placed.get(where) if where else max(r.placed.values(), default=None)
        if not r.note and got:
            fracs.append((r.bytes_per_token + state) * got[0] / 1e9 / got[1])
    return statistics.median(fracs) if fracs else 0.0


def _placed_cell(runs: list[Rates], state: float, where: str) -> str:
    n = sum(1 for r in runs if not r.note and where in r.placed)
    return f"{_placed_fraction(runs, state, where):.0%} ({n})" if n else "-"


def _median(runs: list[Rates]) -> Rates | None:
    """The run of median decode rate (its prefill alongside), failed runs left out."""
    ok = sorted((r for r in runs if not r.note), key=lambda r: r.decode)
    if not ok:
        return runs[0] if runs else None
    mid = ok[len(ok) // 2]
    prefill = sorted(r.prefill for r in ok)[len(ok) // 2]
    return dataclasses.replace(mid, prefill=prefill)


if __name__ == "__main__":
    main()
