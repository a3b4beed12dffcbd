"""The `model.ninfer` file format: header, manifest, aligned tensors (no model knowledge).

Layout (little endian):

    offset 0   8 bytes   magic b"NINFER\\0\\0"
           8   u32       format version (FORMAT_VERSION)
          12   u32       reserved (0)
          16   u64       manifest length in bytes
          24   u64       XXH64 (seed 0) of the manifest bytes
          32   ...       manifest, UTF-8 JSON
                         zero padding to a multiple of ALIGN
                         tensors, each starting at a multiple of ALIGN

The manifest holds the model id and config, the target (name, kind, hash, arch, SMs),
the compiled serve limits, tokenizer.json, the chat templates, and a tensor table with
dtype, shape, offset, byte size and XXH64 of each payload. Tensor dtypes: f32, f16, bf16
(stored as its 16-bit pattern), i8, u8 (packed 4-bit weights), all little endian. The C++ loader
(`runtime_cpp/model/artifact.cpp`) checks all of them and says which one failed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

MAGIC = b"NINFER\0\0"
FORMAT_VERSION = 1
ALIGN = 4096
HEADER = struct.Struct("<8sIIQQ")


class ArtifactError(ValueError):
    """The artifact is not a ninfer artifact, is corrupt, or is for another target."""


# numpy / kernel-spec dtype -> artifact dtype (16-bit floats are stored as their bits)
ARTIFACT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint16": "bf16",
                   "int8": "i8", "uint8": "u8"}
# artifact dtype -> numpy dtype of the stored payload
DTYPES: dict[str, Any] = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16,
                          "i8": np.int8, "u8": np.uint8}


@dataclass(frozen=True)
class PendingTensor:
    name: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]  # produces the payload (of `dtype`) when written
    dtype: str = "f32"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_artifact(path: Path, manifest: dict[str, Any], tensors: Iterable[PendingTensor],
                   on_tensor: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write the artifact; tensors are loaded one at a time so memory stays flat.

    The tensor table needs offsets before the payloads, so sizes come from `shape` and
    the table is rewritten in place once checksums are known (its length is fixed by
    padding the checksum fields to constant width).
    """
    pending = list(tensors)
    table: list[dict[str, Any]] = []
    offset = 0
    for t in pending:
        if t.dtype not in DTYPES:
            raise ArtifactError(f"tensor {t.name}: dtype {t.dtype!r} is not one of "
                                f"{', '.join(DTYPES)}")
        itemsize = np.dtype(DTYPES[t.dtype]).itemsize
        nbytes = itemsize * int(np.prod(t.shape, dtype=np.int64))
        table.append({"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                      "offset": offset, "nbytes": nbytes, "xxh64": "0" * 16})
        offset = _align(offset + nbytes)
    full = {**manifest, "format_version": FORMAT_VERSION, "tensors": table}
    blob = json.dumps(full, sort_keys=True).encode()
    data_start = _align(HEADER.size + len(blob))
    for entry in table:
        entry["offset"] += data_start
    with open(path, "wb") as fh:
        fh.truncate(data_start + offset)
        for t, entry in zip(pending, table, strict=True):
            arr = np.asarray(t.load())
            if t.dtype != "f32" and arr.dtype != DTYPES[t.dtype]:
                raise ArtifactError(f"tensor {t.name}: payload is {arr.dtype}, planned "
                                    f"{t.dtype}")
            arr = np.ascontiguousarray(arr, dtype=DTYPES[t.dtype])
            if arr.shape != t.shape:
                raise ArtifactError(f"tensor {t.name}: shape {arr.shape} != planned {t.shape}")
            payload = arr.tobytes()
            entry["xxh64"] = xxhash.xxh64(payload).hexdigest()
            fh.seek(entry["offset"])
            fh.write(payload)
            if on_tensor:
                on_tensor(t.name)
        full["tensors"] = table
        blob = json.dumps(full, sort_keys=True).encode()
        if HEADER.size + len(blob) > data_start:
            raise ArtifactError("internal: manifest grew past its reserved space")
        fh.seek(0)
        fh.write(HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(blob), xxhash.xxh64(blob).intdigest()))
        fh.write(blob)
    return full


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse and check the header and manifest (not the payloads)."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
        if len(head) < HEADER.size:
            raise ArtifactError(f"{path}: truncated ({len(head)} bytes), not a ninfer artifact")
        magic, version, _, length, digest = HEADER.unpack(head)
        if magic != MAGIC:
            raise ArtifactError(f"{path}: bad magic {magic!r}, not a ninfer artifact")
        if version != FORMAT_VERSION:
            raise ArtifactError(f"{path}: format version {version}, this ninfer reads "
                                f"{FORMAT_VERSION}; recompile the model")
        blob = fh.read(length)
    if len(blob) != length or xxhash.xxh64(blob).intdigest() != digest:
        raise ArtifactError(f"{path}: manifest checksum mismatch (file truncated or corrupt)")
    manifest: dict[str, Any] = json.loads(blob)
    return manifest
