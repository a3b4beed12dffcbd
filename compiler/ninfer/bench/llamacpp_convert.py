"""Hugging Face checkpoint -> GGUF through llama.cpp's own converter, for the architectures
ninfer's exporter (gguf_export) does not write: the hybrids (Qwen3.5, Qwen3-Next), whose
GGUF layout (value heads reordered for ggml's broadcast, A_log as -exp, conv squeezed,
MRoPE sections, the recurrent-layer flags) is llama.cpp's to define.

The converter is the one that ships with the llama.cpp that llama-cpp-python vendors
(`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/` of the pinned sdist), unpacked by
benchmarks/install_llamacpp.sh into build/third_party/llama.cpp-convert. It runs in a
subprocess, unchanged except for one thing: it recognises a BPE pre-tokenizer by the hash
of a sample's token ids, which a benchmark checkpoint's demo tokenizer has not got, so the
pre-tokenizer name is given (the one gguf_export derives from tokenizer.json's split
regex). The MTP head is left out (--no-mtp): the benchmarks time the main model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ninfer.paths import DEFAULT_BUILD_DIR

CONVERTER_DIR = DEFAULT_BUILD_DIR / "third_party" / "llama.cpp-convert"
OUTTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}

_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[1] + "/gguf-py")
import conversion.base as base
pre = sys.argv[2]
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
convert_hf_to_gguf.main()
"""


def convert(checkpoint_dir: str | Path, out_path: str | Path, qtype: str,
            converter_dir: Path = CONVERTER_DIR) -> Path:
    """`checkpoint_dir` as a GGUF of `qtype` (F32, F16, BF16, Q8_0) at `out_path`."""
    from ninfer.bench.gguf_export import _pre_tokenizer_name

    if qtype not in OUTTYPES:
        raise ValueError(f"llama.cpp's converter writes {', '.join(OUTTYPES)}, not {qtype}")
    if not (converter_dir / "convert_hf_to_gguf.py").exists():
        raise FileNotFoundError(f"llama.cpp's converter is not in {converter_dir}; run "
                                "`bash benchmarks/install_llamacpp.sh`")
    ckpt, out = Path(checkpoint_dir), Path(out_path)
    pre = _pre_tokenizer_name(json.loads((ckpt / "tokenizer.json").read_text()))
    tmp = out.with_suffix(".partial")
    result = subprocess.run(
        [sys.executable, "-c", _RUN, str(converter_dir), pre, str(ckpt), "--outtype",
         OUTTYPES[qtype], "--no-mtp", "--outfile", str(tmp)],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {ckpt}:\n"
                           + result.stderr[-3000:])
    tmp.replace(out)
    return out


def quantize(in_path: str | Path, out_path: str | Path, qtype: str, threads: int) -> Path:
    """An F32 / F16 GGUF requantized by llama.cpp (`llama_model_quantize`, every matrix in
    `qtype`: "pure", as gguf_export does for the dense models)."""
    import ctypes

    import llama_cpp as lc

    ftype = {"Q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0, "Q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0}[qtype]
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.pure = True
    tmp = Path(out_path).with_suffix(".partial")
    rc = lc.llama_model_quantize(str(in_path).encode(), str(tmp).encode(),
                                 ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({in_path} -> {qtype}) returned {rc}")
    tmp.replace(out_path)
    return Path(out_path)
