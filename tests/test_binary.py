"""The built binary: self-contained, refuses wrong or corrupt artifacts, checks its flags."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from ninfer.artifact import HEADER, read_manifest

pytestmark = pytest.mark.e2e


def run_server(server, *args, timeout=60):
    return subprocess.run([str(server), "--port", "0", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_needs_only_glibc_up_to_its_floor(qwen3_model):
    """The server's ELF NEEDED entries are glibc's own libraries (cpp-httplib header-only,
    PCRE2, libstdc++ and libgcc static) and no symbol needs a glibc newer than the README's
    floor (test_cuda_build checks a CUDA build the same way)."""
    from conftest import glibc_needs

    needed, highest = glibc_needs(qwen3_model.server)
    assert "libc.so.6" in needed and highest >= (2, 17), (needed, highest)


def test_serves_from_a_root_holding_only_glibc(qwen3_model, tmp_path):
    """Standalone for real: in a root that holds the server, its artifact and glibc's
    files (the libraries ldd resolves and the loader) and nothing else, no /proc, /etc or
    /dev, it starts, answers /health and completes a prompt."""
    import os
    import re

    from ninfer.runtime import Server

    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(qwen3_model.server, root / "ninfer-server")
    shutil.copy(qwen3_model.out_dir / "model.ninfer", root / "model.ninfer")
    ldd = subprocess.run(["ldd", str(qwen3_model.server)], capture_output=True, text=True,
                         check=True).stdout
    files = re.findall(r"(/\S+) \(0x", ldd)  # resolved libraries and the loader
    assert any("ld-linux" in f for f in files) and any("libc.so" in f for f in files), ldd
    for f in files:
        dest = root / f.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)  # follows links: the real file under the linked name
    # chroot needs root; elsewhere a user namespace maps this user to root in it
    wrap = ["chroot"] if os.geteuid() == 0 else ["unshare", "-r", "chroot"]
    probe = subprocess.run([*wrap, str(root), "/ninfer-server", "--help"],
                           capture_output=True, text=True)
    if os.geteuid() != 0 and probe.returncode != 0 and "unshare" in probe.stderr:
        pytest.skip(f"no chroot here (not root, no user namespaces): {probe.stderr.strip()}")
    assert probe.returncode == 0 and "usage" in probe.stdout, probe.stderr
    srv = Server(root)
    srv.args = [*wrap, str(root), "/ninfer-server", "--artifact", "/model.ninfer",
                *srv.args[1:]]
    with srv:
        assert srv.client.get("/health").json() == {"status": "ok"}
        r = srv.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4,
                                                     "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4


@pytest.mark.unit
def test_client_watch_finds_the_socket_with_and_without_proc():
    """A client that leaves while its request waits or prefills is noticed by finding its
    socket among the server's descriptors: through /proc/self/fd, or, where there is no
    /proc (the chroot above, a minimal container), by trying every descriptor number."""
    import native_build

    binary = native_build.build("test_client_watch") / "test_client_watch"
    r = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "client watch ok" in r.stdout, r.stdout + r.stderr


def test_refuses_truncated_artifact(qwen3_model, tmp_path):
    bad = tmp_path / "model.ninfer"
    data = (qwen3_model.out_dir / "model.ninfer").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0
    assert "truncated" in r.stderr


def test_refuses_corrupt_tensor(qwen3_model, tmp_path):
    src = qwen3_model.out_dir / "model.ninfer"
    manifest = read_manifest(src)
    entry = next(t for t in manifest["tensors"] if t["name"] == "layers.1.down")
    data = bytearray(src.read_bytes())
    data[entry["offset"] + 100] ^= 0xFF
    bad = tmp_path / "model.ninfer"
    bad.write_bytes(bytes(data))
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0
    assert "checksum mismatch in tensor 'layers.1.down'" in r.stderr


def test_refuses_bad_magic(qwen3_model, tmp_path):
    bad = tmp_path / "model.ninfer"
    bad.write_bytes(b"GGUF" + b"\0" * 5000)
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0 and "not a ninfer artifact" in r.stderr


def _rewrite_manifest(src, dst, edit) -> None:
    """Apply `edit` to the manifest, keeping its length and the header checksum valid."""
    import xxhash

    data = bytearray(src.read_bytes())
    magic, version, res, length, _ = HEADER.unpack_from(data)
    manifest = json.loads(data[HEADER.size:HEADER.size + length])
    edit(manifest)
    blob = json.dumps(manifest, sort_keys=True).encode()
    assert len(blob) <= length
    blob = blob + b" " * (length - len(blob))  # same length keeps tensor offsets valid
    data[: HEADER.size] = HEADER.pack(magic, version, res, length, xxhash.xxh64(blob).intdigest())
    data[HEADER.size:HEADER.size + length] = blob
    dst.write_bytes(bytes(data))


def test_refuses_artifact_for_another_target(qwen3_model, tmp_path):
    def edit(manifest):
        manifest["target"]["name"] = "rtx4080s"
        manifest["model"]["id"] = manifest["model"]["id"][:-5]  # keep the length unchanged

    bad = tmp_path / "model.ninfer"
    _rewrite_manifest(qwen3_model.out_dir / "model.ninfer", bad, edit)
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0
    assert "compiled for target 'rtx4080s'" in r.stderr and "'cpu'" in r.stderr


def test_refuses_artifact_of_another_plan(qwen3_model, tmp_path):
    """Same model and target, another plan (say --max-concurrency 8 instead of 4): the
    tensors may even fit, but the program is not the one the server was generated from."""
    digest = ""

    def edit(manifest):
        nonlocal digest
        digest = manifest["build"]["digest"]
        manifest["build"]["digest"] = digest[::-1]

    bad = tmp_path / "model.ninfer"
    _rewrite_manifest(qwen3_model.out_dir / "model.ninfer", bad, edit)
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0
    assert (f"compiled from another plan (build digest {digest[::-1]}) than this server's "
            f"({digest})") in " ".join(r.stderr.split())

    def older(manifest):
        del manifest["build"]

    _rewrite_manifest(qwen3_model.out_dir / "model.ninfer", bad, older)
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0 and "build digest none (an older ninfer)" in r.stderr


def test_refuses_tensor_of_another_dtype(qwen3_model, tmp_path):
    def edit(manifest):
        entry = next(t for t in manifest["tensors"] if t["name"] == "layers.1.down")
        entry["dtype"] = "f16"

    bad = tmp_path / "model.ninfer"
    _rewrite_manifest(qwen3_model.out_dir / "model.ninfer", bad, edit)
    r = run_server(qwen3_model.server, "--artifact", str(bad))
    assert r.returncode != 0
    assert "tensor 'layers.1.down'" in r.stderr and "of f16" in r.stderr


def test_artifact_stores_typed_tensors(tmp_path):
    import numpy as np

    from ninfer.artifact import PendingTensor, write_artifact

    parts = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3),
             "f16": np.ones((5,), np.float16), "bf16": np.full((3,), 0x3F80, np.uint16),
             "i8": np.array([-127, 0, 127], np.int8), "u8": np.arange(7, dtype=np.uint8)}
    path = tmp_path / "typed.ninfer"
    write_artifact(path, {"target": {}}, [PendingTensor(k, v.shape, lambda v=v: v, k)
                                          for k, v in parts.items()])
    table = {t["name"]: t for t in read_manifest(path)["tensors"]}
    raw = path.read_bytes()
    for name, arr in parts.items():
        entry = table[name]
        assert (entry["dtype"], entry["nbytes"]) == (name, arr.nbytes)
        assert raw[entry["offset"]:entry["offset"] + arr.nbytes] == arr.tobytes()
    with pytest.raises(ValueError, match="payload is int8, planned u8"):
        write_artifact(path, {}, [PendingTensor("x", (3,), lambda: parts["i8"], "u8")])


@pytest.mark.parametrize(("args", "message"), [
    (("--max-context", "512"), "--max-context 512 exceeds the compiled maximum 256; recompile "
                               "with --max-context 512"),
    (("--prefill-chunk", "17"), "--prefill-chunk 17 exceeds the compiled maximum 16; recompile "
                                "with --prefill-chunk 17"),
    (("--max-concurrency", "9"), "--max-concurrency 9 exceeds the compiled maximum 8"),
    (("--prefill-chunk", "4", "--max-concurrency", "6"),
     "--max-concurrency 6 exceeds --prefill-chunk 4: every running request needs a row"),
    (("--prefill-chunk", "0"), "--prefill-chunk must be at least 1"),
])
def test_limits_beyond_the_compiled_ones_are_refused_with_the_numbers(qwen3_model, args,
                                                                       message):
    from conftest import MAX_CONTEXT, PREFILL_CHUNK

    assert (MAX_CONTEXT, PREFILL_CHUNK) == (256, 16)  # the numbers in the messages
    r = run_server(qwen3_model.server, *args)
    assert r.returncode == 2
    assert message in r.stderr


def test_unknown_flag_is_refused(qwen3_model):
    r = run_server(qwen3_model.server, "--frobnicate")
    assert r.returncode != 0 and "unknown flag '--frobnicate'" in r.stderr


def test_server_runs_from_a_copied_directory(qwen3_model, tmp_path):
    """The binary finds model.ninfer beside itself, wherever the pair is copied."""
    from ninfer.runtime import Server

    for name in ("ninfer-server", "model.ninfer"):
        shutil.copy2(qwen3_model.out_dir / name, tmp_path / name)
    with Server(tmp_path, threads=1) as srv:
        assert srv.client.get("/v1/models").json()["data"][0]["id"] == "qwen3-tiny"


def _thp_never() -> bool:
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return thp.exists() and "[never]" in thp.read_text()


def test_weights_are_copied_into_huge_page_memory_unless_mmap_weights(qwen3_model):
    """On the CPU the server reads its weights out of the mapped artifact into huge-page
    memory at start (decode streams them faster: RESULTS 2026-12-05); --mmap-weights reads
    them in place. The process's memory maps show which, the start-up log says so, and
    both serve the same greedy tokens."""
    from pathlib import Path

    from ninfer.runtime import Server

    body = {"prompt": "Hello there", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    texts = {}
    for extra in ((), ("--mmap-weights",)):
        with Server(qwen3_model.out_dir, extra_args=extra) as srv:
            assert srv.proc is not None
            maps = Path(f"/proc/{srv.proc.pid}/maps").read_text()
            log = "\n".join(srv.output)
            r = srv.client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            texts[extra] = r.json()["choices"][0]["text"]
        copied = "weights loaded into huge-page memory" in log
        if extra or _thp_never():
            assert "model.ninfer" in maps and not copied, log
        else:
            assert "model.ninfer" not in maps and copied, log
    assert texts[()] == texts[("--mmap-weights",)]


def test_kv_block_size_64_gives_the_default_builds_logits(qwen3_model):
    """--kv-block-size 64 (the plan's blocks, the runtime's block tables, the CPU attention's
    runs of 32 keys instead of 16) reads the same keys in the same order and softmax steps
    as the default 16 blocks: a prompt of several chunks and the decode steps after it give
    bitwise the default build's logits; the compile report says 64."""
    import dataclasses

    import numpy as np

    from conftest import TEST_MODELS, compile_once, compiled_options
    from ninfer.runtime.engine import load_engine

    opts = dataclasses.replace(compiled_options("qwen3-tiny"), kv_block_size=64,
                               out_dir=TEST_MODELS / "qwen3-tiny-kvb64-cpu")
    compile_once(opts)
    report = json.loads((opts.out_dir / "compile_report.json").read_text())
    assert report["plan"]["kv"]["block_size"] == 64
    base, big = qwen3_model.engine(), load_engine(opts.out_dir, threads=2)
    ids = [(7 * i) % 500 + 3 for i in range(70)]  # 5 chunks; the 2nd block from token 64
    assert np.array_equal(base.forward(ids, 0), big.forward(ids, 0))
    for step in range(5):
        assert np.array_equal(base.forward([11 + step], 70 + step),
                              big.forward([11 + step], 70 + step)), step


def test_python_engine_copies_weights_unless_mmap_weights(qwen3_model):
    """The Python engine loads as the server does (load_engine's mmap_weights is the
    server's --mmap-weights), with the same logits either way."""
    import numpy as np

    from ninfer.runtime.engine import load_engine

    copied = load_engine(qwen3_model.out_dir, threads=2)
    mapped = load_engine(qwen3_model.out_dir, threads=2, mmap_weights=True)
    assert copied.weights_in_memory is not _thp_never()
    assert mapped.weights_in_memory is False
    ids = [3, 17, 42, 5]
    assert np.array_equal(copied.forward(ids, 0), mapped.forward(ids, 0))
