"""Template views of the cooperative split-K projection stubs (CUDA, opt-in).

With `--prefill-projections coop`, every bias-free linear layer of a CUDA model runs
its prefill rows through the cooperative family (kernels/cuda/coop.py): one stub per
(k, n_out) dispatches a token count to the route the verifier derived for the target,
and re-checks the grid against that route's resident budget before launching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CoopRouteView:
    min_tokens: int
    max_tokens: int
    kernel: str
    bounds: str  # name of the LaunchBounds constant
    grid: str  # C expression over n
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

    @property
    def declaration(self) -> str:
        return f"void {self.name}(const float* x, const float* w, float* out, int64_t n)"


def coop_stubs(plan: Any, target: Any, resources: Any) -> tuple[dict[str, CoopStubView],
                                                                  list[Any], list[Any]]:
    """role -> stub for every bias-free projection; plus the variant specs to compile and
    the routers' verification reports (for compile_report.json)."""
    from ninfer.kernels.cuda.coop import derive_coop_routes

    chunk = plan.limits.max_prefill_chunk
    by_shape: dict[tuple[int, int], CoopStubView] = {}
    roles: dict[str, CoopStubView] = {}
    variants: list[Any] = []
    reports: list[Any] = []
    for role in ("q", "k", "v", "o", "gate_up", "down"):
        spec = plan.kernels[f"{role}_gemm"]
        if spec.bias or spec.wdtype != "float32":
            continue  # the family has no bias epilogue and reads f32 weights: the TVM GEMM
        key = (spec.k, spec.n_out)
        if key not in by_shape:
            router = derive_coop_routes(target, spec.k, spec.n_out, chunk, resources)
            reports.append(router.report)
            checks = {(c.launch.kernel, c.sizes): c for c in router.report.checks}
            views = []
            for i, r in enumerate(router.routes):
                v = r.variant
                check = checks[(v.name(), (r.min_tokens, r.max_tokens))]
                views.append(CoopRouteView(
                    r.min_tokens, r.max_tokens, v.name(), f"kBounds_{v.name()}_r{i}",
                    v.grid_expr().c_expr("n"), v.threads,
                    (check.resident_budget or 0) if v.cooperative else 0, v.cooperative))
                variants.append(v)
            workspace = max(r.variant.workspace_floats(chunk) for r in router.routes)
            by_shape[key] = CoopStubView(f"coop_proj_k{spec.k}_n{spec.n_out}", spec.k,
                                         spec.n_out, max(workspace, 1), tuple(views))
        roles[role] = by_shape[key]
    return roles, list(dict.fromkeys(variants)), reports
