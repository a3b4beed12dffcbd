"""Target profiles: `targets/<name>.toml` loaded into one frozen, validated dataclass.

Every GPU-dependent number the compiler uses comes from a `Target`; capability-derived
values live in `Target` methods and nowhere else (no `if arch == ...` in emitters).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package
    import tomli as tomllib

from ninfer.paths import TARGETS_DIR


class TargetError(ValueError):
    """A target profile is missing, malformed or inconsistent."""


_COMMON = {"name": str, "kind": str, "description": str, "l2_bytes": int,
           "memory_gib": (int, float), "bandwidth_gbs": (int, float)}
_CPU = {"vector_bytes": int, "cache_line_bytes": int}
_CUDA = {
    "arch": str, "sm_count": int, "registers_per_sm": int, "registers_per_thread_max": int,
    "register_alloc_unit": int, "max_threads_per_block": int, "max_warps_per_sm": int,
    "max_ctas_per_sm": int, "shared_memory_per_sm": int, "shared_memory_per_block": int,
    "shared_memory_per_block_optin": int, "reserved_shared_memory_per_block": int,
    "shared_memory_alloc_unit": int, "memory_latency_ns": (int, float),
}
_SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120", "sm_120a")


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # "cpu" | "cuda"
    description: str
    l2_bytes: int
    memory_gib: float
    bandwidth_gbs: float
    vector_bytes: int = 0
    cache_line_bytes: int = 0
    arch: str = ""
    sm_count: int = 0
    registers_per_sm: int = 0
    registers_per_thread_max: int = 0
    register_alloc_unit: int = 0
    max_threads_per_block: int = 0
    max_warps_per_sm: int = 0
    max_ctas_per_sm: int = 0
    shared_memory_per_sm: int = 0
    shared_memory_per_block: int = 0
    shared_memory_per_block_optin: int = 0
    reserved_shared_memory_per_block: int = 0
    shared_memory_alloc_unit: int = 0
    memory_latency_ns: float = 0
    source: str = field(default="", compare=False)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) from the arch string, e.g. sm_120a -> (12, 0)."""
        digits = "".join(c for c in self.arch.removeprefix("sm_") if c.isdigit())
        return int(digits[:-1]), int(digits[-1])

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * (1 << 30))

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}

    def stable_hash(self) -> str:
        """Hash of every field that affects generated code; used in cache keys and artifacts."""
        blob = json.dumps(self.fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_overrides(self, **overrides: Any) -> Target:
        """A copy with some fields replaced (e.g. --memory-gib 32), validated again."""
        schema = _schema(self.kind)
        data = {k: v for k, v in self.fields().items() if k in schema}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return _validated(data, self.source + " (overridden)")


def available_targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def load_target(name_or_path: str) -> Target:
    """Load `targets/<name>.toml`, or a TOML file given by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TARGETS_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise TargetError(
            f"unknown target '{name_or_path}': no file {path}; "
            f"available: {', '.join(available_targets())}"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"{path}: not valid TOML: {exc}") from exc
    return _validated(data, str(path))


def _schema(kind: str) -> dict[str, Any]:
    return {**_COMMON, **(_CPU if kind == "cpu" else _CUDA)}


def _validated(data: dict[str, Any], source: str) -> Target:
    kind = data.get("kind")
    if kind not in ("cpu", "cuda"):
        raise TargetError(f"{source}: field 'kind' must be 'cpu' or 'cuda', got {kind!r}")
    schema = _schema(kind)
    for key, typ in schema.items():
        if key not in data:
            raise TargetError(f"{source}: missing field '{key}' (required for kind '{kind}')")
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, typ):
            raise TargetError(f"{source}: field '{key}' has type {type(value).__name__}, "
                              f"expected {typ if isinstance(typ, type) else 'number'}")
        if not isinstance(value, str) and value <= 0:
            raise TargetError(f"{source}: field '{key}' must be positive, got {value}")
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise TargetError(f"{source}: unknown field(s) {', '.join(unknown)}")
    if kind == "cuda":
        _check_cuda(data, source)
    return Target(**data, source=source)


def _check_cuda(d: dict[str, Any], source: str) -> None:
    if d["arch"] not in _SUPPORTED_ARCHS:
        raise TargetError(f"{source}: arch '{d['arch']}' is not supported "
                          f"(supported: {', '.join(_SUPPORTED_ARCHS)})")
    if d["shared_memory_per_block_optin"] > d["shared_memory_per_sm"]:
        raise TargetError(
            f"{source}: shared_memory_per_block_optin ({d['shared_memory_per_block_optin']}) "
            f"exceeds shared_memory_per_sm ({d['shared_memory_per_sm']})")
    if d["shared_memory_per_block"] > d["shared_memory_per_block_optin"]:
        raise TargetError(
            f"{source}: shared_memory_per_block ({d['shared_memory_per_block']}) exceeds "
            f"shared_memory_per_block_optin ({d['shared_memory_per_block_optin']})")
    if d["max_threads_per_block"] > d["max_warps_per_sm"] * 32:
        raise TargetError(f"{source}: max_threads_per_block ({d['max_threads_per_block']}) "
                          f"exceeds max_warps_per_sm x 32 ({d['max_warps_per_sm'] * 32})")
