"""`ninfer-compile` and `ninfer-chat`: the embedded default and clear failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import TEST_MODELS


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.unit
def test_demo_checkpoint_is_deterministic(tmp_path):
    from ninfer.demo.checkpoint import write_demo_checkpoint

    a = write_demo_checkpoint(tmp_path / "a", trained=False)  # training: test_demo.py
    b = write_demo_checkpoint(tmp_path / "b", trained=False)
    names = sorted(p.name for p in a.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "ninfer-demo.json", "tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.unit
@pytest.mark.parametrize(("args", "message"), [
    (["--model", "/nonexistent/model"], "does not exist"),
    (["--target", "nosuchgpu"], "unknown target 'nosuchgpu'"),
    (["--max-context", "100000"], "exceeds the model's max_position_embeddings"),
    (["--memory-gib", "0.001"], "does not fit"),
    (["--prefill-projections", "coop"], "needs a CUDA target"),
    (["--target", "h100", "--kv-dtype", "int8"], "reads f32, f16, bf16 KV caches"),
    (["--target", "h100", "--cpu-gemv-streams", "1"], "applies to the cpu target, not h100"),
    (["--target", "h100", "--cpu-bf16-activations", "f32"],
     "applies to the cpu target, not h100"),
    # a value given is never clamped to another; the old flag spelling still works
    (["--max-context", "256", "--prefill-chunk", "512"],
     "--prefill-chunk 512 must be in [1, --max-context 256]"),
    (["--max-context", "256", "--max-prefill-chunk", "300"],
     "--prefill-chunk 300 must be in [1, --max-context 256]"),
])
def test_compile_errors_are_clear(tmp_path, args, message):
    r = run("-m", "ninfer.cli", "-o", str(tmp_path / "out"), *args)
    assert r.returncode == 1
    assert message in r.stderr


@pytest.mark.e2e
def test_no_build_stops_after_sources_proofs_and_artifact(tmp_path):
    out = tmp_path / "out"
    r = run("-m", "ninfer.cli", "-o", str(out), "--max-context", "512", "--no-build")
    assert r.returncode == 0, r.stderr
    assert (out / "src" / "CMakeLists.txt").exists() and (out / "model.ninfer").exists()
    assert (out / "compile_report.json").exists()
    assert not (out / "ninfer-server").exists() and not (out / "cmake-build").exists()
    assert "not built" in r.stderr and "--no-build: sources in src/" in r.stderr


@pytest.mark.e2e
def test_default_compile_then_chat_prints_reply_and_timings():
    """The quickstart's main job, through the same entry points the README uses."""
    out = TEST_MODELS / "demo-cpu"
    r = run("-m", "ninfer.cli", "-o", str(out), "--max-context", "512",
            "--no-python-module")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out.resolve())
    assert "serve limits: context 512, prefill chunk 512, concurrency 8" in r.stderr
    report = json.loads((out / "compile_report.json").read_text())
    assert report["model_id"] == "ninfer-demo"
    assert report["architecture"] == "Qwen3ForCausalLM"
    assert report["plan"]["kv"]["dtype"] == "f16"  # the default KV cache, as llama.cpp's
    assert set(report["stage_seconds"]) == {"target", "frontend", "plan", "kernels",
                                            "codegen", "artifact", "build", "chat-check"}
    # scripts/demo.sh's question: the trained demo answers it from its corpus and stops
    chat = run("-m", "ninfer.runtime.chat", str(out), "Hello! What can you do?")
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert lines[0] == "user: Hello! What can you do?"
    assert lines[1] == ("assistant: 'Hello! I am the ninfer demo model. I can answer short "
                        "questions about ninfer, GPUs, compilers and everyday facts.'")
    assert "tokens/s" in lines[2] and "reply:" in lines[2] and "finish: stop" in lines[2]


@pytest.mark.e2e
def test_demo_answers_corpus_questions():
    """Greedy replies of the compiled demo (its default f16 KV cache) are the corpus's
    answers, with or without a system message and in a second turn; reuses the build of
    the test above (same options: a cache hit)."""
    from ninfer.demo.train import conversations
    from ninfer.runtime import Server

    out = TEST_MODELS / "demo-cpu"
    r = run("-m", "ninfer.cli", "-o", str(out), "--max-context", "512",
            "--no-python-module")
    assert r.returncode == 0, r.stderr
    answers = {tuple(m["content"] for m in conv[:-1]): conv[-1]["content"]
               for conv in conversations()}
    prompts = [
        ["Hello! Who are you?"],  # ninfer-chat's default question
        ["What is ninfer?"],
        ["What is a GPU?"],
        ["How many days are in a week?"],
        ["What is the capital of France?"],
        ["You are a helpful assistant.", "What is ninfer?"],
        ["What is the capital of France?", "The capital of France is Paris.", "And of Japan?"],
    ]
    with Server(out, threads=2) as srv:
        for contents in prompts:
            roles = ["user", "assistant"] * 2
            if len(contents) == 2:
                roles = ["system", "user"]
            messages = [{"role": role, "content": c} for role, c in zip(roles, contents)]
            body = srv.client.post("/v1/chat/completions", json={
                "messages": messages, "max_tokens": 64, "temperature": 0}).json()
            choice = body["choices"][0]
            assert choice["message"]["content"] == answers[tuple(contents)], contents
            assert choice["finish_reason"] == "stop"


@pytest.mark.unit
def test_runtime_wrapper_does_not_import_tvm():
    r = run("-c", "import sys, ninfer.runtime, ninfer.runtime.engine, ninfer.runtime.chat; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'torch')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.unit
def test_unsupported_chat_template_fails_the_compile_naming_it(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content | from_json }}{% endfor %}")
    r = run("-m", "ninfer.cli", "-o", str(tmp_path / "out"), "--chat-template", str(bad))
    err = " ".join(r.stderr.split())
    assert r.returncode == 1, r.stderr
    assert "line 2: the filter 'from_json' is not supported" in err
    assert not (tmp_path / "out" / "ninfer-server").exists()


def test_engine_module_of_another_compile_is_refused_not_imported(tmp_path):
    """Two engine modules in one build directory (a recompile under another model id that
    did not clean up): load_engine names them instead of importing whichever sorts first."""
    from ninfer.runtime.engine import load_engine_module

    for name in ("ninfer_engine_a.cpython-311-x86_64-linux-gnu.so",
                 "ninfer_engine_b.cpython-311-x86_64-linux-gnu.so"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ImportError, match="holds 2 engine modules"):
        load_engine_module(tmp_path)
