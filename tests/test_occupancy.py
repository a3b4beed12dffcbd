"""CUDA occupancy rules from the target profile, checked against hand-computed cases.

Every expected number below is worked out in the comment next to it with the rules of
NVIDIA's occupancy calculator (see ninfer/occupancy/calc.py), from the profile fields.
"""

from __future__ import annotations

import pytest

from ninfer.occupancy.calc import OccupancyError, occupancy, resident_budget
from ninfer.targets import load_target

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def rtx4080s():
    return load_target("rtx4080s")


@pytest.fixture(scope="module")
def rtx4090():
    return load_target("rtx4090")


@pytest.fixture(scope="module")
def h100():
    return load_target("h100")


def test_gdn_split2_schedule_is_one_cta_per_sm_on_4080s(rtx4080s):
    # 512 threads = 16 warps; 74 x 32 = 2368 registers/warp -> 2560 (unit 256);
    # 65536 / 2560 = 25 warps -> 25 // 16 = 1 CTA. Warps alone: 48 // 16 = 3.
    occ = occupancy(rtx4080s, 512, 74, 0)
    assert occ.ctas_per_sm == 1 and occ.limited_by == "registers"
    assert (occ.by_registers, occ.by_warps) == (1, 3)
    assert occ.registers_per_cta == 40960  # 37,888 used, allocated in 256-register units
    assert resident_budget(rtx4080s, occ) == 80


def test_same_schedule_on_4090_has_128_resident_ctas(rtx4090):
    occ = occupancy(rtx4090, 512, 74, 0)
    assert occ.ctas_per_sm == 1
    assert resident_budget(rtx4090, occ) == 128


def test_registers_and_shared_memory_both_allow_two(rtx4080s, h100):
    # 256 threads = 8 warps; 128 x 32 = 4096 registers/warp -> 16 warps -> 2 CTAs.
    # 48 KiB + 1 KiB reserved = 50176 bytes; 102400 // 50176 = 2 CTAs.
    occ = occupancy(rtx4080s, 256, 128, 48 * 1024)
    assert occ.ctas_per_sm == 2
    assert (occ.by_registers, occ.by_smem) == (2, 2)
    assert occ.smem_per_cta == 50176
    # H100: 233472 // 50176 = 4 by shared memory, registers still allow 2.
    occ = occupancy(h100, 256, 128, 48 * 1024)
    assert (occ.ctas_per_sm, occ.limited_by, occ.by_smem) == (2, "registers", 4)


def test_small_blocks_on_h100_are_warp_limited(h100):
    # 128 threads = 4 warps: 64 warps // 4 = 16. Registers: 32 x 32 = 1024/warp ->
    # 64 warps -> 16 CTAs (a tie; warps are reported first). Cap is 32.
    occ = occupancy(h100, 128, 32, 0)
    assert occ.ctas_per_sm == 16 and occ.limited_by == "warps"
    assert (occ.by_warps, occ.by_registers, occ.by_cta_cap) == (16, 16, 32)
    assert resident_budget(h100, occ) == 16 * 132


def test_register_allocation_unit_rounds_per_warp(h100):
    # 33 x 32 = 1056 -> 1280 registers/warp; 65536 // 1280 = 51 warps; 51 // 4 = 12 CTAs.
    occ = occupancy(h100, 128, 33, 0)
    assert (occ.ctas_per_sm, occ.limited_by) == (12, "registers")


def test_shared_memory_rounding_and_reservation(rtx4080s):
    # 64 threads x 32 registers leave registers (32), warps (24) and the cap (24) aside.
    # 24576 + 1024 = 25600 -> 102400 // 25600 = 4; one byte more rounds to 25728 -> 3.
    assert occupancy(rtx4080s, 64, 32, 24576).ctas_per_sm == 4
    occ = occupancy(rtx4080s, 64, 32, 24577)
    assert (occ.ctas_per_sm, occ.limited_by, occ.smem_per_cta) == (3, "shared memory", 25728)


def test_cta_cap_binds_tiny_blocks(rtx4080s):
    # 1 warp x 16 registers: warps 48, registers 128, smem 102400 // 1024 = 100, cap 24.
    occ = occupancy(rtx4080s, 32, 16, 0)
    assert (occ.ctas_per_sm, occ.limited_by) == (24, "CTA cap")


def test_partial_warps_count_as_whole_warps(rtx4080s):
    # 100 threads occupy 4 warps: 48 // 4 = 12 CTAs, though 1536 // 100 = 15 by threads.
    occ = occupancy(rtx4080s, 100, 32, 0)
    assert (occ.ctas_per_sm, occ.limited_by, occ.by_threads) == (12, "warps", 15)


def test_full_block_at_64_registers_fits_once(rtx4080s):
    # 1024 threads = 32 warps x 2048 registers = the whole register file: 1 CTA.
    assert occupancy(rtx4080s, 1024, 64, 0).ctas_per_sm == 1


def test_block_that_fits_no_sm_is_rejected_with_the_limit(rtx4080s):
    # 72 x 32 = 2304 registers/warp; 65536 // 2304 = 28 warps < 32 warps of the block.
    with pytest.raises(OccupancyError, match=r"1024 threads x 72 registers.*registers"):
        occupancy(rtx4080s, 1024, 72, 0)


def test_registers_above_255_rejected(rtx4080s):
    with pytest.raises(OccupancyError, match=r"256 registers per thread exceeds .* 255"):
        occupancy(rtx4080s, 128, 256, 0)


def test_shared_memory_above_opt_in_rejected(rtx4080s, h100):
    with pytest.raises(OccupancyError, match=r"opt-in per-block limit of 101376"):
        occupancy(rtx4080s, 128, 32, 101377)
    assert occupancy(rtx4080s, 128, 32, 101376).ctas_per_sm == 1  # exactly the limit
    assert occupancy(h100, 128, 32, 101377).ctas_per_sm == 2  # 233472 // 102528


def test_too_many_threads_rejected(rtx4080s):
    with pytest.raises(OccupancyError, match=r"2048 threads per block exceeds .* 1024"):
        occupancy(rtx4080s, 2048, 16, 0)


def test_numbers_come_from_the_profile_not_the_arch(rtx4080s):
    # Same arch, half the register file: 32768 // 2560 = 12 warps < 16 -> cannot run.
    half = rtx4080s.with_overrides(registers_per_sm=32768)
    with pytest.raises(OccupancyError, match="registers"):
        occupancy(half, 512, 74, 0)
    fewer = rtx4080s.with_overrides(sm_count=10)
    assert resident_budget(fewer, occupancy(fewer, 512, 74, 0)) == 10


def test_resident_budget_is_capped_by_the_schedule(rtx4090):
    occ = occupancy(rtx4090, 256, 32, 0)  # 48 // 8 = 6 by warps
    assert resident_budget(rtx4090, occ) == 6 * 128
    assert resident_budget(rtx4090, occ, schedule_ctas=100) == 100
    assert resident_budget(rtx4090, occ, schedule_ctas=10_000) == 768


def test_cpu_target_has_no_occupancy():
    with pytest.raises(OccupancyError, match="not a CUDA target"):
        occupancy(load_target("cpu"), 128, 32, 0)


def test_projection_shapes_of_a_hybrid_config():
    """explain --config: the prefill projections of Qwen3.5-27B's published shapes, the
    Gated DeltaNet ones ([q|k|v] 2 x 16 x 128 + 48 x 128, z, the gating projection [b|a]
    of 2 x 48 value heads, out) beside the gated attention's and the MLP's."""
    from pathlib import Path

    from ninfer.occupancy.explain import projection_shapes

    config = Path(__file__).parent.parent / "benchmarks" / "configs" / "qwen3.5-27b.json"
    shapes = {role: (k, n) for role, (k, n, w) in projection_shapes(config).items()
              if w == "float32"}
    assert shapes["gdn_qkv"] == (5120, 10240) and shapes["gdn_z"] == (5120, 6144)
    assert shapes["gdn_ba"] == (5120, 96) and shapes["gdn_out"] == (6144, 5120)
    assert shapes["q_gate"] == shapes["q"] == (5120, 24 * 256)
    assert shapes["k"] == (5120, 4 * 256) and shapes["down"] == (17408, 5120)
    assert set(shapes) == {"q", "k", "v", "o", "gate_up", "down", "q_gate", "gdn_qkv",
                           "gdn_z", "gdn_ba", "gdn_out"}


@pytest.mark.parametrize(("args", "message"), [
    (["--markdown"], "--markdown needs --config"),
    (["--roles", "gdn_ba"], "--roles needs --config"),
    (["--config", "CONFIG", "--k", "512"], "exclude each other"),
    (["--config", "CONFIG", "--markdown", "--plain"], "exclude each other"),
    (["--config", "CONFIG", "--roles", "mtp_fc"], "--roles: mtp_fc not among"),
])
def test_explain_refuses_options_it_would_ignore(args, message):
    """No option is taken and then left unused: each of these fails before any nvcc run."""
    from pathlib import Path

    from click.testing import CliRunner

    from ninfer.occupancy.explain import main

    config = Path(__file__).parent.parent / "benchmarks" / "configs" / "qwen3.5-27b.json"
    args = [str(config) if a == "CONFIG" else a for a in args]
    r = CliRunner().invoke(main, ["--target", "rtx4080s", *args])
    assert r.exit_code != 0 and message in r.output + (r.stderr or ""), r.output
