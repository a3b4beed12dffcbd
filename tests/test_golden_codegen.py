"""Golden generated code: a fixed model and target render to checked-in sources.

A change that alters generated code shows up here as a readable diff. After an
intended change, regenerate with:
    NINFER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden_codegen.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from ninfer.codegen import render_tree
from ninfer.frontend import open_checkpoint
from ninfer.frontend.llama import build_graph
from ninfer.plan import ServeLimits, make_plan
from ninfer.targets import load_target
from test_frontend import make_ckpt

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden" / "qwen2-mini-cpu"
FILES = ("model.cpp", "kernels.h", "launch.cpp")  # CMakeLists.txt holds machine paths


def test_generated_sources_match_golden(tmp_path):
    graph = build_graph(open_checkpoint(make_ckpt(tmp_path / "ckpt")))
    target = load_target("cpu")
    plan = make_plan(graph, target, ServeLimits(max_context=128, max_prefill_chunk=32))
    tree = render_tree(graph, plan, target, "qwen2-mini", {"kernel_object": "kernels.o"},
                       tmp_path / "src", tmp_path / "out")
    for name in FILES:
        got = (tree.directory / name).read_text().replace(target.stable_hash(), "<target-hash>")
        golden = GOLDEN / name
        if os.environ.get("NINFER_UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(got)
        want = golden.read_text()
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{name}", f"generated/{name}"))
        assert not diff, f"generated {name} changed:\n{diff}"
