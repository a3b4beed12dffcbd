#!/usr/bin/env bash
# The GPU check, in two halves because the lent GPU machine has no package registry:
#   bash scripts/gpu_check.sh prepare TARGET   # here: compile the tiny Qwen3 for TARGET
#                                              # (coop and tvm prefill projections; bf16
#                                              # weights with an f16 KV cache; q8g32; n-gram
#                                              # speculation), the
#                                              # tiny hybrids (Qwen3.5, also with the chunked
#                                              # GDN prefill, with and without n-gram
#                                              # speculation, with MTP drafts; Qwen3-Next
#                                              # MoE) and a
#                                              # 0.6B-shaped bench model (no artifact)
#   bash scripts/gpu_check.sh prepare-tier     # here: the pytest gpu tier's builds
#   bash scripts/gpu_check.sh run-tier         # there: pytest -m gpu on them (no TVM)
#   bash scripts/gpu_check.sh run [bench]      # there: parity with transformers (graphs
#                                              # on/off, 1/2/4 streams), memcheck, speed
# `prepare` leaves everything `run` needs in build/gpu-check.tar.gz (carry that file; it
# unpacks to build/gpu-check, whose artifacts gpu_check.py rewrites from the checkpoints).
set -euo pipefail
cd "$(dirname "$0")/.."
root=build/gpu-check
case "${1:-}" in
  prepare)
    target=${2:-h200}
    rm -rf "$root" && mkdir -p "$root"
    PYTHONPATH=tests:benchmarks .venv/bin/python - "$target" "$root" <<'PY'
import json, shutil, subprocess, sys
from pathlib import Path
from conftest import MAX_CONTEXT, PREFILL_CHUNK, compiled
from gpu_check import BENCH_LIMITS, bench_checkpoint
from ninfer.pipeline import CompileOptions, compile_model
target, root = sys.argv[1], Path(sys.argv[2])
model = compiled("qwen3-tiny")
shutil.copytree(model.checkpoint, root / "checkpoint")
def tidy(out, opts=None, checkpoint=None):
    """Keep the server (stripped) and the report. The artifact is left out (the lent
    machine's upload is 64 MiB): gpu_check.py rewrites it there from the copied checkpoint
    `checkpoint` (under root) and the options recorded in artifact-options.json."""
    for junk in ("src", "cmake-build"):
        shutil.rmtree(out / junk)
    subprocess.run(["strip", str(out / "ninfer-server")], check=True)
    if opts is not None:
        (out / "model.ninfer").unlink()
        keep = ("target", "model_id", "max_context", "prefill_chunk", "max_concurrency",
                "kv_capacity", "weights", "weight_overrides", "kv_dtype", "memory_gib",
                "prefill_projections", "gdn_prefill", "spec", "max_draft_tokens")
        recorded = {k: getattr(opts, k) for k in keep} | {"model_dir": checkpoint}
        (out / "artifact-options.json").write_text(json.dumps(recorded, indent=1))
def tiny(name, t, **options):
    """The tiny Qwen3 as root/qwen3-tiny-T-NAME, with the given compile options."""
    out = root / f"qwen3-tiny-{t}-{name}"
    opts = CompileOptions(model_dir=model.checkpoint, target=t, out_dir=out,
                          model_id="qwen3-tiny", max_context=MAX_CONTEXT,
                          prefill_chunk=PREFILL_CHUNK, max_concurrency=4,
                          python_module=False, **options)
    compile_model(opts)
    tidy(out, opts, "checkpoint")
# f32 KV caches where the run compares with transformers, which does not round them.
for mode in ("coop", "tvm"):
    tiny(mode, target, prefill_projections=mode, kv_dtype="f32")
# bf16 matmul weights with an f16 KV cache, on the GPU and (the reference, as the f16
# cache rounds keys and values where transformers does not) on the CPU.
for t in (target, "cpu"):
    tiny("kvf16-bf16", t, weights="bf16", kv_dtype="f16")
# Group-quantized weights (hand-written CUDA kernels).
tiny("q8g32", target, weights="q8g32", kv_dtype="f32")
# n-gram speculation (served with drafts by default): greedy parity with transformers as
# the plain builds, through draft rows, the device sampler's verify rows and their graphs.
tiny("spec", target, kv_dtype="f32", spec="ngram", max_draft_tokens=4)
# Hybrids: Qwen3.5 (Gated DeltaNet + gated attention, f32: cooperative GDN projections)
# and Qwen3-Next (MoE, f16 weights), each beside its checkpoint for transformers.
for name in ("qwen35-tiny", "qwen3next-tiny"):
    hybrid = compiled(name)
    out = root / f"hybrid-{name}"
    shutil.copytree(hybrid.checkpoint, root / f"hybrid-{name}-checkpoint")
    opts = CompileOptions(model_dir=hybrid.checkpoint, target=target, out_dir=out,
                          model_id=name, max_context=MAX_CONTEXT,
                          prefill_chunk=PREFILL_CHUNK, max_concurrency=4,
                          python_module=False, kv_dtype="f32")
    compile_model(opts)
    tidy(out, opts, f"hybrid-{name}-checkpoint")
# The chunked (WY) Gated DeltaNet prefill: 80-row steps beside 4 sequences give 64-row
# chunks, so the 70-token prompt crosses a chunk boundary.
out = root / "hybrid-qwen35-tiny-chunked"
opts = CompileOptions(model_dir=compiled("qwen35-tiny").checkpoint, target=target, out_dir=out,
                      model_id="qwen35-tiny", max_context=MAX_CONTEXT, prefill_chunk=80,
                      max_concurrency=4, python_module=False, kv_dtype="f32",
                      gdn_prefill="chunked")
compile_model(opts)
tidy(out, opts, "hybrid-qwen35-tiny-checkpoint")
# ... and with n-gram speculation: the states after draft rows in scratch slots, the
# accepted one made current (gpu_check.py compares drafts on and off as well).
out = root / "hybrid-qwen35-tiny-spec"
opts = CompileOptions(model_dir=compiled("qwen35-tiny").checkpoint, target=target, out_dir=out,
                      model_id="qwen35-tiny", max_context=MAX_CONTEXT, prefill_chunk=80,
                      max_concurrency=4, python_module=False, kv_dtype="f32",
                      gdn_prefill="chunked", spec="ngram", max_draft_tokens=4)
compile_model(opts)
tidy(out, opts, "hybrid-qwen35-tiny-checkpoint")
# ... and with MTP drafts: the checkpoint's head (random: few drafts accepted) run after
# each step; greedy tokens = transformers and = --spec none (hybrid_parity, spec_identity).
from conftest import checkpoint
mtp_ckpt, _ = checkpoint("qwen35mtp-tiny")
shutil.copytree(mtp_ckpt, root / "hybrid-qwen35mtp-tiny-spec-checkpoint")
out = root / "hybrid-qwen35mtp-tiny-spec"
opts = CompileOptions(model_dir=mtp_ckpt, target=target, out_dir=out,
                      model_id="qwen35mtp-tiny", max_context=MAX_CONTEXT, prefill_chunk=80,
                      max_concurrency=4, python_module=False, kv_dtype="f32",
                      gdn_prefill="chunked", spec="mtp", max_draft_tokens=3)
compile_model(opts)
tidy(out, opts, "hybrid-qwen35mtp-tiny-spec-checkpoint")
# The 0.6B-shaped bench model: built here without its 3 GB artifact, which
# gpu_check.py writes there from a checkpoint it makes with the same seed and shapes.
ckpt = Path("build/bench-0.6b-checkpoint")
if not (ckpt / "config.json").exists():
    bench_checkpoint(ckpt, model.checkpoint)
# Its weights as stored (bf16), as f16 and as q4g64 (bench-TARGET, bench-TARGET-FMT).
for fmt in (None, "f16", "q4g64"):
    out = root / (f"bench-{target}" + (f"-{fmt}" if fmt else ""))
    compile_model(CompileOptions(model_dir=ckpt, target=target, out_dir=out,
                                 model_id="qwen3-0.6b-shape", python_module=False,
                                 write_artifact=False, **BENCH_LIMITS,
                                 **({"weights": fmt} if fmt else {})))
    tidy(out)
shutil.copy(ckpt / "config.json", root / "bench-config.json")
PY
    nvcc -O2 -arch="$(.venv/bin/python -c "from ninfer.targets import load_target as t; print(t('$target').arch)")" \
      -o "$root/membench" benchmarks/gpu_membench.cu
    # One compressed file to carry (the servers are most of it): build/gpu-check.tar.gz.
    tar -czf "$root.tar.gz" -C "$(dirname "$root")" "$(basename "$root")"
    du -sh "$root" "$root.tar.gz"
    ;;
  prepare-tier)
    # The pytest gpu tier (tests/test_gpu.py) for a GPU machine without TVM: its builds and
    # the CPU builds and checkpoints it reads, made here, in build/gpu-tier.tar.gz (carry
    # it; `run-tier` there unpacks it into build/test-models and runs the tier with
    # NINFER_TEST_PREBUILT=1, which takes them as they are).
    target=${2:-h200}
    PYTHONPATH=tests .venv/bin/python - "$target" > build/gpu-tier.list <<'PY'
import sys
from pathlib import Path
from conftest import TEST_MODELS, checkpoint, compile_once, compiled
import test_gpu
dirs = []
for name in ("qwen3-tiny", *test_gpu.HYBRIDS):
    dirs += [checkpoint(name)[0], compiled(name).out_dir]  # the CPU builds it compares with
for opts in test_gpu.tier_options(sys.argv[1]).values():
    compile_once(opts)
    dirs.append(Path(opts.out_dir))
print("\n".join(str(d.resolve().relative_to(TEST_MODELS.resolve().parent)) for d in dirs))
PY
    # staged with stripped servers (the upload is 64 MiB)
    stage=build/gpu-tier-stage
    rm -rf "$stage" && mkdir -p "$stage"
    # (and without artifacts: run-tier writes them from the checkpoints, byte for byte)
    tar -cf - --exclude='src' --exclude='cmake-build' --exclude='*.so' --exclude='*.lock' \
      --exclude='model.ninfer' -C build -T build/gpu-tier.list | tar -xf - -C "$stage"
    find "$stage" -name ninfer-server -exec strip {} +
    tar -czf build/gpu-tier.tar.gz -C "$stage" test-models
    du -sh build/gpu-tier.tar.gz
    ;;
  run-tier)
    if [ ! -f build/test-models/.gpu-tier ]; then
      tar -xzf build/gpu-tier.tar.gz -C build && touch build/test-models/.gpu-tier
    fi
    nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv
    export NINFER_TEST_PREBUILT=1 PYTHONUNBUFFERED=1 PYTHONPATH=compiler:tests
    python3 - <<'PY'
from pathlib import Path
from conftest import compiled_options
import test_gpu
from ninfer.pipeline import write_model_artifact
target = test_gpu.present_gpu_target()
opts = [compiled_options(n) for n in ("qwen3-tiny", *test_gpu.HYBRIDS)]
opts += list(test_gpu.tier_options(target).values()) if target else []
for o in opts:
    if not (Path(o.out_dir) / "model.ninfer").exists():
        write_model_artifact(o, Path(o.out_dir) / "model.ninfer")
print(f"artifacts of {len(opts)} builds in place")
PY
    python3 -m pytest -m gpu -p no:cacheprovider -q -ra tests/test_gpu.py "${@:2}"
    ;;
  run)
    if [ ! -d "$root" ]; then
      tar -xzf "$root.tar.gz" -C "$(dirname "$root")"
    fi
    nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv
    "$root/membench" || true
    # `run bench`: the speed of the bench builds alone.
    PYTHONUNBUFFERED=1 PYTHONPATH=compiler python3 benchmarks/gpu_check.py "${2:-run}" "$root"
    ;;
  *)
    echo "usage: $0 prepare [TARGET] | run [bench] | prepare-tier [TARGET] | run-tier [PYTEST ARGS]" >&2
    exit 2
    ;;
esac
