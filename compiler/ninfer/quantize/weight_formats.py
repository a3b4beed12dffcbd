"""Weight formats chosen at compile time, and their exact storage layout (pure numpy).

A matmul weight w is [n_out, k] (Hugging Face layout, k = input features). Its format
decides which arrays ("parts") the artifact stores and the kernel takes, in this order:

| format   | parts (name: dtype [shape])                          | bytes/weight |
|----------|------------------------------------------------------|--------------|
| float32  | w: float32 [n_out, k]                                 | 4            |
| f16      | w: float16 [n_out, k] (IEEE binary16)                | 2            |
| bf16     | w: uint16 [n_out, k] (bfloat16 bits)                 | 2            |
| q8g32    | q: int8 [n_out, k];  scales: float16 [n_out, k/32]   | 1.0625       |
| q4g64    | q: uint8 [n_out, k/2]; scales: float16 [n_out, k/64] | 0.53125      |
| q4g128   | q: uint8 [n_out, k/2]; scales: float16 [n_out, k/128]| 0.515625     |

Group-wise integer formats (qBgG): each row is cut along k into groups of G consecutive
weights; group g of row j holds signed integers q with one float16 scale d = scales[j, g]
and no zero point: w[j, k] ~= d * q[j, k], g = k // G. k must be a multiple of G.

- q8gG: q is int8 in [-127, 127] (never -128), d = max|w| / 127 over the group (rounded
  to float16 first; q = round-half-even(w / d) with that rounded d, so |error| <= |d| / 2).
- q4gG: q is in [-8, 7], stored offset-binary as the nibble q + 8, two per byte: byte
  q[j, b] holds k = 2b in its low nibble and k = 2b + 1 in its high nibble. The scale is
  chosen per group as the better (smaller sum of squared errors) of two candidates:
  d = max|w| / 7 (symmetric, levels -7..7, |error| <= |d| / 2), and d = -m / 8 where m is
  the group's value of largest magnitude (m maps exactly to q = -8 and the step is 7/8 of
  the symmetric one, as in llama.cpp's Q4_0; values of the other sign beyond 7.5 steps
  clip to 7, |error| <= |d|). The choice never has a larger squared error than the
  symmetric scale and on Gaussian weights lowers it by ~22% (RMS error 9.5% instead of
  10.8% of the weights' RMS for q4g64), which is what matters: the matmul output error
  is driven by the squared weight errors (sum of x^2 * e^2), not by the largest one.
  d may therefore be negative.
- f16: round to nearest even; bf16: the top 16 bits of the float32, rounded to nearest
  even (NaN stays NaN).

Float formats also have a "panels" layout (the CPU target's): the single part w is
[ceil(n_out / 64), k, 64], w_panels[p, k, c] = w[64 p + c, k], rows beyond n_out zero. A
panel's 64 output columns are then contiguous for each k, so the CPU kernels load them as
vectors and broadcast x (an outer product): each output is one sequential chain over k,
whatever the number of rows (kernels/cpu/matmul.py). "rows" is the [n_out, k] layout above.

q8g32, q4g64 and q4g128 also have a "lanes" layout (the CPU target's): the same parts and
shapes as "rows", with each row of q's bytes reordered within every whole block of 512
bytes (LANES_BLOCK_BYTES: 16 groups of 32 bytes for q8g32 (512 k) and q4g64 (1024 k), 8
of 64 bytes for q4g128 (1024 k)): position 64 j + 4 l + t of a block (j < 8, l < 16,
t < 4) holds byte 32 (l // B) + 4 j + t of the block's group l % B, B the groups a block
(`lanes_order`), so that a 64-byte vector of step j holds 4 bytes of each of the block's
groups, group g in 32-bit lane g (and, with 64-byte groups, lane g + 8); the groups after
the last whole block stay in order. The CPU kernels then sum a block's 8 integer dot steps
per lane and convert and scale once per block instead of once per step
(kernels/cpu/qmatmul.py).
- Values whose float16 (or scale) would overflow are rejected, not turned into inf.

The CPU kernels for q8/q4 also round the activations (the CUDA ones keep them float32):
each row of x is cut into the same groups of G values along k and stored as int8 with
one float32 scale dx = max|x| / 127 (x * (127 / max|x|) rounded half-even, in float32);
the group's integer dot product is then exact and out += d * dx * dot (see
`quantize_activations`). Measured on a 4096 x 4096 Gaussian weight (relative L2 error of
out against float64 with unrounded weights and x): rounding x alone adds 0.5-0.7%
(Gaussian x) to 0.8-1.4% (heavy-tailed, Student-t3 x); q8g32 goes from 0.54% (weights
only) to 0.76% (1.0% with heavy tails); q4g64 (9.6%) and q4g128 (10.4%) barely change.
f16: 0.02%, bf16: 0.17%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WEIGHT_FORMATS = ("float32", "f16", "bf16", "q8g32", "q4g64", "q4g128")
LAYOUTS = ("rows", "panels", "lanes")
LANES_BLOCK_BYTES = 512  # bytes of q per block of the "lanes" layout (8 vectors of 64)
PANEL = 64  # output columns per panel of the "panels" layout

_F16_MAX = 65504.0
_CHUNK = 1 << 22  # weights per packing step (bounds the float64 temporaries)


@dataclass(frozen=True)
class FormatInfo:
    """bits per stored integer (0 for float formats) and group size along k (0: none)."""

    name: str
    bits: int
    group: int

    @property
    def quantized(self) -> bool:
        return self.group > 0


_INFO = {
    "float32": FormatInfo("float32", 0, 0),
    "f16": FormatInfo("f16", 0, 0),
    "bf16": FormatInfo("bf16", 0, 0),
    "q8g32": FormatInfo("q8g32", 8, 32),
    "q4g64": FormatInfo("q4g64", 4, 64),
    "q4g128": FormatInfo("q4g128", 4, 128),
}


def format_info(fmt: str) -> FormatInfo:
    try:
        return _INFO[fmt]
    except KeyError:
        raise ValueError(
            f"unknown weight format {fmt!r}; known: {', '.join(WEIGHT_FORMATS)}"
        ) from None


def check_k(fmt: str, k: int) -> None:
    """Raise ValueError unless k suits `fmt` (a positive multiple of its group size)."""
    group = format_info(fmt).group
    if k <= 0:
        raise ValueError(f"{fmt}: k must be positive, got {k}")
    if group and k % group:
        raise ValueError(
            f"{fmt}: k = {k} is not a multiple of the group size {group} "
            f"(k % {group} = {k % group}; nearest valid k: {k // group * group} or "
            f"{(k // group + 1) * group})"
        )


def check_layout(fmt: str, layout: str) -> None:
    """Raise ValueError unless `fmt` can be stored in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if layout == "panels" and format_info(fmt).quantized:
        raise ValueError(f"{fmt}: the panels layout is for float formats only")
    if layout == "lanes" and fmt not in LANES_FORMATS:
        raise ValueError(f"{fmt}: the lanes layout is for {', '.join(LANES_FORMATS)} only")


LANES_FORMATS = ("q8g32", "q4g64", "q4g128")  # the formats with a "lanes" layout


def group_bytes(fmt: str) -> int:
    """Bytes of q per group of a group-quantized format (G for q8, G / 2 for q4)."""
    info = format_info(fmt)
    return info.group * info.bits // 8


def lanes_order(row_bytes: int, group_bytes: int) -> np.ndarray:
    """int64 [row_bytes]: the byte of a row of q stored at each position in the "lanes"
    layout (see the module docstring): within every whole block of LANES_BLOCK_BYTES,
    position 64 j + 4 l + t holds byte 32 (l // B) + 4 j + t of group l % B (B =
    LANES_BLOCK_BYTES / group_bytes groups a block); the rest in order."""
    if group_bytes not in (32, 64):
        raise ValueError(f"lanes layout: groups of 32 or 64 bytes, got {group_bytes}")
    per_block = LANES_BLOCK_BYTES // group_bytes
    order = np.arange(row_bytes, dtype=np.int64)
    whole = row_bytes // LANES_BLOCK_BYTES * LANES_BLOCK_BYTES
    j, lane, t = np.meshgrid(np.arange(8), np.arange(16), np.arange(4), indexing="ij")
    inside = (group_bytes * (lane % per_block) + 32 * (lane // per_block) + 4 * j
              + t).reshape(-1)  # position 64 j + 4 l + t of a block
    for b0 in range(0, whole, LANES_BLOCK_BYTES):
        order[b0 : b0 + LANES_BLOCK_BYTES] = b0 + inside
    return order


_FLOAT_STORAGE = {"float32": "float32", "f16": "float16", "bf16": "uint16"}


def part_layout(fmt: str, n_out: int, k: int, layout: str = "rows"
                ) -> list[tuple[str, str, tuple[int, ...]]]:
    """(part name, numpy dtype, shape) of every stored array, in kernel-argument order."""
    check_k(fmt, k)
    check_layout(fmt, layout)
    info = format_info(fmt)
    if not info.quantized:
        shape = (n_out, k) if layout == "rows" else (-(-n_out // PANEL), k, PANEL)
        return [("w", _FLOAT_STORAGE[fmt], shape)]
    q = ("q", "int8", (n_out, k)) if info.bits == 8 else ("q", "uint8", (n_out, k // 2))
    return [q, ("scales", "float16", (n_out, k // info.group))]


def bytes_per_weight(fmt: str) -> float:
    """Stored bytes per weight, scales included."""
    info = format_info(fmt)
    if not info.quantized:
        return {"float32": 4.0, "f16": 2.0, "bf16": 2.0}[fmt]
    return info.bits / 8 + 2 / info.group


def packed_nbytes(fmt: str, n_out: int, k: int, layout: str = "rows") -> int:
    """Total bytes of all parts of one [n_out, k] weight."""
    return sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize
        for _, dtype, shape in part_layout(fmt, n_out, k, layout)
    )


def _check_finite_f16(what: str, values: np.ndarray) -> None:
    big = np.abs(values) > _F16_MAX
    if np.any(big & np.isfinite(values)):
        worst = float(np.max(np.abs(values[np.isfinite(values)])))
        raise ValueError(f"{what}: magnitude {worst:g} overflows float16 (max {_F16_MAX:g})")


def _bf16_bits(w: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(w, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(w)
    if np.any(nan):
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep it a (quiet) NaN
    return rounded


def _scales_f16(d: np.ndarray) -> np.ndarray:
    _check_finite_f16("quantization scale", d)
    return d.astype(np.float16)


def _q8_groups(wg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """wg [rows, groups, G] float64 -> q int8, d float16 [rows, groups]."""
    amax = np.max(np.abs(wg), axis=-1)
    d16 = _scales_f16(amax / 127.0)
    d = d16.astype(np.float64)[..., None]
    safe = np.where(d == 0, 1.0, d)
    q = np.where(d == 0, 0.0, np.clip(np.rint(wg / safe), -127, 127))
    return q.astype(np.int8), d16


def _q4_candidate(wg: np.ndarray, d16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = d16.astype(np.float64)[..., None]
    safe = np.where(d == 0, 1.0, d)
    q = np.where(d == 0, 0.0, np.clip(np.rint(wg / safe), -8, 7))
    sse = np.sum((wg - q * d) ** 2, axis=-1)
    return q, sse


def _q4_groups(wg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """wg [rows, groups, G] float64 -> q in [-8, 7] (float64), d float16 [rows, groups]."""
    idx = np.argmax(np.abs(wg), axis=-1)
    m = np.take_along_axis(wg, idx[..., None], axis=-1)[..., 0]
    d_sym = _scales_f16(np.abs(m) / 7.0)
    d_neg = _scales_f16(m / -8.0)
    q_sym, sse_sym = _q4_candidate(wg, d_sym)
    q_neg, sse_neg = _q4_candidate(wg, d_neg)
    use_neg = sse_neg < sse_sym
    q = np.where(use_neg[..., None], q_neg, q_sym)
    return q, np.where(use_neg, d_neg, d_sym)


def _to_panels(w: np.ndarray) -> np.ndarray:
    """[n_out, k] -> [ceil(n_out / PANEL), k, PANEL], rows beyond n_out zero."""
    n_out, k = w.shape
    panels = -(-n_out // PANEL)
    out = np.zeros((panels, k, PANEL), w.dtype)
    full = n_out // PANEL
    out[:full] = w[: full * PANEL].reshape(full, PANEL, k).transpose(0, 2, 1)
    if full < panels:
        out[full, :, : n_out - full * PANEL] = w[full * PANEL :].T
    return out


def _from_panels(panels: np.ndarray, n_out: int) -> np.ndarray:
    """Inverse of _to_panels."""
    p, k, c = panels.shape
    return np.ascontiguousarray(panels.transpose(0, 2, 1).reshape(p * c, k)[:n_out])


def _float_rows(w: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "float32":
        return np.ascontiguousarray(w, np.float32)
    if fmt == "f16":
        _check_finite_f16("f16 weight", w)
        return np.ascontiguousarray(w, np.float16)
    return _bf16_bits(np.asarray(w, np.float32))


def pack(w: np.ndarray, fmt: str, layout: str = "rows") -> dict[str, np.ndarray]:
    """Pack a [n_out, k] float weight into the parts of `fmt` (see the module docstring)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"pack: weight must be 2-D [n_out, k], got shape {w.shape}")
    n_out, k = w.shape
    parts_layout = part_layout(fmt, n_out, k, layout)
    info = format_info(fmt)
    if not info.quantized:
        stored = _float_rows(w, fmt)
        return {"w": stored if layout == "rows" else _to_panels(stored)}
    G = info.group
    parts = {name: np.empty(shape, dtype) for name, dtype, shape in parts_layout}
    rows = max(1, _CHUNK // k)
    for r0 in range(0, n_out, rows):
        wg = np.asarray(w[r0 : r0 + rows], np.float64).reshape(-1, k // G, G)
        if info.bits == 8:
            q8, d16 = _q8_groups(wg)
            packed = q8.reshape(-1, k)
        else:
            q, d16 = _q4_groups(wg)
            u = (q.reshape(-1, k) + 8).astype(np.uint8)
            packed = u[:, 0::2] | (u[:, 1::2] << 4)
        parts["q"][r0 : r0 + rows] = (packed[:, lanes_order(packed.shape[1], group_bytes(fmt))]
                                      if layout == "lanes" else packed)
        parts["scales"][r0 : r0 + rows] = d16
    return parts


def unpack_ints(parts: dict[str, np.ndarray], fmt: str, k: int, layout: str = "rows"
                ) -> np.ndarray:
    """The signed integers q [n_out, k] (int8) of a group-quantized weight, in k order."""
    info = format_info(fmt)
    q = np.asarray(parts["q"])
    if layout == "lanes":
        in_order = np.empty_like(q)
        in_order[:, lanes_order(q.shape[1], group_bytes(fmt))] = q
        q = in_order
    if info.bits == 8:
        return q.astype(np.int8)
    out = np.empty((q.shape[0], k), np.int8)
    out[:, 0::2] = (q & 0x0F).astype(np.int8) - 8
    out[:, 1::2] = (q >> 4).astype(np.int8) - 8
    return out


def dequantize(parts: dict[str, np.ndarray], fmt: str, k: int, layout: str = "rows",
               n_out: int | None = None) -> np.ndarray:
    """float32 [n_out, k] weight the parts stand for (exact: d * q fits in float32).
    The panels layout needs n_out (its padding rows are dropped)."""
    info = format_info(fmt)
    check_layout(fmt, layout)
    if not info.quantized:
        w = np.asarray(parts["w"])
        if layout == "panels":
            if n_out is None:
                raise ValueError("dequantize: the panels layout needs n_out")
            w = _from_panels(w, n_out)
        if fmt == "float32":
            return np.asarray(w, np.float32)
        if fmt == "f16":
            return w.astype(np.float32)
        return (np.asarray(w, np.uint16).astype(np.uint32) << 16).view(np.float32)
    check_k(fmt, k)
    q = unpack_ints(parts, fmt, k, layout).astype(np.float32)
    d = np.asarray(parts["scales"]).astype(np.float32)
    return (q.reshape(q.shape[0], -1, info.group) * d[..., None]).reshape(q.shape)


def quantize_activations(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """What the q8/q4 kernels do to x [n, k]: int8 xq [n, k] and float32 dx [n, k/G].

    Per group of G values along k (float32 arithmetic, as in the kernel):
    a = max|x|, dx = a / 127, xq = round-half-even(x * (127 / a)) (0 when a = 0).
    """
    info = format_info(fmt)
    if not info.quantized:
        raise ValueError(f"{fmt}: activations are not quantized for float formats")
    x = np.ascontiguousarray(x, np.float32)
    n, k = x.shape
    check_k(fmt, k)
    xg = x.reshape(n, k // info.group, info.group)
    amax = np.max(np.abs(xg), axis=-1)
    dx = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint(xg * inv[..., None]).astype(np.int8).reshape(n, k)
    return xq, dx.astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest even) and widened back to float32: what the CPU matmul
    multiplies bf16 weights with (kernels.cpu.matmul; the CUDA kernels keep x float32)."""
    bits = _bf16_bits(np.asarray(x, np.float32)).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(np.shape(x))


def activation_roundtrip(x: np.ndarray, fmt: str) -> np.ndarray:
    """x as the kernels of `fmt` see it: unchanged for float formats, else xq * dx."""
    if not format_info(fmt).quantized:
        return np.asarray(x)
    G = format_info(fmt).group
    xq, dx = quantize_activations(x, fmt)
    n, k = xq.shape
    xg = xq.reshape(n, k // G, G).astype(np.float64) * dx.astype(np.float64)[..., None]
    return xg.reshape(n, k)
