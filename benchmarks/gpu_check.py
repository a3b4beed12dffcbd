"""The GPU check, on a lent GPU machine: CUDA ninfer-server builds prepared by
scripts/gpu_check.sh, first through `ninfer-check` (ninfer.runtime.check), then against
transformers token for token, with CUDA graphs on and off, one request at a
time and several at once; memcheck; decode speed of a Qwen3-0.6B-shaped model with
transformers on the same GPU as the peer. The hybrid builds (Gated DeltaNet, dense and
MoE) against transformers' own recurrent cache.

Needs only python3 with torch, transformers, httpx, numpy, safetensors, xxhash and jinja2
(as on the lent H200 image); it imports ninfer from this checkout, without TVM
(PYTHONPATH=compiler: ninfer is not installed there).

    PYTHONPATH=compiler python3 benchmarks/gpu_check.py run ROOT        # there
    PYTHONPATH=compiler python3 benchmarks/gpu_check.py bench ROOT      # the speed alone
    PYTHONPATH=compiler python3 benchmarks/gpu_check.py check ROOT [PATTERN]  # ninfer-check
    PYTHONPATH=compiler python3 benchmarks/gpu_check.py hybrid ROOT PATTERN   # some hybrids
    PYTHONPATH=compiler python3 benchmarks/gpu_check.py profile ROOT OUT      # ncu, per kernel
    PYTHONPATH=compiler python3 benchmarks/gpu_check.py bench-ckpt DIR  # the bench checkpoint
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STARTED = time.perf_counter()
# The run's budget in seconds (a lent machine's lease is short): memcheck, which runs last,
# is skipped for the builds it has no time left for.
DEADLINE = float(os.environ.get("GPU_CHECK_SECONDS", "inf"))
PROMPTS = ["The quick brown fox", "def fibonacci(n):", "東京は日本の首都です。", "a"]
# Qwen3-0.6B's shape (tied embeddings), random weights; vocab cut to 32k to keep the
# checkpoint small to make on the lent machine.
BENCH_CONFIG = dict(vocab_size=32768, hidden_size=1024, intermediate_size=3072,
                    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, tie_word_embeddings=True)
BENCH_LIMITS = dict(max_context=1024, prefill_chunk=256, max_concurrency=8)


def bench_checkpoint(out: Path, tokenizer_from: Path) -> Path:
    """Random-weight Qwen3-0.6B-shaped checkpoint (seed 0, bf16) with the tiny tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**BENCH_CONFIG, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "ninfer-test")):
            shutil.copy(f, out / f.name)
    return out


def hf_greedy(model, prompts: list[list[int]], n: int, device: str) -> list[list[int]]:
    import torch

    out = []
    for ids in prompts:
        with torch.no_grad():
            g = model.generate(torch.tensor([ids], device=device), max_new_tokens=n,
                               do_sample=False, pad_token_id=0,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                                                         device=device))
        out.append(g[0, len(ids):].tolist())
    return out


def complete(client, ids: list[int], n: int, **extra) -> dict:
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": n,
                                             "temperature": 0, "return_token_ids": True,
                                             **extra}, timeout=600)
    return r.json()


def check_tokens(tag: str, r: dict, want: list[int]) -> bool:
    """The response's token ids are exactly `want`: an early stop is a mismatch (the
    reference stops where it stops too)."""
    if "choices" not in r:
        print(f"{tag}: ERROR {r}")
        return False
    got = r["choices"][0]["token_ids"]
    ok = got == want
    print(f"{tag}: {'OK ' if ok else 'BAD'} got {got[:8]}... want {want[:8]}..."
          + ("" if ok or len(got) == len(want) else f" ({len(got)} tokens, want {len(want)})"))
    return ok


def eager(build: Path) -> bool:
    """A sparse MoE build: its steps read the routing on the host and never run as graphs."""
    report = json.loads((build / "compile_report.json").read_text())
    return any(k["family"].startswith("moe") for k in report["kernels"])


def graphs_verdict(metrics_text: str, graphs: bool) -> tuple[bool, str]:
    """The server's /metrics after its requests: with graphs on, graphs were captured and
    replayed (a counter of 0 means every step ran eagerly); with --no-cuda-graph, none."""
    from ninfer.runtime.client import BenchError, parse_metrics

    try:
        m = parse_metrics(metrics_text)
        captured = m.value("ninfer:cuda_graphs_captured_total")
        replays = m.value("ninfer:cuda_graph_replays_total")
    except BenchError as e:
        return False, f"no CUDA graph counters: {e}"
    ok = (captured > 0 and replays > 0) if graphs else (captured == 0 and replays == 0)
    return ok, f"{captured:.0f} graphs captured, {replays:.0f} replays"


def overlap_verdict(metrics_text: str) -> tuple[bool, str]:
    """Some step ran two or more sequences at once (the concurrent requests overlapped)."""
    from ninfer.runtime.client import BenchError, parse_metrics

    try:
        m = parse_metrics(metrics_text)
        steps = m.value("ninfer:iteration_sequences_count")
        single = m.value("ninfer:iteration_sequences_bucket", le="1.0")
    except BenchError as e:
        return False, f"no ninfer:iteration_sequences: {e}"
    return steps - single > 0, f"{steps - single:.0f} of {steps:.0f} steps ran 2+ sequences"


def sanitizer_verdict(output: list[str]) -> tuple[bool, str]:
    """compute-sanitizer's output read whole: clean only with its closing `ERROR SUMMARY: 0
    errors` and no error record; no summary (it never finished) is a failure."""
    report = [line for line in output if line.startswith("=====")]
    summary = [m for line in report
               if (m := re.search(r"ERROR SUMMARY: (\d+) errors?", line))]
    records = [line for line in report
               if re.match(r"=+\s+(Invalid|Program hit|Uninitialized|Race|Error|Leaked)", line)]
    if not summary:
        return False, "no ERROR SUMMARY: compute-sanitizer did not finish"
    errors = int(summary[-1].group(1))
    if errors or records:
        return False, f"{errors} errors, {len(records)} error records"
    return True, "ERROR SUMMARY: 0 errors"


def parity(build: Path, prompts: list[list[int]], expected: list[list[int]],
           **request: object) -> int:
    """Greedy tokens = transformers: one at a time, 2 and 4 at once; graphs on and off."""
    from ninfer.runtime import Server

    failures = 0
    for extra in ((), ("--no-cuda-graph",)):
        mode = "graphs off" if extra else "graphs on"
        with Server(build, extra_args=extra) as srv:
            for ids, want in zip(prompts, expected, strict=True):
                failures += not check_tokens(f"{build.name} {mode} batch 1",
                                             complete(srv.client, ids, 32, **request), want)
            for width in (2, 4):
                with ThreadPoolExecutor(width) as pool:
                    rs = list(pool.map(lambda ids: complete(srv.client, ids, 32, **request),
                                       prompts[:width]))
                for r, want in zip(rs, expected, strict=False):
                    failures += not check_tokens(f"{build.name} {mode} batch {width}", r, want)
            text = srv.client.get("/metrics").text
            for what, (ok, detail) in (("graphs", graphs_verdict(text, not extra
                                                                 and not eager(build))),
                                       ("overlap", overlap_verdict(text))):
                print(f"{build.name} {mode} {what}: {'OK ' if ok else 'BAD'} {detail}")
                failures += not ok
            r = complete(srv.client, prompts[0], 200, ignore_eos=True)
            t = r["timings"]
            print(f"{build.name} {mode}: decode {t['predicted_per_second']:.1f} tok/s, "
                  f"prefill {t['prompt_per_second']:.1f} tok/s")
            print("\n".join(line for line in srv.output if "graph" in line)[-2000:])
    return failures


def server_greedy(build: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of another ninfer build (here: the CPU build of the same formats)."""
    from ninfer.runtime import Server

    with Server(build) as srv:
        return [complete(srv.client, ids, 32)["choices"][0]["token_ids"] for ids in prompts]


def sanitize(build: Path, ids: list[int], want: list[int]) -> int:
    """Prefill + decode, two requests at once, under compute-sanitizer memcheck."""
    from ninfer.runtime import Server, ServerError

    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        print("compute-sanitizer: not found")
        return 0
    left = DEADLINE - (time.perf_counter() - STARTED) - 60
    srv = Server(build, startup_timeout=min(300.0, max(30.0, left)))
    srv.args = [tool, "--tool", "memcheck", *srv.args]
    failures = 0
    try:
        with srv:
            with ThreadPoolExecutor(2) as pool:
                rs = list(pool.map(lambda _: complete(srv.client, ids, 8), range(2)))
            for r in rs:
                failures += not check_tokens(f"{build.name} under memcheck", r, want[:8])
            # The summary is printed as the server exits: give the tool time to write it.
            srv.stop(timeout=120)
    except ServerError as e:
        print(f"{build.name} under memcheck: server did not start: {e}")
        return 1
    print("\n".join(line for line in srv.output if line.startswith("====="))[-3000:])
    ok, verdict = sanitizer_verdict(srv.output)
    print(f"{build.name} memcheck: {verdict}")
    return failures + (not ok)


def bench_builds(root: Path) -> list[tuple[Path, str, str]]:
    """(build, target, weights) of each bench-TARGET[-FMT] build prepare made: the target as
    its compile report names it, the weight format from the name (none: as stored)."""
    out = []
    for build in sorted(root.glob("bench-*")):
        if not (build / "ninfer-server").exists():
            continue
        target = json.loads((build / "compile_report.json").read_text())["target"]["name"]
        fmt = build.name.removeprefix(f"bench-{target}").lstrip("-") or "auto"
        out.append((build, target, fmt))
    return out


def bench(root: Path) -> None:
    """Decode speed of the 0.6B-shaped model, each bench-TARGET[-FMT] build (its weights as
    stored, bf16, or as FMT): ninfer with graphs on (1..8 streams) and off, the bytes a
    decode step reads (the artifact: matmul weights and the tied embedding/LM head) over
    its time; transformers on the same GPU (fp32 and bf16, generate) as the peer."""
    import torch
    from transformers import AutoModelForCausalLM

    from ninfer.pipeline import CompileOptions, write_model_artifact
    from ninfer.runtime import Server

    t0 = time.perf_counter()
    ckpt = bench_checkpoint(Path("/tmp/ninfer-bench-ckpt"), root / "checkpoint")
    # The config as written where the server was compiled: another transformers writes other
    # fields, which the build digest covers (the server would refuse the artifact).
    shutil.copy(root / "bench-config.json", ckpt / "config.json")
    print(f"bench checkpoint: {time.perf_counter() - t0:.1f} s")
    prompt = list(range(100, 164))
    n = 128
    mine: list[int] = []
    for build, target, fmt in bench_builds(root):
        write_model_artifact(CompileOptions(model_dir=ckpt, target=target, weights=fmt,
                                            model_id="qwen3-0.6b-shape", **BENCH_LIMITS),
                             build / "model.ninfer")
        size = (build / "model.ninfer").stat().st_size
        tag = f"{build.name} ({size / 1e9:.2f} GB)"
        with Server(build) as srv:
            complete(srv.client, prompt, 8)  # warm-up: graphs for the shapes used below
            r = complete(srv.client, prompt, n, ignore_eos=True)
            if fmt == "auto":
                mine = r["choices"][0]["token_ids"]
            t = r["timings"]
            tps = t["predicted_per_second"]
            print(f"{tag} graphs on: decode {tps:.1f} tok/s = {size * tps / 1e9:.0f} GB/s of "
                  f"weights, prefill {t['prompt_per_second']:.1f} tok/s (64-token prompt)")
            for c in (2, 4, 8):
                complete(srv.client, prompt, 8)
                t1 = time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    rs = list(pool.map(lambda _: complete(srv.client, prompt, n,
                                                          ignore_eos=True), range(c)))
                wall = time.perf_counter() - t1
                toks = sum(len(x["choices"][0]["token_ids"]) for x in rs)
                print(f"{tag} {c} streams: {toks / wall:.1f} tok/s aggregate ({wall:.2f} s)")
            print("\n".join(line for line in srv.output if "graph" in line)[-600:])
        with Server(build, extra_args=("--no-cuda-graph",)) as srv:
            complete(srv.client, prompt, 8)
            t = complete(srv.client, prompt, n, ignore_eos=True)["timings"]
            tps = t["predicted_per_second"]
            print(f"{tag} graphs off: decode {tps:.1f} tok/s = {size * tps / 1e9:.0f} GB/s")
        (build / "model.ninfer").unlink()
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).cuda().eval()
        hf_greedy(model, [prompt], 8, "cuda")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        ref = hf_greedy(model, [prompt], n, "cuda")[0]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t1
        print(f"transformers {dtype} (same GPU, generate): decode {len(ref) / dt:.1f} tok/s "
              "incl. prefill")
        if dtype == torch.float32 and mine:
            same = next((i for i, (a, b) in enumerate(zip(mine, ref, strict=False))
                         if a != b), min(len(mine), len(ref)))
            print(f"greedy agreement with transformers fp32: first {same} of {n} tokens "
                  "identical")
        del model


def profile(root: Path, out: Path) -> None:
    """Each kernel's time in a decode of the 0.6B-shaped model (graphs off: ncu times every
    launch), by kernel: what a decode step spends where. The raw CSV goes to `out`."""
    import csv
    import glob
    from collections import defaultdict

    from ninfer.pipeline import CompileOptions, write_model_artifact
    from ninfer.runtime import Server

    ncu = shutil.which("ncu") or next(iter(sorted(glob.glob(
        "/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda/bin/ncu"))), None)
    if ncu is None:
        print("ncu: not found")
        return
    ckpt = bench_checkpoint(Path("/tmp/ninfer-bench-ckpt"), root / "checkpoint")
    shutil.copy(root / "bench-config.json", ckpt / "config.json")
    prompt = list(range(100, 108))
    n = 24
    for build, target, fmt in bench_builds(root):
        if fmt == "f16":
            continue
        write_model_artifact(CompileOptions(model_dir=ckpt, target=target, weights=fmt,
                                            model_id="qwen3-0.6b-shape", **BENCH_LIMITS),
                             build / "model.ninfer")
        log = out / f"ncu-{build.name}.csv"
        srv = Server(build, extra_args=("--no-cuda-graph",), startup_timeout=200)
        srv.args = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
                    "--csv", "--print-units", "base", "--log-file", str(log), *srv.args]
        t0 = time.perf_counter()
        with srv:
            r = complete(srv.client, prompt, n, ignore_eos=True)
            # ncu writes its table as the server exits: give it the time (Server.stop's
            # default 10 s ended it by SIGKILL with an empty log on the H200, 2026-12-04).
            srv.stop(timeout=150)
        print(f"{build.name} under ncu: {len(r['choices'][0]['token_ids'])} tokens, "
              f"{time.perf_counter() - t0:.0f} s")
        rows = [row for row in csv.DictReader(
            line for line in log.read_text().splitlines() if line.startswith('"'))
            if row.get("Metric Name") == "gpu__time_duration.sum"]
        by: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for row in rows:
            name = row["Kernel Name"].split("(")[0][:60]
            by[(name, row["Grid Size"], row["Block Size"])].append(
                float(row["Metric Value"].replace(",", "")) / 1e3)
        total = sum(sum(v) for v in by.values())
        print(f"{build.name}: {len(rows)} kernels, {total / 1e3:.2f} ms in all "
              f"({total / 1e3 / (n + 1):.3f} ms per step over {n + 1} steps)")
        for (name, grid, block), v in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:30]:
            print(f"  {sum(v) / 1e3:8.2f} ms {len(v):6d}x {sum(v) / len(v):8.1f} us  "
                  f"{name} grid {grid} block {block}")
        (build / "model.ninfer").unlink()


# Outputs held to five tokens: they repeat their own n-grams, so drafts are both accepted
# and rejected (tests/test_speculative.py's NARROW).
NARROW = {"logit_bias": {str(t): 60 for t in range(40, 45)}}


def spec_identity(build: Path, prompts: list[list[int]]) -> int:
    """A speculation build: greedy tokens with n-gram drafts = without (--spec none), for
    outputs held to five tokens (many drafts, some rejected: KV rows and, in a hybrid, the
    recurrent state rolled back), 1 and 4 at once, graphs on and off."""
    from ninfer.runtime import Server

    def run(srv, width: int) -> list[dict]:
        with ThreadPoolExecutor(width) as pool:
            return list(pool.map(lambda ids: complete(srv.client, ids, 32, ignore_eos=True,
                                                      **NARROW), prompts))

    with Server(build, extra_args=("--spec", "none")) as srv:
        want = [r["choices"][0]["token_ids"] for r in run(srv, 1)]
    failures = 0
    for extra in ((), ("--no-cuda-graph",)):
        mode = "graphs off" if extra else "graphs on"
        with Server(build, extra_args=extra) as srv:
            for width in (1, 4):
                rs = run(srv, width)
                for r, w in zip(rs, want, strict=True):
                    failures += not check_tokens(f"{build.name} drafts {mode} batch {width}",
                                                 r, w)
                drafted = sum(r.get("timings", {}).get("draft_n", 0) for r in rs)
                accepted = sum(r.get("timings", {}).get("draft_accepted_n", 0) for r in rs)
                print(f"{build.name} {mode} batch {width}: {accepted} of {drafted} drafts "
                      "accepted")
    return failures


def hybrid_parity(root: Path, pattern: str = "hybrid-*") -> int:
    """The hybrid builds (hybrid-*, their checkpoint the one artifact-options.json names):
    greedy tokens = transformers fp32 for prompts up to 5 prefill chunks, 1, 2 and 4 at
    once, graphs on and off (a padded graph row must not touch a live sequence's recurrent
    state)."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from ninfer.bench.hf_reference import greedy_cached

    failures = 0
    rng = np.random.default_rng(21)
    prompts = [rng.integers(0, 2000, n).tolist() for n in (5, 23, 40, 70)]
    for build in sorted(p for p in root.glob(pattern) if (p / "model.ninfer").exists()):
        recorded = json.loads((build / "artifact-options.json").read_text())
        hf = AutoModelForCausalLM.from_pretrained(root / recorded["model_dir"],
                                                  dtype="float32").eval()
        want = [greedy_cached(hf, ids, 32) for ids in prompts]
        failures += parity(build, prompts, want, ignore_eos=True)
        if build.name.endswith("-spec"):
            failures += spec_identity(build, prompts)
    print(f"hybrids: {failures} mismatches")
    return failures


def restore_artifacts(root: Path) -> None:
    """The artifacts prepare left out (artifact-options.json beside the server): written
    here from the copied checkpoints with the recorded options (no TVM, no compiler), as
    the server was compiled."""
    from ninfer.pipeline import CompileOptions, write_model_artifact

    for recorded in sorted(root.glob("*/artifact-options.json")):
        build = recorded.parent
        if (build / "model.ninfer").exists():
            continue
        t0 = time.perf_counter()
        opts = json.loads(recorded.read_text())
        opts["model_dir"] = root / opts["model_dir"]
        opts["weight_overrides"] = tuple(tuple(o) for o in opts["weight_overrides"])
        write_model_artifact(CompileOptions(**opts), build / "model.ninfer")
        print(f"{build.name}: artifact written in {time.perf_counter() - t0:.1f} s")


def ninfer_checks(root: Path, pattern: str = "*") -> int:
    """`ninfer-check` (ninfer.runtime.check) on every GPU build under `root` matching
    `pattern` against its checkpoint: transformers on this GPU, the bound its formats
    promise, 1..max concurrency, graphs off, drafts off. The exact-token comparisons below
    (transformers with the build's dequantized weights, the CPU build of the same formats)
    are stricter than its bounds and stay."""
    from ninfer.runtime.check import check

    failures = 0
    for build in sorted(root.glob(pattern)):
        recorded = build / "artifact-options.json"
        if not (build / "model.ninfer").exists() or not recorded.exists() or "-cpu-" in build.name:
            continue
        ckpt = root / json.loads(recorded.read_text())["model_dir"]
        t0 = time.perf_counter()
        report = check(build, ckpt, tokens=32)
        for row in report.rows:
            print(f"ninfer-check {build.name} {row.check}: {'pass' if row.ok else 'FAIL'} "
                  f"{row.detail}")
        if report.divergence:
            d = report.divergence
            print(f"  first divergence ({d.check}): prompt {d.prompt}, position {d.position}: "
                  f"{d.reason}; server top {d.got_top}; reference top {d.want_top}")
        print(f"ninfer-check {build.name}: {'passed' if report.ok else 'FAILED'} in "
              f"{time.perf_counter() - t0:.0f} s")
        failures += not report.ok
    return failures


def run(root: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    restore_artifacts(root)
    ckpt = root / "checkpoint"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(ckpt / "tokenizer.json"))
    eos = set(json.loads((ckpt / "ninfer-test.json").read_text())["eos_token_ids"])
    prompts = [tok.encode(p) for p in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype="float32").eval()
    expected = [[t for t in seq if t not in eos][:32] for seq in hf_greedy(hf, prompts, 32,
                                                                          "cpu")]
    # Builds with 16-bit or quantized matmul weights (name suffix -bf16, -q8g32) compute in
    # f32 with exactly the stored weights: the reference is transformers with those weights
    # (embeddings and norms stay f32; activations are not rounded on CUDA).
    from ninfer.quantize import weight_formats as quant

    def reference_for(fmt: str) -> list[list[int]]:
        m = copy.deepcopy(hf)
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):  # a new Parameter also unties lm_head
                w = mod.weight.detach().numpy()
                stored = quant.dequantize(quant.pack(w, fmt), fmt, w.shape[1])
                mod.weight = torch.nn.Parameter(torch.from_numpy(stored.astype("float32")))
        return [[t for t in seq if t not in eos][:32] for seq in hf_greedy(m, prompts, 32, "cpu")]

    failures = ninfer_checks(root)
    builds = sorted(p for p in root.iterdir() if (p / "model.ninfer").exists()
                    and p.name.startswith("qwen3-tiny") and "-cpu-" not in p.name)
    wants: dict[Path, list[list[int]]] = {}
    for build in builds:
        fmt = build.name.rsplit("-", 1)[-1]
        if "-kvf16" in build.name:
            # An f16 KV cache rounds keys and values, which transformers does not: the
            # reference is the CPU build of the same formats (the same rounding).
            cpu = root / re.sub(r"^qwen3-tiny-[^-]+", "qwen3-tiny-cpu", build.name)
            wants[build] = server_greedy(cpu, prompts)
        else:
            wants[build] = reference_for(fmt) if fmt in ("bf16", "q8g32") else expected
        failures += parity(build, prompts, wants[build])
        if build.name.endswith("-spec"):
            failures += spec_identity(build, prompts)
    print(f"{failures} mismatches")
    failures += hybrid_parity(root)
    if bench_builds(root):
        bench(root)
    # memcheck last (a server under it starts and runs tens of times slower): while the
    # lease's time allows (GPU_CHECK_SECONDS, from the start of this run), the plain and
    # the speculation builds first.
    order = sorted(builds, key=lambda b: (not b.name.endswith(("-coop", "-spec")), b.name))
    for build in order:
        if time.perf_counter() - STARTED > DEADLINE - 90:
            print(f"memcheck: {build.name} skipped (the run's {DEADLINE:.0f} s are nearly up)")
            continue
        failures += sanitize(build, prompts[1], wants[build][1])
    print(f"gpu check: {failures} failures in {time.perf_counter() - STARTED:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1] == "profile":
        profile(Path(sys.argv[2]), Path(sys.argv[3]))
        sys.exit(0)
    if sys.argv[1] == "check":  # check ROOT [PATTERN]: ninfer-check alone
        restore_artifacts(Path(sys.argv[2]))
        sys.exit(1 if ninfer_checks(Path(sys.argv[2]), *sys.argv[3:4]) else 0)
    if sys.argv[1] == "hybrid":  # hybrid ROOT PATTERN: those hybrid builds alone
        restore_artifacts(Path(sys.argv[2]))
        sys.exit(1 if hybrid_parity(Path(sys.argv[2]), sys.argv[3]) else 0)
    if sys.argv[1] == "bench":
        bench(Path(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1] == "bench-ckpt":
        bench_checkpoint(Path(sys.argv[2]), Path(sys.argv[3]))
        sys.exit(0)
    sys.exit(run(Path(sys.argv[2])))
