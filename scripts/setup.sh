#!/usr/bin/env bash
# Installs everything ninfer needs on a fresh Debian machine: system packages for the
# C++ runtime, and a virtual environment (.venv) with the compiler and test tools.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev pybind11-dev
      pkg-config ccache g++ python3-venv)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.ninfer-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python packages (first run takes a few minutes)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[test]"
  touch "$stamp"
fi
