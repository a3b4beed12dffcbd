"""`CompileOptions`: what `ninfer-compile` was asked for, checked when it is made.

Checks that need no target run in `__post_init__`; those that depend on the target
(`check_target`) and the values later stages read (`serve_limits`, `weight_formats`,
`projections`) are methods, so the pipeline only calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ninfer.paths import DEFAULT_BUILD_DIR
from ninfer.plan import FORMAT_WDTYPES, ServeLimits, WeightFormats
from ninfer.quantize.kv_formats import KV_DTYPES
from ninfer.targets import Target

PREFILL_PROJECTIONS = ("auto", "tvm", "coop")
GDN_PREFILL = ("auto", "recurrent", "chunked")
CPU_GEMV_STREAMS = ("auto", "1", "2")
CPU_BF16_ACTIVATIONS = ("auto", "bf16", "f32")
SPEC_KINDS = ("none", "ngram", "mtp")
# --max-draft-tokens when --spec is given without it (vLLM's and NInfer's usual values)
DEFAULT_DRAFT_TOKENS = {"ngram": 4, "mtp": 3}
MAX_DRAFT_TOKENS = 16
# KV-cache formats the CUDA attention reads (kernels.cuda.attention.CUDA_KV_FORMATS)
CUDA_KV_DTYPES = ("f32", "f16", "bf16")
# Row counts up to this run the GEMV schedule. On the CPU the float GEMV's 2- and 3-row
# micro-kernels beat the GEMM tile up to 8 rows on decode-shaped weights (k 512-3072,
# n 512-3072), and so does the quantized GEMV with its tiles of 4 rows since session 12
# (5 / 8 rows, weights hot in L3: q4g64 23.5 / 16.2 GB/s against the GEMM's 18.8 / 6.8,
# q8g32 26.4 / 16.8 against 9.6 / 11.9; RESULTS, session 13). The CUDA schedules keep 4.
GEMV_MAX_ROWS_CPU = 8
GEMV_MAX_ROWS = 4
# Defaults of the serve limits the user leaves out. Each is also capped by the limit it
# depends on (the model's positions, the context, the prefill chunk), and the compile says
# so; a value the user gives is never changed: if it contradicts another, ServeLimits
# refuses it with both numbers.
DEFAULT_MAX_CONTEXT = 4096
DEFAULT_PREFILL_CHUNK = 512
DEFAULT_MAX_CONCURRENCY = 8


class OptionsError(ValueError):
    """The compile options contradict each other or the target."""


@dataclass(frozen=True)
class CompileOptions:
    model_dir: Path
    target: str = "cpu"
    out_dir: Path | None = None
    model_id: str | None = None
    # Serve limits; None: the defaults below, fitted to the model (see serve_limits).
    max_context: int | None = None
    prefill_chunk: int | None = None
    max_concurrency: int | None = None
    kv_capacity: int = 0  # tokens; 0 = auto
    kv_block_size: int = 16  # tokens per KV block (ServeLimits.kv_block_size)
    # Matmul weight format (plan.FORMAT_WDTYPES), or "auto": the checkpoint's own dtype
    # (a bf16 checkpoint stays bf16, as llama.cpp's converter keeps it); resolved by
    # with_checkpoint_weights once the frontend has read the checkpoint.
    weights: str = "auto"
    weight_overrides: tuple[tuple[str, str], ...] = ()  # (role, format), e.g. lm_head
    kv_dtype: str = "f16"  # KV-cache format (ninfer.quantize.kv_formats)
    memory_gib: float | None = None
    python_module: bool = True
    # False (--no-build): stop once the sources, the launch proofs and the artifact are
    # written; build them later with cmake (src/CMakeLists.txt). The chat-template check,
    # which runs the built server, is skipped with it.
    build: bool = True
    dump_dir: Path | None = None
    # CUDA: "tvm" runs prefill projections through the TVM GEMM; "coop" through the
    # cooperative split-K family with verifier-derived routes (validated on an H200);
    # "auto" = coop on CUDA targets, tvm on the CPU.
    prefill_projections: str = "auto"
    # Hybrid models' Gated DeltaNet prefill: "recurrent" runs a prompt row by row,
    # "chunked" in 64-row chunks of the WY form (GdnRecurrentSpec.chunk; on CUDA a block per
    # column tile of the state, kernels/cuda/gdn.py); "auto" = recurrent: the faster of the
    # two on the CPUs measured (benchmarks/RESULTS.md: the chunked form does as many FMAs
    # per row as the recurrence, which keeps the state in cache), and the CUDA chunked form
    # has not run on a GPU yet, so nothing says it is faster there.
    gdn_prefill: str = "auto"
    # The cpu target's decode gemvs: weight streams a thread, "1" (hardware prefetch only)
    # or "2" (prefetched in software); "auto" = what reads faster in the host's read probe
    # (ninfer.roofline.host_gemv_streams), resolved by with_host_read.
    cpu_gemv_streams: str = "auto"
    # The cpu target's bf16-weight matmuls: "bf16" multiplies them with x rounded to bf16
    # (vdpbf16ps where the host has AVX512_BF16; llama.cpp's BF16 path rounds x the same
    # way), "f32" with float32 x (float32 arithmetic throughout; prefill slower, decode the
    # same, where vdpbf16ps is fast); "auto" = bf16 where the host has the instruction and
    # it pays (ninfer.roofline.host_dpbf16_pays), else f32 (there rounding would cost
    # accuracy and buy nothing: the FMA twin decodes ~8% slower). MatmulSpec.x_bf16.
    cpu_bf16_activations: str = "auto"
    kernel_cache: Path = field(default_factory=lambda: DEFAULT_BUILD_DIR / ".kernel-cache")
    # False: build everything but model.ninfer (write it later with write_model_artifact,
    # e.g. on a machine that holds the weights but not TVM).
    write_artifact: bool = True
    # A Jinja chat template file replacing the checkpoint's (--chat-template).
    chat_template: Path | None = None
    # Conversations per template the compile renders through jinja2 and the generated C++.
    chat_template_checks: int = 300
    # Speculative decoding the step programs are sized for (--spec): "ngram" (prompt
    # lookup on the host) or "mtp" (the checkpoint's multi-token-prediction head), with
    # up to max_draft_tokens drafts per sequence and step (None: DEFAULT_DRAFT_TOKENS).
    spec: str = "none"
    max_draft_tokens: int | None = None
    # Hybrid models' prefix cache: recurrent-state checkpoint slots (None: auto, see
    # plan.DEFAULT_CHECKPOINTS_PER_SLOT; 0: no prefix caching for the hybrid).
    state_checkpoints: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_projections not in PREFILL_PROJECTIONS:
            raise OptionsError(f"--prefill-projections must be 'auto', 'tvm' or 'coop', got "
                               f"{self.prefill_projections!r}")
        if self.cpu_gemv_streams not in CPU_GEMV_STREAMS:
            raise OptionsError(f"--cpu-gemv-streams must be one of {', '.join(CPU_GEMV_STREAMS)}"
                               f", got {self.cpu_gemv_streams!r}")
        if self.cpu_bf16_activations not in CPU_BF16_ACTIVATIONS:
            raise OptionsError(f"--cpu-bf16-activations must be one of "
                               f"{', '.join(CPU_BF16_ACTIVATIONS)}, got "
                               f"{self.cpu_bf16_activations!r}")
        if self.gdn_prefill not in GDN_PREFILL:
            raise OptionsError(f"--gdn-prefill must be one of {', '.join(GDN_PREFILL)}, got "
                               f"{self.gdn_prefill!r}")
        if self.weights != "auto" and self.weights not in FORMAT_WDTYPES:
            raise OptionsError(f"weight format {self.weights!r} is not 'auto' or one of "
                               f"{', '.join(FORMAT_WDTYPES)}")
        for _, fmt in self.weight_overrides:
            if fmt not in FORMAT_WDTYPES:
                raise OptionsError(f"weight format {fmt!r} is not one of "
                                   f"{', '.join(FORMAT_WDTYPES)}")
        if self.kv_dtype not in KV_DTYPES:
            raise OptionsError(f"--kv-dtype {self.kv_dtype!r} is not one of "
                               f"{', '.join(KV_DTYPES)}")
        for flag, value in (("--max-context", self.max_context),
                            ("--prefill-chunk", self.prefill_chunk),
                            ("--max-concurrency", self.max_concurrency)):
            if value is not None and value < 1:
                raise OptionsError(f"{flag} {value} must be at least 1")
        if self.kv_capacity < 0:
            raise OptionsError(f"--kv-capacity {self.kv_capacity} must be a positive number "
                               "of tokens, or 0 for auto")
        if self.spec not in SPEC_KINDS:
            raise OptionsError(f"--spec must be one of {', '.join(SPEC_KINDS)}, got "
                               f"{self.spec!r}")
        if self.state_checkpoints is not None and self.state_checkpoints < 0:
            raise OptionsError(f"--state-checkpoints {self.state_checkpoints} must be 0 or more")
        if self.max_draft_tokens is not None:
            if self.spec == "none":
                raise OptionsError("--max-draft-tokens sizes speculative decoding: give "
                                   "--spec ngram (or mtp) with it")
            if not 1 <= self.max_draft_tokens <= MAX_DRAFT_TOKENS:
                raise OptionsError(f"--max-draft-tokens {self.max_draft_tokens} must be in "
                                   f"[1, {MAX_DRAFT_TOKENS}]")

    @property
    def draft_tokens(self) -> int:
        """Drafts per sequence and step the programs are sized for (0: no speculation)."""
        if self.spec == "none":
            return 0
        return self.max_draft_tokens or DEFAULT_DRAFT_TOKENS[self.spec]

    def with_checkpoint_weights(self, native: str) -> tuple[CompileOptions, str | None]:
        """`weights="auto"` resolved to `native` (the checkpoint's matmul dtype as a
        format name), and the note the compile prints about it (None when --weights was
        given)."""
        if self.weights != "auto":
            return self, None
        return (replace(self, weights=native),
                f"--weights not given: {native}, the checkpoint's own dtype")

    @property
    def resolved_model_id(self) -> str:
        return self.model_id or self.model_dir.resolve().name

    def check_target(self, target: Target) -> None:
        """Raise OptionsError where an option does not suit `target`."""
        if self.prefill_projections == "coop" and not target.is_cuda:
            raise OptionsError("--prefill-projections coop needs a CUDA target")
        if self.cpu_gemv_streams != "auto" and target.is_cuda:
            raise OptionsError(f"--cpu-gemv-streams applies to the cpu target, not "
                               f"{target.name}")
        if self.cpu_bf16_activations != "auto" and target.is_cuda:
            raise OptionsError(f"--cpu-bf16-activations applies to the cpu target, not "
                               f"{target.name} (its bf16 kernels multiply with float32 x)")
        if target.is_cuda and self.kv_dtype not in CUDA_KV_DTYPES:
            raise OptionsError(f"--kv-dtype {self.kv_dtype}: the CUDA attention reads "
                               f"{', '.join(CUDA_KV_DTYPES)} KV caches so far; compile "
                               f"{target.name} with one of those (the other KV formats run on "
                               "the cpu target)")

    def with_host_read(self, target: Target) -> tuple[CompileOptions, str | None]:
        """These options with --cpu-gemv-streams auto resolved for this host (cpu target),
        and the compile summary's note on the choice."""
        if target.is_cuda or self.cpu_gemv_streams != "auto":
            return self, None
        from ninfer.roofline import RooflineError, host_gemv_streams

        try:
            streams, why = host_gemv_streams()
        except RooflineError as exc:
            return (replace(self, cpu_gemv_streams="2"),
                    f"--cpu-gemv-streams not given: 2, the kernels' default ({exc})")
        return (replace(self, cpu_gemv_streams=str(streams)),
                f"--cpu-gemv-streams not given: {streams} weight stream"
                f"{'s' if streams > 1 else ''} a thread in the decode gemvs, what reads "
                f"faster here ({why})")

    def x_bf16(self, target: Target, host_dpbf16: bool) -> bool:
        """make_plan's x_bf16: the cpu target's bf16 weights multiply x rounded to bf16
        (auto: `host_dpbf16`, where the host has AVX512_BF16's vdpbf16ps and it pays, which
        the caller asks the kernels and the host's probe: pipeline._auto_x_bf16)."""
        if target.is_cuda or self.cpu_bf16_activations == "f32":
            return False
        return self.cpu_bf16_activations == "bf16" or host_dpbf16

    def gemv_streams(self, target: Target) -> int:
        """make_plan's gemv_streams: 1 where the cpu target reads one stream a thread."""
        return 1 if not target.is_cuda and self.cpu_gemv_streams == "1" else 0

    def projections(self, target: Target) -> Literal["tvm", "coop"]:
        """Where prefill projections run on `target` ("auto" resolved)."""
        if self.prefill_projections == "auto":
            return "coop" if target.is_cuda else "tvm"
        return "coop" if self.prefill_projections == "coop" else "tvm"

    def serve_limits(self, target: Target, max_positions: int) -> ServeLimits:
        """The serve limits for a model with `max_positions` positions (its
        max_position_embeddings); checked against the model by make_plan."""
        gemv_rows = GEMV_MAX_ROWS_CPU if target.kind == "cpu" else GEMV_MAX_ROWS
        context, chunk, concurrency = self._limit_values(max_positions)
        return ServeLimits(context, chunk, max_concurrency=concurrency, gemv_max_rows=gemv_rows,
                           kv_capacity=self.kv_capacity, kv_dtype=self.kv_dtype,
                           kv_block_size=self.kv_block_size,
                           gdn_prefill="chunked" if self.gdn_prefill == "chunked"
                           else "recurrent", spec=self.spec,  # type: ignore[arg-type]
                           max_draft_tokens=self.draft_tokens,
                           state_checkpoints=-1 if self.state_checkpoints is None
                           else self.state_checkpoints)

    def limit_notes(self, max_positions: int) -> tuple[str, ...]:
        """What the compile says about each serve limit it chose (the ones not given)."""
        context, chunk, concurrency = self._limit_values(max_positions)
        notes = []
        if self.max_context is None:
            notes.append(f"--max-context not given: {context} tokens, the smaller of "
                         f"{DEFAULT_MAX_CONTEXT} and the model's max_position_embeddings "
                         f"({max_positions})")
        if self.prefill_chunk is None and chunk < DEFAULT_PREFILL_CHUNK:
            notes.append(f"--prefill-chunk not given: {chunk} rows per step, the max context "
                         f"(the default {DEFAULT_PREFILL_CHUNK} is larger)")
        if self.max_concurrency is None and concurrency < DEFAULT_MAX_CONCURRENCY:
            notes.append(f"--max-concurrency not given: {concurrency}, the prefill chunk "
                         f"(the default {DEFAULT_MAX_CONCURRENCY} is larger; every running "
                         "request needs a row in each step)")
        return tuple(notes)

    def _limit_values(self, max_positions: int) -> tuple[int, int, int]:
        context = self.max_context or min(DEFAULT_MAX_CONTEXT, max_positions)
        chunk = self.prefill_chunk or min(DEFAULT_PREFILL_CHUNK, context)
        concurrency = self.max_concurrency or min(DEFAULT_MAX_CONCURRENCY, chunk)
        return context, chunk, concurrency

    def weight_formats(self) -> WeightFormats:
        if self.weights == "auto":
            raise OptionsError("weights='auto' is resolved from the checkpoint first "
                               "(with_checkpoint_weights)")
        return WeightFormats(self.weights, tuple(self.weight_overrides))
