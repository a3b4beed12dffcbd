"""Decode and prefill speed of a compiled model vs. transformers, measured in one run.

    .venv/bin/python benchmarks/bench_decode.py --size small --threads 2
    .venv/bin/python benchmarks/bench_decode.py --size hybrid --threads 2   # Qwen3.5

Builds a random-weight Qwen3 checkpoint of the chosen size with transformers (fixed
seed), compiles it for `cpu`, and times, with the same thread count on both sides:
  - decode: tokens/s of single-token forward passes at context ~128
  - prefill: tokens/s of a 256-token prompt (ninfer in chunks of --chunk)
Prints each number and the ratio ninfer / transformers. Not a test: numbers depend on
the machine; record them in benchmarks/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import os
import time

from ninfer.bench.checkpoints import SIZES, build_checkpoint


def best_rate(fn, tokens: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        rates.append(tokens / (time.perf_counter() - t0))
    return max(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--weights", default="f32",
                    help="ninfer weight format (f32, f16, bf16, q8g32, q4g64, q4g128); "
                         "transformers stays fp32")
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    # numpy's OpenBLAS threads spin after each call and steal cores from ninfer's pool.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    import torch

    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model
    from ninfer.runtime.engine import load_engine

    torch.set_num_threads(args.threads)
    root = DEFAULT_BUILD_DIR / "bench"
    ckpt = root / f"qwen3-{args.size}"
    build_checkpoint(ckpt, args.size)
    suffix = "" if args.weights == "f32" else f"-{args.weights}"
    out = root / f"qwen3-{args.size}-cpu{suffix}"
    report = compile_model(CompileOptions(
        model_dir=ckpt, out_dir=out, model_id=f"qwen3-{args.size}{suffix}", max_context=1024,
        prefill_chunk=args.chunk, weights=args.weights)).report.to_json()
    engine = load_engine(out, threads=args.threads)

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    params = sum(p.numel() for p in hf.parameters())
    prompt = list(range(10, 10 + 256))
    n_dec = args.decode_tokens

    # ninfer
    def ninfer_prefill() -> None:
        engine.forward(prompt, 0)

    def ninfer_decode() -> None:
        for i in range(n_dec):
            engine.forward([7], 128 + i)

    engine.forward(prompt[:128], 0)
    ours_dec = best_rate(ninfer_decode, n_dec, 3)
    ours_pre = best_rate(ninfer_prefill, len(prompt), 3)

    # transformers, same threads, KV cache on
    def hf_prefill() -> None:
        with torch.no_grad():
            hf(torch.tensor([prompt]), use_cache=False)

    with torch.no_grad():
        cache = hf(torch.tensor([prompt[:128]]), use_cache=True).past_key_values

    def hf_decode() -> None:
        nonlocal cache
        with torch.no_grad():
            for _ in range(n_dec):
                cache = hf(torch.tensor([[7]]), past_key_values=cache,
                           use_cache=True).past_key_values

    ref_dec = best_rate(hf_decode, n_dec, 3)
    ref_pre = best_rate(hf_prefill, len(prompt), 3)

    gb = report["plan"]["memory"]["weights_bytes"] / 1e9
    arch = "Qwen3.5 (hybrid)" if args.size == "hybrid" else "Qwen3"
    print(f"model: random {arch} '{args.size}', {params / 1e6:.0f}M params, {args.weights} "
          f"weights {gb:.2f} GB (embedding table included); threads={args.threads}")
    print(f"{'':10}{'ninfer':>12}{'transformers':>14}{'ratio':>8}")
    print(f"{'decode':10}{ours_dec:>10.1f}/s{ref_dec:>12.1f}/s{ours_dec / ref_dec:>8.2f}")
    print(f"{'prefill':10}{ours_pre:>10.1f}/s{ref_pre:>12.1f}/s{ours_pre / ref_pre:>8.2f}")
    from ninfer.roofline import measure

    roof = measure(int(gb * 1e9), args.threads)
    print(roof.describe())
    print(f"ninfer decode streams {ours_dec * gb:.1f} GB/s of weights, "
          f"{ours_dec * gb / roof.best_read_gbps:.0%} of the read bandwidth (embedding table "
          "counted, so a slight overestimate)")


if __name__ == "__main__":
    main()
