"""KV-cache formats chosen at compile time (`--kv-dtype`), their exact layout, and a numpy
reference of the rounding the kernels do.

Keys and values are stored per layer in a pool of rows (one row per cached token), each
row `kv_heads x head_dim` values. The format decides the arrays ("parts") of one pool:

| kv dtype | parts (dtype [shape])                                           | bytes/value |
|----------|-----------------------------------------------------------------|-------------|
| f32      | float32 [rows, kv_heads, head_dim]                               | 4           |
| f16      | float16 [rows, kv_heads, head_dim] (IEEE binary16)               | 2           |
| bf16     | uint16 [rows, kv_heads, head_dim] (bfloat16 bits)                | 2           |
| fp8      | uint8 [rows, kv_heads, head_dim] (float8 e4m3fn bits, no scale)  | 1           |
| int8     | int8 [rows, kv_heads, head_dim]; float16 [rows, kv_heads, head_dim/32] | 1.0625 |
| int4     | uint8 [rows, kv_heads, head_dim/2]; float16 [rows, kv_heads, head_dim/32] | 0.5625 |

- f16 and bf16 round to nearest even; f16 saturates at +-65504.
- fp8 (e4m3fn: 4 exponent bits, bias 7, 3 mantissa bits, no infinities) rounds to nearest
  even and saturates at +-448, with no scale (like vLLM's fp8 cache with its default
  scale of 1): values below 2^-9 flush to zero.
- int8 / int4: each head's vector is cut into groups of 32 values with one float16 scale
  d = max|x| / 127 (int8) or max|x| / 7 (int4), rounded to float16 first; q = round-half-
  even(x / d), |error| <= |d| / 2. int4 stores q + 8 as a nibble: byte b of a group (16
  bytes) holds value b in its low nibble and value b + 16 in its high nibble, so 8
  consecutive values unpack from 8 consecutive bytes with one shift.
- int4 keys are rotated before quantization: each head vector is multiplied by the
  normalized Walsh-Hadamard matrix H (blocks of P = the largest power of two dividing
  head_dim, at most 128). H spreads an outlier channel over the whole block, so the group
  scale is no longer set by one value. H is orthogonal and symmetric, so attention rotates
  the query the same way and q . k is unchanged: (H q) . (H k) = q . k. Values are not
  rotated.

A format that halves (f16, bf16) or quarters (fp8) the bytes of a token lets the pool
hold 2x or 4x the tokens in the same memory (`--kv-capacity auto`, ninfer.plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KV_DTYPES = ("f32", "f16", "bf16", "fp8", "int8", "int4")
KV_GROUP = 32  # values per scale of the integer formats
MAX_ROTATION = 128
FP8_MAX = 448.0
_F16_MAX = 65504.0


@dataclass(frozen=True)
class KvFormat:
    name: str
    storage: str  # dtype of the value array (numpy / TVM name)
    bits: int  # bits per value
    scaled: bool  # a float16 scale per group of KV_GROUP values
    rotate_keys: bool  # keys are Hadamard-rotated before quantization

    @property
    def bytes_per_value(self) -> float:
        return self.bits / 8 + (2 / KV_GROUP if self.scaled else 0.0)


_FORMATS = {
    "f32": KvFormat("f32", "float32", 32, False, False),
    "f16": KvFormat("f16", "float16", 16, False, False),
    "bf16": KvFormat("bf16", "uint16", 16, False, False),
    "fp8": KvFormat("fp8", "uint8", 8, False, False),
    "int8": KvFormat("int8", "int8", 8, True, False),
    "int4": KvFormat("int4", "uint8", 4, True, True),
}
assert tuple(_FORMATS) == KV_DTYPES


def kv_format(name: str) -> KvFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown KV-cache dtype {name!r}; known: {', '.join(KV_DTYPES)}"
                         ) from None


def check_head_dim(name: str, head_dim: int) -> None:
    """Raise ValueError unless `head_dim` suits format `name`."""
    fmt = kv_format(name)
    if fmt.scaled and head_dim % KV_GROUP:
        raise ValueError(f"--kv-dtype {name} groups {KV_GROUP} values per scale; head_dim "
                         f"{head_dim} is not a multiple of {KV_GROUP}")


def rotation_block(head_dim: int) -> int:
    """P: the Hadamard block size for keys (largest power of two dividing head_dim, <= 128)."""
    p = 1
    while head_dim % (2 * p) == 0 and 2 * p <= MAX_ROTATION:
        p *= 2
    return p


def pool_parts(name: str, rows: int, kv_heads: int, head_dim: int
               ) -> list[tuple[str, str, tuple[int, int, int]]]:
    """(suffix, dtype, shape) of the arrays of one pool, in kernel-argument order."""
    fmt = kv_format(name)
    check_head_dim(name, head_dim)
    width = head_dim // 2 if fmt.bits == 4 else head_dim
    parts = [("", fmt.storage, (rows, kv_heads, width))]
    if fmt.scaled:
        parts.append(("_scales", "float16", (rows, kv_heads, head_dim // KV_GROUP)))
    return parts


# How a pool's rows (tokens) and kv heads are laid out in its arrays, whose shape is
# [rows, kv_heads, width] in every layout. "rows": token-major, one token's heads together
# (the CUDA kernels). "heads": within each block of block_size tokens, head-major
# ([blocks, kv_heads, block_size, width]): a kv head's keys of a block are one contiguous
# run, which a CPU thread walking one head reads as a stream (token-major, a head's key
# is a short run every kv_heads * width elements: the hardware prefetchers and the L1's
# sets cope badly, RESULTS session 31). "planes": head-major over the whole pool
# ([kv_heads, rows, width], one plane a kv head): a head's keys of consecutive blocks are
# contiguous too, so a sequence whose blocks are consecutive (the block pool keeps them
# so where it can, also for sequences that grow in step: engine/kv_blocks.h) is one long
# stream a head (the CPU plan's: decode attention from memory read 1.11x as fast as by
# "heads" at 2048 keys, 1.17x at 8192, on a par at 512, RESULTS session 36; blocks
# interleaved one by one read 1.17x slower at 2048 keys and 1.30x at 8192 on the Intel VM,
# session 37).
KV_LAYOUTS = ("rows", "heads", "planes")


def check_pool_layout(layout: str, block_size: int) -> None:
    if layout not in KV_LAYOUTS:
        raise ValueError(f"KV pool layout {layout!r} is not one of {', '.join(KV_LAYOUTS)}")
    if layout == "heads" and block_size <= 0:
        raise ValueError("the heads KV pool layout needs the block size")


def _swap_in_blocks(part: np.ndarray, block_size: int, heads_first: bool) -> np.ndarray:
    """part [rows, kv_heads, width] with each block's token and head axes swapped:
    `heads_first` says whether `part` holds its blocks head-major."""
    rows, heads, width = part.shape
    inner = (heads, block_size) if heads_first else (block_size, heads)
    blocks = part.reshape(rows // block_size, *inner, width).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).reshape(rows, heads, width)


def pool_to_rows(part: np.ndarray, layout: str, block_size: int) -> np.ndarray:
    """A pool array [rows, kv_heads, width] as stored in `layout`, token-major."""
    check_pool_layout(layout, block_size)
    if layout == "planes":
        rows, heads, width = part.shape
        return np.ascontiguousarray(part.reshape(heads, rows, width).transpose(1, 0, 2))
    return part if layout == "rows" else _swap_in_blocks(part, block_size, heads_first=True)


def pool_from_rows(part: np.ndarray, layout: str, block_size: int) -> np.ndarray:
    """A token-major pool array [rows, kv_heads, width] as stored in `layout`."""
    check_pool_layout(layout, block_size)
    if layout == "planes":
        return np.ascontiguousarray(part.transpose(1, 0, 2)).reshape(part.shape)
    return part if layout == "rows" else _swap_in_blocks(part, block_size, heads_first=False)


def pool_bytes_per_row(name: str, kv_heads: int, head_dim: int) -> int:
    """Bytes one token takes in one pool (keys or values of one layer)."""
    return sum(np.dtype(dt).itemsize * shape[1] * shape[2]
               for _, dt, shape in pool_parts(name, 1, kv_heads, head_dim))


# ------------------------------------------------------------------ numpy reference


def hadamard(x: np.ndarray, block: int) -> np.ndarray:
    """x @ H along the last axis, H block-diagonal with normalized Walsh-Hadamard blocks
    of size `block` (H is symmetric and orthogonal: hadamard(hadamard(x)) == x)."""
    y = np.array(x, np.float64)
    shape = y.shape
    y = y.reshape(-1, shape[-1] // block, block)
    h = 1
    while h < block:
        y = y.reshape(*y.shape[:2], block // (2 * h), 2, h)
        a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        y = y.reshape(*y.shape[:2], block)
        h *= 2
    return (y / np.sqrt(block)).reshape(shape)


def fp8_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bits (uint8), round to nearest even, saturating at +-448."""
    x = np.asarray(x, np.float32)
    a = np.minimum(np.abs(x), np.float32(FP8_MAX))
    bits = a.view(np.uint32).astype(np.int64)
    normal = (bits - (120 << 23) + 0x7FFFF + ((bits >> 20) & 1)) >> 20
    sub = np.rint(a.astype(np.float64) * 512.0).astype(np.int64)  # multiples of 2^-9
    code = np.where(a < np.float32(2.0**-6), sub, normal)
    return (code | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)


def fp8_decode(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, np.uint8).astype(np.int64)
    e, m = (u >> 3) & 15, u & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return np.where(u & 0x80, -mag, mag)


def _f16_round(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


def encode(name: str, x: np.ndarray, rotate: bool = False) -> list[np.ndarray]:
    """The stored parts of values x [..., kv_heads, head_dim] (float32), as the kernels
    write them; `rotate` applies the key rotation first (int4 keys)."""
    fmt = kv_format(name)
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    if rotate:
        x = hadamard(x, rotation_block(d)).astype(np.float32)
    if name == "f32":
        return [x.copy()]
    if name == "f16":
        return [np.clip(x, -_F16_MAX, _F16_MAX).astype(np.float16)]
    if name == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        return [((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)]
    if name == "fp8":
        return [fp8_encode(x)]
    qmax = 127 if fmt.bits == 8 else 7
    g = x.reshape(*x.shape[:-1], d // KV_GROUP, KV_GROUP)
    amax = np.abs(g).max(axis=-1)
    scale = (amax / np.float32(qmax)).astype(np.float32).astype(np.float16)
    s = scale.astype(np.float32)[..., None]
    inv = np.divide(np.float32(1.0), s, out=np.zeros_like(s), where=s != 0)
    q = np.clip(np.rint(g * inv), -qmax, qmax).astype(np.int32)
    if fmt.bits == 8:
        return [q.reshape(x.shape).astype(np.int8), scale]
    nib = (q + 8).astype(np.uint8)
    packed = nib[..., :16] | (nib[..., 16:] << 4)
    return [packed.reshape(*x.shape[:-1], d // 2), scale]


def decode(name: str, parts: list[np.ndarray]) -> np.ndarray:
    """float64 values of stored parts (in the rotated basis for rotated keys)."""
    fmt = kv_format(name)
    data = parts[0]
    if name == "f32":
        return data.astype(np.float64)
    if name == "f16":
        return data.astype(np.float64)
    if name == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if name == "fp8":
        return fp8_decode(data)
    scale = parts[1].astype(np.float64)[..., None]
    if fmt.bits == 8:
        q = data.astype(np.float64)
    else:
        b = data.reshape(*data.shape[:-1], data.shape[-1] // 16, 16)
        q = np.concatenate([b & 15, b >> 4], axis=-1).astype(np.float64) - 8
    g = q.reshape(*scale.shape[:-1], KV_GROUP)
    return (g * scale).reshape(*data.shape[:-1], -1)


def roundtrip(name: str, x: np.ndarray, rotate: bool = False) -> np.ndarray:
    """What attention sees of values x stored in format `name`, in x's own basis."""
    y = decode(name, encode(name, x, rotate))
    return hadamard(y, rotation_block(y.shape[-1])) if rotate else y
