"""`ninfer-check BUILD_DIR --reference CHECKPOINT_DIR`: does this compiled server compute
what its checkpoint computes, here, on the machine that will serve it?

It starts the build's `ninfer-server` (through `Server`) and sends a fixed set of prompts
(text in several scripts and code, and prompts longer than a prefill chunk; `--prompts
FILE` adds one per line), each for `--tokens` greedy tokens with the five most likely
alternatives' log-probabilities (as token ids: return_tokens_as_token_ids). Then:

- **reference**: the checkpoint's model (transformers, float32, on the GPU when torch has
  one; without torch and transformers the float64 numpy reference of the dense and hybrid
  architectures, ninfer.runtime.float64_reference) reads each prompt and the server's
  tokens in one forward pass, and at every position the server's listed
  log-probabilities are compared with its distribution: the mean KL
  (over the five tokens and the rest) must be within the bound the artifact's formats
  promise and the server's token must be the reference's argmax at least as often as they
  promise (its manifest's "check" section, ninfer.runtime.tolerance; `--tolerance` gives
  another: a format such as `f32` or `q4g64+kv:int4`, or MEAN_KL[,TOP1]).
- **concurrency W**: the same prompts W at a time, for W = 2, 4, .. up to the build's
  concurrency: the same bits as one at a time where the backend promises batch invariance
  (the CPU), else the same tokens up to a near tie and log-probabilities within the
  tolerance.
- **graphs off** (CUDA builds): the server again with `--no-cuda-graph`, compared the same
  way; **drafts off** (builds with speculation): again with `--spec none`.
- **soak** (`--soak N --concurrency C`): ninfer-bench soak's N mixed requests (streaming
  or not, chat and completions, clients hanging up) against a fresh server: every answer
  well formed, the server drained with no KV block held, its RSS flat.

The first divergence is reported with the prompt, the position, both tokens and both top-5
lists. Exit status 0 when every check passes, 1 when one fails, 2 when the check could not
run. Needs the runtime's dependencies; it imports no TVM.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact_format import read_manifest
from ninfer.runtime.server import Server, ServerError
from ninfer.runtime.tolerance import Bound, bound, parse_format

TOP = 5  # alternatives per position the server lists
# Between two runs of the same build (concurrency, graphs, drafts): float32 in another
# order, whatever the formats (they round the same stored values the same way).
RUN_TOLERANCE = 1e-3
PROMPT_SEED = 4011
PROMPTS = ("The quick brown fox jumps over the lazy dog because",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
           "東京は日本の首都です。大阪は",
           "Q: What is 17 times 23?\nA:",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who")


class CheckError(RuntimeError):
    """The check could not run (no reference, a server that does not start, a request it
    refused): not a verdict on the build."""


@dataclass
class Run:
    """One response: the tokens and, per position, the listed tokens' log-probabilities
    (the chosen one included)."""

    tokens: list[int]
    tops: list[dict[int, float]]


@dataclass
class Divergence:
    check: str
    prompt: int
    position: int
    reason: str
    got: int | None = None
    want: int | None = None
    got_top: list[tuple[int, float]] = field(default_factory=list)
    want_top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Row:
    check: str
    ok: bool
    detail: str


@dataclass
class Report:
    build: Path
    bound: Bound
    rows: list[Row] = field(default_factory=list)
    divergence: Divergence | None = None
    soak: Any = None  # ninfer.runtime.soak.SoakResult, when a soak ran

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)


def _top(d: dict[int, float] | np.ndarray, k: int = TOP) -> list[tuple[int, float]]:
    if isinstance(d, np.ndarray):
        idx = np.argsort(-d, kind="stable")[:k]
        return [(int(i), float(d[i])) for i in idx]
    return sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def coarse_kl(ref: np.ndarray, top: dict[int, float]) -> float:
    """KL(reference || server) over the server's listed tokens and the rest of the
    vocabulary as one outcome (a lower bound of the full KL)."""
    ids = list(top)
    pr = np.exp(ref[ids])
    ps = np.exp(np.array([top[t] for t in ids], dtype=np.float64))
    kl = float((pr * (ref[ids] - np.log(ps))).sum())
    rest_r, rest_s = max(1.0 - pr.sum(), 1e-300), max(1.0 - ps.sum(), 1e-300)
    if rest_r > 1e-12:
        kl += rest_r * (np.log(rest_r) - np.log(rest_s))
    return max(kl, 0.0)


@dataclass
class Against:
    """A run against the reference, per position: the coarse KL and whether the run's
    token is the reference's argmax."""

    prompt: int
    kls: list[float]
    agree: list[bool]
    run: Run
    rows: np.ndarray

    def divergence(self, i: int, reason: str) -> Divergence:
        ref = self.rows[i]
        return Divergence("reference", self.prompt, i, reason, self.run.tokens[i],
                          int(np.argmax(ref)), _top(self.run.tops[i]), _top(ref))


def against_reference(run: Run, rows: np.ndarray, prompt: int) -> Against:
    """`rows[i]`: the reference's log-probabilities predicting the run's token i, having
    read the prompt and the run's tokens before it."""
    return Against(prompt, [coarse_kl(rows[i], top) for i, top in enumerate(run.tops)],
                   [tok == int(np.argmax(rows[i])) for i, tok in enumerate(run.tokens)],
                   run, rows)


def verdict(results: list[Against], b: Bound) -> tuple[str, Divergence | None]:
    """(detail, the first divergence or None) of the runs against the reference under
    bound `b`: the mean KL at most b.mean_kl, the agreement at least b.top1."""
    kls = [k for r in results for k in r.kls]
    agree = [a for r in results for a in r.agree]
    mean_kl, top1 = float(np.mean(kls)), float(np.mean(agree))
    detail = (f"mean KL {mean_kl:.2e} (bound {b.mean_kl:.0e}), max {max(kls):.2e}; top-1 "
              f"agreement {top1:.3f} (bound {b.top1:.2f}) over {len(kls)} positions")
    if mean_kl > b.mean_kl:
        r, i = next((r, i) for r in results for i, k in enumerate(r.kls) if k > b.mean_kl)
        return detail, r.divergence(i, f"KL {r.kls[i]:.3g} at this position; the mean "
                                    f"{mean_kl:.3g} is over the bound {b.mean_kl:g}")
    if top1 < b.top1:
        r, i = next((r, i) for r in results for i, a in enumerate(r.agree) if not a)
        return detail, r.divergence(i, f"not the reference's argmax; agreement {top1:.3f} "
                                    f"is under the bound {b.top1:g}")
    return detail, None


def compare_runs(got: Run, want: Run, tol: float, exact: bool, check: str,
                 prompt: int) -> tuple[float, Divergence | None]:
    """`got` against `want` (the server's own one-at-a-time run): the same bits when
    `exact`, else the same tokens up to a near tie in `want` (then the rest is another
    continuation) and log-probabilities within `tol`. (largest difference, divergence)."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(got.tokens, want.tokens, strict=False)):
        ga, wb = got.tops[i], want.tops[i]
        common = set(ga) & set(wb)
        dev = max((abs(ga[t] - wb[t]) for t in common), default=0.0)
        worst = max(worst, dev)
        if exact and (a != b or ga != wb):
            return worst, Divergence(check, prompt, i, "not the same bits as one request at a "
                                     "time (this backend promises batch invariance)",
                                     a, b, _top(ga), _top(wb))
        if a != b:
            near = b in wb and a in wb and wb[b] - wb[a] <= 2 * tol
            if not near:
                return worst, Divergence(check, prompt, i, f"token {a} where one request at "
                                         f"a time gives {b} (not a near tie)",
                                         a, b, _top(ga), _top(wb))
            return worst, None
        if dev > tol:
            return worst, Divergence(check, prompt, i, f"log-probabilities differ by {dev:.5f} "
                                     f"> {tol:g} from one request at a time",
                                     a, b, _top(ga), _top(wb))
    if len(got.tokens) != len(want.tokens):
        n = min(len(got.tokens), len(want.tokens))
        return worst, Divergence(check, prompt, n, f"{len(got.tokens)} tokens where one "
                                 f"request at a time gives {len(want.tokens)}")
    return worst, None


class TransformersReference:
    """The checkpoint's model in transformers, float32, on the GPU when torch has CUDA."""

    def __init__(self, checkpoint: Path) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as e:
            raise CheckError(f"the reference needs torch and transformers ({e}); install "
                             "them beside ninfer (pip install torch transformers)") from e
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        except Exception as e:  # any loader failure is the same to the user
            raise CheckError(f"transformers cannot load {checkpoint}: {e}") from e
        self.model = model.to(self.device).eval()
        self.name = f"transformers {type(model).__name__} float32 on {self.device}"

    def logprobs(self, ids: Sequence[int], start: int) -> np.ndarray:
        """Log-probabilities (float64) predicting ids[start:], each having read the ids
        before it."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([list(ids)], device=self.device)).logits[0]
        x = logits[start - 1:len(ids) - 1].double()
        return (x - torch.logsumexp(x, dim=-1, keepdim=True)).cpu().numpy()


def make_reference(checkpoint: Path, impl: str = "auto") -> Any:
    """`impl`: "transformers", "float64" (ninfer.runtime.float64_reference, numpy only), or
    "auto": transformers where torch and transformers import, else float64."""
    from ninfer.runtime.float64_reference import ReferenceError, float64_reference

    if impl not in ("auto", "transformers", "float64"):
        raise CheckError(f"reference {impl!r}: one of auto, transformers, float64")
    if impl != "float64":
        try:
            return TransformersReference(checkpoint)
        except CheckError as e:
            if impl == "transformers" or "needs torch and transformers" not in str(e):
                raise
    try:
        return float64_reference(checkpoint)
    except (ReferenceError, OSError, KeyError, ValueError) as e:
        raise CheckError(f"no reference for {checkpoint}: {e}") from e


def default_prompts(checkpoint: Path, limits: dict[str, Any], tokens: int,
                    extra: Sequence[str] = ()) -> list[list[int]]:
    """The fixed prompts (and `extra` texts) tokenized with the checkpoint's tokenizer, and
    two seeded prompts of ordinary tokens longer than a prefill chunk."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    room = limits["max_context"] - tokens
    if room < 8:
        raise CheckError(f"--tokens {tokens} leaves no room for a prompt in the build's "
                         f"context of {limits['max_context']}")
    prompts = [tok.encode(p, add_special_tokens=False).ids for p in (*PROMPTS, *extra)]
    special = set(tok.get_added_tokens_decoder())  # {id: AddedToken}
    ordinary = [i for i in range(tok.get_vocab_size(with_added_tokens=False))
                if i not in special]
    rng = random.Random(PROMPT_SEED)
    for n in (limits["prefill_chunk"] + 3, 2 * limits["prefill_chunk"] + 5):
        prompts.append([rng.choice(ordinary) for _ in range(min(n, room))])
    out = [p[:room] for p in prompts if p]
    if not out:
        raise CheckError("no prompt left after tokenizing")
    return out


def parse_tolerance(value: str) -> Bound:
    """A format ("f32", "q4g64", "kv:int4", "q4g64+kv:int4": its bound), or "KL[,TOP1]"
    (a mean KL in nats, and a top-1 agreement, default 0)."""
    try:
        parts = [float(x) for x in value.split(",")]
    except ValueError:
        parts = []
    if parts and len(parts) <= 2:
        return Bound(parts[0], parts[1] if len(parts) > 1 else 0.0)
    weights, kv = parse_format(value)
    try:
        return bound([weights], kv)
    except ValueError as e:
        raise CheckError(f"--tolerance {value!r}: {e}") from e


def _completion(srv: Server, ids: list[int], n: int) -> Run:
    r = srv.client.post("/v1/completions", json={
        "prompt": ids, "max_tokens": n, "temperature": 0, "logprobs": TOP, "ignore_eos": True,
        "return_token_ids": True, "return_tokens_as_token_ids": True}, timeout=600)
    if r.status_code != 200:
        raise CheckError(f"the server answered {r.status_code}: {r.text[:500]}")
    c = r.json()["choices"][0]
    tops = [{int(k.removeprefix("token_id:")): float(v) for k, v in d.items()}
            for d in c["logprobs"]["top_logprobs"]]
    return Run(list(c["token_ids"]), tops)


def _serve(build: Path, args: tuple[str, ...], threads: int | None,
           prompts: list[list[int]], n: int, widths: Sequence[int] = (1,)
           ) -> dict[int, list[Run]]:
    """{width: runs of every prompt} with `width` requests in flight at once."""
    out: dict[int, list[Run]] = {}
    with Server(build, threads=threads, extra_args=args) as srv:
        for w in widths:
            if w == 1:
                out[w] = [_completion(srv, p, n) for p in prompts]
                continue
            # every prompt once, `w` in flight: each prompt beside others of other lengths
            with ThreadPoolExecutor(w) as pool:
                out[w] = list(pool.map(lambda p: _completion(srv, p, n), prompts))
    return out


def check(build: Path, reference: Path, *, tokens: int = 24, prompts_file: Path | None = None,
          tolerance: Bound | None = None, threads: int | None = None,
          server_args: tuple[str, ...] = (), soak: int = 0, concurrency: int | None = None,
          reference_impl: str = "auto", log: Callable[[str], None] = lambda s: None) -> Report:
    """Run every check on the build in `build` against the checkpoint in `reference`;
    `soak` > 0: then `soak` mixed requests with `concurrency` (default: the build's) in
    flight, as `ninfer-bench soak` sends them."""
    build = Path(build)
    if concurrency is not None and soak <= 0:
        raise CheckError("--concurrency sets the soak's requests in flight: give --soak N too")
    try:
        manifest = read_manifest(build / "model.ninfer")
    except (OSError, ValueError) as e:
        raise CheckError(f"{build}: {e}") from e
    limits = manifest["limits"]
    promised = manifest.get("check")
    if tolerance is None:
        if promised is None:
            raise CheckError(f"{build / 'model.ninfer'} records no bounds (compiled by an "
                             "older ninfer): recompile, or give --tolerance")
        tolerance = Bound(float(promised["mean_kl"]), float(promised["top1_agreement"]))
    exact = bool(promised and promised.get("batch_invariant"))
    report = Report(build, tolerance)
    extra = prompts_file.read_text().splitlines() if prompts_file else []
    prompts = default_prompts(reference, limits, tokens, [e for e in extra if e.strip()])
    ref = make_reference(reference, reference_impl)
    log(f"{len(prompts)} prompts x {tokens} tokens; reference: {ref.name}; bound: mean KL "
        f"{tolerance.mean_kl:g}, top-1 agreement {tolerance.top1:g}")
    widths = [1] + [w for w in (2, 4, 8, 16, 32, 64) if w < limits["max_concurrency"]]
    if limits["max_concurrency"] > 1:
        widths.append(limits["max_concurrency"])
    runs = _serve(build, server_args, threads, prompts, tokens, widths)

    def fail(d: Divergence) -> None:
        if report.divergence is None:
            report.divergence = d

    results = [against_reference(run, ref.logprobs(p + run.tokens, len(p)), i)
               for i, (p, run) in enumerate(zip(prompts, runs[1], strict=True))]
    detail, bad = verdict(results, tolerance)
    report.rows.append(Row("reference", bad is None, detail))
    if bad:
        fail(bad)

    def against(name: str, others: list[Run]) -> None:
        worst, bad = 0.0, None
        for i, (a, b) in enumerate(zip(others, runs[1], strict=True)):
            w, d = compare_runs(a, b, RUN_TOLERANCE, exact, name, i)
            worst, bad = max(worst, w), bad or d
        kind = "same bits" if exact else "same tokens"
        report.rows.append(Row(name, bad is None, (f"{kind}, max |d logprob| {worst:.2e}"
                                                   if bad is None else bad.reason)))
        if bad:
            fail(bad)

    for w in widths[1:]:
        against(f"concurrency {w}", runs[w])
    if manifest["target"]["kind"] == "cuda" and "--no-cuda-graph" not in server_args:
        log("again with --no-cuda-graph")
        against("graphs off", _serve(build, (*server_args, "--no-cuda-graph"), threads,
                                     prompts, tokens)[1])
    if limits.get("spec", "none") != "none" and "--spec" not in server_args:
        log("again with --spec none")
        against("drafts off", _serve(build, (*server_args, "--spec", "none"), threads,
                                     prompts, tokens)[1])
    if soak > 0:
        report.soak = _soak(build, server_args, threads, soak,
                            concurrency or limits["max_concurrency"],
                            limits.get("spec", "none") != "none", log)
        r = report.soak
        report.rows.append(Row(f"soak {soak} x {r.config['concurrency']}", r.passed,
                               f"{r.completed} answered, {r.disconnected} hung up, {r.failed} "
                               f"failed; KV blocks used after: {r.kv_blocks_used}; RSS "
                               f"{r.rss_start_mib}->{r.rss_end_mib} MiB"
                               + ("; " + "; ".join(r.problems) if r.problems else "")))
    return report


def _soak(build: Path, server_args: tuple[str, ...], threads: int | None, n: int,
          concurrency: int, speculative: bool, log: Callable[[str], None]) -> Any:
    """ninfer-bench soak's client against a fresh server of the build."""
    from ninfer.runtime.client import open_endpoint
    from ninfer.runtime.soak import SoakConfig, run_soak

    log(f"soak: {n} requests, {concurrency} in flight")
    cfg = SoakConfig(requests=n, concurrency=concurrency, seed=PROMPT_SEED,
                     narrow_rate=0.3 if speculative else 0.0)
    with open_endpoint(build, None, threads=threads, server_args=server_args) as ep:
        return run_soak(ep, cfg)


def _describe(d: Divergence, decode: Callable[[int], str]) -> list[str]:
    def top(items: list[tuple[int, float]]) -> str:
        return ", ".join(f"{t} {decode(t)!r} {lp:.4f}" for t, lp in items)

    lines = [f"first divergence ({d.check}): prompt {d.prompt}, position {d.position}: "
             f"{d.reason}"]
    if d.got is not None:
        lines.append(f"  server:    token {d.got} {decode(d.got)!r}; top {top(d.got_top)}")
    if d.want is not None:
        lines.append(f"  reference: token {d.want} {decode(d.want)!r}; top {top(d.want_top)}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    import click
    from rich.console import Console
    from rich.table import Table

    from ninfer.runtime.client import BenchError

    @click.command(context_settings={"help_option_names": ["-h", "--help"]},
                   help=__doc__.split("\n\n")[0].replace("`", ""))
    @click.argument("build", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option("--reference", "reference", required=True,
                  type=click.Path(exists=True, file_okay=False, path_type=Path),
                  help="the checkpoint directory the build was compiled from")
    @click.option("--tokens", default=24, show_default=True, type=click.IntRange(1, 4096),
                  help="greedy tokens per prompt")
    @click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False,
                                                                path_type=Path),
                  help="more prompts, one per line")
    @click.option("--tolerance", help="a format's bound (f32, q8g32, kv:int4, "
                  "q4g64+kv:int4), or MEAN_KL[,TOP1]; default: what the artifact's formats "
                  "promise")
    @click.option("--reference-impl", type=click.Choice(["auto", "transformers", "float64"]),
                  default="auto", show_default=True,
                  help="the reference model: transformers (float32), the float64 numpy "
                  "reference (dense and hybrid architectures), or auto (transformers where "
                  "it imports)")
    @click.option("--threads", type=int, help="the server's --threads (CPU builds)")
    @click.option("--server-arg", "server_args", multiple=True,
                  help="an argument for ninfer-server (repeat for each)")
    @click.option("--soak", default=0, show_default=True, type=click.IntRange(0),
                  help="then this many mixed requests (ninfer-bench soak's: streaming or "
                  "not, chat and completions, hang-ups); fails on a bad answer, a leaked KV "
                  "block or growing RSS")
    @click.option("--concurrency", type=click.IntRange(1),
                  help="requests in flight in the soak (default: the build's concurrency)")
    def command(build: Path, reference: Path, tokens: int, prompts_file: Path | None,
                tolerance: str | None, reference_impl: str, threads: int | None,
                server_args: tuple[str, ...], soak: int, concurrency: int | None) -> None:
        console = Console()
        try:
            tol = parse_tolerance(tolerance) if tolerance is not None else None
            report = check(build, reference, tokens=tokens, prompts_file=prompts_file,
                           tolerance=tol, threads=threads, server_args=server_args,
                           soak=soak, concurrency=concurrency, reference_impl=reference_impl,
                           log=lambda s: console.print(f"[dim]{s}[/dim]"))
        except (CheckError, ServerError, OSError, BenchError) as e:  # could not run
            console.print(f"[red]ninfer-check could not run:[/red] {e}")
            raise SystemExit(2) from e
        table = Table(title=f"ninfer-check {build}")
        table.add_column("check")
        table.add_column("result")
        table.add_column("detail")
        for r in report.rows:
            table.add_row(r.check, "[green]pass[/green]" if r.ok else "[red]FAIL[/red]",
                          r.detail)
        console.print(table)
        if report.soak is not None:
            from ninfer.runtime.soak import render_soak

            console.print(render_soak(report.soak))
            for line in report.soak.failures[:10]:
                console.print(f"  failed: {line}", markup=False, highlight=False)
        if report.divergence:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(reference / "tokenizer.json"))
            for line in _describe(report.divergence,
                                  lambda t: tok.decode([t], skip_special_tokens=False)):
                console.print(line, markup=False, highlight=False)
        raise SystemExit(0 if report.ok else 1)

    command.main(args=list(argv) if argv is not None else None,
                 prog_name="ninfer-check")
