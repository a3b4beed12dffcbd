"""Where ninfer-check's bounds come from (ninfer.runtime.tolerance): the mean KL of every
weight and KV format's build against transformers, on the test models.

    .venv/bin/python benchmarks/bench_check_bounds.py

Each format of the table is compiled for the CPU (max concurrency 2) from the tiny Qwen3
(random), the same after tests/conftest's short training run (peaked predictions, as a
real model's), and the tiny Qwen3.5 hybrid (random), and checked with ninfer-check's
reference row (7 prompts x 24 greedy tokens; the KL over the server's top 5 and the rest)
under no bound. Printed: the mean KL and top-1 agreement per model, the bound the format
promises, and the bound over the largest mean KL (the margin; under 1 is a bound that a
correct build breaks). Builds under build/bench/check-bounds. Not a test: record the table
in benchmarks/RESULTS.md with the command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

FORMATS = [("f32", "f32"), ("f16", "f32"), ("bf16", "f32"), ("q8g32", "f32"),
           ("q4g64", "f32"), ("f32", "f16"), ("f32", "bf16"), ("f32", "fp8"),
           ("f32", "int8"), ("f32", "int4")]


def main() -> None:
    import conftest
    from conftest import MAX_CONTEXT, PREFILL_CHUNK, TEST_MODELS
    from ninfer.paths import DEFAULT_BUILD_DIR
    from ninfer.pipeline import CompileOptions, compile_model
    from ninfer.runtime.check import check
    from ninfer.runtime.tolerance import Bound, bound

    random_qwen3, _ = conftest.checkpoint("qwen3-tiny")
    trained = TEST_MODELS / "qwen3-trained-checkpoint"
    if not (trained / "config.json").exists():
        conftest._train(random_qwen3, trained)
    models = {"Qwen3 random": random_qwen3, "Qwen3 trained": trained,
              "Qwen3.5 random": conftest.checkpoint("qwen35-tiny")[0]}
    rows: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for label, ckpt in models.items():
        for weights, kv in FORMATS:
            out = DEFAULT_BUILD_DIR / "bench" / "check-bounds" / f"{ckpt.name}-{weights}-{kv}"
            compile_model(CompileOptions(model_dir=ckpt, target="cpu", out_dir=out,
                                         model_id="check-bounds", max_context=MAX_CONTEXT,
                                         prefill_chunk=PREFILL_CHUNK, max_concurrency=2,
                                         weights=weights, kv_dtype=kv, python_module=False))
            report = check(out, ckpt, tolerance=Bound(1e9, 0.0), threads=2, tokens=24)
            detail = report.rows[0].detail  # "mean KL X (bound ..), max ..; top-1 agreement Y"
            kl = float(detail.split("mean KL ")[1].split()[0])
            top1 = float(detail.split("agreement ")[1].split()[0])
            rows.setdefault((weights, kv), {})[label] = (kl, top1)
            print(f"{label:15} {weights}/{kv}: {detail}", flush=True)
    print(f"\n{'weights/kv':12}" + "".join(f"{m:>24}" for m in models)
          + f"{'bound':>10}{'margin':>10}")
    for (weights, kv), by in rows.items():
        b = bound([weights], kv)
        worst = max(kl for kl, _ in by.values())
        print(f"{weights + '/' + kv:12}" + "".join(
            f"{by[m][0]:13.1e} ({by[m][1]:.2f} top1)" for m in models)
            + f"{b.mean_kl:10.0e}{b.mean_kl / max(worst, 1e-300):>10.3g}")


if __name__ == "__main__":
    main()
