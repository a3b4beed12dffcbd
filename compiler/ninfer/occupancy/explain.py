"""`python -m ninfer.occupancy.explain --target rtx4080s`: why each launch fits.

Compiles the cooperative split-K projection family for the target's arch (cached under
build/.cuda-cache), derives the token ranges each variant serves, verifies every route
and prints the tables: per variant (registers, shared memory, CTAs/SM, resident budget,
largest token count it fits), the routes, and the verifier's table of the routes.
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


def route_label(split: int) -> str:
    return f"split{split}" if split > 1 else "unsplit"


def explain(args: ExplainArgs) -> None:
    """Derive, verify and print the coop projection routes for each target."""
    from rich.console import Console

    from ninfer.occupancy.coop import derive_coop_routes
    from ninfer.occupancy.resources import nvcc_resources
    from ninfer.occupancy.verifier import VerificationReport, format_table, rich_table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    for name in args.targets:
        target = load_target(name)
        router = derive_coop_routes(target, args.k, args.n_out, args.max_tokens,
                                    nvcc_resources(args.cache_dir))
        alone = VerificationReport(target, router.variant_checks)
        lines = [f"coop projection k={args.k} n_out={args.n_out}, prefill chunk "
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
@click.option("--k", default=2048, show_default=True, type=click.IntRange(1),
              help="Input features of the projection.")
@click.option("--n", "n_out", default=2048, show_default=True, type=click.IntRange(1),
              help="Output features of the projection.")
@click.option("--max-tokens", default=2048, show_default=True, type=click.IntRange(1),
              help="Largest prefill chunk the runtime may request.")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              default=CUDA_CACHE, show_default=True, help="nvcc result cache.")
@click.option("--plain", is_flag=True, help="Plain-text tables (no colors, fixed width).")
def main(targets: tuple[str, ...], k: int, n_out: int, max_tokens: int, cache_dir: Path,
         plain: bool) -> None:
    """Print the launch verifier's tables for the coop projection family."""
    from ninfer.occupancy.verifier import LaunchVerificationError
    from ninfer.targets import TargetError

    if "all" in targets:
        targets = tuple(t for t in available_targets() if load_target(t).is_cuda)
    try:
        explain(ExplainArgs(targets, k, n_out, max_tokens, cache_dir, plain))
    except (TargetError, LaunchVerificationError, RuntimeError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
