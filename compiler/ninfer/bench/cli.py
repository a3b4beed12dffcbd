"""`ninfer-bench soak|serving [BUILD_DIR]`: load-test a compiled model's server;
`ninfer-bench accuracy CHECKPOINT`: drift of each weight / KV-cache format against float32.

Each command starts BUILD_DIR's ninfer-server (and stops it afterwards), or with --url
uses a server that is already running. Exit status: 0 passed, 1 a check failed (soak),
2 the benchmark could not run.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console

from ninfer.runtime.client import BenchError, open_endpoint
from ninfer.runtime.server import ServerError

console = Console()
err = Console(stderr=True)


def _range(text: str, name: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not LO,HI", param_hint=name) from None
    if not 1 <= lo <= hi:
        raise click.BadParameter(f"need 1 <= LO <= HI, got {text!r}", param_hint=name)
    return lo, hi


def _write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n")
        err.print(f"[dim]wrote {path}[/dim]")


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["ninfer-bench", *sys.argv[1:]])


def _server_options(fn: Any) -> Any:
    for opt in reversed([
        click.argument("build_dir", required=False,
                       type=click.Path(path_type=Path, exists=True, file_okay=False)),
        click.option("--url", help="Use the server already running here instead of "
                                   "starting BUILD_DIR's."),
        click.option("--threads", type=click.IntRange(1),
                     help="Server compute threads (default: the server's)."),
        click.option("--server-arg", "server_args", multiple=True,
                     help="Extra ninfer-server flag, repeatable "
                          "(e.g. --server-arg=--max-concurrency=4)."),
        click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
                     help="Also write the results as JSON here."),
    ]):
        fn = opt(fn)
    return fn


def _server_args(args: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for a in args:  # "--flag=value" -> "--flag", "value": the server wants separate words
        out.extend(a.split("=", 1) if a.startswith("--") and "=" in a else [a])
    return tuple(out)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Load tests for ninfer-server."""


@main.command()
@_server_options
@click.option("--requests", "n_requests", default=200, show_default=True,
              type=click.IntRange(1))
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1),
              help="Requests in flight.")
@click.option("--seed", default=0, show_default=True)
@click.option("--disconnect-rate", default=0.2, show_default=True,
              type=click.FloatRange(0, 1), help="Fraction of requests that stream and hang "
                                                "up after a random number of events.")
@click.option("--max-tokens-range", default="1,64", show_default=True)
@click.option("--prompt-len-range", default="1,200", show_default=True,
              help="Prompt tokens (clamped so prompt + max_tokens fits the context).")
@click.option("--stream-rate", default=0.5, show_default=True, type=click.FloatRange(0, 1),
              help="Fraction of the other requests that stream.")
@click.option("--chat-rate", default=0.25, show_default=True, type=click.FloatRange(0, 1),
              help="Fraction sent to /v1/chat/completions (text prompts).")
@click.option("--narrow-rate", default=0.0, show_default=True, type=click.FloatRange(0, 1),
              help="Fraction of the token-prompt requests whose logit_bias holds the output "
                   "to five of the prompt's ids: outputs that repeat themselves, so "
                   "speculative decoding's drafts get accepted and rejected.")
@click.option("--vocab-size", type=click.IntRange(2),
              help="Token ids in prompts stay below this (default: /v1/models' vocab_size, "
                   "else 256).")
@click.option("--pid", type=int, help="With --url: the server's pid, to sample its RSS.")
@click.option("--drain-timeout", default=30.0, show_default=True,
              help="Seconds to wait for the server to go idle at the end.")
@click.option("--request-timeout", default=120.0, show_default=True)
def soak(build_dir: Path | None, url: str | None, threads: int | None,
         server_args: tuple[str, ...], json_path: Path | None, n_requests: int,
         concurrency: int, seed: int, disconnect_rate: float, max_tokens_range: str,
         prompt_len_range: str, stream_rate: float, chat_rate: float, narrow_rate: float,
         vocab_size: int | None, pid: int | None, drain_timeout: float,
         request_timeout: float) -> None:
    """Fire many mixed requests; check answers, draining, KV blocks and RSS.

    RSS is sampled after a warm-up, halfway and at the end; it counts as
    flat when end <= start x 1.10 + 16 MiB.
    """
    from ninfer.runtime.soak import SoakConfig, render_soak, run_soak

    cfg = SoakConfig(requests=n_requests, concurrency=concurrency, seed=seed,
                     disconnect_rate=disconnect_rate,
                     max_tokens_range=_range(max_tokens_range, "--max-tokens-range"),
                     prompt_len_range=_range(prompt_len_range, "--prompt-len-range"),
                     stream_rate=stream_rate, chat_rate=chat_rate, narrow_rate=narrow_rate,
                     request_timeout=request_timeout, drain_timeout=drain_timeout)
    try:
        with open_endpoint(build_dir, url, threads=threads,
                           server_args=_server_args(server_args), pid=pid) as ep:
            with console.status("soak") as status:
                res = run_soak(ep, cfg, vocab_size=vocab_size,
                               progress=lambda d, n: status.update(f"soak: {d}/{n} requests"))
    except (BenchError, ServerError, httpx.HTTPError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    console.print(render_soak(res))
    for line in res.failures[:10]:
        console.print(f"  [red]failed[/red] {line}", highlight=False)
    if len(res.failures) > 10:
        console.print(f"  ... and {len(res.failures) - 10} more")
    for p in res.problems:
        console.print(f"[red]problem:[/red] {p}", highlight=False)
    console.print(f"[dim]{_command_line()}[/dim]", highlight=False)
    _write_json(json_path, {**res.to_json(), "command": _command_line()})
    sys.exit(0 if res.passed else 1)


@main.command()
@_server_options
@click.option("--prefill-chunk", type=click.IntRange(1),
              help="The server's prefill chunk (default: its startup line, else "
                   "compile_report.json plan.limits.prefill_chunk).")
@click.option("--prefill-multiple", default=8, show_default=True, type=click.IntRange(1),
              help="B's prompt is this many prefill chunks.")
@click.option("--decode-tokens", default=64, show_default=True, type=click.IntRange(4),
              help="max_tokens of A and of each scaling stream.")
@click.option("--levels", default="1,2,4,8", show_default=True,
              help="Concurrency levels for the scaling test.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1),
              help="Runs per measurement (the median is reported).")
def serving(build_dir: Path | None, url: str | None, threads: int | None,
            server_args: tuple[str, ...], json_path: Path | None, prefill_chunk: int | None,
            prefill_multiple: int, decode_tokens: int, levels: str, repeats: int) -> None:
    """Decode fairness under a long prefill, and decode throughput vs. concurrency."""
    from ninfer.bench.serving import ServingConfig, render_tables, run_serving

    try:
        lv = tuple(int(x) for x in levels.split(","))
    except ValueError:
        raise click.BadParameter(f"{levels!r} is not a comma list", param_hint="--levels") \
            from None
    if 1 not in lv or min(lv) < 1:
        raise click.BadParameter("levels must be positive and include 1",
                                 param_hint="--levels")
    cfg = ServingConfig(decode_tokens=decode_tokens, prefill_chunk=prefill_chunk,
                        prefill_multiple=prefill_multiple, levels=tuple(sorted(set(lv))),
                        repeats=repeats)
    try:
        with open_endpoint(build_dir, url, threads=threads,
                           server_args=_server_args(server_args)) as ep:
            res = run_serving(ep, cfg, _command_line(),
                              log=lambda s: err.print(f"[dim]{s}[/dim]"))
    except (BenchError, ServerError, httpx.HTTPError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    for table in render_tables(res):
        console.print(table)
    for note in res.fairness.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"[dim]{res.command}[/dim]", highlight=False)
    _write_json(json_path, res.to_json())


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--formats", default="f16,q8g32,q4g64,q4g128,kv:f16,kv:fp8,kv:int8,kv:int4",
              show_default=True,
              help="Formats to compare with f32 (comma list): weight formats, KV-cache "
                   "formats as kv:DTYPE, or both as WEIGHTS+kv:DTYPE.")
@click.option("--tokens", default=512, show_default=True, type=click.IntRange(16),
              help="Positions of the fixed text set.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1))
@click.option("-o", "--output", "out_root", type=click.Path(path_type=Path, file_okay=False),
              default=Path("build/accuracy"), show_default=True,
              help="Where the per-format CPU builds go.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the results as JSON here.")
def accuracy(checkpoint: Path, formats: str, tokens: int, threads: int, out_root: Path,
             json_path: Path | None) -> None:
    """Top-1 agreement, KL divergence and perplexity of each weight/KV format vs. f32."""
    from ninfer.bench.accuracy import format_table, run_accuracy, to_json

    try:
        rows = run_accuracy(checkpoint, [f for f in formats.split(",") if f], out_root,
                            tokens, threads, log=lambda s: err.print(f"[dim]{s}[/dim]"))
    except (ValueError, RuntimeError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    for line in format_table(rows):
        console.print(line, highlight=False)
    console.print(f"[dim]{_command_line()}[/dim]", highlight=False)
    _write_json(json_path, to_json(rows))


if __name__ == "__main__":
    main()
