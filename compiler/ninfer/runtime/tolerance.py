"""What a build's outputs may differ by from its checkpoint's reference model, by the
formats it stores: the bounds `ninfer-check` holds a build to (the compile records them in
the artifact's manifest, under "check").

The measures are those of the accuracy table (`ninfer-bench accuracy`), taken along the
build's own greedy continuations: the mean over positions of KL(reference || build) of the
next-token distributions, in nats, and the fraction of positions where the build's token is
the reference's argmax (top-1 agreement). The server lists each position's five most likely
tokens, so the KL is that of the distributions coarsened to those tokens and "the rest" (a
lower bound of the full KL that a wrong kernel or weight still drives up by orders of
magnitude). Float32 arithmetic in another order gives ~1e-12; each stored format adds its
rounding of the weights or of the keys and values. The KL bounds are 5 to 15 times the
largest mean KL measured on the test models (the tiny Qwen3, random and trained, and the
tiny random Qwen3.5, 7 prompts x 24 tokens, 2026-12-04); a format's bound combines its
weights' and its KV cache's (KL bounds add, disagreements add).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    mean_kl: float  # nats, at most
    top1: float  # agreement, at least

    def __add__(self, other: Bound) -> Bound:
        return Bound(self.mean_kl + other.mean_kl, max(0.0, self.top1 + other.top1 - 1.0))

    def to_json(self) -> dict[str, float]:
        return {"mean_kl": self.mean_kl, "top1_agreement": self.top1}


# Matmul weight formats (the manifest's "weights" per role); embeddings and norms stay f32.
# Measured mean KL (the largest of the three test models; tests/test_check.py): f32 1e-12,
# f16 6.7e-7, bf16 4.5e-5 (with float32 x; the cpu target's default rounds x to bf16 where
# the host has AVX512_BF16, which doubled the trained Qwen3's KL from f32, 2.3e-5 ->
# 4.6e-5: README, so ~1e-4 here, still 5x under the bound), q8g32 2.0e-3, q4g64 5.1e-2.
# Top-1 agreement is held only where
# nothing rounds: on the random test models' flat distributions a rounding format flips
# many near ties (q4g64: 15% agreement on the random Qwen3.5, 69% on the trained Qwen3)
# while its KL stays small, so agreement says nothing there.
WEIGHT_BOUNDS = {"f32": Bound(1e-6, 0.95), "f16": Bound(1e-5, 0.0), "bf16": Bound(5e-4, 0.0),
                 "q8g32": Bound(1e-2, 0.0), "q4g64": Bound(0.25, 0.0),
                 "q4g128": Bound(0.35, 0.0)}
# KV-cache formats (limits.kv_dtype), beside f32 weights. Measured: f16 1.2e-7, bf16 7.8e-6,
# fp8 1.9e-3, int8 7.7e-5, int4 1.8e-2.
KV_BOUNDS = {"f32": Bound(0.0, 1.0), "f16": Bound(1e-5, 0.0), "bf16": Bound(1e-4, 0.0),
             "fp8": Bound(1e-2, 0.0), "int8": Bound(1e-3, 0.0), "int4": Bound(0.1, 0.0)}


def parse_format(fmt: str) -> tuple[str, str]:
    """'q4g64+kv:int4' -> ('q4g64', 'int4'); 'kv:fp8' -> ('f32', 'fp8'); 'q8g32' ->
    ('q8g32', 'f32') (the format names of `ninfer-bench accuracy` and `ninfer-check
    --tolerance`)."""
    weights, kv = "f32", "f32"
    for part in fmt.split("+"):
        if part.startswith("kv:"):
            kv = part[3:]
        elif part:
            weights = part
    return weights, kv


def bound(weight_formats: list[str] | tuple[str, ...], kv_dtype: str) -> Bound:
    """The bound of a build whose matmuls store `weight_formats` (the loosest counts) and
    whose KV cache is `kv_dtype`."""
    unknown = [f for f in weight_formats if f not in WEIGHT_BOUNDS]
    if unknown or not weight_formats or kv_dtype not in KV_BOUNDS:
        raise ValueError(f"no bound for weights {unknown or list(weight_formats)} / KV "
                         f"{kv_dtype!r}; known: weights {', '.join(WEIGHT_BOUNDS)}, KV "
                         f"{', '.join(KV_BOUNDS)}")
    loosest = max((WEIGHT_BOUNDS[f] for f in weight_formats), key=lambda b: b.mean_kl)
    return loosest + KV_BOUNDS[kv_dtype]


def manifest_entry(weights: dict[str, str], kv_dtype: str, target_kind: str) -> dict[str, object]:
    """The manifest's "check" section: the bound, and whether the backend's outputs are the
    same bits whatever else runs in the step (the CPU kernels are; CUDA's split-K decode
    attention and cooperative projections are not promised to be)."""
    return {**bound(sorted(set(weights.values())), kv_dtype).to_json(),
            "batch_invariant": target_kind == "cpu"}
