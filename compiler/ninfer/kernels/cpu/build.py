"""CPU kernel library: spec -> scheduled TIR PrimFunc -> one LLVM object file.

The object exports `__tvm_ffi_<spec.name()>` per kernel with TVM's packed FFI ABI
(DLTensor pointers and int64 scalars, in `spec.signature()` order). The host program
provides `__TVMBackendParallelLaunch` (thread pool) and `__TVMBackendAllocWorkspace` /
`__TVMBackendFreeWorkspace`; tensors must be 64-byte aligned and compact row-major.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import tvm
from tvm import tirx

from ninfer.quantize.weight_formats import format_info
from ninfer.targets import Target

from ..spec import KernelSpec, KvStoreSpec, MatmulSpec
from . import attention, bf16dot, elementwise, gdn, kv, matmul, moe, qmatmul
from .common import host_target


def _matmul(spec: MatmulSpec) -> tirx.PrimFunc:
    """Float weights (float32, f16, bf16): matmul; group-quantized: qmatmul."""
    if format_info(spec.wdtype).quantized:
        return qmatmul.qmatmul(spec)
    return matmul.matmul(spec)


def _kv_store(spec: KvStoreSpec) -> tirx.PrimFunc:
    """float32 pools: a row copy; other KV formats: kv."""
    if spec.flat:
        return elementwise.kv_store(spec)
    return kv.kv_store(spec)


_BUILDERS: dict[str, Callable[..., tirx.PrimFunc]] = {
    "embedding": elementwise.embedding,
    "rmsnorm": elementwise.rmsnorm,
    "matmul": _matmul,
    "rope": elementwise.rope,
    "silu_mul": elementwise.silu_mul,
    "add": elementwise.add,
    "attention": attention.attention,
    "kv_store": _kv_store,
    "gdn_recurrent": gdn.gdn_recurrent,
    "gdn_conv": gdn.gdn_conv,
    "gdn_gate": gdn.gdn_gate,
    "gdn_norm": gdn.gdn_norm,
    "sigmoid_gate": elementwise.sigmoid_gate,
    "moe_router": moe.moe_router,
    "moe_combine": moe.moe_combine,
}


def cpu_target() -> tvm.target.Target:
    """LLVM target for this machine's CPU: its model and the features Linux lists
    (common.host_target)."""
    return host_target()


def cpu_primfunc(spec: KernelSpec) -> tirx.PrimFunc:
    """The scheduled PrimFunc of one kernel, exported as `spec.name()`."""
    try:
        build = _BUILDERS[spec.family]
    except KeyError:
        raise NotImplementedError(f"no CPU kernel for family {spec.family!r}") from None
    return build(spec).with_attr("global_symbol", spec.name())


def _module(specs: Iterable[KernelSpec]) -> tvm.IRModule:
    funcs: dict[str, tirx.PrimFunc] = {}
    for spec in specs:
        name = spec.name()
        if name not in funcs:
            funcs[name] = cpu_primfunc(spec)
    if not funcs:
        raise ValueError("no kernel specs given; pass at least one spec")
    return tvm.IRModule(funcs)


# StorageRewrite would re-create the kernels' stack scratch buffers without their
# "disable_lower_builtin" mark (see common.scratch), turning them into per-iteration
# TVMBackendAllocWorkspace calls. The kernels allocate nothing else, so it has nothing
# else to do. TIR's common-subexpression elimination binds every repeated index
# expression of an unrolled block to a variable before LLVM sees it: the q4g64 lanes gemv
# (32 weight and activation offsets a row) then kept them across its task loop on the
# stack and reloaded them every task, at half the speed of the same code without the
# pass (1 row, L2-resident: 22 against 44 GB/s; q8g32 +10%; the other kernels alike
# within noise, RESULTS session 34). LLVM's own CSE and addressing modes do the rest.
_PASS_CONFIG = {"tirx.disable_storage_rewrite": True, "tirx.disable_cse_tir": True}


def build_cpu_module(specs: Iterable[KernelSpec]) -> tvm.runtime.Executable:
    """Compile all specs into one executable; `ex[spec.name()](*args)` runs a kernel."""
    with tvm.transform.PassContext(config=_PASS_CONFIG):
        ex = tvm.compile(_module(specs), target=cpu_target())
    return bf16dot.patch(ex)  # vdpbf16ps where a bf16 matmul placed it


def build_cpu_object(specs: Iterable[KernelSpec], out_path: Path) -> Path:
    """Compile all specs once and write a single relocatable object file to `out_path`."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    build_cpu_module(specs).mod.write_to_file(str(out_path))
    return out_path


def cached_cpu_object(specs: Sequence[KernelSpec], target: Target, cache: Path, dest: Path
                      ) -> Path:
    """Every kernel of `specs` in one object at `dest`. Each kernel is compiled on its own
    and cached under `cache` by the target, the CPU the code is generated for (this host's:
    its instructions, e.g. vdpbf16ps, differ by CPU, and a cache may be copied to another
    host), its name and the sources of the kernels and of the formats they read, so builds
    that share kernels (another KV format, other serve limits) compile only the kernels
    they add; the objects are then joined with `ld -r` (their only common symbols are
    TVM's weak helpers)."""
    sources = hashlib.sha256()
    sources.update(target.stable_hash().encode())
    sources.update(str(cpu_target()).encode())
    package = Path(__file__).resolve().parents[2]  # compiler/ninfer
    for src in sorted(p for d in ("kernels", "quantize") for p in (package / d).rglob("*.py")):
        sources.update(str(src.relative_to(package)).encode())
        sources.update(src.read_bytes())
    unique = {s.name(): s for s in specs}
    if not unique:
        raise ValueError("no kernel specs given; pass at least one spec")
    cache.mkdir(parents=True, exist_ok=True)
    objects = []
    for name in sorted(unique):
        digest = sources.copy()
        digest.update(name.encode())
        cached = cache / f"{name[:64]}-{digest.hexdigest()[:16]}.o"
        if not cached.exists():
            tmp = cached.with_suffix(f".tmp{os.getpid()}.o")
            build_cpu_object([unique[name]], tmp)
            tmp.replace(cached)
        objects.append(str(cached))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = dest.with_suffix(f".tmp{os.getpid()}.o")
    ld = shutil.which("ld")
    if ld is None:
        raise RuntimeError("'ld' (binutils) is needed to join the kernel objects")
    proc = subprocess.run([ld, "-r", "-o", str(tmp_dest), *objects], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"joining the kernel objects failed: {proc.stderr.strip()}")
    if dest.exists() and dest.read_bytes() == tmp_dest.read_bytes():
        tmp_dest.unlink()  # unchanged: keep its time stamp (no relink)
    else:
        tmp_dest.replace(dest)
    return dest
