"""CPU run of the hybrid models' hand-written CUDA kernels (templates/cuda/gdn.cu.j2): the
Gated DeltaNet conv, gates, recurrence and output norm, the MoE router and combine.

The exact source `build_cuda_source` emits is compiled with g++ against cuda_emulation.h
(test_cuda_emulation.compile_emulated) and launched with the grid and block of its
CudaLaunch, then compared with the float64 references, the in-place states included.
Rows mix sequences the way a step does: a prefill chunk of one slot, decode rows of
others, a slot that comes back after another, a row at position 0 in a slot holding a
stale state (it must start from zeros), a slot outside the pool (clamped).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import replace

import numpy as np
import pytest
from test_cuda_emulation import TARGETS, compile_emulated, run_launches

from ninfer.kernels import reference
from ninfer.kernels.cuda.gdn import chunked_layout, chunked_smem_bytes, recurrent_layout
from ninfer.kernels.cuda.lower import build_cuda_source
from ninfer.kernels.cuda.schedules import cuda_params
from ninfer.kernels.reference import (
    gdn_conv_states,
    gdn_recurrent_states,
    moe_router_parts,
)
from ninfer.kernels.spec import (
    GdnConvSpec,
    GdnGateSpec,
    GdnNormSpec,
    GdnRecurrentSpec,
    KernelSpec,
    MoeCombineSpec,
    MoeRouterSpec,
)

pytestmark = pytest.mark.unit

TOL = 2e-5
CONV = [GdnConvSpec(channels=96, kernel=4, max_seqs=4), GdnConvSpec(channels=300, kernel=2,
                                                                    max_seqs=3)]
RECURRENT = [
    GdnRecurrentSpec(k_heads=2, v_heads=4, k_dim=16, v_dim=16, max_seqs=4),
    GdnRecurrentSpec(k_heads=1, v_heads=3, k_dim=20, v_dim=40, max_seqs=4),  # partial groups
    GdnRecurrentSpec(k_heads=1, v_heads=2, k_dim=128, v_dim=128, max_seqs=4),  # 27B heads
    GdnRecurrentSpec(k_heads=1, v_heads=2, k_dim=128, v_dim=128, max_seqs=2),  # CHUNKED_27B's
]
# The chunked (WY) form (--gdn-prefill chunked): one column tile (v_dim 8), a partial
# last tile (v_dim 40 in tiles of 32 or 16), Qwen3.5-27B's 128 x 128 heads in chunks of 64
CHUNKED = [
    GdnRecurrentSpec(k_heads=2, v_heads=4, k_dim=16, v_dim=8, max_seqs=3, chunk=8),
    GdnRecurrentSpec(k_heads=1, v_heads=3, k_dim=20, v_dim=40, max_seqs=4, chunk=16),
]
CHUNKED_27B = GdnRecurrentSpec(k_heads=1, v_heads=2, k_dim=128, v_dim=128, max_seqs=2, chunk=64)
GATE = [GdnGateSpec(v_heads=6)]
NORM = [GdnNormSpec(v_heads=3, v_dim=40, eps=1e-6), GdnNormSpec(v_heads=2, v_dim=128)]
ROUTER = [MoeRouterSpec(experts=8, top_k=2), MoeRouterSpec(experts=64, top_k=6, normalize=False),
          MoeRouterSpec(experts=512, top_k=10)]
COMBINE = [MoeCombineSpec(hidden=96, top_k=2, rows=40), MoeCombineSpec(hidden=300, top_k=3,
                                                                       rows=60)]
ALL: list[KernelSpec] = [*CONV, *RECURRENT, *CHUNKED, CHUNKED_27B, *GATE, *NORM, *ROUTER,
                         *COMBINE]


@functools.cache
def emulated(target_name: str):
    return compile_emulated(build_cuda_source(ALL, TARGETS[target_name]()))


def _rng(spec: KernelSpec) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(spec.name().encode()))


def _rows(max_seqs: int) -> tuple[np.ndarray, np.ndarray]:
    """(pos, slot) of one step: slot 1's 5-row chunk from 0, decode rows of slots 0 and 2,
    slot 1 again, slot 2 restarting at 0 (its stale state must not leak), a clamped slot."""
    slot = [1, 1, 1, 1, 1, 0, 2, 1, 2, 0, 2, max_seqs + 3]
    pos = [0, 1, 2, 3, 4, 7, 3, 5, 0, 8, 1, 2]
    return np.array(pos, np.int32), np.array(slot, np.int32)


def _no_save(n: int) -> np.ndarray:
    return np.full(n, -1, np.int32)


def _close(got: np.ndarray, want: np.ndarray, tol: float = TOL) -> None:
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= tol, f"max relative error {err:.3g} > {tol:g}"


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
@pytest.mark.parametrize("spec", CONV, ids=lambda s: s.name())
def test_conv_matches_reference(target_name: str, spec: GdnConvSpec) -> None:
    rng = _rng(spec)
    pos, slot = _rows(spec.max_seqs)
    n = len(pos)
    x = rng.standard_normal((n, spec.channels)).astype(np.float32)
    w = (rng.standard_normal((spec.channels, spec.kernel)) * 0.5).astype(np.float32)
    state = rng.standard_normal((spec.max_seqs, spec.kernel - 1, spec.channels)).astype(
        np.float32)
    save = _no_save(n)
    want = reference(spec, x, w, pos, slot, save, state)
    want_state = gdn_conv_states(spec, x, w, pos, slot, save, state)
    out = np.full((n, spec.channels), np.nan, np.float32)
    got_state = state.copy()
    run_launches(emulated(target_name), spec, [x, w, pos, slot, save, got_state, out], n)
    _close(out, want)
    _close(got_state, want_state)


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
@pytest.mark.parametrize("spec", RECURRENT, ids=lambda s: s.name())
def test_recurrence_matches_reference(target_name: str, spec: GdnRecurrentSpec) -> None:
    rng = _rng(spec)
    pos, slot = _rows(spec.max_seqs)
    n = len(pos)
    qkv = rng.standard_normal((n, spec.channels)).astype(np.float32)
    H = spec.v_heads
    a, b = rng.standard_normal((n, H)), rng.standard_normal((n, H))
    g = -np.exp(np.log(rng.uniform(0.01, 4, H))) * np.log1p(np.exp(a + 1.0))
    gb = np.concatenate([g, 1 / (1 + np.exp(-b))], axis=1).astype(np.float32)
    state = rng.standard_normal((spec.max_seqs, H, spec.k_dim, spec.v_dim)).astype(np.float32)
    save = _no_save(n)
    want = reference(spec, qkv, gb, pos, slot, save, state)
    want_state = gdn_recurrent_states(spec, qkv, gb, pos, slot, save, state)
    out = np.full((n, H, spec.v_dim), np.nan, np.float32)
    got_state = state.copy()
    run_launches(emulated(target_name), spec, [qkv, gb, pos, slot, save, got_state, out], n)
    _close(out, want)
    _close(got_state, want_state)


def _recurrence_inputs(spec: GdnRecurrentSpec, pos: np.ndarray, rng: np.random.Generator
                      ) -> list[np.ndarray]:
    n, H = len(pos), spec.v_heads
    qkv = rng.standard_normal((n, spec.channels)).astype(np.float32)
    a, b = rng.standard_normal((n, H)), rng.standard_normal((n, H))
    g = -rng.uniform(0.01, 4, H) * np.log1p(np.exp(a + 1.0))
    gb = np.concatenate([g, 1 / (1 + np.exp(-b))], axis=1).astype(np.float32)
    state = rng.standard_normal((spec.max_seqs, H, spec.k_dim, spec.v_dim)).astype(np.float32)
    return [qkv, gb, state]


def _run_recurrence(target_name: str, spec: GdnRecurrentSpec, qkv: np.ndarray, gb: np.ndarray,
                    pos: np.ndarray, slot: np.ndarray, state: np.ndarray,
                    save: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    out = np.full((len(pos), spec.v_heads, spec.v_dim), np.nan, np.float32)
    got_state = state.copy()
    save = _no_save(len(pos)) if save is None else save
    run_launches(emulated(target_name), spec, [qkv, gb, pos, slot, save, got_state, out],
                 len(pos))
    return out, got_state


# (pos, slot) of the chunked form's steps: _rows (a 5-row segment from 0 in the chunked form,
# decode rows row by row, a restart, a clamped slot); a prompt from position 5 across chunk
# boundaries with a decode row of another slot inside it, then slot 2 restarting with 21 rows
CHUNKED_ROWS = {
    "mixed": None,
    "chunks": ([*range(5, 32), 40, *range(32, 46), *range(21)],
               [1] * 27 + [0] + [1] * 14 + [2] * 21),
}


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
@pytest.mark.parametrize("rows", CHUNKED_ROWS, ids=str)
@pytest.mark.parametrize("spec", CHUNKED, ids=lambda s: s.name())
def test_chunked_recurrence_matches_reference(target_name: str, rows: str,
                                              spec: GdnRecurrentSpec) -> None:
    """The chunked kernel (segments of >= GDN_CHUNK_MIN_ROWS rows in the WY form, the
    others row by row on the column tile) against the float64 recurrence, states in place;
    slots no row names keep their state."""
    given = CHUNKED_ROWS[rows]
    pos, slot = _rows(spec.max_seqs) if given is None else (np.array(given[0], np.int32),
                                                           np.array(given[1], np.int32))
    qkv, gb, state = _recurrence_inputs(spec, pos, _rng(spec))
    out, got_state = _run_recurrence(target_name, spec, qkv, gb, pos, slot, state)
    _close(out, reference(spec, qkv, gb, pos, slot, _no_save(len(pos)), state))
    _close(got_state, gdn_recurrent_states(spec, qkv, gb, pos, slot, _no_save(len(pos)), state))
    untouched = sorted(set(range(spec.max_seqs)) - {min(max(s, 0), spec.max_seqs - 1)
                                                    for s in slot})
    assert np.array_equal(got_state[untouched], state[untouched])


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
def test_chunked_recurrence_at_27b_head_dims(target_name: str) -> None:
    """Qwen3.5-27B's 128 x 128 heads in chunks of 64 (column tiles of 32 on the H200, of 16
    within sm_89's 99 KiB of shared memory per block): a prompt from position
    37 (segments of 27, 64 and 59 rows) and 3 decode rows against the float64 recurrence
    and the row-by-row CUDA kernel; split at position 64 into two launches it gives the
    same bits (segments are cut at absolute positions, as the scheduler aligns steps)."""
    spec = CHUNKED_27B
    pos = np.array([*range(37, 190)], np.int32)
    slot = np.ones(len(pos), np.int32)
    qkv, gb, state = _recurrence_inputs(spec, pos, _rng(spec))
    out, got_state = _run_recurrence(target_name, spec, qkv, gb, pos, slot, state)
    _close(out, reference(spec, qkv, gb, pos, slot, _no_save(len(pos)), state))
    _close(got_state, gdn_recurrent_states(spec, qkv, gb, pos, slot, _no_save(len(pos)), state))
    row_by_row = replace(spec, chunk=1)
    assert row_by_row in RECURRENT
    want, _ = _run_recurrence(target_name, row_by_row, qkv, gb, pos, slot, state)
    _close(out, want)
    cut = 64 - 37
    first, mid = _run_recurrence(target_name, spec, qkv[:cut], gb[:cut], pos[:cut],
                                 slot[:cut], state)
    second, end = _run_recurrence(target_name, spec, qkv[cut:], gb[cut:], pos[cut:],
                                  slot[cut:], mid)
    assert np.array_equal(np.concatenate([first, second]), out)
    assert np.array_equal(end, got_state)


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
@pytest.mark.parametrize("spec", [*CONV, *RECURRENT, *CHUNKED, CHUNKED_27B],
                         ids=lambda s: s.name())
def test_verify_step_saves_each_draft_rows_state(target_name: str, spec: KernelSpec) -> None:
    """Speculative decoding's verify step: slot 0's last token and its drafts (5 rows at
    consecutive positions) beside a decode row of slot 1, the states after slot 0's first
    rows copied into scratch slots, as the float64 reference says; and through the saved
    rows, bitwise what plain decoding (a launch per row) gives, outputs and saved states
    (in the chunked kernel a saved row ends its segment, so the engine's draft rows, all
    saved but the last, run row by row as decode rows do)."""
    n_seq = spec.max_seqs
    pos = np.array([20, 21, 22, 23, 24, 9], np.int32)
    slot = np.array([0, 0, 0, 0, 0, 1], np.int32)
    save = np.array([n_seq - 1, n_seq - 2 if n_seq > 3 else -1, -1, -1, -1, -1], np.int32)
    if n_seq <= 2:
        slot[-1] = 0
        pos[-1] = 25
    rng = _rng(spec)
    if isinstance(spec, GdnConvSpec):
        x = rng.standard_normal((len(pos), spec.channels)).astype(np.float32)
        w = (rng.standard_normal((spec.channels, spec.kernel)) * 0.5).astype(np.float32)
        state = rng.standard_normal((n_seq, spec.kernel - 1, spec.channels)).astype(np.float32)
        out = np.full((len(pos), spec.channels), np.nan, np.float32)
        got_state = state.copy()
        run_launches(emulated(target_name), spec, [x, w, pos, slot, save, got_state, out],
                     len(pos))
        _close(out, reference(spec, x, w, pos, slot, save, state))
        _close(got_state, gdn_conv_states(spec, x, w, pos, slot, save, state))
        return
    assert isinstance(spec, GdnRecurrentSpec)
    qkv, gb, state = _recurrence_inputs(spec, pos, rng)
    out, got_state = _run_recurrence(target_name, spec, qkv, gb, pos, slot, state, save)
    _close(out, reference(spec, qkv, gb, pos, slot, save, state))
    _close(got_state, gdn_recurrent_states(spec, qkv, gb, pos, slot, save, state))
    # the same bits as plain decoding (one launch per row) through the last saved row (the
    # rows after it may form a segment of the chunked form), and each saved state
    carried = state
    for i in range(int(np.flatnonzero(save >= 0).max()) + 1):
        one_out, carried = _run_recurrence(target_name, spec, qkv[i:i + 1], gb[i:i + 1],
                                           pos[i:i + 1], slot[i:i + 1], carried)
        assert np.array_equal(out[i], one_out[0]), f"row {i}"
        if save[i] >= 0:
            assert np.array_equal(got_state[save[i]], carried[slot[i]]), f"state after row {i}"


def test_chunked_recurrence_tile_follows_the_targets_shared_memory() -> None:
    """The column tile is the widest whose shared memory fits the target's opt-in limit per
    block: 32 columns on the H200 (227 KiB), 16 on sm_89 (99 KiB); a chunk whose q and k
    rows alone exceed the limit is refused with the numbers."""
    h200, ada = (cuda_params(TARGETS[name]()) for name in ("h200", "rtx4090"))
    tile, threads, smem = chunked_layout(CHUNKED_27B, h200)
    assert tile == 32 and smem == chunked_smem_bytes(CHUNKED_27B, 32, threads)
    assert smem <= h200.max_dynamic_smem
    tile, threads, smem = chunked_layout(CHUNKED_27B, ada)
    assert tile == 16 and smem <= ada.max_dynamic_smem
    assert chunked_smem_bytes(CHUNKED_27B, 32, threads) > ada.max_dynamic_smem
    wide = replace(CHUNKED_27B, k_dim=256)
    with pytest.raises(NotImplementedError, match=r"needs \d+ bytes of shared memory"):
        chunked_layout(wide, ada)


@pytest.mark.parametrize("target_name", ["h200", "rtx4090"])
def test_recurrence_layout_covers_every_state_element(target_name: str) -> None:
    params = cuda_params(TARGETS[target_name]())
    for spec in RECURRENT:
        tx, kg, kpt = recurrent_layout(spec, params)
        assert tx >= spec.v_dim and tx % 32 == 0 and kg * kpt >= spec.k_dim
        assert (kg - 1) * kpt < spec.k_dim  # no group without rows
        assert tx * kg <= params.recurrent_threads


def test_recurrence_block_follows_the_target() -> None:
    """The block size comes from the target (its register file and block limit): a
    target of 64-thread blocks gets 64-thread recurrence blocks, and a value head wider
    than its block is refused, naming the limit."""
    small = cuda_params(TARGETS["small"]())
    assert small.recurrent_threads == 64
    tx, kg, _ = recurrent_layout(RECURRENT[0], small)
    assert tx * kg <= 64
    with pytest.raises(NotImplementedError, match="exceeds the 64 threads"):
        recurrent_layout(RECURRENT[2], small)


@pytest.mark.parametrize("spec", GATE, ids=lambda s: s.name())
def test_gates_match_reference(spec: GdnGateSpec) -> None:
    rng = _rng(spec)
    n = 7
    ba = (rng.standard_normal((n, 2 * spec.v_heads)) * 4).astype(np.float32)
    a_log = np.log(rng.uniform(0.01, 16, spec.v_heads)).astype(np.float32)
    dt_bias = rng.uniform(0.5, 1.5, spec.v_heads).astype(np.float32)
    out = np.full((n, 2 * spec.v_heads), np.nan, np.float32)
    run_launches(emulated("h200"), spec, [ba, a_log, dt_bias, out], n)
    _close(out, reference(spec, ba, a_log, dt_bias))


@pytest.mark.parametrize("spec", NORM, ids=lambda s: s.name())
def test_output_norm_matches_reference(spec: GdnNormSpec) -> None:
    rng = _rng(spec)
    n, width = 5, spec.v_heads * spec.v_dim
    o, z = (rng.standard_normal((n, width)).astype(np.float32) for _ in range(2))
    weight = rng.uniform(0.5, 1.5, spec.v_dim).astype(np.float32)
    out = np.full((n, width), np.nan, np.float32)
    run_launches(emulated("h200"), spec, [o, z, weight, out], n)
    _close(out, reference(spec, o, z, weight))


@pytest.mark.parametrize("spec", ROUTER, ids=lambda s: s.name())
def test_router_matches_reference(spec: MoeRouterSpec) -> None:
    """Top-k ids in descending order, ties to the lower id (row 0 is all equal, row 1 has
    a tied pair at the cut), weights renormalised when the spec says."""
    rng = _rng(spec)
    n = 9
    logits = rng.standard_normal((n, spec.experts)).astype(np.float32)
    logits[0] = 0.5
    logits[1, [3, 5]] = logits[1].max() + 1
    ids = np.full((n, spec.top_k), -1, np.int32)
    weights = np.full((n, spec.top_k), np.nan, np.float32)
    run_launches(emulated("h200"), spec, [logits, ids, weights], n)
    want_ids, want_w = moe_router_parts(spec, logits)
    np.testing.assert_array_equal(ids, want_ids)
    _close(weights, want_w)
    assert list(ids[0]) == list(range(spec.top_k)) and list(ids[1, :2]) == [3, 5]


@pytest.mark.parametrize("spec", COMBINE, ids=lambda s: s.name())
def test_combine_matches_reference(spec: MoeCombineSpec) -> None:
    rng = _rng(spec)
    n = spec.rows // spec.top_k
    y = rng.standard_normal((spec.rows, spec.hidden)).astype(np.float32)
    pos = rng.permutation(spec.rows).astype(np.int32).reshape(n, spec.top_k)
    w = rng.uniform(0, 1, (n, spec.top_k)).astype(np.float32)
    x = rng.standard_normal((n, spec.hidden)).astype(np.float32)
    gate = (rng.standard_normal(spec.hidden) * 0.1).astype(np.float32)
    shared = rng.standard_normal((n, spec.hidden)).astype(np.float32)
    out = np.full((n, spec.hidden), np.nan, np.float32)
    run_launches(emulated("h200"), spec, [y, pos, w, x, gate, shared, out], n)
    _close(out, reference(spec, y, pos, w, x, gate, shared))
