"""CUDA kernels: spec -> te_defs PrimFunc -> per-target schedule -> standalone CUDA source.

`build_cuda_source(specs, target)` runs TVM's TIR pipeline by hand and stops before host
code generation: the device module becomes one CUDA translation unit (all kernels), and
the host functions TVM would have compiled are read instead for what a launcher needs,
per kernel in launch order: its symbol, its parameters in kernel order, grid and block
dimensions, the dynamic shared memory size and any scratch buffers the host must
allocate. Sizes are typed expressions over the spec's symbolic sizes (`n`), built from
the host code's TIR (module.py, ninfer.kernels.launch).

Paged attention, KV-cache stores (attention.py, templates/cuda/paged_attention.cu.j2),
group-quantized matmuls (qmatmul.py), the device sampler (sampler.py, over a scratch
row per logits row) and the hybrid models' Gated DeltaNet and MoE kernels (gdn.py) are
hand-written CUDA: their source is
appended to the same translation unit and their launches are described the same way
(parameters in spec.signature() order, then `n`; attention split over its keys is two
launches, which add their scratch and the `splits` expression).

Kernel symbols are `<spec.name()>_kernel`, then `_kernel_1`, ... when one spec lowers to
several kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx.build import split_host_device_mods

from ninfer.targets import Target

from ..launch import ONE, ZERO, Add, Const, Expr, FloorDiv, Mod, Mul, N, Sub, Var
from ..spec import (
    AddSpec,
    AttentionSpec,
    EmbeddingSpec,
    KernelSpec,
    MatmulSpec,
    RMSNormSpec,
    RopeSpec,
    SamplerSpec,
    SigmoidGateSpec,
    SiluMulSpec,
)
from ..te_defs import te_primfunc
from . import attention, gdn, qmatmul, sampler
from . import schedules as cs
from .module import CudaLaunch, CudaModule, CudaParam, HostAlloc


def cuda_target(target: Target) -> tvm.target.Target:
    """TVM CUDA target for a ninfer GPU profile (host "c": host code is never compiled)."""
    if not target.is_cuda:
        raise ValueError(f"target {target.name!r} is not a CUDA target")
    return tvm.target.Target(
        {
            "kind": "cuda",
            "arch": target.arch,
            "max_shared_memory_per_block": target.shared_memory_per_block,
            "max_threads_per_block": target.max_threads_per_block,
            "thread_warp_size": cs.WARP,
        },
        host={"kind": "c"},
    )


def cuda_primfunc(spec: KernelSpec, target: Target) -> tirx.PrimFunc:
    """The scheduled PrimFunc of one kernel for `target`, exported as `spec.name()`."""
    if _hand_written(spec):
        raise NotImplementedError(f"{spec.name()} is hand-written CUDA (attention.py, "
                                  "qmatmul.py), not a TVM schedule")
    params = cs.cuda_params(target)
    func = te_primfunc(spec)
    if isinstance(spec, MatmulSpec) and spec.schedule == "gemv":
        func = cs.schedule_gemv(func, spec, params)
    elif isinstance(spec, MatmulSpec):
        func = cs.schedule_gemm(func, spec, params, cuda_target(target))
    elif isinstance(spec, RMSNormSpec):
        func = cs.schedule_rmsnorm(func, spec, params)
    elif isinstance(spec, RopeSpec):
        func = cs.schedule_rope(func, spec, params)
    elif isinstance(spec, EmbeddingSpec | SiluMulSpec | AddSpec | SigmoidGateSpec):
        func = cs.schedule_elementwise(func, params)
    else:
        raise NotImplementedError(f"no CUDA schedule for family {spec.family!r}")
    return func.with_attr("global_symbol", spec.name()).with_attr("tirx.is_scheduled", True)


def build_cuda_source(specs: Iterable[KernelSpec], target: Target) -> CudaModule:
    """Schedule every spec for `target` and lower them into one CUDA translation unit
    (hand-written families are rendered and appended)."""
    specs = list({spec.name(): spec for spec in specs}.values())
    if not specs:
        raise ValueError("no kernel specs given; pass at least one spec")
    params = cs.cuda_params(target)
    tvm_specs = [spec for spec in specs if not _hand_written(spec)]
    if tvm_specs:
        funcs = {spec.name(): cuda_primfunc(spec, target) for spec in tvm_specs}
        sizes = {"n"} | {a.name for s in tvm_specs for a in s.signature() if a.kind == "scalar"}
        module = lower_to_cuda(tvm.IRModule(funcs), cuda_target(target), sizes)
    else:
        module = CudaModule("", [], target.arch)
    hand_written = [spec for spec in specs if _hand_written(spec)]
    source = module.source
    for extra in (attention.render_source(hand_written, params),
                  qmatmul.render_source(hand_written, params),
                  sampler.render_source(hand_written, params),
                  gdn.render_source(hand_written, params)):
        if extra:
            source += "\n" + extra
    launches = module.launches + [launch for spec in hand_written
                                  for launch in _hand_written_launches(spec, params)]
    order = {spec.name(): i for i, spec in enumerate(specs)}
    launches.sort(key=lambda launch: order[launch.spec_name])  # stable: keeps _1, _2
    return CudaModule(source, launches, module.arch)


def _hand_written(spec: KernelSpec) -> bool:
    return (attention.is_hand_written(spec) or qmatmul.is_quantized_matmul(spec)
            or sampler.is_sampler(spec) or gdn.is_hand_written(spec))


# Element types of hand-written kernels' tensors: 16-bit floats travel as their bits.
_HAND_CTYPES = {"float16": "uint16_t", "int8": "int8_t", "uint8": "uint8_t"}


def _hand_written_launches(spec: KernelSpec, params: cs.CudaParams) -> list[CudaLaunch]:
    """The launches of a hand-written kernel: spec.signature() in order, then `n`; split
    attention (attention.attention_splits > 1) is two launches over scratch."""
    if any(arg.kind != "tensor" for arg in spec.signature()):
        raise NotImplementedError(f"{spec.name()}: hand-written kernels take tensors and n only")
    args = [
        CudaParam(arg.name, "tensor", (_HAND_CTYPES.get(arg.dtype) or _CTYPES[arg.dtype]) + "*")
        for arg in spec.signature()
    ]
    size = CudaParam("n", "size", "int64_t")
    if isinstance(spec, SamplerSpec):
        grid, threads = sampler.launch_shape(spec, params)
        work = HostAlloc(sampler.work_name(spec), "float32", Mul((N, Const(spec.vocab))))
        return [CudaLaunch(spec.name(), sampler.kernel_symbol(spec),
                           [*args, CudaParam(work.name, "scratch", "float*"), size], grid,
                           (threads, 1, 1), ZERO, [work])]
    if isinstance(spec, MatmulSpec):
        grid, threads = qmatmul.launch_shape(spec, params)
        return [CudaLaunch(spec.name(), qmatmul.kernel_symbol(spec), [*args, size], grid,
                           (threads, 1, 1), ZERO, [])]
    if gdn.is_hand_written(spec):
        grid, threads = gdn.launch_shape(spec, params)
        return [CudaLaunch(spec.name(), gdn.kernel_symbol(spec), [*args, size], grid,
                           (threads, 1, 1), Const(gdn.dynamic_smem(spec, params)), [])]
    grid, threads = attention.launch_shape(spec, params)
    symbol = attention.kernel_symbol(spec)
    if not (isinstance(spec, AttentionSpec) and attention.attention_splits(spec, params) > 1):
        return [CudaLaunch(spec.name(), symbol, [*args, size], grid, (threads, 1, 1), ZERO, [])]
    splits = attention.splits_expr(spec, params)
    blocks = N * spec.heads
    allocs = [HostAlloc(f"{spec.name()}_part_acc", "float32",
                        Mul((blocks, splits, Const(spec.head_dim)))),
              HostAlloc(f"{spec.name()}_part_ml", "float32", Mul((blocks, splits, Const(2))))]
    part = [CudaParam(a.name, "scratch", "float*") for a in allocs]
    out = [a for a in args if a.name == "out"]
    split_arg = CudaParam("splits", "expr", "int64_t", splits)
    return [
        CudaLaunch(spec.name(), symbol, [*(a for a in args if a.name != "out"), *part, split_arg,
                                         size],
                   (blocks, splits, ONE), (threads, 1, 1), ZERO, allocs),
        CudaLaunch(spec.name(), attention.combine_symbol(spec), [*part, *out, split_arg, size],
                   (blocks, ONE, ONE), (attention.combine_threads(spec), 1, 1), ZERO, allocs),
    ]


def lower_to_cuda(mod: tvm.IRModule, target: tvm.target.Target, sizes: set[str]) -> CudaModule:
    """Lower scheduled PrimFuncs to CUDA source plus launch descriptions.

    `sizes` names the symbolic sizes and scalar arguments that launch expressions may use.
    """
    mod = tirx.transform.BindTarget(target)(mod)
    pipeline, _, finalize_device = tirx.get_default_tir_pipeline(target)
    host_mod, device_mods = split_host_device_mods(pipeline(mod))
    if len(device_mods) != 1:
        raise RuntimeError(f"expected one CUDA device module, got {len(device_mods)}")
    ((device_target, device_mod),) = device_mods.items()
    device_mod = finalize_device()(device_mod)
    source = tvm.get_global_func("target.build.cuda")(device_mod, device_target).inspect_source()
    kernels = {gv.name_hint: f for gv, f in device_mod.functions.items()}
    launches: list[CudaLaunch] = []
    for gv, host_func in host_mod.functions.items():
        launches.extend(_launches(gv.name_hint, host_func, kernels, sizes))
    return CudaModule(source, launches, str(target.attrs["arch"]))


def _launches(
    spec_name: str, host: tirx.PrimFunc, kernels: Mapping[str, tirx.PrimFunc], sizes: set[str]
) -> list[CudaLaunch]:
    """The kernel launches of one host function, in order."""
    binds: dict[int, tirx.PrimExpr] = {}  # host-computed values (CSE temporaries), by var
    calls: list[Any] = []
    alloc_nodes: list[tirx.AllocBuffer] = []

    def on_bind(node: tirx.Bind) -> None:
        if node.var.name not in sizes:
            binds[node.var.__chandle__()] = node.value

    def on_call(node: Any) -> None:
        if isinstance(node.op, tvm.ir.Op) and node.op.name == "tirx.call_ffi_kernel":
            calls.append(node)

    tvm_ffi.structural_walk(
        host.body,
        [(tirx.Bind, on_bind), (tvm.ir.Call, on_call), (tirx.AllocBuffer, alloc_nodes.append)],
        order="pre",
    )

    def c(expr: tirx.PrimExpr) -> Expr:
        return _size_expr(expr, binds, sizes)

    def elements(shape: list[tirx.PrimExpr]) -> Expr:
        dims = [c(dim) for dim in shape]
        return ONE if not dims else dims[0] if len(dims) == 1 else Mul(tuple(dims))

    allocs = {
        node.buffer.name: HostAlloc(node.buffer.name, str(node.buffer.dtype),
                                    elements(list(node.buffer.shape)))
        for node in alloc_nodes
    }
    out = []
    for call in calls:
        symbol = call.args[0].value
        tags = list(call.attrs.launch_params)  # one trailing argument per tag
        args, dims = (
            call.args[1 : len(call.args) - len(tags)],
            call.args[len(call.args) - len(tags) :],
        )
        values = dict(zip(tags, dims))
        params = [_param(p, arg, allocs, c) for p, arg in zip(kernels[symbol].params, args)]
        gx, gy, gz = (
            c(values[f"blockIdx.{a}"]) if f"blockIdx.{a}" in values else ONE for a in "xyz"
        )
        bx, by, bz = (_const(values.get(f"threadIdx.{a}"), symbol) for a in "xyz")
        smem = values.get("tirx.use_dyn_shared_memory")
        out.append(
            CudaLaunch(
                spec_name=spec_name,
                kernel_symbol=symbol,
                params=params,
                grid=(gx, gy, gz),
                block=(bx, by, bz),
                dynamic_smem=c(smem) if smem is not None else ZERO,
                host_allocs=[allocs[p.name] for p in params if p.kind == "scratch"],
            )
        )
    return out


def _param(
    kparam: tirx.Var, arg: Any, allocs: Mapping[str, HostAlloc], c: Callable[[Any], Expr]
) -> CudaParam:
    ty = kparam.ty
    if isinstance(ty, tvm.ir.PointerType):
        ctype = _CTYPES[str(ty.element_type.dtype)] + "*"
        if not (isinstance(arg, tvm.ir.Call) and arg.op.name == "tirx.buffer_data"):
            raise NotImplementedError(f"pointer kernel argument {arg} is not a buffer's data")
        name = arg.args[0].name
        return CudaParam(name, "scratch" if name in allocs else "tensor", ctype)
    ctype = _CTYPES[str(ty.dtype)]
    value = c(arg)
    if isinstance(arg, tirx.Var) and value == Var(arg.name):
        return CudaParam(arg.name, "size" if arg.name == "n" else "scalar", ctype)
    return CudaParam(kparam.name, "expr", ctype, value)


_CTYPES = {"float32": "float", "float16": "half", "uint16": "uint16_t", "int32": "int32_t",
           "int64": "int64_t"}


def _const(expr: Any, symbol: str) -> int:
    if expr is None:
        return 1
    if not isinstance(expr, tirx.IntImm):
        raise NotImplementedError(f"{symbol}: block dimension {expr} is not a constant")
    return int(expr.value)


def _size_expr(expr: Any, binds: Mapping[int, Any], sizes: set[str]) -> Expr:
    """The typed (int64) size of a host-side TIR expression. TVM's floor division and
    modulo become FloorDiv and Mod, which print as C's `/` and `%`: sizes are non-negative."""

    def sub(e: Any) -> Expr:
        return _size_expr(e, binds, sizes)

    if isinstance(expr, tirx.IntImm):
        return Const(int(expr.value))
    if isinstance(expr, tirx.Var):
        bound = binds.get(expr.__chandle__())
        if bound is not None:
            return sub(bound)
        if expr.name in sizes:
            return Var(expr.name)
        raise NotImplementedError(f"launch expression uses unknown variable {expr.name!r}")
    if isinstance(expr, tirx.Add):
        return Add(sub(expr.a), sub(expr.b))
    if isinstance(expr, tirx.Sub):
        return Sub(sub(expr.a), sub(expr.b))
    if isinstance(expr, tirx.Mul):
        return Mul((sub(expr.a), sub(expr.b)))
    if isinstance(expr, tirx.FloorDiv | tirx.FloorMod | tirx.Div | tirx.Mod):
        if not (isinstance(expr.b, tirx.IntImm) and expr.b.value > 0):
            raise NotImplementedError(f"division by a non-constant in launch expression {expr}")
        node = FloorDiv if isinstance(expr, tirx.FloorDiv | tirx.Div) else Mod
        return node(sub(expr.a), Const(int(expr.b.value)))
    if isinstance(expr, tirx.Cast) and str(expr.dtype) in ("int32", "int64"):
        return sub(expr.value)
    raise NotImplementedError(f"cannot print launch expression {expr} ({type(expr).__name__})")


def serial_equivalent(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The same scheduled PrimFunc with every thread binding turned into a serial loop and
    every on-chip buffer moved to global scope, so it builds and runs on the CPU (LLVM).

    Schedule primitives keep a PrimFunc's meaning under any loop kind, so running this is
    a CPU check of the exact loop nest, index math and masks the CUDA kernel executes
    (only the cross-thread reductions are performed serially instead of by shuffles).
    """
    remap: dict[int, tirx.Buffer] = {}

    def buffer(var: Any) -> Any:
        if not isinstance(var.ty, tirx.BufferType) or var.scope() == "global":
            return var
        key = var.__chandle__()
        if key not in remap:
            remap[key] = tirx.decl_buffer(
                var.shape,
                var.dtype,
                var.name,
                scope="global",
                strides=var.ty.strides,
                elem_offset=var.ty.elem_offset,
            )
        return remap[key]

    def loop(node: tirx.For) -> tirx.For:
        if node.kind != tirx.ForKind.THREAD_BINDING:
            return node
        return tirx.For(
            node.loop_var,
            node.min,
            node.extent,
            tirx.ForKind.SERIAL,
            node.body,
            None,
            node.annotations,
        )

    return tvm_ffi.structural_map(func, [(tirx.Var, buffer), (tirx.For, loop)], order="pre")
