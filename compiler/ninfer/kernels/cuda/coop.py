"""Cooperative split-K projection family, and the router that picks a variant per size.

`y[t, n] = sum_k x[t, k] * w[n, k]` (float32). A variant splits K into `split` slices so
that a small token count still spreads over many CTAs; the slices are combined after a
grid-wide barrier, so every CTA of the grid must be resident at once (a cooperative
launch). How many CTAs that is depends on the target (SM count) and on the kernel's real
registers and shared memory (nvcc), so the largest token count each variant may serve is
derived here, never written down: `route_coop` asks the launch verifier.

The CUDA source is rendered from templates/cuda/coop_splitk.cu.j2; one translation unit
holds every variant (`render_coop_source`) so one nvcc run per arch compiles them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import jinja2

from ninfer.occupancy.resources import CudaCompileError, KernelResources, ResourceSource
from ninfer.occupancy.verifier import (
    Grid,
    LaunchCheck,
    LaunchSpec,
    LaunchVerificationError,
    RuntimeLimits,
    VerificationReport,
    Violation,
    verify,
)
from ninfer.paths import TEMPLATES_DIR
from ninfer.targets import Target

TEMPLATE = "cuda/coop_splitk.cu.j2"
FAMILY_SPLITS = (8, 4, 2, 1)


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

    def __post_init__(self) -> None:
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
                f"_tt{self.token_tile}_cb{self.col_block}_f32")

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

    def grid_expr(self) -> Grid:
        return Grid(per_tile=self.split * self.col_blocks, tile=self.token_tile)

    def grid(self, tokens: int) -> int:
        return self.grid_expr()(tokens)

    def workspace_floats(self, max_tokens: int) -> int:
        """Scratch the runtime allocates for the partial sums (0 when unsplit)."""
        return self.split * max_tokens * self.n_out if self.cooperative else 0

    def launch(self, sizes: tuple[int, int] | None = None) -> LaunchSpec:
        return LaunchSpec(self.name(), self.threads, self.grid_expr(),
                          cooperative=self.cooperative, axis="tokens", sizes=sizes)

    def template_values(self) -> dict[str, object]:
        tm, tn = self.micro_tile()
        return {"name": self.name(), "k": self.k, "n_out": self.n_out, "split": self.split,
                "threads": self.threads, "token_tile": self.token_tile,
                "col_block": self.col_block, "k_tile": self.k_tile, "tm": tm, "tn": tn,
                "col_blocks": self.col_blocks, "k_slice": self.k_slice}


def coop_family(k: int, n_out: int, threads: int = 256, token_tile: int = 64,
                col_block: int = 128) -> list[CoopProjectionSpec]:
    """split8 / split4 / split2 / unsplit with one tiling."""
    return [CoopProjectionSpec(k, n_out, s, threads, token_tile, col_block)
            for s in FAMILY_SPLITS]


def render_coop_source(specs: Sequence[CoopProjectionSpec]) -> str:
    """One CUDA translation unit with an `extern "C"` kernel per spec."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    unique = list(dict.fromkeys(specs))
    return env.get_template(TEMPLATE).render(specs=[s.template_values() for s in unique])


def compile_coop_family(specs: Sequence[CoopProjectionSpec], arch: str,
                        resources: ResourceSource) -> Mapping[str, KernelResources]:
    """All variants in one nvcc run for `arch`; resources keyed by spec.name()."""
    found = resources(render_coop_source(specs), arch)
    missing = [s.name() for s in specs if s.name() not in found]
    if missing:
        raise CudaCompileError(f"nvcc reported no resource usage for {', '.join(missing)} "
                               f"({arch})")
    return found


@dataclass(frozen=True)
class CoopRoute:
    """Token counts min_tokens..max_tokens (inclusive) run `variant`."""

    min_tokens: int
    max_tokens: int
    variant: CoopProjectionSpec


@dataclass(frozen=True)
class CoopRouter:
    """The derived routing for one target; `report` is the verification of every route."""

    target: str
    routes: tuple[CoopRoute, ...]
    report: VerificationReport
    variant_checks: tuple[LaunchCheck, ...]  # each variant alone over 1..max_tokens

    def variant_for(self, tokens: int) -> CoopProjectionSpec:
        for r in self.routes:
            if r.min_tokens <= tokens <= r.max_tokens:
                return r.variant
        raise ValueError(f"{self.target}: {tokens} tokens is outside the routed range "
                         f"1..{self.routes[-1].max_tokens}")

    def launches(self) -> list[LaunchSpec]:
        return [r.variant.launch((r.min_tokens, r.max_tokens)) for r in self.routes]

    def max_tokens_by_variant(self) -> dict[str, int]:
        """Largest token count each variant can serve on this target (0: none)."""
        return {c.launch.kernel: c.max_ok_size for c in self.variant_checks}


def route_coop(target: Target, variants: Sequence[CoopProjectionSpec],
               resources: Mapping[str, KernelResources], max_tokens: int,
               max_spill_bytes: int = 0) -> CoopRouter:
    """For each token count 1..max_tokens, the variant with the largest split that fits.

    Each variant is verified alone over 1..max_tokens; since its grid grows with the
    token count, it fits on a prefix 1..max_ok. Raises LaunchVerificationError when a
    token count fits no variant, naming the kernel, size, limit and target.
    """
    if not variants:
        raise ValueError("route_coop needs at least one variant")
    limits = RuntimeLimits(max_prefill_chunk=max_tokens, max_spill_bytes=max_spill_bytes)
    alone = verify(target, [v.launch() for v in variants], resources, limits)
    by_split = sorted(zip(variants, alone.checks, strict=True), key=lambda vc: -vc[0].split)
    routes: list[CoopRoute] = []
    for tokens in range(1, max_tokens + 1):
        chosen = next((v for v, c in by_split if tokens <= c.max_ok_size), None)
        if chosen is None:
            raise LaunchVerificationError(_no_variant_fits(target, tokens, alone))
        if routes and routes[-1].variant == chosen:
            routes[-1] = CoopRoute(routes[-1].min_tokens, tokens, chosen)
        else:
            routes.append(CoopRoute(tokens, tokens, chosen))
    launches = [r.variant.launch((r.min_tokens, r.max_tokens)) for r in routes]
    report = verify(target, launches, resources, limits)
    report.raise_if_failed()  # by construction; kept so a router is never unverified
    return CoopRouter(target.name, tuple(routes), report, alone.checks)


def derive_coop_routes(target: Target, k: int, n_out: int, max_tokens: int,
                       resources: ResourceSource) -> CoopRouter:
    """Compile the family for the target's arch and route 1..max_tokens."""
    specs = coop_family(k, n_out)
    return route_coop(target, specs, compile_coop_family(specs, target.arch, resources),
                      max_tokens)


def _no_variant_fits(target: Target, tokens: int,
                     alone: VerificationReport) -> list[Violation]:
    """Why `tokens` has no variant: each variant's violation at or below that size."""
    reasons = [v for v in alone.violations if v.size is None or v.size <= tokens]
    return reasons or [Violation(target.name, "coop_splitk", "routing", None, None,
                                 size=tokens, note="no variant serves this size")]
