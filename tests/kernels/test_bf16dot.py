"""The bf16 CPU matmul's vdpbf16ps path (kernels.cpu.bf16dot) and its FMA twin.

The IR rewrite is checked on text, so it runs on every host; the builds compare the
instruction with the two FMAs that every other host runs, bit for bit, where the host has
AVX512_BF16 (elsewhere only the FMA path can run, and the other kernel tests cover it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tvm

from ninfer.kernels import MatmulSpec, build_cpu_module, build_cpu_object, reference
from ninfer.kernels.cpu import bf16dot, matmul
from ninfer.quantize import weight_formats as quant

pytestmark = pytest.mark.unit

CALL = ("  %9 = tail call <32 x float> @ninfer_dpbf16ps_512(<32 x float> %acc.0, "
        "<32 x i16> %3, <32 x i16> zeroinitializer, <2 x i16> %x.1), !dbg !50")
ROUND = "  %4 = tail call <16 x i16> @ninfer_cvtneps2bf16_512(<16 x float> %v) #3, !dbg !7"
DECLARE = ("declare <32 x float> @ninfer_dpbf16ps_512(<32 x float>, <32 x i16>, <32 x i16>, "
           "<2 x i16>) local_unnamed_addr")


def test_the_rewrite_makes_each_call_the_intrinsic() -> None:
    text, sites = bf16dot.rewrite_ir("\n".join(["define void @f() {", CALL, ROUND, "}",
                                                DECLARE,
                                                "declare <16 x i16> @ninfer_cvtneps2bf16_512("
                                                "<16 x float>)"]))
    assert sites == 2
    assert "ninfer_" not in text
    assert text.count("call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(") == 2
    assert "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, " \
           "<32 x bfloat>, <32 x bfloat>)" in text
    assert "fptrunc <16 x float> %v to <16 x bfloat>" in text
    # the result keeps its name and its debug location; the low half's first pair is
    # (even[0], odd[0]), the high half's (even[4], odd[4])
    assert "  %9 = shufflevector <16 x float>" in text and text.count("!dbg !50") == 1
    assert "<32 x i32> <i32 0, i32 32, i32 1, i32 33, i32 2, i32 34, i32 3, i32 35, " \
           "i32 8, i32 40," in text
    assert "<32 x i32> <i32 4, i32 36, i32 5, i32 37," in text


def test_pair_columns_are_a_permutation_within_128_bit_lanes() -> None:
    cols = bf16dot.PAIR_COLUMNS
    assert sorted(cols) == list(range(32))
    # lane l of either half reads columns of the same 128-bit lane of 8 weights
    assert all(c // 8 == lane % 16 // 4 for lane, c in enumerate(cols))


def test_the_rewrite_refuses_what_it_does_not_know() -> None:
    with pytest.raises(RuntimeError, match="not a call"):
        bf16dot.rewrite_ir("  store ptr @ninfer_dpbf16ps_512, ptr %p")
    bad = CALL.replace("<2 x i16> %x.1", "<4 x i16> %x.1")
    with pytest.raises(RuntimeError, match="unexpected operands"):
        bf16dot.rewrite_ir(bad)


def test_a_module_without_placeholders_is_left_alone() -> None:
    spec = MatmulSpec(k=64, n_out=64, wdtype="f16", layout="panels")
    ex = build_cpu_module([spec])
    assert bf16dot.patch(ex) is ex


def _inputs(k: int, n_out: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * np.exp(rng.uniform(-4, 4, (n, 1)))).astype(np.float32)
    w = rng.standard_normal((n_out, k)).astype(np.float32)
    return [x, quant.pack(w, "bf16", "panels")["w"], rng.standard_normal(n_out).astype(np.float32)]


def _run(ex: tvm.runtime.Executable, spec: MatmulSpec, args: list[np.ndarray]) -> np.ndarray:
    out = tvm.runtime.tensor(np.full((len(args[0]), spec.n_out), np.nan, np.float32))
    ex[spec.name()](*(tvm.runtime.tensor(a) for a in args), out)
    return out.numpy()


@pytest.mark.parametrize("k", [2101, 2048, 7])
def test_vdpbf16ps_and_two_fmas_give_the_same_bits(monkeypatch: pytest.MonkeyPatch,
                                                   k: int) -> None:
    """The instruction and its FMA twin, both schedules, 1 to 9 rows (k = 2101 spans two
    1024-k blocks and ends in a single k; 7 is one short block): the same bits, within float32
    rounding of the float64 reference with x rounded to bf16."""
    if not matmul.use_dpbf16():
        pytest.skip("no AVX512_BF16 on this host: only the FMA path can run")
    n_out = 64 * 2 + 10  # two whole panels and a padded one
    specs = [MatmulSpec(k=k, n_out=n_out, bias=True, schedule=s, wdtype="bf16",
                        layout="panels", x_bf16=True) for s in ("gemv", "gemm")]
    dp = build_cpu_module(specs)
    monkeypatch.setattr(matmul, "use_dpbf16", lambda: False)
    fma = build_cpu_module(specs)
    args = _inputs(k, n_out, 9, k)
    want = _run(fma, specs[1], args)
    ref = reference(specs[1], *args)
    assert np.linalg.norm(want - ref) / np.linalg.norm(ref) <= 1e-5
    for ex in (dp, fma):
        for spec in specs:
            for n in (1, 2, 3, 5, 9):
                got = _run(ex, spec, [args[0][:n], *args[1:]])
                assert np.array_equal(got, want[:n]), (spec.name(), n)


def test_the_object_holds_the_instructions(tmp_path: Path) -> None:
    if not matmul.use_dpbf16():
        pytest.skip("no AVX512_BF16 on this host: the bf16 kernels use FMAs")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    spec = MatmulSpec(k=256, n_out=64, wdtype="bf16", layout="panels", schedule="gemm",
                      x_bf16=True)
    obj = build_cpu_object([spec], tmp_path / "k.o")
    asm = subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    assert "vdpbf16ps" in asm and "vcvtneps2bf16" in asm
    assert "ninfer_" not in subprocess.run([objdump, "-t", str(obj)], capture_output=True,
                                           text=True, check=True).stdout


def test_x_bf16_is_for_bf16_panels_only() -> None:
    assert MatmulSpec(k=64, n_out=64, wdtype="bf16", layout="panels",
                      x_bf16=True).name().endswith("_bf16_p64_xbf16_gemv")
    for wdtype, layout in (("f16", "panels"), ("bf16", "rows"), ("q8g32", "rows")):
        with pytest.raises(ValueError, match="x_bf16 is for bf16 weights in the panels"):
            MatmulSpec(k=64, n_out=64, wdtype=wdtype, layout=layout, x_bf16=True)


def test_stack_frames_do_not_grow_with_k(tmp_path: Path) -> None:
    """x is rounded into a stack buffer XS_K values at a time: the frames of the gemv (all
    of k in one pass) and of the gemm stay small for a 70B-sized k (28672: 1.5 MB when
    the buffer held all of k)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    specs = [MatmulSpec(28672, 64 * 2 + 10, False, s, "bf16", "panels", 0, True)
             for s in ("gemv", "gemm")]
    obj = build_cpu_object(specs, tmp_path / "k.o")
    asm = subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    frames = [int(m, 16) for m in re.findall(r"sub\s+\$0x([0-9a-f]+),%rsp", asm)]
    assert frames and max(frames) < 32 * 1024, max(frames)


def test_the_kernel_cache_is_keyed_by_the_host_cpu(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """The cached objects hold this CPU's instructions (vdpbf16ps, AVX-512): a cache
    copied to another host must not hand them over."""
    from ninfer.kernels.cpu.build import cached_cpu_object
    from ninfer.targets import load_target

    spec = MatmulSpec(k=64, n_out=64, wdtype="f16", layout="panels")
    cache = tmp_path / "cache"
    cached_cpu_object([spec], load_target("cpu"), cache, tmp_path / "a.o")
    other = "haswell" if tvm.target.codegen.llvm_get_system_cpu() != "haswell" else "znver4"
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: other)
    cached_cpu_object([spec], load_target("cpu"), cache, tmp_path / "b.o")
    assert len(list(cache.glob("*.o"))) == 2


def test_the_target_follows_the_flags_linux_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLVM names the CPU model; a hypervisor may report a model that lacks features the
    guest has (the Intel VM of RESULTS session 23: "rocketlake" with AVX512_BF16 and FP16)
    or hide a feature the model implies: the target follows /proc/cpuinfo's flags both
    ways, and the kernels with it."""
    from tvm.target import codegen

    from ninfer.kernels.cpu import build, common

    flags = common.host_flags()
    assert flags is None or "fpu" in flags  # every x86-64 Linux lists it

    def host(cpu: str, listed: set[str]) -> dict:
        monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: cpu)
        monkeypatch.setattr(common, "host_flags", lambda: frozenset(listed))
        common.host_has.cache_clear()
        return dict(common.host_target_config())

    base = {"fpu", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
            "avx512cd", "avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
            "avx512_vpopcntdq", "avx512ifma", "gfni", "vaes", "vpclmulqdq"}
    try:
        config = host("rocketlake", base | {"avx512_bf16"})
        assert config["mattr"] == ("+avx512bf16",)
        assert common.host_has("avx512bf16") and matmul.use_dpbf16()
        assert "+avx512bf16" in str(build.cpu_target())
        config = host("sapphirerapids", base - {"avx512vbmi"})  # no bf16, fp16, avxvnni
        assert {"-avx512bf16", "-avx512fp16", "-avxvnni", "-avx512vbmi"} <= set(config["mattr"])
        assert not common.host_has("avx512bf16") and not matmul.use_dpbf16()
        assert common.host_has("avx512vnni")
        assert "mattr" not in host("rocketlake", base)  # the model's set as listed
        monkeypatch.setattr(common, "host_flags", lambda: None)  # nothing to ask: the model
        assert "mattr" not in dict(common.host_target_config())
    finally:
        common.host_has.cache_clear()
