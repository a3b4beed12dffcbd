"""CPU run of the device sampler (templates/cuda/sampler.cu.j2) against the host sampler.

The kernel's exact source, as build_cuda_source emits it, runs under cuda_emulation.h
(test_cuda_emulation.compile_emulated). It is checked against the engine's own host code
(runtime_cpp/engine/sampling.cpp compiled into a small shim: the logit edits, argmax,
LogSoftmax) and against a float64 reference of the host sampler's kept set and
distribution (ties broken by lower id). The `work` scratch row holds the processed logits
after a greedy row and the kept weights after a drawn one, so both are compared directly.
Draw frequencies are checked with a chi-square statistic over a fixed set of counters:
the RNG is counter-based (Philox4x32-10), so the test is deterministic.

To add a case: build `Row`s (a row's parameters) and call `sample(rows, logits)`.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from test_cuda_emulation import (
    compile_emulated,
    run_launches,
    shared_library,
    small_block_target,
)

from ninfer.kernels import SamplerSpec
from ninfer.kernels.cuda.lower import CudaModule, build_cuda_source
from ninfer.kernels.cuda.sampler import kernel_symbol, work_name
from ninfer.targets import load_target

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
V = 300
SPEC = SamplerSpec(vocab=V, max_rows=64, max_edits=1024)
TOP = SPEC.top
NEG_INF = np.float32(-np.inf)
MASK, BIAS, REPEAT, OUTPUT = 1, 2, 4, 8

_PHILOX_DRIVER = """
extern "C" uint32_t emu_philox(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1,
                               uint32_t c2, uint32_t c3) {
  return ninfer_sampler::philox(k0, k1, c0, c1, c2, c3);
}
"""

_HOST_SHIM = r"""
#include <cmath>
#include <limits>
#include "engine/sampling.h"
using namespace ninfer;
extern "C" void host_process(float* logits, int vocab, const int32_t* masked, int n_masked,
                             const int32_t* bias_ids, const float* bias, int n_bias,
                             const int32_t* prompt, int n_prompt, const int32_t* output,
                             int n_output, float rep, float freq, float pres) {
  // Engine::process_logits: min_tokens masking, logit_bias, penalties.
  for (int i = 0; i < n_masked; ++i) logits[masked[i]] = -std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.repetition_penalty = rep, p.frequency_penalty = freq, p.presence_penalty = pres;
  for (int i = 0; i < n_bias; ++i) p.logit_bias.emplace_back(bias_ids[i], bias[i]);
  apply_logit_bias(logits, vocab, p);
  TokenCounts counts;
  counts.add_prompt(std::vector<int32_t>(prompt, prompt + n_prompt));
  for (int i = 0; i < n_output; ++i) counts.add_output(output[i]);
  if (p.has_penalties()) counts.apply(logits, vocab, p);
}
extern "C" int host_argmax(const float* logits, int vocab) { return argmax(logits, vocab); }
extern "C" void host_logprobs(const float* logits, int vocab, int token, int n, float* lp,
                              int32_t* ids, float* lps) {
  const LogSoftmax lsm(logits, vocab);
  *lp = lsm.logprob(token);
  const auto top = lsm.top(n);
  for (size_t i = 0; i < top.size(); ++i) ids[i] = top[i].first, lps[i] = top[i].second;
}
"""


@functools.cache
def kernel(target_name: str) -> tuple[ctypes.CDLL, dict]:
    target = small_block_target() if target_name == "small" else load_target(target_name)
    module = build_cuda_source([SPEC], target)
    return compile_emulated(CudaModule(module.source + _PHILOX_DRIVER, module.launches,
                                       module.arch))


@functools.cache
def host() -> ctypes.CDLL:
    """The engine's host sampling code (engine/sampling.cpp) behind _HOST_SHIM."""
    return shared_library(_HOST_SHIM, [f"-I{ROOT / 'runtime_cpp'}"],
                          sources=(ROOT / "runtime_cpp/engine/sampling.cpp",),
                          depends=((ROOT / "runtime_cpp/engine/sampling.h").read_bytes(),))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


@dataclass
class Row:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition: float = 1.0
    logprobs: int = -1
    seed: int = 0
    counter: int = 0
    edits: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    mask: np.ndarray | None = None  # bool [V]: allowed


@dataclass
class Result:
    tokens: np.ndarray  # [n]
    ids: np.ndarray  # [n, 1 + TOP]
    logprobs: np.ndarray  # [n, 1 + TOP]
    work: np.ndarray  # [n, V]


def sample(rows: list[Row], logits: np.ndarray, target: str = "small") -> Result:
    n = len(rows)
    fparams = np.array([[r.temperature, r.top_p, r.min_p, r.repetition] for r in rows],
                       np.float32)
    iparams = np.zeros((n, SamplerSpec.INTS), np.int32)
    edit_ids = np.zeros((SPEC.max_edits, 2), np.int32)
    edit_vals = np.zeros((SPEC.max_edits, 3), np.float32)
    masks = np.zeros((SPEC.max_rows, SPEC.words), np.uint32)
    offset = mask_rows = 0
    for i, r in enumerate(rows):
        for e, (token, flags, bias, freq, pres) in enumerate(r.edits):
            edit_ids[offset + e] = token, flags
            edit_vals[offset + e] = bias, freq, pres
        mask_row = -1
        if r.mask is not None:
            bits = np.zeros(SPEC.words * 32, np.uint64)
            bits[:V] = r.mask
            masks[mask_rows] = (bits.reshape(-1, 32) << np.arange(32, dtype=np.uint64)).sum(1)
            mask_row, mask_rows = mask_rows, mask_rows + 1
        iparams[i] = (r.top_k, offset, len(r.edits), mask_row, r.logprobs, r.seed & 0xFFFFFFFF,
                      r.seed >> 32, r.counter & 0xFFFFFFFF, r.counter >> 32)
        offset += len(r.edits)
    out_ids = np.full((n, TOP + 1), -7, np.int32)
    out_lp = np.full((n, TOP + 1), np.nan, np.float32)
    work = np.full(n * V, np.nan, np.float32)
    logits = np.ascontiguousarray(logits, np.float32)
    run_launches(kernel(target), SPEC, [logits, fparams, iparams, edit_ids, edit_vals,
                                        masks.view(np.int32), out_ids, out_lp], n,
                 scratch={work_name(SPEC): work})
    return Result(out_ids[:, 0].copy(), out_ids, out_lp, work.reshape(n, V))


def reference_kept(q: np.ndarray, r: Row) -> tuple[dict[int, float], bool]:
    """The host sampler's distribution over the processed logits q (float64, ties by lower
    id), and whether a float-rounding-sized change could move its cut (ambiguous)."""
    q64 = q.astype(np.float64)
    best = int(np.argmax(q64))
    if r.temperature <= 0 or r.top_k == 1:
        return {best: 1.0}, False
    w = np.exp((q64 - q64[best]) / r.temperature)
    ambiguous = bool(r.min_p > 0 and np.any(np.abs(w - r.min_p) < 1e-5 * r.min_p))
    w = np.where(w >= r.min_p, w, 0.0)
    order = np.lexsort((np.arange(len(q)), -q64))
    cand = order[:r.top_k] if 0 < r.top_k < len(q) else order
    if r.top_p < 1:
        cum = np.cumsum(w[cand]) / w[cand].sum()
        cut = int(np.argmax(cum >= r.top_p))
        ambiguous |= bool(abs(cum[cut] - r.top_p) < 1e-5
                          or (cut > 0 and abs(cum[cut - 1] - r.top_p) < 1e-5))
        cand = cand[:cut + 1]
    cand = cand[w[cand] > 0]
    return dict(zip(cand.tolist(), (w[cand] / w[cand].sum()).tolist())), ambiguous


def random_logits(rng: np.random.Generator, n: int, ties: bool) -> np.ndarray:
    x = rng.standard_normal((n, V)) * rng.uniform(0.5, 3.0, (n, 1))
    if ties:  # many equal logits, at every cut
        x = np.round(x * 2) / 2
    return x.astype(np.float32)


def test_philox_matches_the_random123_known_answers() -> None:
    lib, _ = kernel("small")
    fn = lib.emu_philox
    fn.argtypes = [ctypes.c_uint32] * 6
    fn.restype = ctypes.c_uint32
    assert fn(0, 0, 0, 0, 0, 0) == 0x6627E8D5
    assert fn(*[0xFFFFFFFF] * 6) == 0x408F276D
    assert fn(0xA4093822, 0x299F31D0, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344) == (
        0xD16CFE09)


@pytest.mark.parametrize("target", ["small", "h200"])
def test_greedy_is_the_host_argmax_and_logprobs_the_host_log_softmax(target: str) -> None:
    rng = np.random.default_rng(1)
    logits = random_logits(rng, 6, ties=True)
    logits[1, :] = 2.5  # every token tied: the first wins
    logits[2, rng.choice(V, 250, replace=False)] = NEG_INF  # the raw row has -inf too
    rows = [Row(temperature=0.0, logprobs=lp) for lp in (0, 1, 5, 20, 3, -1)]
    rows[4].top_k = 1  # top_k 1 is greedy at any temperature
    res = sample(rows, logits, target)
    lib = host()
    for i, row in enumerate(rows):
        assert res.tokens[i] == lib.host_argmax(ptr(logits[i]), V)
        if row.logprobs < 0:
            continue
        lp = ctypes.c_float()
        ids = np.full(TOP, -1, np.int32)
        lps = np.zeros(TOP, np.float32)
        lib.host_logprobs(ptr(logits[i]), V, int(res.tokens[i]), row.logprobs,
                          ctypes.byref(lp), ptr(ids), ptr(lps))
        assert abs(res.logprobs[i, 0] - lp.value) <= 1e-5
        k = row.logprobs
        np.testing.assert_array_equal(res.ids[i, 1:1 + k], ids[:k])
        np.testing.assert_allclose(res.logprobs[i, 1:1 + k], lps[:k], rtol=0, atol=1e-5)
        assert (res.ids[i, 1 + k:] == -1).all()


def test_edits_equal_the_host_logits_processors() -> None:
    """Masks, logit_bias and the three penalties over prompt and output tokens, merged per
    token as the engine merges them: bit for bit the host's processed logits."""
    rng = np.random.default_rng(2)
    logits = random_logits(rng, 4, ties=False)
    rows, want = [], []
    lib = host()
    for i in range(4):
        prompt = rng.choice(V, 40).astype(np.int32)
        output = rng.choice(V, 25).astype(np.int32)
        masked = rng.choice(V, 3, replace=False).astype(np.int32) if i % 2 else np.zeros(0,
                                                                                          np.int32)
        bias_ids = rng.choice(V, 10, replace=False).astype(np.int32)
        bias = rng.uniform(-5, 5, 10).astype(np.float32)
        rep, freq, pres = [(1.3, 0.5, -0.7), (0.8, 0.0, 1.1), (1.0, -1.5, 0.0), (1.0, 0, 0)][i]
        ref = logits[i].copy()
        lib.host_process(ptr(ref), V, ptr(masked), len(masked), ptr(bias_ids), ptr(bias),
                         len(bias_ids), ptr(prompt), len(prompt), ptr(output), len(output),
                         ctypes.c_float(rep), ctypes.c_float(freq), ctypes.c_float(pres))
        allowed = rng.random(V) < 0.8
        ref[~allowed] = NEG_INF
        want.append(ref)
        edits: dict[int, list] = {}
        for t in masked:
            edits.setdefault(int(t), [0, 0.0, 0.0, 0.0])[0] |= MASK
        for t, b in zip(bias_ids, bias):
            e = edits.setdefault(int(t), [0, 0.0, 0.0, 0.0])
            e[0] |= BIAS
            e[1] = float(b)
        penalties = rep != 1 or freq != 0 or pres != 0
        counts = np.bincount(output, minlength=V)
        for t in (set(prompt.tolist()) | set(output.tolist())) if penalties else ():
            e = edits.setdefault(t, [0, 0.0, 0.0, 0.0])
            e[0] |= REPEAT if rep != 1 else 0
            if counts[t]:
                e[0] |= OUTPUT
                e[2] = float(np.float32(freq) * np.float32(counts[t]))
                e[3] = pres
        rows.append(Row(temperature=0.0, repetition=rep, mask=allowed,
                        edits=[(t, *e) for t, e in edits.items()]))
    res = sample(rows, logits)
    for i in range(4):
        np.testing.assert_array_equal(res.work[i].view(np.uint32), want[i].view(np.uint32))
        assert res.tokens[i] == lib.host_argmax(ptr(want[i]), V)


@pytest.mark.parametrize("ties", [False, True])
def test_kept_set_is_the_host_samplers(ties: bool) -> None:
    """top_k, top_p, min_p and their combinations keep exactly the host's candidates, with
    its probabilities, on random rows (rows where float rounding could move a cut are
    counted and must be few)."""
    rng = np.random.default_rng(3 + ties)
    n = 60
    logits = random_logits(rng, n, ties)
    rows = []
    for i in range(n):
        rows.append(Row(temperature=float(rng.choice([0.3, 0.7, 1.0, 1.6])),
                        top_k=int(rng.choice([0, -1, 1, 2, 7, 40, V - 1, V, V + 5])),
                        top_p=float(rng.choice([1.0, 0.9, 0.5, 0.05])),
                        min_p=float(rng.choice([0.0, 0.0, 0.05, 0.3])), seed=i, counter=i))
        if i % 5 == 0:
            rows[-1].mask = rng.random(V) < 0.5
    res = sample(rows, logits)
    ambiguous = 0
    for i, r in enumerate(rows):
        q = logits[i].copy()
        if r.mask is not None:
            q[~r.mask] = NEG_INF
        want, amb = reference_kept(q, r)
        if amb:
            ambiguous += 1
            continue
        assert res.tokens[i] in want
        if r.temperature <= 0 or r.top_k == 1:
            continue
        got = np.flatnonzero(res.work[i] > 0)
        assert got.tolist() == sorted(want), (i, r)
        probs = res.work[i][got] / res.work[i][got].sum()
        np.testing.assert_allclose(probs, [want[t] for t in got.tolist()], rtol=1e-5, atol=1e-7)
    assert ambiguous <= n // 20


@pytest.mark.parametrize("row", [Row(), Row(top_k=5, temperature=0.8), Row(top_p=0.7),
                                 Row(min_p=0.1, top_k=12, top_p=0.95, temperature=1.3)],
                         ids=["plain", "top_k", "top_p", "all"])
def test_draws_follow_the_kept_distribution(row: Row) -> None:
    """2000 draws at counters 0..1999 of one seed: chi-square against the kept
    distribution below its 99.9% point (a fixed outcome: the counters are fixed)."""
    rng = np.random.default_rng(5)
    one = random_logits(rng, 1, ties=False)[0] / 2
    draws = 2000
    rows = [Row(**{**row.__dict__, "seed": 1234, "counter": c}) for c in range(draws)]
    tokens = np.concatenate([sample(rows[i:i + 500], np.tile(one, (500, 1))).tokens
                             for i in range(0, draws, 500)])
    want, amb = reference_kept(one, row)
    assert not amb and set(tokens.tolist()) <= set(want)
    ids = sorted(want, key=want.get, reverse=True)
    expected = np.array([want[t] for t in ids]) * draws
    observed = np.array([(tokens == t).sum() for t in ids], np.float64)
    # pool the tail so every bin expects at least 5 draws
    big = expected >= 5
    exp_b = np.append(expected[big], expected[~big].sum())
    obs_b = np.append(observed[big], observed[~big].sum())
    keep = exp_b > 0
    chi2 = float((((obs_b - exp_b) ** 2)[keep] / exp_b[keep]).sum())
    dof = int(keep.sum()) - 1
    assert dof >= 1
    # Wilson-Hilferty approximation of the chi-square 99.9% quantile
    limit = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < limit, (chi2, limit, dof)


def test_same_seed_and_counter_give_the_same_token() -> None:
    rng = np.random.default_rng(6)
    one = random_logits(rng, 1, ties=False)[0] / 3
    rows = [Row(seed=s, counter=c, top_p=0.95) for s in (7, 2**40 + 7) for c in (0, 1, 2**33)]
    first = sample(rows + rows, np.tile(one, (12, 1))).tokens
    again = sample(rows, np.tile(one, (6, 1))).tokens
    np.testing.assert_array_equal(first[:6], first[6:])
    np.testing.assert_array_equal(first[:6], again)
    assert len(set(first[:6].tolist())) > 1  # seed and counter change the draw


def test_masked_tokens_are_never_drawn_and_all_masked_is_an_error() -> None:
    rng = np.random.default_rng(7)
    logits = random_logits(rng, 1, ties=False)
    logits[0, :10] = 50.0  # the most likely tokens are the masked ones
    allowed = np.ones(V, bool)
    allowed[:10] = False
    edits = [(t, MASK, 0.0, 0.0, 0.0) for t in range(10, 20)]
    rows = [Row(seed=3, counter=c, mask=allowed, edits=edits) for c in range(40)]
    rows += [Row(temperature=0.0, mask=np.zeros(V, bool)),
             Row(seed=1, edits=[(t, MASK, 0.0, 0.0, 0.0) for t in range(V)]),
             Row(seed=1, top_k=3, top_p=0.5, mask=np.zeros(V, bool))]
    res = sample(rows, np.tile(logits, (len(rows), 1)))
    assert ((res.tokens[:40] >= 20) & (res.tokens[:40] < V)).all()
    assert (res.tokens[40:] == -1).all()


def test_launch_is_one_block_per_row_with_the_attention_block_size() -> None:
    _, launches = kernel("small")
    (launch,) = launches[SPEC.name()]
    assert launch.kernel_symbol == kernel_symbol(SPEC)
    assert launch.grid[0].evaluate({"n": 5}) == 5 and launch.block == (64, 1, 1)
    assert [p.name for p in launch.params][-2:] == [work_name(SPEC), "n"]
    assert launch.host_allocs[0].elements.evaluate({"n": 3}) == 3 * V


def test_plan_sampler_holds_the_engines_logprob_limit():
    """The plan's sampler returns as many top logprobs as the engine admits
    (Engine::kMaxLogprobs; SamplePack refuses more at run time)."""
    import re

    from ninfer.plan import SAMPLER_TOP_LOGPROBS

    engine_h = (ROOT / "runtime_cpp/engine/engine.h").read_text()
    m = re.search(r"static constexpr int kMaxLogprobs = (\d+);", engine_h)
    assert m, "kMaxLogprobs not found in engine.h"
    assert SAMPLER_TOP_LOGPROBS == int(m.group(1))

