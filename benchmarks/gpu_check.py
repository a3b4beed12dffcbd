"""On a GPU machine: run CUDA ninfer-server builds prepared by scripts/gpu_check.sh and
compare their greedy tokens with transformers; print decode speed.

Needs only python3 with torch, transformers and httpx (as on the lent H200 image); it
imports ninfer.runtime from this checkout, which does not need TVM.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compiler"))

PROMPTS = ["The quick brown fox", "def fibonacci(n):", "東京は日本の首都です。", "a"]


def hf_greedy(ckpt: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    out = []
    for ids in prompts:
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               pad_token_id=0)
        out.append(g[0, len(ids):].tolist())
    return out


def main(root: Path) -> int:
    from transformers import PreTrainedTokenizerFast

    from ninfer.runtime import Server

    ckpt = root / "checkpoint"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(ckpt / "tokenizer.json"))
    eos = set(json.loads((ckpt / "ninfer-test.json").read_text())["eos_token_ids"])
    prompts = [tok.encode(p) for p in PROMPTS]
    expected = [[t for t in seq if t not in eos][:32] for seq in hf_greedy(ckpt, prompts, 32)]
    failures = 0
    for build in sorted(p for p in root.iterdir() if (p / "ninfer-server").exists()):
        with Server(build) as srv:
            for ids, want in zip(prompts, expected, strict=True):
                r = srv.client.post("/v1/completions", json={
                    "prompt": ids, "max_tokens": 32, "temperature": 0,
                    "return_token_ids": True}).json()
                if "choices" not in r:
                    print(f"{build.name}: ERROR {r}")
                    print("\n".join(srv.output))
                    failures += 1
                    break
                got = r["choices"][0]["token_ids"]
                ok = got == want[: len(got)] and (len(got) == len(want) or
                                                   r["choices"][0]["finish_reason"] == "stop")
                failures += not ok
                print(f"{build.name}: {'OK ' if ok else 'BAD'} prompt {len(ids)} tokens; "
                      f"got {got[:8]}... want {want[:8]}...")
            t0 = time.perf_counter()
            r = srv.client.post("/v1/completions", json={
                "prompt": prompts[0], "max_tokens": 200, "temperature": 0,
                "ignore_eos": True}).json()
            t = r["timings"]
            print(f"{build.name}: decode {t['predicted_per_second']:.1f} tok/s, prefill "
                  f"{t['prompt_per_second']:.1f} tok/s ({time.perf_counter() - t0:.2f} s wall)")
            print("\n".join(srv.output))
    print(f"{failures} mismatches")
    for build in sorted(p for p in root.iterdir() if (p / "ninfer-server").exists()):
        failures += sanitize(build, prompts[1], expected[1])
    return 1 if failures else 0


def sanitize(build: Path, ids: list[int], want: list[int]) -> int:
    """One prefill + decode under compute-sanitizer memcheck (where the machine allows it)."""
    import shutil

    from ninfer.runtime import Server, ServerError

    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        print("compute-sanitizer: not found")
        return 0
    srv = Server(build, startup_timeout=240)
    srv.args = [tool, "--tool", "memcheck", "--error-exitcode", "9", *srv.args]
    try:
        with srv:
            r = srv.client.post("/v1/completions", json={
                "prompt": ids, "max_tokens": 8, "temperature": 0,
                "return_token_ids": True}, timeout=240).json()
            got = r["choices"][0]["token_ids"]
            print(f"{build.name} under memcheck: got {got} want {want[:8]}")
    except ServerError as e:
        print(f"{build.name} under memcheck: server did not start: {e}")
        return 0
    report = [line for line in srv.output if line.startswith("=====")]
    print("\n".join(report)[-4000:])
    bad = [line for line in report if re.match(r"=+\s+(Invalid|Program hit|Uninit|Race)", line)]
    print(f"{build.name} memcheck: {len(bad)} error lines")
    return int(bool(bad))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
