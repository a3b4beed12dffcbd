"""Routing the cooperative split-K family: which variant serves each token count.

A variant (ninfer.kernels.cuda.coop) splits K into `split` slices and combines them after a
grid-wide barrier, so its whole grid must be resident (a cooperative launch), and its grid
grows with the token count. How many CTAs fit depends on the target (SM count) and on the
kernel's real registers and shared memory (nvcc). `route_coop` verifies each variant over
1..max_tokens and gives every token count the variant with the largest split that fits;
the routes themselves are verified again, so a router is never unverified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ninfer.kernels.cuda.coop import (
    CoopProjectionSpec,
    CoopShape,
    coop_family,
    render_coop_source,
)
from ninfer.occupancy.resources import CudaCompileError, KernelResources, ResourceSource
from ninfer.occupancy.verifier import (
    LaunchCheck,
    LaunchSpec,
    LaunchVerificationError,
    RuntimeLimits,
    VerificationReport,
    Violation,
    verify,
)
from ninfer.targets import Target


def coop_launch(variant: CoopProjectionSpec, sizes: tuple[int, int] | None = None
                ) -> LaunchSpec:
    """A variant's launch over token counts (`sizes`, inclusive; None: 1..max_tokens)."""
    return LaunchSpec(variant.launch_shape(), axis="tokens", sizes=sizes)


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
        return [coop_launch(r.variant, (r.min_tokens, r.max_tokens)) for r in self.routes]

    def max_tokens_by_variant(self) -> dict[str, int]:
        """Largest token count each variant can serve on this target (0: none)."""
        return {c.launch.kernel: c.max_ok_size for c in self.variant_checks}

    def check(self, route: CoopRoute) -> LaunchCheck:
        """The verifier's check of one route (its resident budget, its sizes)."""
        sizes = (route.min_tokens, route.max_tokens)
        return next(c for c in self.report.checks
                    if c.launch.kernel == route.variant.name() and c.sizes == sizes)


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
    limits = RuntimeLimits(prefill_chunk=max_tokens, max_spill_bytes=max_spill_bytes)
    alone = verify(target, [coop_launch(v) for v in variants], resources, limits)
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
    launches = [coop_launch(r.variant, (r.min_tokens, r.max_tokens)) for r in routes]
    report = verify(target, launches, resources, limits)
    report.raise_if_failed()  # by construction; kept so a router is never unverified
    return CoopRouter(target.name, tuple(routes), report, alone.checks)


def derive_coop_routes(target: Target, k: int, n_out: int, max_tokens: int,
                       resources: ResourceSource, wdtype: str = "float32") -> CoopRouter:
    """Compile the family for the target's arch and route 1..max_tokens."""
    specs = coop_family(k, n_out, wdtype=wdtype)
    return route_coop(target, specs, compile_coop_family(specs, target.arch, resources),
                      max_tokens)


def route_projections(target: Target, shapes: Mapping[str, CoopShape],
                      max_tokens: int, resources: ResourceSource
                      ) -> dict[CoopShape, CoopRouter]:
    """One router per distinct (k, n_out, wdtype) among `shapes` (role -> shape), in role
    order."""
    routers: dict[CoopShape, CoopRouter] = {}
    for shape in shapes.values():
        if shape not in routers:
            k, n_out, wdtype = shape
            routers[shape] = derive_coop_routes(target, k, n_out, max_tokens, resources,
                                                wdtype)
    return routers


def _no_variant_fits(target: Target, tokens: int,
                     alone: VerificationReport) -> list[Violation]:
    """Why `tokens` has no variant: each variant's violation at or below that size."""
    reasons = [v for v in alone.violations if v.size is None or v.size <= tokens]
    return reasons or [Violation(target.name, "coop_splitk", "routing", None, None,
                                 size=tokens, note="no variant serves this size")]
