"""Typed launch shapes: how a kernel is launched for `n` rows, as data.

A launch size (grid dimension, dynamic shared memory, scratch elements, a computed kernel
argument) is an `Expr` over the row count `n` and other named sizes. The same object
evaluates (`evaluate(sizes)`, what the launch verifier walks) and prints the C the
generated runtime computes (`c()`), so the number that was proven and the number that is
launched cannot drift apart.

C printing keeps the text TVM's host code and the hand-written kernels have always
produced: every operation in its own parentheses, `(n * 4)`, `((n + 3) / 4)`. Division
and modulo print as C's `/` and `%`; they agree with the floor semantics `evaluate` uses
because sizes are non-negative, which `evaluate` checks.

`LaunchShape` is one kernel's launch as the kernel library describes it (block size,
total grid, dynamic shared memory, whether the launch is cooperative); the occupancy
stage proves it fits the target for every size the runtime can ask for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


class Expr:
    """An int64 size expression; build with + - * // % and `ceil_div`."""

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        raise NotImplementedError

    def c(self) -> str:
        """C source text, fully parenthesized."""
        raise NotImplementedError

    def bare(self) -> str:
        """C text without the outermost parentheses (for a term inside a sum)."""
        return self.c()

    def __add__(self, other: Operand) -> Expr:
        return Add(self, const(other))

    def __radd__(self, other: int) -> Expr:
        return Add(const(other), self)

    def __sub__(self, other: Operand) -> Expr:
        return Sub(self, const(other))

    def __mul__(self, other: Operand) -> Expr:
        return Mul((self, const(other)))

    def __rmul__(self, other: int) -> Expr:
        return Mul((const(other), self))

    def __floordiv__(self, other: Operand) -> Expr:
        return FloorDiv(self, const(other))

    def __mod__(self, other: Operand) -> Expr:
        return Mod(self, const(other))

    def __str__(self) -> str:
        return self.c()


Operand = Expr | int


def const(value: Operand) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a launch size is an int or an Expr, got {value!r}")
    return Const(value)


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return self.value

    def c(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """A named size the runtime passes: `n` (rows) or a scalar kernel argument."""

    name: str

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        try:
            return int(sizes[self.name])
        except KeyError:
            raise KeyError(f"launch expression needs a value for {self.name!r}") from None

    def c(self) -> str:
        return self.name


@dataclass(frozen=True, eq=True)
class Add(Expr):
    a: Expr
    b: Expr

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return self.a.evaluate(sizes) + self.b.evaluate(sizes)

    def c(self) -> str:
        return f"({self.bare()})"

    def bare(self) -> str:
        return f"{self.a.c()} + {self.b.c()}"


@dataclass(frozen=True, eq=True)
class Sub(Expr):
    a: Expr
    b: Expr

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return self.a.evaluate(sizes) - self.b.evaluate(sizes)

    def c(self) -> str:
        return f"({self.bare()})"

    def bare(self) -> str:
        return f"{self.a.c()} - {self.b.c()}"


@dataclass(frozen=True, eq=True)
class Mul(Expr):
    """A product of two or more factors, printed as one parenthesized term."""

    factors: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if len(self.factors) < 2:
            raise ValueError("Mul needs at least two factors")

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return math.prod(f.evaluate(sizes) for f in self.factors)

    def c(self) -> str:
        return f"({self.bare()})"

    def bare(self) -> str:
        return " * ".join(f.c() for f in self.factors)


def _divide(a: int, b: int, what: str) -> tuple[int, int]:
    if a < 0 or b <= 0:
        raise ValueError(f"{what} of {a} by {b}: launch sizes are non-negative and divisors "
                         "positive (where C's / and % agree with floor division)")
    return divmod(a, b)


@dataclass(frozen=True, eq=True)
class FloorDiv(Expr):
    a: Expr
    b: Expr

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return _divide(self.a.evaluate(sizes), self.b.evaluate(sizes), "division")[0]

    def c(self) -> str:
        return f"({self.a.c()} / {self.b.c()})"


@dataclass(frozen=True, eq=True)
class Mod(Expr):
    a: Expr
    b: Expr

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return _divide(self.a.evaluate(sizes), self.b.evaluate(sizes), "modulo")[1]

    def c(self) -> str:
        return f"({self.a.c()} % {self.b.c()})"


@dataclass(frozen=True, eq=True)
class CeilDiv(Expr):
    """ceil(a / b), printed in C's idiom: `((a + (b - 1)) / b)`, with `b - 1` folded for a
    constant b: `((n + 63) / 64)`, `((64 + n * 2 - 1) / (n * 2))`."""

    a: Expr
    b: Expr

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        q, r = _divide(self.a.evaluate(sizes), self.b.evaluate(sizes), "ceil division")
        return q + (r > 0)

    def c(self) -> str:
        if isinstance(self.b, Const):
            return f"(({self.a.c()} + {self.b.value - 1}) / {self.b.c()})"
        return f"(({self.a.c()} + {self.b.bare()} - 1) / {self.b.c()})"


def ceil_div(a: Operand, b: Operand) -> Expr:
    return CeilDiv(const(a), const(b))


N = Var("n")  # the row count every stub receives
ZERO = Const(0)
ONE = Const(1)


@dataclass(frozen=True)
class LaunchShape:
    """One kernel launch as a function of `n`: `grid` is the total CTA count (the product
    of the grid dimensions), `dynamic_smem` in bytes; a cooperative launch needs its whole
    grid resident at once."""

    kernel: str  # symbol
    threads: int  # per block
    grid: Expr
    dynamic_smem: Expr = ZERO
    cooperative: bool = False
