#!/usr/bin/env bash
# The GPU check, in two halves because the lent GPU machine has no package registry:
#   bash scripts/gpu_check.sh prepare TARGET   # here: compile the tiny Qwen3 for TARGET
#                                              # (tvm and coop prefill projections)
#   bash scripts/gpu_check.sh run              # there: serve both, compare with transformers
# `prepare` leaves everything `run` needs in build/gpu-check (carry that path).
set -euo pipefail
cd "$(dirname "$0")/.."
root=build/gpu-check
case "${1:-}" in
  prepare)
    target=${2:-h200}
    rm -rf "$root" && mkdir -p "$root/lib"
    .venv/bin/python - "$target" "$root" <<'PY'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "tests")
from conftest import MAX_CONTEXT, PREFILL_CHUNK, compiled
from ninfer.pipeline import CompileOptions, compile_model
target, root = sys.argv[1], Path(sys.argv[2])
model = compiled("qwen3-tiny")
shutil.copytree(model.checkpoint, root / "checkpoint")
for mode in ("tvm", "coop"):
    out = root / f"qwen3-tiny-{target}-{mode}"
    compile_model(CompileOptions(model_dir=model.checkpoint, target=target, out_dir=out,
                                 model_id="qwen3-tiny", max_context=MAX_CONTEXT,
                                 max_prefill_chunk=PREFILL_CHUNK, python_module=False,
                                 prefill_projections=mode))
    for junk in ("src", "cmake-build"):
        shutil.rmtree(out / junk)
PY
    nvcc -O2 -arch="$(.venv/bin/python -c "from ninfer.targets import load_target as t; print(t('$target').arch)")" \
      -o "$root/membench" benchmarks/gpu_membench.cu
    # Debian ships cpp-httplib only as a shared library: carry it beside the servers.
    cp -L /lib/x86_64-linux-gnu/libcpp-httplib.so.0.11 "$root/lib/"
    du -sh "$root"
    ;;
  run)
    export LD_LIBRARY_PATH="$PWD/$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv
    "$root/membench" || true
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py "$root"
    ;;
  *)
    echo "usage: $0 prepare [TARGET] | run" >&2
    exit 2
    ;;
esac
