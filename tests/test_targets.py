"""Target profiles load, validate, and fail with the file and field named."""

from __future__ import annotations

import pytest

from ninfer.targets import TargetError, available_targets, load_target

pytestmark = pytest.mark.unit

SHIPPED = {"cpu": None, "rtx4080s": ("sm_89", 80), "rtx4090": ("sm_89", 128),
           "rtx4090d": ("sm_89", 114), "rtx5090": ("sm_120a", 170), "rtx5080": ("sm_120", 84),
           "h100": ("sm_90", 132), "h200": ("sm_90", 132)}


def test_all_shipped_targets_load():
    assert set(SHIPPED) <= set(available_targets())
    for name, expect in SHIPPED.items():
        t = load_target(name)
        assert t.name == name
        if expect:
            assert (t.arch, t.sm_count) == expect
            assert t.is_cuda and t.max_threads_per_block == 1024


def test_compute_capability_parsed_from_arch():
    assert load_target("rtx5090").compute_capability == (12, 0)
    assert load_target("h100").compute_capability == (9, 0)
    assert load_target("rtx4080s").compute_capability == (8, 9)


def test_stable_hash_distinguishes_profiles():
    hashes = {load_target(n).stable_hash() for n in SHIPPED}
    assert len(hashes) == len(SHIPPED)  # h100 and h200 differ in memory size
    assert load_target("h100").stable_hash() == load_target("h100").stable_hash()


def test_override_changes_hash_and_validates():
    t = load_target("rtx4080s")
    bigger = t.with_overrides(memory_gib=32)
    assert bigger.memory_gib == 32 and bigger.stable_hash() != t.stable_hash()
    with pytest.raises(TargetError, match="memory_gib"):
        t.with_overrides(memory_gib=-1)


def _write(tmp_path, text):
    p = tmp_path / "custom.toml"
    p.write_text(text)
    return str(p)


def test_missing_field_names_file_and_field(tmp_path):
    src = (load_target("rtx4090").source)
    text = "\n".join(ln for ln in open(src).read().splitlines()
                     if not ln.startswith("sm_count"))
    with pytest.raises(TargetError, match=r"custom\.toml: missing field 'sm_count'"):
        load_target(_write(tmp_path, text))


def test_wrong_type_and_unknown_field(tmp_path):
    src = open(load_target("rtx4090").source).read()
    with pytest.raises(TargetError, match="field 'sm_count' has type str"):
        load_target(_write(tmp_path, src.replace("sm_count = 128", 'sm_count = "128"')))
    with pytest.raises(TargetError, match="unknown field"):
        load_target(_write(tmp_path, src + "\nsm_cnt = 3\n"))


def test_inconsistent_shared_memory_rejected(tmp_path):
    src = open(load_target("rtx4090").source).read()
    bad = src.replace("shared_memory_per_block_optin = 101376",
                      "shared_memory_per_block_optin = 200000")
    with pytest.raises(TargetError, match="exceeds shared_memory_per_sm"):
        load_target(_write(tmp_path, bad))


def test_unknown_target_lists_available():
    with pytest.raises(TargetError, match=r"available: .*rtx4080s"):
        load_target("rtx9999")
