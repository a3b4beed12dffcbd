"""`ninfer-compile`: parse options into CompileOptions and call compile_model()."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from ninfer.options import CPU_BF16_ACTIVATIONS, CPU_GEMV_STREAMS
from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.report import LAUNCH_COLUMNS, CoopRouteRow, LaunchRow
from ninfer.targets import available_targets

DEMO_DIR = DEFAULT_BUILD_DIR / "demo-checkpoint"
console = Console(stderr=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Hugging Face checkpoint directory (default: the embedded demo model).")
@click.option("--target", default="cpu", show_default=True,
              help=f"Target profile name or TOML path ({', '.join(available_targets())}).")
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Output directory (default: build/<model>-<target>).")
@click.option("--model-id", help="Model id served by /v1/models (default: directory name).")
@click.option("--max-context", type=click.IntRange(2),
              help="Compiled maximum context (prompt + reply) in tokens; the server's "
                   "--max-context may lower it. Default: min(4096, the model's "
                   "max_position_embeddings).")
@click.option("--prefill-chunk", "--max-prefill-chunk", "prefill_chunk",
              type=click.IntRange(1),
              help="Compiled token rows per step (decode rows of every running request + "
                   "prompt chunks); the server's --prefill-chunk may lower it. Default: "
                   "min(512, the max context). --max-prefill-chunk is its old spelling.")
@click.option("--max-concurrency", type=click.IntRange(1),
              help="Compiled maximum requests running at once (continuous batching slots); "
                   "the server's --max-concurrency may lower it. Default: min(8, the "
                   "prefill chunk).")
@click.option("--kv-capacity", default="auto", show_default=True,
              help="Tokens in the paged KV pool: 'auto' (every slot at full context, capped "
                   "by the memory left after weights and activations) or a number.")
@click.option("--kv-block-size", default="16", show_default=True,
              type=click.Choice(["8", "16", "32", "64"]),
              help="Tokens per block of the paged KV cache: the unit of its allocation and "
                   "of prefix-cache hits (larger blocks share prefixes more coarsely). The "
                   "CPU attention gives the same outputs at every size.")
@click.option("--weights", "weights", default="auto", show_default=True,
              type=click.Choice(["auto", "f32", "f16", "bf16", "q8g32", "q4g64", "q4g128"]),
              help="Storage format of the matmul weights: auto keeps the checkpoint's dtype "
                   "(f16, bf16, else f32); q* are group-wise int8/int4 with one fp16 scale "
                   "per group of 32/64/128 along k.")
@click.option("--weights-override", "weight_overrides", multiple=True, metavar="ROLE=FORMAT",
              help="Per-role format, e.g. lm_head=q8g32 (roles: q k v o gate_up down "
                   "lm_head); repeatable.")
@click.option("--kv-dtype", default="f16", show_default=True,
              type=click.Choice(["f32", "f16", "bf16", "fp8", "int8", "int4"]),
              help="Storage format of the KV cache: floats, fp8 e4m3, or int8/int4 with an "
                   "fp16 scale per 32 values (int4 keys Hadamard-rotated). CUDA targets read "
                   "f32, f16 and bf16.")
@click.option("--cpu-gemv-streams", default="auto", show_default=True,
              type=click.Choice(CPU_GEMV_STREAMS),
              help="cpu target: the decode gemvs read their weights as 1 stream a thread "
                   "(hardware prefetch only) or as the kernels' default streams, 2 a thread for "
                   "one row, prefetched in software (results bitwise the same). auto = what reads "
                   "faster in this host's read probe (measured once per CPU; "
                   "NINFER_CPU_GEMV_STREAMS=1|2 sets it for every compile).")
@click.option("--cpu-bf16-activations", default="auto", show_default=True,
              type=click.Choice(CPU_BF16_ACTIVATIONS),
              help="cpu target: bf16 weights multiply x rounded to bf16 (vdpbf16ps where the "
                   "host has AVX512_BF16; llama.cpp's BF16 path rounds x the same way) or "
                   "float32 x (float32 arithmetic throughout; prefill about 1.6x slower "
                   "where vdpbf16ps is fast, decode the same). auto = bf16 where the host "
                   "has AVX512_BF16 and vdpbf16ps gives 1.25x the FMAs' multiply-adds "
                   "(measured once per CPU), else f32.")
@click.option("--gdn-prefill", default="auto", show_default=True,
              type=click.Choice(["auto", "recurrent", "chunked"]),
              help="Hybrid models: a prompt's Gated DeltaNet recurrence row by row, or in "
                   "64-row chunks of the WY form (cpu and CUDA targets). auto = recurrent, "
                   "the faster on the CPUs measured (the CUDA chunked form is unmeasured).")
@click.option("--spec", default="none", show_default=True,
              type=click.Choice(["none", "ngram", "mtp"]),
              help="Speculative decoding the step programs are sized for: ngram (prompt "
                   "lookup: drafts copied from the sequence's own earlier tokens) or mtp (the "
                   "checkpoint's multi-token-prediction head; not built yet). Dense and "
                   "hybrid models (these keep 1 + max draft tokens recurrent-state slots per "
                   "sequence), cpu and CUDA targets. The server's --spec turns it on or off.")
@click.option("--max-draft-tokens", type=click.IntRange(1, 16),
              help="Most draft tokens per sequence and step (default: 4 for ngram, 3 for "
                   "mtp); a step returns up to max concurrency x (1 + this) logits rows.")
@click.option("--state-checkpoints", type=click.IntRange(min=0),
              help="Hybrid models' prefix cache: slots that keep the Gated DeltaNet state "
                   "after a cached prompt prefix (a cache hit needs one; counted in the memory "
                   "plan). Default: 1 per sequence slot; 0 turns the hybrid's prefix caching "
                   "off. Dense models cache KV blocks only and take no checkpoints.")
@click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True),
              help="Override the target's memory budget.")
@click.option("--no-python-module", is_flag=True, help="Do not build the ninfer_engine module.")
@click.option("--no-build", is_flag=True,
              help="Stop after the sources, launch proofs and artifact (build src/ with cmake "
                   "later).")
@click.option("--dump", "dump_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Write each stage's output here as it finishes (graph, plan, kernel and "
                   "launch tables, generated code, report).")
@click.option("--prefill-projections", type=click.Choice(["auto", "tvm", "coop"]),
              default="auto", show_default=True,
              help="CUDA: prefill projections through the TVM GEMM or the cooperative "
                   "split-K family (routes derived per target); auto = coop on CUDA.")
@click.option("--chat-template", "chat_template",
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A Jinja chat template file replacing the checkpoint's (which comes from "
                   "tokenizer_config.json or chat_template.jinja); compiled to C++ and checked "
                   "against jinja2 on generated conversations.")
@click.option("--explain", is_flag=True,
              help="Print the launch verification table (GPU targets): kernel, registers, "
                   "shared memory, CTAs/SM, resident budget, largest size that fits.")
def main(model_dir: Path | None, target: str, out_dir: Path | None, model_id: str | None,
         max_context: int | None, prefill_chunk: int | None, max_concurrency: int | None,
         kv_capacity: str, kv_block_size: str, spec: str, max_draft_tokens: int | None,
         state_checkpoints: int | None,
         weights: str, weight_overrides: tuple[str, ...], kv_dtype: str, cpu_gemv_streams: str,
         cpu_bf16_activations: str, gdn_prefill: str,
         memory_gib: float | None,
         no_python_module: bool, no_build: bool, dump_dir: Path | None,
         prefill_projections: str,
         chat_template: Path | None, explain: bool) -> None:
    """Compile a checkpoint for a target into a standalone ninfer-server."""
    from ninfer.options import CompileOptions
    from ninfer.pipeline import compile_model
    from ninfer.targets import load_target

    try:  # a bad target fails at once, before the demo model is trained
        load_target(target)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)
    if model_dir is None:
        from ninfer.demo.checkpoint import is_cached, write_demo_checkpoint

        if not is_cached(DEMO_DIR):
            console.print("[dim]training the embedded demo model on its bundled corpus "
                          "(first run only, about a minute)[/dim]")
        try:
            model_dir = write_demo_checkpoint(
                DEMO_DIR, progress=lambda line: console.print(f"[dim]  {line}[/dim]"))
        except RuntimeError as exc:
            console.print(f"[red]error:[/red] {exc}")
            sys.exit(1)
        model_id = model_id or "ninfer-demo"
        console.print(f"[dim]no --model given: using the embedded demo checkpoint "
                      f"({model_dir})[/dim]")
    if kv_capacity != "auto" and not (kv_capacity.isdigit() and int(kv_capacity) > 0):
        raise click.BadParameter(f"{kv_capacity!r} is neither 'auto' nor a positive number "
                                 "of tokens", param_hint="--kv-capacity")
    overrides = []
    for item in weight_overrides:
        role, sep, fmt = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not ROLE=FORMAT",
                                     param_hint="--weights-override")
        overrides.append((role, fmt))
    try:
        opts = CompileOptions(model_dir=model_dir, target=target, out_dir=out_dir,
                              model_id=model_id, max_context=max_context,
                              prefill_chunk=prefill_chunk,
                              max_concurrency=max_concurrency,
                              kv_capacity=0 if kv_capacity == "auto" else int(kv_capacity),
                              kv_block_size=int(kv_block_size),
                              weights=weights, weight_overrides=tuple(overrides),
                              kv_dtype=kv_dtype, gdn_prefill=gdn_prefill,
                              cpu_gemv_streams=cpu_gemv_streams,
                              cpu_bf16_activations=cpu_bf16_activations,
                              memory_gib=memory_gib,
                              python_module=not no_python_module, build=not no_build,
                              dump_dir=dump_dir,
                              prefill_projections=prefill_projections,
                              chat_template=chat_template, spec=spec,
                              max_draft_tokens=max_draft_tokens,
                              state_checkpoints=state_checkpoints)
        with console.status("compiling") as status:
            result = compile_model(opts, lambda s: status.update(f"[bold]{s}[/bold]"))
    except (ValueError, RuntimeError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)
    report = result.report
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    limits = report.plan.limits
    console.print(f"  serve limits: context {limits.max_context}, prefill chunk "
                  f"{limits.prefill_chunk}, concurrency {limits.max_concurrency}"
                  + (f", speculation {limits.spec} (up to {limits.max_draft_tokens} drafts, "
                     f"{limits.logit_rows} logits rows per step)" if limits.max_draft_tokens
                     else ""))
    if explain:
        _print_launches(report.launches, target)
        _print_coop_routes(report.coop_routes, target)
    for stage, seconds in report.stage_seconds.items():
        console.print(f"  {stage:<10} {seconds:7.2f} s")
    mem, kv = report.plan.memory, report.plan.kv
    console.print(f"  memory plan: weights {mem.weights_bytes / 2**20:.1f} MiB, "
                  f"KV {mem.kv_bytes / 2**20:.1f} MiB, activations "
                  f"{mem.activation_bytes / 2**20:.1f} MiB"
                  + (f", recurrent state {mem.state_bytes / 2**20:.1f} MiB "
                     f"({mem.state_slots} slots, {limits.state_checkpoints} of them prefix-cache "
                     "checkpoints)" if mem.state_bytes else ""))
    console.print(f"  KV pool: {kv.tokens} tokens in {kv.blocks - 1} blocks of "
                  f"{kv.block_size} ({kv.dtype}, {kv.bytes_per_token} B per token)")
    spent = ("weights, activations, workspace and state" if mem.state_bytes
             else "weights, activations and workspace")
    console.print(f"  memory left after {spent} holds: " + ", ".join(
        f"{fmt} {tokens}" for fmt, _, tokens in kv.memory_tokens) + " tokens")
    if no_build:
        console.print(f"[green]generated[/green] {result.out_dir / 'src'} (not built)")
    else:
        console.print(f"[green]built[/green] {result.server}")
    print(result.out_dir)


def _print_launches(rows: tuple[LaunchRow, ...], target: str) -> None:
    from rich.table import Table

    if not rows:
        console.print(f"[dim]target {target}: no GPU launches to verify (CPU kernels run "
                      "on the thread pool)[/dim]")
        return
    table = Table(title=f"launch verification: {target}")
    for column in LAUNCH_COLUMNS:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*row.cells())
    console.print(table, width=max(console.width, 150))


def _print_coop_routes(rows: tuple[CoopRouteRow, ...], target: str) -> None:
    """Per prefill projection: which variant each token range runs, derived from the
    variants' real occupancy on the target (its largest grid against the budget)."""
    from rich.table import Table

    if not rows:
        return
    table = Table(title=f"cooperative prefill projections: routes on {target}")
    for column in ("role", "k x n", "tokens", "variant", "max grid", "resident budget"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.role, f"{r.k} x {r.n_out}", f"{r.min_tokens}..{r.max_tokens}",
                      f"split{r.split}" if r.split > 1 else "unsplit", str(r.max_grid),
                      str(r.resident_budget) if r.resident_budget else "-")
    console.print(table, width=max(console.width, 100))


if __name__ == "__main__":
    main()
