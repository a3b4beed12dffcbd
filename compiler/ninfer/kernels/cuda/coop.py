"""Cooperative split-K projection family: the variant specs and their CUDA source.

`y[t, n] = sum_k x[t, k] * w[n, k]`, x and y float32, w float32 or 16-bit (f16 / bf16,
stored as their bits and widened to float as the tile is staged). A variant splits K into
`split` slices so that a small token count still spreads over many CTAs; the slices are
combined after a grid-wide barrier, so every CTA of the grid must be resident at once (a cooperative
launch). How many CTAs that is depends on the target (SM count) and on the kernel's real
registers and shared memory (nvcc), so the largest token count each variant may serve is
derived, never written down: ninfer.occupancy.coop routes each token count to a variant
by asking the launch verifier.

The CUDA source is rendered from templates/cuda/coop_splitk.cu.j2; one translation unit
holds every variant (`render_coop_source`) so one nvcc run per arch compiles them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import jinja2

from ninfer.paths import TEMPLATES_DIR

from ..launch import Expr, LaunchShape, N, ceil_div
from ..spec import KernelSpec, MatmulSpec

TEMPLATE = "cuda/coop_splitk.cu.j2"
FAMILY_SPLITS = (8, 4, 2, 1)
# weight element type -> (C type of the stored element, suffix of the kernel name)
WEIGHT_TYPES = {"float32": ("float", "f32"), "f16": ("uint16_t", "f16"),
                "bf16": ("uint16_t", "bf16")}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CoopProjectionSpec:
    """One variant: K split into `split` slices (1 = unsplit, no grid barrier).

    A CTA of `threads` threads computes a `token_tile x col_block` tile of y; each thread
    owns a tm x tn micro-tile, derived from these fields.
    """

    family: ClassVar[str] = "coop_splitk"
    k_tile: ClassVar[int] = 32  # depth of the x / w tiles staged in shared memory

    k: int
    n_out: int
    split: int
    threads: int = 256
    token_tile: int = 64
    col_block: int = 128
    wdtype: str = "float32"  # WEIGHT_TYPES

    def __post_init__(self) -> None:
        if self.wdtype not in WEIGHT_TYPES:
            raise ValueError(f"CoopProjectionSpec.wdtype must be one of "
                             f"{', '.join(WEIGHT_TYPES)}, got {self.wdtype!r}")
        for f in ("k", "n_out", "split", "threads", "token_tile", "col_block"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"CoopProjectionSpec.{f} must be a positive int, got {value!r}")
        if self.threads % 32:
            raise ValueError(f"CoopProjectionSpec.threads must be a multiple of 32, "
                             f"got {self.threads}")
        self.micro_tile()  # validates the tiling

    def name(self) -> str:
        return (f"coop_splitk_k{self.k}_n{self.n_out}_s{self.split}_t{self.threads}"
                f"_tt{self.token_tile}_cb{self.col_block}_{WEIGHT_TYPES[self.wdtype][1]}")

    @property
    def cooperative(self) -> bool:
        return self.split > 1

    @property
    def col_blocks(self) -> int:
        return _ceil_div(self.n_out, self.col_block)

    @property
    def k_slice(self) -> int:
        """K elements per slice, a multiple of k_tile."""
        return _ceil_div(_ceil_div(self.k, self.split), self.k_tile) * self.k_tile

    def micro_tile(self) -> tuple[int, int]:
        """(tm, tn): tokens x columns per thread; tn as wide as the tiling allows (<= 4)."""
        outputs = self.token_tile * self.col_block
        if outputs % self.threads:
            raise ValueError(f"{self.name()}: token_tile x col_block ({outputs}) must be a "
                             f"multiple of threads ({self.threads})")
        per_thread = outputs // self.threads
        for tn in (4, 2, 1):
            tx = self.col_block // tn
            if (per_thread % tn or self.col_block % tn or tx > self.threads
                    or self.threads % tx or self.token_tile % (self.threads // tx)):
                continue
            return per_thread // tn, tn
        raise ValueError(f"{self.name()}: no micro-tile maps {self.threads} threads onto a "
                         f"{self.token_tile} x {self.col_block} tile")

    def grid_expr(self) -> Expr:
        """CTAs for n tokens: split x column blocks x token tiles."""
        return (self.split * self.col_blocks) * ceil_div(N, self.token_tile)

    def grid(self, tokens: int) -> int:
        return self.grid_expr().evaluate({"n": tokens})

    def workspace_floats(self, max_tokens: int) -> int:
        """Scratch the runtime allocates for the partial sums (0 when unsplit)."""
        return self.split * max_tokens * self.n_out if self.cooperative else 0

    def launch_shape(self) -> LaunchShape:
        return LaunchShape(self.name(), self.threads, self.grid_expr(),
                           cooperative=self.cooperative)

    def template_values(self) -> dict[str, object]:
        tm, tn = self.micro_tile()
        return {"name": self.name(), "k": self.k, "n_out": self.n_out, "split": self.split,
                "threads": self.threads, "token_tile": self.token_tile,
                "col_block": self.col_block, "k_tile": self.k_tile, "tm": tm, "tn": tn,
                "col_blocks": self.col_blocks, "k_slice": self.k_slice,
                "wtype": WEIGHT_TYPES[self.wdtype][0], "wdtype": self.wdtype}


def coop_family(k: int, n_out: int, threads: int = 256, token_tile: int = 64,
                col_block: int = 128, wdtype: str = "float32") -> list[CoopProjectionSpec]:
    """split8 / split4 / split2 / unsplit with one tiling."""
    return [CoopProjectionSpec(k, n_out, s, threads, token_tile, col_block, wdtype)
            for s in FAMILY_SPLITS]


def render_coop_source(specs: Sequence[CoopProjectionSpec]) -> str:
    """One CUDA translation unit with an `extern "C"` kernel per spec."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    unique = list(dict.fromkeys(specs))
    return env.get_template(TEMPLATE).render(specs=[s.template_values() for s in unique])


# Projection roles whose prefill rows may run through the family (gemm specs of the plan):
# the dense layers', and the hybrid models' (the gated attention's query + gate, the Gated
# DeltaNet input projections [q|k|v], z and [b|a] - the gating projection whose hand-sized
# budget crashed an 80-SM card - and its output, the MoE shared expert). Routed experts
# keep the TVM GEMM: each runs on a data-dependent share of the rows.
PROJECTION_ROLES = ("q", "k", "v", "o", "gate_up", "down", "q_gate", "gdn_qkv", "gdn_z",
                    "gdn_ba", "gdn_out", "shared_gate_up", "shared_down")


CoopShape = tuple[int, int, str]  # k, n_out, weight element type


def coop_projections(kernels: Mapping[str, KernelSpec]) -> dict[str, CoopShape]:
    """role -> (k, n_out, wdtype) of every projection the family can serve: bias-free,
    with f32, f16 or bf16 weights in rows (group-quantized ones keep their own GEMM)."""
    shapes = {}
    for role in PROJECTION_ROLES:
        spec = kernels.get(f"{role}_gemm")
        if (isinstance(spec, MatmulSpec) and not spec.bias and spec.wdtype in WEIGHT_TYPES
                and spec.layout == "rows"):
            shapes[role] = (spec.k, spec.n_out, spec.wdtype)
    return shapes
