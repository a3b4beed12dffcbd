#!/usr/bin/env bash
# Quickstart, command 1: set up, compile the embedded demo checkpoint for the host CPU,
# start ninfer-server, send one chat request, print the reply and timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=$(.venv/bin/ninfer-compile --target cpu -o build/ninfer-demo-cpu)
.venv/bin/ninfer-chat "$out" "${1:-Hello! What can you do?}"
