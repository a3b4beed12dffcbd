"""Template views of the cooperative split-K projection stubs (CUDA).

With `--prefill-projections coop` (the default on CUDA), every bias-free linear layer of a
CUDA model with f32, f16 or bf16 weights runs its prefill rows through the cooperative
family (kernels/cuda/coop.py): one stub per (k, n_out, weight type) dispatches a token
count to the route the verifier derived for the target (occupancy/coop.py), and re-checks
the grid against that route's resident budget before launching.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ninfer.kernels.cuda.coop import WEIGHT_TYPES, CoopProjectionSpec
from ninfer.occupancy.coop import CoopRouter


@dataclass(frozen=True)
class CoopRouteView:
    min_tokens: int
    max_tokens: int
    kernel: str
    bounds: str  # name of the LaunchBounds constant
    grid: str  # C over n, as the argument of a call
    threads: int
    budget: int
    cooperative: bool


@dataclass(frozen=True)
class CoopStubView:
    name: str
    k: int
    n_out: int
    workspace_floats: int
    routes: tuple[CoopRouteView, ...]
    wtype: str = "float"  # C type of a stored weight element (16-bit: their bits)

    @property
    def declaration(self) -> str:
        return (f"void {self.name}(const float* x, const {self.wtype}* w, float* out, "
                "int64_t n)")


def _stub(router: CoopRouter, max_tokens: int) -> CoopStubView:
    views = []
    for i, r in enumerate(router.routes):
        v = r.variant
        check = router.check(r)
        views.append(CoopRouteView(
            r.min_tokens, r.max_tokens, v.name(), f"kBounds_{v.name()}_r{i}",
            v.grid_expr().bare(), v.threads,
            (check.resident_budget or 0) if v.cooperative else 0, v.cooperative))
    first = router.routes[0].variant
    workspace = max(r.variant.workspace_floats(max_tokens) for r in router.routes)
    wtype, suffix = WEIGHT_TYPES[first.wdtype]
    name = f"coop_proj_k{first.k}_n{first.n_out}" + ("" if suffix == "f32" else f"_{suffix}")
    return CoopStubView(name, first.k, first.n_out, max(workspace, 1), tuple(views), wtype)


def coop_stubs(routers: Mapping[str, CoopRouter], max_tokens: int
               ) -> tuple[dict[str, CoopStubView], list[CoopProjectionSpec]]:
    """role -> stub for every routed projection (roles of one shape share a stub), and
    the variants the routes use, each once (to render their device code)."""
    stubs: dict[int, CoopStubView] = {}
    roles = {}
    for role, router in routers.items():
        if id(router) not in stubs:
            stubs[id(router)] = _stub(router, max_tokens)
        roles[role] = stubs[id(router)]
    variants = [r.variant for router in routers.values() for r in router.routes]
    return roles, list(dict.fromkeys(variants))
