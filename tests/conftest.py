"""Session fixtures: tiny checkpoints built with transformers, compiled once.

Each model is compiled into build/test-models/<name>-cpu (`compile_once`): under a lock,
so that the test workers of one run (scripts/test.sh runs pytest-xdist) build it once and
the others wait for it, and skipped when the directory holds a build of the same options,
checkpoint and compiler/runtime sources. The kernel object cache and ccache make any
rebuild cheap, and a fresh checkout (CI) builds each model once.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from ninfer.paths import DEFAULT_BUILD_DIR

TEST_MODELS = DEFAULT_BUILD_DIR / "test-models"
MAX_CONTEXT = 256
PREFILL_CHUNK = 16  # small, so test prompts are prefilled in several chunks


@dataclass
class CompiledModel:
    name: str
    checkpoint: Path
    out_dir: Path
    eos_token_ids: list[int]
    hf_class: str = "AutoModelForCausalLM"  # the transformers class that is the reference

    @property
    def server(self) -> Path:
        return self.out_dir / "ninfer-server"

    def hf_model(self) -> Any:
        import torch
        import transformers

        cls = getattr(transformers, self.hf_class)
        return cls.from_pretrained(self.checkpoint, dtype=torch.float32).eval()

    def hf_tokenizer(self) -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_file=str(self.checkpoint / "tokenizer.json"))

    def engine(self) -> Any:
        """The model's Python module (same runtime and kernels), loaded on the artifact."""
        from ninfer.runtime.engine import load_engine

        return load_engine(self.out_dir, threads=2)


def _make_hybrid(name: str, directory: Path, common: dict[str, Any]) -> None:
    """qwen35-tiny: Qwen3_5ForCausalLM, fp32, untied, partial rotary 0.25, 3 Gated DeltaNet
    layers per full-attention one. qwen35vl-tiny: Qwen3_5ForConditionalGeneration (text
    fields under text_config, a one-block vision tower), bf16, tied. qwen3next-tiny:
    Qwen3NextForCausalLM with its fused GDN projections and sparse MoE blocks (8 experts,
    2 per token, a gated shared expert; layer 1 a dense MLP by mlp_only_layers), f16, full
    attention every 2nd layer, partial rotary 0.5. qwen35moe-tiny: Qwen3_5MoeForCausalLM,
    every layer sparse (its config has no dense intermediate_size), 3 of 8 experts, fp32.
    Weights perturbed away from the initialisers (the zero-centred norms start at 0, A_log
    at log(1..16))."""
    import torch
    import transformers

    text = {**common, "num_hidden_layers": 4, "num_key_value_heads": 2,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
    torch.manual_seed(4321)
    model: Any
    if name in ("qwen35-tiny", "qwen35mtp-tiny"):
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
            **text, tie_word_embeddings=False))
        dtype = torch.float32
    elif name == "qwen35vl-tiny":
        model = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(
            text_config=text, tie_word_embeddings=True,
            vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                           "num_heads": 2, "out_hidden_size": common["hidden_size"]}))
        dtype = torch.bfloat16
    elif name == "qwen35moe-tiny":
        moe = {k: v for k, v in text.items() if k != "intermediate_size"}
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(
            **moe, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=64, shared_expert_intermediate_size=96))
        dtype = torch.float32
    else:
        model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            **text, tie_word_embeddings=False, full_attention_interval=2, num_experts=8,
            num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96,
            mlp_only_layers=[1], norm_topk_prob=True, partial_rotary_factor=0.5))
        dtype = torch.float16
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(directory)
    if name == "qwen35mtp-tiny":
        _add_mtp_head(model.config, directory)


def _add_mtp_head(cfg: Any, directory: Path) -> None:
    """qwen35mtp-tiny: qwen35-tiny plus a multi-token-prediction head under `mtp.` as
    Qwen3.5 checkpoints hold it (fc [H, 2H], the two pre-fc norms, one full-attention
    decoder layer `mtp.layers.0.`, `mtp.norm`), random, written into the checkpoint's
    safetensors file beside the model's tensors."""
    import copy

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    mtp_cfg = copy.deepcopy(cfg)
    mtp_cfg.num_hidden_layers, mtp_cfg.layer_types = 1, ["full_attention"]
    torch.manual_seed(8765)
    layer = transformers.Qwen3_5TextModel(mtp_cfg)
    H = cfg.hidden_size
    extra = {f"mtp.{k}": v for k, v in layer.state_dict().items()
             if not k.startswith("embed_tokens")}
    extra |= {"mtp.fc.weight": torch.randn(H, 2 * H) / (2 * H) ** 0.5,
              "mtp.pre_fc_norm_embedding.weight": torch.zeros(H),
              "mtp.pre_fc_norm_hidden.weight": torch.zeros(H)}
    with torch.no_grad():
        for v in extra.values():
            v.add_(0.1 * torch.randn_like(v))
    path = directory / "model.safetensors"
    tensors = load_file(path)
    save_file({**tensors, **{k: v.contiguous() for k, v in extra.items()}}, path,
              metadata={"format": "pt"})


HYBRID_MODELS = ("qwen35-tiny", "qwen35vl-tiny", "qwen3next-tiny", "qwen35moe-tiny",
                 "qwen35mtp-tiny")


def _make_checkpoint(name: str, directory: Path) -> list[int]:
    """A random-weight checkpoint saved with save_pretrained (fixed seed).

    qwen3-tiny: fp32, untied, q/k norm. llama-tiny: bf16, tied, GQA 4, llama3 rope
    scaling. qwen2-tiny: fp16, tied, q/k/v bias.
    """
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    from ninfer.demo.checkpoint import write_tokenizer_files

    style = "qwen" if name.startswith("qwen") else "llama3"
    facts = write_tokenizer_files(directory, style)
    vocab = (facts["vocab_size"] + 63) // 64 * 64
    common: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=128, intermediate_size=320, num_hidden_layers=2,
        num_attention_heads=4, head_dim=32, max_position_embeddings=1024,
        rms_norm_eps=1e-6, initializer_range=0.08, bos_token_id=facts["bos_token_id"],
        eos_token_id=facts["eos_token_id"])
    if name in HYBRID_MODELS:
        _make_hybrid(name, directory, common)
        return list(facts["eos_token_id"])
    torch.manual_seed(1234)
    if name.startswith("qwen3"):
        config = Qwen3Config(**common, num_key_value_heads=2, rope_theta=1e6,
                             tie_word_embeddings=False)
        model: Any = Qwen3ForCausalLM(config)
        dtype = torch.float32
    elif name.startswith("qwen2"):
        config = Qwen2Config(**common, num_key_value_heads=4, rope_theta=1e4,
                             tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # make the q/k/v biases matter
            for pname, p in model.named_parameters():
                if pname.endswith("proj.bias"):
                    p.copy_(0.5 * torch.randn_like(p))
        dtype = torch.float16  # exercises fp16 checkpoints
    else:
        config = LlamaConfig(**common, num_key_value_heads=1, tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 64},
                             rope_theta=5e5)
        model = LlamaForCausalLM(config)
        dtype = torch.bfloat16  # exercises bf16 checkpoints
    with torch.no_grad():  # norms away from 1 so a skipped norm weight shows
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.to(dtype).save_pretrained(directory)
    return list(facts["eos_token_id"])


def generator_digest(*parts: Any) -> str:
    """What a cached checkpoint was made by: the source of the functions that make it
    (and of the demo tokenizer and corpus they use), their other inputs, and the torch and
    transformers versions. A cached checkpoint whose stamp records another digest is
    rebuilt, so changing the generator can never leave a stale checkpoint in use."""
    from ninfer.demo import checkpoint as demo_checkpoint
    from ninfer.demo import tokenizer as demo_tokenizer

    h = hashlib.sha256()
    for part in (*parts, demo_checkpoint, demo_tokenizer):
        h.update((inspect.getsource(part) if inspect.isfunction(part) or inspect.ismodule(part)
                  else repr(part)).encode())
        h.update(b"\0")
    h.update(f"torch {version('torch')}, transformers {version('transformers')}".encode())
    return h.hexdigest()[:16]


def _cached(ckpt: Path, generator: str) -> dict[str, Any] | None:
    """The stamp of a checkpoint made by `generator`, or None (missing or made otherwise)."""
    stamp = ckpt / "ninfer-test.json"
    if not stamp.exists():
        return None
    facts: dict[str, Any] = json.loads(stamp.read_text())
    return facts if facts.get("generator") == generator else None


@contextmanager
def locked(name: str) -> Iterator[None]:
    """One holder at a time of `name` across the test workers (and concurrent runs)."""
    TEST_MODELS.mkdir(parents=True, exist_ok=True)
    with open(TEST_MODELS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


_SOURCES: list[str] = []


def _sources_digest() -> str:
    """What a compile reads besides its checkpoint and options: the compiler package, the
    templates, the runtime and the target profiles."""
    if not _SOURCES:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for base in ("compiler/ninfer", "templates", "runtime_cpp", "targets"):
            for f in sorted((root / base).rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                    h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
        _SOURCES.append(h.hexdigest())
    return _SOURCES[0]


# The oldest glibc ninfer-server runs on (README, "Standalone"): Ubuntu 22.04's.
GLIBC_FLOOR = (2, 35)
GLIBC_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
              "ld-linux-x86-64.so.2"}


def glibc_needs(binary: Path) -> tuple[list[str], tuple[int, int]]:
    """(the ELF NEEDED entries, the highest GLIBC_x.y symbol version) of `binary`; asserts
    that every entry is one of glibc's libraries and the version is at most GLIBC_FLOOR."""
    import re
    import subprocess

    dyn = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    others = [n for n in needed if n not in GLIBC_LIBS]
    assert not others, f"{binary} needs libraries beyond glibc's: {others}"
    syms = subprocess.run(["objdump", "-T", str(binary)], capture_output=True, text=True,
                          check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")[:2])
                for v in re.findall(r"GLIBC_(\d+\.\d+)", syms)}
    highest = max(versions)
    newer = sorted({line.split()[-1] for line in syms.splitlines()
                    if (m := re.search(r"GLIBC_(\d+)\.(\d+)", line))
                    and (int(m.group(1)), int(m.group(2))) > GLIBC_FLOOR})
    assert highest <= GLIBC_FLOOR, (f"{binary} needs glibc {highest[0]}.{highest[1]}, above the "
                                    f"floor {GLIBC_FLOOR[0]}.{GLIBC_FLOOR[1]}: {newer}")
    return needed, highest


def compile_once(opts: Any) -> None:
    """compile_model(opts), unless opts.out_dir already holds the build of these options,
    checkpoint and sources (made by another worker of this run, or an earlier run)."""
    from ninfer.pipeline import compile_model

    out = Path(opts.out_dir)
    stamp = out / "ninfer-test-build.json"
    made_by = Path(opts.model_dir) / "ninfer-test.json"
    key = hashlib.sha256("\0".join((
        repr(opts), made_by.read_text() if made_by.exists() else "",
        _sources_digest())).encode()).hexdigest()
    with locked(out.name):
        if (stamp.exists() and json.loads(stamp.read_text()).get("key") == key
                and ((out / "ninfer-server").exists() or not opts.build)):
            return
        stamp.unlink(missing_ok=True)
        compile_model(opts)
        stamp.write_text(json.dumps({"key": key}))


def clean_soak(out_dir: Path, tmp_path: Path, requests: int, *args: str) -> dict[str, Any]:
    """`ninfer-bench soak out_dir --requests N args...`, checked to have answered every
    request (completed or hung up by the client) with no failure, drained, with no KV
    block left and RSS flat; its JSON report."""
    from click.testing import CliRunner

    from ninfer.bench.cli import main as bench_main

    out = tmp_path / "soak.json"
    r = CliRunner().invoke(bench_main, ["soak", str(out_dir), "--requests", str(requests),
                                        *args, "--json", str(out)])
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    assert r.exit_code == 0, r.output
    assert res["failed"] == 0 and res["failures"] == []
    assert res["drained"] and res["kv_blocks_used"] == 0
    assert res["completed"] + res["disconnected"] == requests
    assert res["rss_flat"] is True
    return res


# NINFER_TEST_PREBUILT=1: the test models under build/test-models were made on another
# machine and carried here (a lent GPU machine has neither TVM, which is too large to carry,
# nor this project's torch and transformers versions): an existing checkpoint is taken as it
# is, so the builds made from it keep their stamps (scripts/gpu_check.sh prepare-tier).
PREBUILT = bool(os.environ.get("NINFER_TEST_PREBUILT"))


def checkpoint(name: str) -> tuple[Path, list[int]]:
    """The test checkpoint `name` (made once, cached) and its eos token ids."""
    ckpt = TEST_MODELS / f"{name}-checkpoint"
    generator = generator_digest(_make_checkpoint, _make_hybrid, _add_mtp_head, name)
    with locked(ckpt.name):
        facts = _cached(ckpt, generator)
        if facts is None and PREBUILT and (ckpt / "ninfer-test.json").exists():
            # made on the machine that prepared the builds (another torch, transformers)
            facts = json.loads((ckpt / "ninfer-test.json").read_text())
        if facts is None:
            shutil.rmtree(ckpt, ignore_errors=True)
            facts = {"eos_token_ids": _make_checkpoint(name, ckpt), "generator": generator}
            (ckpt / "ninfer-test.json").write_text(json.dumps(facts))
    return ckpt, facts["eos_token_ids"]


def compiled_options(name: str) -> Any:
    """The CompileOptions of compiled(name)'s CPU build."""
    from ninfer.pipeline import CompileOptions

    ckpt, _ = checkpoint(name)
    # An f32 KV cache (the default is f16): these builds are checked against transformers
    # at f32 tolerances. The f16 cache is served end to end by test_cli's default compile
    # and test_quantized's kv:f16 build. The weights keep the default (--weights auto):
    # the llama (bf16) and qwen2 (f16) checkpoints are served in their own dtype, which
    # holds their values exactly (test_parity checks the format and the logits), and bf16
    # weights multiply float32 x (--cpu-bf16-activations f32): the default rounds x to
    # bf16, a drift test_quantized bounds as it does the quantized formats'.
    return CompileOptions(model_dir=ckpt, target="cpu", out_dir=TEST_MODELS / f"{name}-cpu",
                          model_id=name, max_context=MAX_CONTEXT,
                          prefill_chunk=PREFILL_CHUNK, kv_dtype="f32",
                          cpu_bf16_activations="f32")


def compiled(name: str) -> CompiledModel:
    ckpt, eos = checkpoint(name)
    opts = compiled_options(name)
    out = opts.out_dir
    compile_once(opts)
    return CompiledModel(name, ckpt, out, eos,
                         "Qwen3_5ForConditionalGeneration" if name == "qwen35vl-tiny"
                         else "AutoModelForCausalLM")


@pytest.fixture(scope="session")
def qwen3_model() -> CompiledModel:
    return compiled("qwen3-tiny")


TRAIN_STEPS = 300


def _train(base: Path, directory: Path) -> None:
    """`base` trained for TRAIN_STEPS steps of next-token prediction on the demo corpus
    (fixed seeds, 2 threads, ~25 s on 2 cores): its predictions become peaked, as a real
    model's are (perplexity ~22 on held-out text instead of ~3300), so that quantization
    drift is judged on tokens with a clear winner rather than on near-ties."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM

    from ninfer.demo.tokenizer import corpus

    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("ninfer-test.json"))
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = Qwen3ForCausalLM.from_pretrained(base, dtype=torch.float32)
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    ids: list[int] = []
    for paragraph in corpus(seed=3, paragraphs=600):  # the accuracy text set uses seed 7
        ids += tok.encode(paragraph).ids
    data = torch.tensor(ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        x = torch.stack([data[int(s):int(s) + 64] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)


@pytest.fixture(scope="session")
def trained_checkpoint(qwen3_model: CompiledModel) -> Path:
    """The tiny Qwen3 after a short training run (see `_train`); built once, cached."""
    ckpt = TEST_MODELS / "qwen3-trained-checkpoint"
    base = json.loads((qwen3_model.checkpoint / "ninfer-test.json").read_text())["generator"]
    generator = generator_digest(_train, TRAIN_STEPS, base)
    with locked(ckpt.name):
        if _cached(ckpt, generator) is None:
            _train(qwen3_model.checkpoint, ckpt)
            (ckpt / "ninfer-test.json").write_text(json.dumps(
                {"base": qwen3_model.checkpoint.name, "steps": TRAIN_STEPS,
                 "generator": generator}))
    return ckpt


@pytest.fixture(scope="session")
def llama_model() -> CompiledModel:
    return compiled("llama-tiny")


@pytest.fixture(scope="session")
def qwen2_model() -> CompiledModel:
    return compiled("qwen2-tiny")


@pytest.fixture(scope="session")
def qwen35_model() -> CompiledModel:
    return compiled("qwen35-tiny")


@pytest.fixture(scope="session")
def qwen35vl_model() -> CompiledModel:
    return compiled("qwen35vl-tiny")


@pytest.fixture(scope="session")
def qwen3next_model() -> CompiledModel:
    return compiled("qwen3next-tiny")


@pytest.fixture(scope="session")
def qwen35moe_model() -> CompiledModel:
    return compiled("qwen35moe-tiny")


MODEL_FIXTURES = {"qwen3-tiny": "qwen3_model", "llama-tiny": "llama_model",
                  "qwen2-tiny": "qwen2_model", "qwen35-tiny": "qwen35_model",
                  "qwen35vl-tiny": "qwen35vl_model", "qwen3next-tiny": "qwen3next_model"}


@pytest.fixture(scope="session", params=sorted(MODEL_FIXTURES))
def any_model(request: pytest.FixtureRequest) -> CompiledModel:
    return request.getfixturevalue(MODEL_FIXTURES[request.param])


@pytest.fixture(scope="session")
def qwen3_server(qwen3_model: CompiledModel) -> Any:
    from ninfer.runtime import Server

    with Server(qwen3_model.out_dir, threads=2) as srv:
        yield srv


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(scope="session")
def qwen3_yarn_model(qwen3_model: CompiledModel) -> CompiledModel:
    """qwen3-tiny's weights with YaRN rope scaling (Qwen3's long-context setting, here 4x
    over 64 original positions, so the compiled context of MAX_CONTEXT runs past them)."""
    from ninfer.pipeline import CompileOptions

    ckpt = TEST_MODELS / "qwen3-yarn-tiny-checkpoint"
    base = json.loads((qwen3_model.checkpoint / "ninfer-test.json").read_text())
    generator = generator_digest(YARN, base["generator"])
    with locked(ckpt.name):
        _yarn_checkpoint(qwen3_model, ckpt, base, generator)
    out = TEST_MODELS / "qwen3-yarn-tiny-cpu"
    compile_once(CompileOptions(model_dir=ckpt, target="cpu", out_dir=out,
                                model_id="qwen3-yarn-tiny", max_context=MAX_CONTEXT,
                                prefill_chunk=PREFILL_CHUNK, kv_dtype="f32"))
    return CompiledModel("qwen3-yarn-tiny", ckpt, out, base["eos_token_ids"])


def _yarn_checkpoint(qwen3_model: CompiledModel, ckpt: Path, base: dict[str, Any],
                     generator: str) -> None:
    if _cached(ckpt, generator) is None:
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.copytree(qwen3_model.checkpoint, ckpt,
                        ignore=shutil.ignore_patterns("ninfer-test.json"))
        config = json.loads((ckpt / "config.json").read_text())
        config.pop("rope_parameters", None)
        config["rope_scaling"] = YARN
        config["rope_theta"] = 1e6
        (ckpt / "config.json").write_text(json.dumps(config, indent=2))
        (ckpt / "ninfer-test.json").write_text(json.dumps({**base, "generator": generator}))


def send_completion(srv: Any, body: dict[str, Any]) -> socket.socket:
    """POST body to srv's /v1/completions on a raw socket, not waiting for the answer (sent
    while the server is SIGSTOPped, the kernel queues it); read it with read_response."""
    host, port = srv.base_url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def read_response(s: socket.socket) -> dict[str, Any]:
    """The 200 response's JSON body of a send_completion socket (closes it)."""
    raw = b""
    s.settimeout(300)
    while chunk := s.recv(65536):
        raw += chunk
    s.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), raw[:500]
    return json.loads(body)
