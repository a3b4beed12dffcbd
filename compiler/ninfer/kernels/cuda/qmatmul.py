"""Hand-written CUDA kernels for group-quantized matmul weights (q8g32, q4g64, q4g128).

Rendered from templates/cuda/qmatmul.cu.j2 into the same translation unit as the TVM
kernels and described by the same CudaLaunch records (lower.py); the TE/dlight path has
no int8/nibble unpacking with per-group scales. Weights are read in their ninfer.quantize
layout (no repacking), activations stay float32: the dot products are float FMAs over
dequantized weights (the CPU kernels instead round x to int8 per group; the reference in
tests computes with float64 and unrounded x).

- gemv (decode rows; MatmulSpec.schedule "gemv"): one warp per output column, WARPS per
  block, chosen like the TVM GEMV's rows per block (schedules.gemv_rows: as many as
  still leave the target gemv_min_blocks blocks). Lane t takes eight consecutive weights
  per step, k = (32 step + t) * 8: one 8-byte (q8) or 4-byte (q4) load and one scale
  (eight weights never straddle a group, G % 8 == 0), and the same k range of up to ROWS
  rows of x (two float4 loads each); the lanes' partial sums meet with warp shuffles.
  grid = (ceil(n_out / WARPS), ceil(n / ROWS)): more rows than ROWS take more blocks (the
  step program passes at most gemv_max_rows).
- gemm (prefill): BM x BN output tile per 256-thread block, k in steps of KT = 32 (within
  one group): the x tile and the dequantized w tile are staged in shared memory (static,
  2 x 64 x 33 floats), each thread accumulates a 4 x 4 micro-tile. grid =
  (ceil(n_out / BN), ceil(n / BM)). The tile is the same on every target: 256 threads and
  17 KB fit all of them, which the launch verifier proves per target like any launch.

No dynamic shared memory and no scratch; everything comes from the spec and `n`.
"""

from __future__ import annotations

from collections.abc import Iterable

import jinja2

from ninfer.paths import TEMPLATES_DIR
from ninfer.quantize.weight_formats import format_info

from ..launch import ONE, Const, Expr, N, ceil_div
from ..spec import KernelSpec, MatmulSpec
from .schedules import WARP, CudaParams, gemv_rows

TEMPLATE = "cuda/qmatmul.cu.j2"
QUANTIZED = ("q8g32", "q4g64", "q4g128")
# Rows of x one gemv block takes (registers: one accumulator each). Any n is correct,
# further rows take further blocks (grid.y); the step program's decode calls pass at most
# options.GEMV_MAX_ROWS (4 on CUDA), which one block then covers.
GEMV_ROWS = 4
GEMM_BM, GEMM_BN, GEMM_KT, GEMM_THREADS = 64, 64, 32, 256


def is_quantized_matmul(spec: KernelSpec) -> bool:
    return isinstance(spec, MatmulSpec) and spec.wdtype in QUANTIZED


def kernel_symbol(spec: MatmulSpec) -> str:
    return f"{spec.name()}_kernel"


def gemv_warps(spec: MatmulSpec, params: CudaParams) -> int:
    return gemv_rows(params, spec.n_out)


def launch_shape(spec: MatmulSpec, params: CudaParams) -> tuple[tuple[Expr, Expr, Expr], int]:
    """(grid over n, threads per block)."""
    if spec.schedule == "gemv":
        warps = gemv_warps(spec, params)
        return (Const(-(-spec.n_out // warps)), ceil_div(N, GEMV_ROWS), ONE), WARP * warps
    return (Const(-(-spec.n_out // GEMM_BN)), ceil_div(N, GEMM_BM), ONE), GEMM_THREADS


def _values(spec: MatmulSpec, params: CudaParams) -> dict[str, object]:
    info = format_info(spec.wdtype)
    if spec.k % GEMM_KT or info.group % GEMM_KT:
        raise NotImplementedError(f"{spec.name()}: k {spec.k} and the group size must be "
                                  f"multiples of {GEMM_KT}")
    _, threads = launch_shape(spec, params)
    return {
        "name": spec.name(), "symbol": kernel_symbol(spec), "wdtype": spec.wdtype,
        "k": spec.k, "n_out": spec.n_out, "bias": spec.bias, "group": info.group,
        "bits": info.bits, "qtype": "int8_t" if info.bits == 8 else "uint8_t",
        "row_bytes": spec.k * info.bits // 8, "threads": threads, "warps": threads // WARP,
        "rows": GEMV_ROWS, "bm": GEMM_BM, "bn": GEMM_BN, "kt": GEMM_KT,
        "tm": GEMM_BM // 16, "tn": GEMM_BN // 16,
    }


def render_source(specs: Iterable[KernelSpec], params: CudaParams) -> str:
    """One CUDA translation unit for the quantized matmuls among `specs`, each once; ""
    when there are none."""
    unique = list({s.name(): s for s in specs if is_quantized_matmul(s)}.values())
    if not unique:
        return ""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    values = [_values(s, params) for s in unique if isinstance(s, MatmulSpec)]
    return env.get_template(TEMPLATE).render(
        gemv=[v for v, s in zip(values, unique, strict=True)
              if isinstance(s, MatmulSpec) and s.schedule == "gemv"],
        gemm=[v for v, s in zip(values, unique, strict=True)
              if isinstance(s, MatmulSpec) and s.schedule != "gemv"])
