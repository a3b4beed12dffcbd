"""Checked-in generated headers must match their generators (rerun them if this fails)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ninfer.paths import RUNTIME_DIR

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("script", ["gen_unicode_nfc.py", "gen_unicode_regex.py"])
def test_generated_header_is_current(script):
    tools = RUNTIME_DIR / "tools"
    r = subprocess.run([sys.executable, str(tools / script), "--check"], cwd=tools,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
