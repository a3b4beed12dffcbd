"""`python -m ninfer.occupancy.explain --target rtx4080s`: why each launch fits.

Compiles the cooperative split-K projection family for the target's arch (cached under
build/.cuda-cache), derives the token ranges each variant serves, verifies every route
and prints the tables: per variant (registers, shared memory, CTAs/SM, resident budget,
largest token count it fits), the routes, and the verifier's table of the routes.

With `--config config.json` (a checkpoint's config) the projections are the model's
prefill projections that the family serves (projection_shapes), each routed on every
target; `--markdown` prints those routes as one table (the README's route table).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.targets import available_targets, load_target

CUDA_CACHE = DEFAULT_BUILD_DIR / ".cuda-cache"


@dataclass(frozen=True)
class ExplainArgs:
    targets: tuple[str, ...]
    k: int = 2048
    n_out: int = 2048
    max_tokens: int = 2048
    cache_dir: Path = CUDA_CACHE
    plain: bool = False
    config: Path | None = None
    markdown: bool = False
    roles: tuple[str, ...] = ()  # with config: only these projections (all when empty)


def route_label(split: int) -> str:
    return f"split{split}" if split > 1 else "unsplit"


def projection_shapes(config_path: Path, target: str = "h200"
                      ) -> dict[str, tuple[int, int, str]]:
    """role -> (k, n_out, weight type) of the prefill projections the cooperative family
    serves in the model a config.json describes: the compiler's own plan of it
    (frontend.config_graph, plan.make_plan, kernels.cuda.coop.coop_projections) with f32
    weights, on `target` with a memory budget that holds any model (only shapes matter)."""
    import json

    from ninfer.frontend.config import ModelConfig
    from ninfer.frontend.llama import config_graph
    from ninfer.kernels.cuda.coop import coop_projections
    from ninfer.plan import ServeLimits, make_plan

    graph = config_graph(ModelConfig.from_dict(json.loads(config_path.read_text())))
    unbounded = load_target(target).with_overrides(memory_gib=float(1 << 20))
    plan = make_plan(graph, unbounded, ServeLimits(max_context=256, prefill_chunk=16))
    return coop_projections(plan.kernels)


def _routes_text(router: object) -> str:
    from ninfer.occupancy.coop import CoopRouter

    assert isinstance(router, CoopRouter)
    return ", ".join(f"{route_label(r.variant.split)} {r.min_tokens}..{r.max_tokens}"
                     for r in router.routes)


def _selected(shapes: dict[str, tuple[int, int, str]], roles: tuple[str, ...]
              ) -> dict[str, tuple[int, int, str]]:
    unknown = [r for r in roles if r not in shapes]
    if unknown:
        raise ValueError(f"--roles: {', '.join(unknown)} not among this model's projections "
                         f"({', '.join(shapes)})")
    return {r: s for r, s in shapes.items() if not roles or r in roles}


def explain_markdown(args: ExplainArgs) -> str:
    """One Markdown table: per target and distinct projection shape, its routes."""
    from ninfer.occupancy.coop import derive_coop_routes
    from ninfer.occupancy.resources import nvcc_resources

    assert args.config is not None
    shapes = _selected(projection_shapes(args.config), args.roles)
    by_shape: dict[tuple[int, int, str], list[str]] = {}
    for role, shape in shapes.items():
        by_shape.setdefault(shape, []).append(role)
    lines = ["| target | SMs | projection (k x n) | routes by prefill tokens |",
             "|---|---|---|---|"]
    for name in args.targets:
        target = load_target(name)
        for shape, roles in by_shape.items():
            k, n_out, wdtype = shape
            router = derive_coop_routes(target, k, n_out, args.max_tokens,
                                        nvcc_resources(args.cache_dir), wdtype)
            lines.append(f"| {name} | {target.sm_count} | {' / '.join(roles)} "
                         f"({k} x {n_out}) | {_routes_text(router)} |")
    return "\n".join(lines)


def explain(args: ExplainArgs) -> None:
    """Derive, verify and print the coop projection routes for each target."""
    from rich.console import Console

    from ninfer.occupancy.coop import derive_coop_routes
    from ninfer.occupancy.resources import nvcc_resources
    from ninfer.occupancy.verifier import VerificationReport, format_table, rich_table

    if args.config is not None and args.markdown:
        print(explain_markdown(args))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    shapes = (_selected(projection_shapes(args.config), args.roles)
              if args.config is not None else {"": (args.k, args.n_out, "float32")})
    for name, (role, (k, n_out, wdtype)) in ((t, item) for t in args.targets
                                             for item in shapes.items()):
        target = load_target(name)
        router = derive_coop_routes(target, k, n_out, args.max_tokens,
                                    nvcc_resources(args.cache_dir), wdtype)
        alone = VerificationReport(target, router.variant_checks)
        lines = [f"coop projection {role + ' ' if role else ''}k={k} n_out={n_out}, prefill chunk "
                 f"{args.max_tokens}: routes on {target.name}"]
        lines += [f"  tokens {r.min_tokens:>5}..{r.max_tokens:<5} -> "
                  f"{route_label(r.variant.split):<8} {r.variant.name()}"
                  for r in router.routes]
        if args.plain:
            print("each variant alone:\n" + format_table(alone) + "\n")
            print("\n".join(lines) + "\n")
            print(format_table(router.report) + "\n")
        else:
            console.print(rich_table(alone, "each variant alone"))
            console.print("\n".join(lines))
            console.print(rich_table(router.report, "verified routes"))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--target", "targets", multiple=True, required=True,
              help=f"Target profile (repeatable; 'all' for every GPU target): "
                   f"{', '.join(available_targets())}.")
@click.option("--k", type=click.IntRange(1),
              help="Input features of the projection (default 2048; not with --config).")
@click.option("--n", "n_out", type=click.IntRange(1),
              help="Output features of the projection (default 2048; not with --config).")
@click.option("--max-tokens", default=2048, show_default=True, type=click.IntRange(1),
              help="Largest prefill chunk the runtime may request.")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              default=CUDA_CACHE, show_default=True, help="nvcc result cache.")
@click.option("--plain", is_flag=True, help="Plain-text tables (no colors, fixed width).")
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A checkpoint's config.json: route the prefill projections the compiler "
                   "plans for it (f32 weights).")
@click.option("--markdown", is_flag=True,
              help="With --config: one Markdown table of every target's routes.")
@click.option("--roles", default="", help="With --config: a comma-separated list of the "
              "projections to route (e.g. gdn_qkv,gdn_ba); default all.")
def main(targets: tuple[str, ...], k: int | None, n_out: int | None, max_tokens: int,
         cache_dir: Path,
         plain: bool, config: Path | None, markdown: bool, roles: str) -> None:
    """Print the launch verifier's tables for the coop projection family."""
    from ninfer.occupancy.verifier import LaunchVerificationError
    from ninfer.targets import TargetError

    if "all" in targets:
        targets = tuple(t for t in available_targets() if load_target(t).is_cuda)
    try:
        if config is None and (markdown or roles):
            raise click.UsageError(f"{'--markdown' if markdown else '--roles'} needs --config")
        if config is not None and (k or n_out):
            raise click.UsageError("--k / --n and --config exclude each other: the config "
                                   "gives the shapes")
        if markdown and plain:
            raise click.UsageError("--markdown and --plain exclude each other")
        explain(ExplainArgs(targets, k or 2048, n_out or 2048, max_tokens, cache_dir, plain,
                            config, markdown, tuple(r for r in roles.split(",") if r)))
    except (TargetError, LaunchVerificationError, RuntimeError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
