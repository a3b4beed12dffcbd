#!/usr/bin/env bash
# Installs everything ninfer needs on a fresh Debian machine: system packages for the
# C++ runtime, and a virtual environment (.venv) with the compiler and test tools.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(nlohmann-json3-dev libpcre2-dev libxxhash-dev pybind11-dev
      pkg-config ccache g++ python3-venv patch dpkg-dev)
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

# xgrammar's C++ core (structured output) is built into the server from its PyPI source
# distribution (runtime_cpp/structured/xgrammar.cmake); only the sources are fetched here,
# then our fixes to them (runtime_cpp/structured/xgrammar-*.patch) are applied.
# --no-binary names xgrammar alone so that pip takes its build backend as wheels: it
# prepares the sdist's metadata in seconds instead of building the backend from source.
XGRAMMAR_VERSION=0.2.8
XGRAMMAR_SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
xg_dir=build/third_party/xgrammar-$XGRAMMAR_VERSION
xg_patches=(runtime_cpp/structured/xgrammar-"$XGRAMMAR_VERSION"-*.patch)
xg_stamp=$(cat "${xg_patches[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$xg_dir/.ninfer-prepared" 2>/dev/null)" != "$xg_stamp" ]; then
  echo "setup: fetching xgrammar $XGRAMMAR_VERSION sources"
  dl=build/third_party/download
  mkdir -p "$dl"
  sdist=$dl/xgrammar-$XGRAMMAR_VERSION.tar.gz
  if [ ! -s "$sdist" ]; then
    .venv/bin/pip download -q --no-deps --no-binary xgrammar "xgrammar==$XGRAMMAR_VERSION" -d "$dl"
  fi
  echo "$XGRAMMAR_SHA256  $sdist" | sha256sum -c --quiet -
  rm -rf "$xg_dir"
  tar -xzf "$sdist" -C build/third_party
  for p in "${xg_patches[@]}"; do patch -s -d "$xg_dir" -p1 < "$p"; done
  echo "$xg_stamp" > "$xg_dir/.ninfer-prepared"
fi

# cpp-httplib, header-only without TLS or compression (the server then needs no shared
# library but glibc's; Debian ships it only as a shared library with OpenSSL, zlib and
# brotli): the single httplib.h of Debian bookworm's source package, its patches applied,
# fetched through a private deb-src list (the machine's apt sources are left alone).
hl_dir=build/third_party/cpp-httplib
if [ ! -s "$hl_dir/httplib.h" ]; then
  echo "setup: fetching cpp-httplib's source package (bookworm)"
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb-src http://deb.debian.org/debian bookworm main" > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
            -o APT::Sandbox::User="$(id -un)")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" source -qq --download-only cpp-httplib >/dev/null)
  (cd "$apt_dir" && dpkg-source -x -q cpp-httplib_*.dsc src >/dev/null 2>&1)
  rm -rf "$hl_dir"
  mkdir -p "$hl_dir"
  cp "$apt_dir/src/httplib.h" "$apt_dir/src/LICENSE" "$hl_dir/"
  grep -m1 'define CPPHTTPLIB_VERSION' "$hl_dir/httplib.h"
  rm -rf "$apt_dir"
fi
