"""Test data from the real world: llama.cpp's corpus of chat templates and vocab-only GGUF
tokenizers, as the llama-cpp-python 0.3.36 source distribution on PyPI carries them.

The sdist is fetched once with pip (`pip download --no-deps --no-binary :all:`, ~20 s) into
build/cache/llama-cpp-python/, and only `vendor/llama.cpp/models/templates/*.jinja` and
`vendor/llama.cpp/models/ggml-vocab-*.gguf` are extracted next to it. Nothing is committed.

Other tests may add functions at the end of this file.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import tarfile
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "cache" / "llama-cpp-python"
VERSION = "0.3.36"
_MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"


def models_dir() -> Path:
    """The extracted `models/` directory (templates/ and the ggml-vocab-*.gguf files)."""
    out = CACHE / "models"
    if (out / ".complete").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:  # one download at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / ".complete").exists():
            return out
        sdists = sorted(CACHE.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
        if not sdists:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 f"llama-cpp-python=={VERSION}", "-d", str(CACHE)],
                capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pip download llama-cpp-python=={VERSION} failed:\n"
                                   f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            sdists = sorted(CACHE.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                if not member.name.startswith(_MODELS) or not member.isfile():
                    continue
                rel = member.name[len(_MODELS):]
                if (rel.startswith("templates/") and rel.endswith(".jinja")) or (
                        rel.startswith("ggml-vocab-") and rel.endswith(".gguf")):
                    target = out / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(member)
                    assert src is not None
                    target.write_bytes(src.read())
        (out / ".complete").write_text("")
    return out


def cached() -> bool:
    return (CACHE / "models" / ".complete").exists()


def corpus_templates() -> dict[str, str]:
    """Every template of the corpus by name (the file name without .jinja)."""
    d = models_dir() / "templates"
    return {p.stem: p.read_text() for p in sorted(d.glob("*.jinja"))}


@cache
def tokenizer_dir(vocab: str) -> Path:
    """A directory with the tokenizer.json transformers makes of ggml-vocab-<vocab>.gguf
    (cached), for `AutoTokenizer.from_pretrained` and ninfer's C++ tokenizer."""
    out = CACHE / "tokenizers" / vocab
    if (out / "tokenizer.json").exists():
        return out
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models_dir()), gguf_file=f"ggml-vocab-{vocab}.gguf")
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return out


def tokenizer_json(vocab: str) -> dict:
    return json.loads((tokenizer_dir(vocab) / "tokenizer.json").read_text())
