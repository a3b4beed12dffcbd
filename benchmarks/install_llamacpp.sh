#!/usr/bin/env bash
# Build the llama.cpp peer (llama-cpp-python, pinned in pyproject's `bench` extra) for this
# host's x86 features, as GGML_NATIVE would, but without AMX: a CPU may advertise AMX that
# its hypervisor does not enable (this project's VM: `tilezero` raises SIGILL in every
# Q8_0 / Q4_0 matmul). On a host without the flags the build is AVX2-only or plain.
#   bash benchmarks/install_llamacpp.sh            # into .venv (and its HF -> GGUF converter
#                                                  # into build/third_party/llama.cpp-convert)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
args=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
opt() { if has "$1"; then args+=("-D$2=ON"); else args+=("-D$2=OFF"); fi; }
opt sse4_2 GGML_SSE42
opt f16c GGML_F16C
opt fma GGML_FMA
opt bmi2 GGML_BMI2
opt avx GGML_AVX
opt avx2 GGML_AVX2
opt avx_vnni GGML_AVX_VNNI
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
  args+=(-DGGML_AVX512=ON)
  opt avx512vbmi GGML_AVX512_VBMI
  opt avx512_vnni GGML_AVX512_VNNI
  opt avx512_bf16 GGML_AVX512_BF16
else
  args+=(-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF)
fi
spec=$(grep -o '"llama-cpp-python==[^"]*"' pyproject.toml | tr -d '"')
echo "building $spec with CMAKE_ARGS=${args[*]}"
CMAKE_ARGS="${args[*]}" "$PY" -m pip install --no-cache-dir --force-reinstall --no-deps "$spec"
"$PY" -m pip install -e '.[bench]'
# llama.cpp's own HF -> GGUF converter from the same sdist, for the architectures
# ninfer.bench.gguf_export does not write (the hybrids: ninfer.bench.llamacpp_convert).
conv=build/third_party/llama.cpp-convert
tmp=$(mktemp -d)
"$PY" -m pip download --no-deps --no-binary :all: -q -d "$tmp" "$spec"
tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
rm -rf "$conv" && mkdir -p "$conv"
src=$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" "$conv/"
rm -rf "$tmp"
echo "llama.cpp converter in $conv"
