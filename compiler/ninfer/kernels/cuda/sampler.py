"""The device sampler: one token per logits row without copying the logits to the host.

Rendered from templates/cuda/sampler.cu.j2 into the model's translation unit (lower.py)
and launched after the LM head; the engine (runtime_cpp/engine/engine.cpp) uploads only
each row's parameters, its sparse logit edits and, for a constrained request, its
allowed-token bitmask, and downloads the token and, when asked, its raw logprob and top
alternatives. It computes what runtime_cpp/engine/sampling.cpp computes, in vLLM's order,
without sorting the vocabulary:

- Processed logits (in the `work` scratch row): NaN and tokens outside the mask -> -inf;
  each edit (one per token, merged by the engine) applies min_tokens masking, logit_bias,
  the repetition penalty (l / r if l > 0 else l * r) and the output penalties
  (l -= frequency x count, then l -= presence), exactly the host's float operations.
- Greedy (temperature 0 or top_k 1): the first index of the largest logit (a block-wide
  (value, index) reduction). A row where every logit is -inf reports token -1; the engine
  fails the request with the host sampler's message.
- Raw logprobs: max and sum of exp over the raw row (float), the token's raw logit minus
  that log-normalizer, and the top alternatives as `logprobs` passes of "next best after
  the previous pick" in (value desc, index asc) order.
- top_k: the k-th largest logit T by a 4-way search over the float bits (order-preserving
  keys) with block-wide counts, three probes per pass (about 16 passes); tokens above T
  and the first k - count(> T) tokens at T (by index: a per-tile ballot scan, only when
  ties straddle the cut) are kept. The kept tokens' weights exp((l - max) / temperature),
  0 below min_p, replace the row.
- top_p: the same search over the weights' bits (positive floats order as their bits)
  with block-wide mass sums finds the smallest weight W whose prefix (largest first) holds
  top_p of the kept mass; ties at W are kept by index, as few as reach the mass.
- The draw: u from Philox4x32-10 keyed by the choice's seed at counter = its token index
  (counter-based: the same seed and step give the same token, whatever else is batched or
  recomputed), target = u x kept mass; the thread whose running sum (threads in order)
  holds it walks its own tokens.

Every sum has a fixed order (warp butterflies, then warps in order), so results are
deterministic. Differences from the host (float weights instead of double, ties at a cut
broken by index where the host's partial sort leaves them unspecified, tokens whose
weight underflows float, e^-103, never drawn) change a draw's probability by less than
float rounding.

No dynamic shared memory: THREADS x 4 bytes of per-thread sums plus a few words per warp,
static. THREADS is the attention kernel's block size (CudaParams.attention_threads: half
an SM's resident threads): the sampler too runs one block per row on a handful of rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import jinja2

from ninfer.paths import TEMPLATES_DIR

from ..launch import ONE, Expr, N
from ..spec import KernelSpec, SamplerSpec
from .schedules import WARP, CudaParams

TEMPLATE = "cuda/sampler.cu.j2"


def is_sampler(spec: KernelSpec) -> bool:
    return isinstance(spec, SamplerSpec)


def kernel_symbol(spec: SamplerSpec) -> str:
    return f"{spec.name()}_kernel"


def work_name(spec: SamplerSpec) -> str:
    """The scratch rows of processed logits, then weights (n x vocab floats)."""
    return f"{spec.name()}_work"


def sampler_threads(params: CudaParams) -> int:
    threads = params.attention_threads
    if threads % WARP or threads < WARP:
        raise NotImplementedError(f"{threads} sampler threads per block is not a whole number "
                                  f"of {WARP}-thread warps")
    return threads


def launch_shape(spec: SamplerSpec, params: CudaParams) -> tuple[tuple[Expr, Expr, Expr], int]:
    """(grid over n, threads per block): one block per row."""
    return (N, ONE, ONE), sampler_threads(params)


def render_source(specs: Iterable[KernelSpec], params: CudaParams) -> str:
    """The sampler kernels among `specs`, each once; "" when there are none."""
    unique = [s for s in {s.name(): s for s in specs}.values() if isinstance(s, SamplerSpec)]
    if not unique:
        return ""
    threads = sampler_threads(params)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(TEMPLATE).render(samplers=[
        {"name": s.name(), "symbol": kernel_symbol(s), "vocab": s.vocab, "words": s.words,
         "top": s.top, "threads": threads, "warps": threads // WARP} for s in unique])
