"""A Hugging Face checkpoint directory: config, safetensors shards, tokenizer files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from ninfer.frontend.config import FrontendError, ModelConfig


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: F32, F16, BF16, ...


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    config: ModelConfig
    raw_config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    tokenizer_json: dict[str, Any]
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]

    def load(self, name: str) -> np.ndarray:
        """One tensor as float32 (bf16 and f16 widened exactly)."""
        info = self.tensors.get(name)
        if info is None:
            raise FrontendError(f"{self.directory}: tensor '{name}' not found in the checkpoint")
        with safe_open(str(info.file), framework="numpy") as f:
            if info.dtype == "BF16":
                raw = _read_raw(info)
                return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info.shape)
            return np.asarray(f.get_tensor(name), dtype=np.float32)


    def load_index(self, name: str, index: int) -> np.ndarray:
        """tensor[index] (along its first axis) as float32, reading only its bytes: one
        expert of a fused [experts, ...] tensor without the others."""
        info = self.tensors.get(name)
        if info is None:
            raise FrontendError(f"{self.directory}: tensor '{name}' not found in the checkpoint")
        if not info.shape or not 0 <= index < info.shape[0]:
            raise FrontendError(f"{name}: index {index} outside its first axis {info.shape}")
        dtype = _NUMPY_DTYPES.get(info.dtype)
        if dtype is None:
            raise FrontendError(f"{name}: dtype {info.dtype} cannot be sliced here")
        row = int(np.prod(info.shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        raw = _read_raw(info, index * row, row).view(dtype).reshape(info.shape[1:])
        if info.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)


_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def _read_raw(info: TensorInfo, skip: int = 0, length: int | None = None) -> np.ndarray:
    """bfloat16 has no numpy dtype: read the payload bytes straight from the file (as
    uint16; with `length`, that many bytes from `skip` on, as uint8)."""
    with open(info.file, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
        start, end = header[info.name]["data_offsets"]
        fh.seek(8 + header_len + start + skip)
        data = fh.read(end - start - skip if length is None else length)
        return np.frombuffer(data, dtype=np.uint8 if length is not None else np.uint16)


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise FrontendError(f"{path.parent}: missing {path.name}")
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FrontendError(f"{path}: not valid JSON: {exc}") from exc


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise FrontendError(f"{path}: truncated safetensors file")
        n = int.from_bytes(head, "little")
        if n > path.stat().st_size:
            raise FrontendError(f"{path}: corrupt safetensors header length {n}")
        return json.loads(fh.read(n))


def open_checkpoint(directory: Path) -> Checkpoint:
    directory = Path(directory)
    if not directory.is_dir():
        raise FrontendError(f"model directory {directory} does not exist")
    raw = _read_json(directory / "config.json", required=True)
    config = ModelConfig.from_dict(raw)

    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index, required=True).get("weight_map", {})
        files = sorted({directory / f for f in weight_map.values()})
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FrontendError(f"{directory}: no *.safetensors files (PyTorch .bin checkpoints "
                            "are not supported; convert with save_pretrained(safe_serialization"
                            "=True))")
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        if not file.exists():
            raise FrontendError(f"{directory}: shard {file.name} named in the index is missing")
        for name, meta in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            tensors[name] = TensorInfo(name, file, tuple(meta["shape"]), meta["dtype"])

    return Checkpoint(
        directory=directory,
        config=config,
        raw_config=raw,
        tensors=tensors,
        tokenizer_json=_read_json(directory / "tokenizer.json", required=True),
        tokenizer_config=_read_json(directory / "tokenizer_config.json", required=False),
        generation_config=_read_json(directory / "generation_config.json", required=False),
    )
