"""What every kernel spec module shares: the argument type and the field checks
(kernels.spec holds the specs; kernels.spec_hybrid those of the hybrid models' layers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dim = int | str
ArgKind = Literal["tensor", "scalar"]


@dataclass(frozen=True)
class Arg:
    """One kernel argument. Scalars have shape ()."""

    name: str
    kind: ArgKind
    dtype: str
    shape: tuple[Dim, ...]


def _tensor(name: str, dtype: str, *shape: Dim) -> Arg:
    return Arg(name, "tensor", dtype, tuple(shape))


def _require_positive(spec: object, *fields: str) -> None:
    for f in fields:
        value = getattr(spec, f)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(spec).__name__}.{f} must be a positive int, got {value!r}")


def _float_token(x: float) -> str:
    """Shortest round-trip repr of a float, spelled as an identifier: 1e-06 -> 1em06."""
    return repr(float(x)).replace("-", "m").replace("+", "").replace(".", "p")
