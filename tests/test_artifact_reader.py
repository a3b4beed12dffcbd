"""The C++ artifact reader (runtime_cpp/model/artifact.cpp) against files from the Python
writer (ninfer.artifact), intact and damaged: each damage is refused with a message that
says what is wrong, before anything reads past the file.

tests/native/test_artifact opens a file as ninfer-server does and reads the tensors named
on its command line; the fake-model server shows the same refusal at start-up.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import native_build
from ninfer.artifact import HEADER, PendingTensor, read_manifest, write_artifact
from test_fake_server import MANIFEST

pytestmark = pytest.mark.unit

TARGET, HASH = "fake", "0"
W = np.arange(32, dtype=np.float32).reshape(4, 8)
B = np.arange(8, dtype=np.int8)


@pytest.fixture(scope="module")
def reader() -> Path:
    return native_build.build("test_artifact") / "test_artifact"


def _write(path: Path, **manifest: Any) -> Path:
    tensors = [PendingTensor("w", (4, 8), lambda: W),
               PendingTensor("b", (8,), lambda: B, dtype="i8")]
    write_artifact(path, {**MANIFEST, **manifest}, tensors)
    return path


def _open(reader: Path, path: Path, *tensors: str, target: str = TARGET,
          target_hash: str = HASH) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(reader), str(path), target, target_hash, *tensors],
                          capture_output=True, text=True, timeout=60)


def _refused(reader: Path, path: Path, *tensors: str, **kw: str) -> str:
    r = _open(reader, path, *tensors, **kw)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith(f"{path}: "), r.stderr
    return r.stderr


def _rewrite_manifest(path: Path, edit: Any) -> None:
    """Edits the manifest in place and rewrites its length and checksum, as a crafted file
    would (the manifest has room before the payloads, which start at a 4096 boundary)."""
    data = bytearray(path.read_bytes())
    magic, version, reserved, length, _ = HEADER.unpack_from(data)
    manifest = json.loads(data[HEADER.size:HEADER.size + length])
    edit(manifest)
    blob = json.dumps(manifest, sort_keys=True).encode()
    first = min(t["offset"] for t in json.loads(data[HEADER.size:HEADER.size + length])["tensors"])
    assert HEADER.size + len(blob) <= first
    data[HEADER.size:first] = blob + b"\0" * (first - HEADER.size - len(blob))
    HEADER.pack_into(data, 0, magic, version, reserved, len(blob), xxhash.xxh64(blob).intdigest())
    path.write_bytes(bytes(data))


def test_an_intact_file_reads(reader: Path, tmp_path: Path) -> None:
    r = _open(reader, _write(tmp_path / "m.ninfer"), "w:f32:4x8", "b:i8:8")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_file_shorter_than_its_header(reader: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.ninfer"
    path.write_bytes(_write(path).read_bytes()[:20])
    assert "truncated (20 bytes), not a ninfer artifact" in _refused(reader, path)
    path.write_bytes(b"")
    assert "truncated (0 bytes)" in _refused(reader, path)


def test_bad_magic(reader: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.ninfer"
    path.write_bytes(b"GGUF" + _write(path).read_bytes()[4:])
    assert "bad magic, not a ninfer artifact" in _refused(reader, path)


def test_format_version_mismatch(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 2)
    path.write_bytes(bytes(data))
    assert "format version 2, this server reads 1; recompile the model" in _refused(reader, path)


def test_manifest_checksum_mismatch(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0x01  # one bit of the manifest
    path.write_bytes(bytes(data))
    assert "manifest checksum mismatch (corrupt)" in _refused(reader, path)


def test_manifest_longer_than_the_file(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    path.write_bytes(path.read_bytes()[:HEADER.size + 40])
    assert "truncated: manifest extends past end of file" in _refused(reader, path)


def test_target_mismatch(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer", target={"name": "rtx4090", "hash": HASH})
    err = _refused(reader, path)
    assert "compiled for target 'rtx4090' but this server was built for 'fake'" in err
    path = _write(tmp_path / "m.ninfer", target={"name": TARGET, "hash": "1234"})
    err = _refused(reader, path)
    assert "target 'fake' profile hash 1234 differs from this server's 0" in err


def _offset(path: Path, name: str) -> int:
    return next(t["offset"] for t in read_manifest(path)["tensors"] if t["name"] == name)


def test_tensor_payload_checksum_mismatch(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    data = bytearray(path.read_bytes())
    data[_offset(path, "b") + 3] ^= 0x01  # one bit of b's payload
    path.write_bytes(bytes(data))
    assert "checksum mismatch in tensor 'b' (file corrupt)" in _refused(reader, path)
    assert _open(reader, path, "w:f32:4x8").returncode == 1  # no tensor is served then


def test_file_truncated_in_a_payload(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    end = _offset(path, "b") + 4  # half of b's 8 bytes
    path.write_bytes(path.read_bytes()[:end])
    err = _refused(reader, path)
    assert f"truncated: tensor 'b' needs bytes up to {end + 4} but the file has {end}" in err


def test_missing_tensor_and_wrong_shape_or_dtype(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    assert "tensor 'lm_head' missing" in _refused(reader, path, "lm_head:f32:4x8")
    assert "tensor 'w' has shape [4, 8], expected [8, 4]" in _refused(reader, path, "w:f32:8x4")
    assert "tensor 'b' is i8, expected u8" in _refused(reader, path, "b:u8:8")


def test_offset_plus_size_overflowing_64_bits_is_refused(reader: Path, tmp_path: Path) -> None:
    """offset + nbytes wraps around 2^64 to a small number that passes a naive bounds
    check; the reader must refuse it instead of reading (or checksumming) wild memory."""
    path = _write(tmp_path / "m.ninfer")
    size = path.stat().st_size

    def wrap(manifest: dict[str, Any]) -> None:
        t = manifest["tensors"][0]
        t["offset"] = 2**64 - 4096
        t["nbytes"] = 4096 + 128  # the sum wraps to 128
    _rewrite_manifest(path, wrap)
    err = _refused(reader, path)
    assert f"tensor 'w' at offset {2**64 - 4096} with {4096 + 128} bytes" in err
    assert "corrupt tensor table" in err
    # Without the wrap, past the end is still refused.
    _rewrite_manifest(path, lambda m: m["tensors"][0].update(offset=size - 64, nbytes=128))
    assert "needs bytes up to" in _refused(reader, path)


@pytest.mark.parametrize("shape", [[-1, -32], [2**62 + 8, 4]])
def test_shape_whose_size_overflows_is_refused(reader: Path, tmp_path: Path,
                                               shape: list[int]) -> None:
    """A shape whose element count is negative or overflows must not pass for the
    payload's 128 bytes: multiplied out modulo 2^64, both shapes give 32 f32 elements."""
    path = _write(tmp_path / "m.ninfer")
    _rewrite_manifest(path, lambda m: m["tensors"][0].update(shape=shape))
    assert "tensor 'w': 128 bytes for shape" in _refused(reader, path)


def test_malformed_tensor_table(reader: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "m.ninfer")
    _rewrite_manifest(path, lambda m: m["tensors"][0].update(offset="4096"))
    assert "malformed manifest" in _refused(reader, path)


def test_server_refuses_a_damaged_artifact_at_start(reader: Path, tmp_path: Path) -> None:
    """The same checks reach the user as ninfer-server's start-up error (exit 2)."""
    server = native_build.build("fake_server") / "fake-server" / "ninfer-server"
    path = _write(tmp_path / "m.ninfer", target={"name": TARGET, "hash": "1234"})
    r = subprocess.run([str(server), "--port", "0", "--artifact", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"ninfer-server: error: {path}: target 'fake' profile hash")


def test_q_k_and_v_are_written_part_by_part() -> None:
    """A layer's q, k and v are written values, values, values, then scales, scales,
    scales, so each part of the three lies back to back (plan.qkv_fusable's one gemv reads
    them as one matrix); every other weight keeps its own parts together, and a q, k, v
    whose part counts differ keep theirs."""
    from ninfer.artifact import _qkv_parts_together

    def weight(name: str, parts: tuple[str, ...] = ("values", "scales")) -> list[PendingTensor]:
        if not parts:
            return [PendingTensor(name, (1,), lambda: np.zeros(1))]
        return [PendingTensor(f"{name}.{p}", (1,), lambda: np.zeros(1)) for p in parts]

    groups = [weight("layers.0.input_norm", ()), weight("layers.0.q"), weight("layers.0.k"),
              weight("layers.0.v"), weight("layers.0.q_bias", ()), weight("layers.0.o"),
              weight("layers.1.q"), weight("layers.1.k", ()), weight("layers.1.v")]
    names = [t.name for g in _qkv_parts_together(groups) for t in g]
    assert names == [
        "layers.0.input_norm",
        "layers.0.q.values", "layers.0.k.values", "layers.0.v.values",
        "layers.0.q.scales", "layers.0.k.scales", "layers.0.v.scales",
        "layers.0.q_bias", "layers.0.o.values", "layers.0.o.scales",
        "layers.1.q.values", "layers.1.q.scales", "layers.1.k",
        "layers.1.v.values", "layers.1.v.scales"]
