"""Generate runtime_cpp/text/unicode/nfc_tables.h, the data behind the C++ NFC normalizer.

Usage: python runtime_cpp/tools/gen_unicode_nfc.py [--output PATH] [--check]

The tables come from Python's `unicodedata`:
  * canonical combining classes (as ranges),
  * one-level canonical decompositions (recursion is done at run time),
  * which two-code-point decompositions are primary composites, i.e. not composition
    exclusions (singletons, non-starter decompositions and CompositionExclusions.txt). Python
    exposes no exclusion list, so a pair counts as a primary composite when NFC recomposes it.

Hangul syllables are algorithmic and not in the tables.

Hugging Face `tokenizers` normalizes with the `unicode-normalization-alignments` crate, whose
tables are older than Python's (Unicode 9). The C++ tokenizer must match Hugging Face, so the
generator asks the installed `tokenizers` package for the few characters where the two differ
(combining marks encoded later, and later compositions) and follows Hugging Face for those.
"""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

from _generator import generator_main
from tokenizers import normalizers

OUTPUT = Path(__file__).resolve().parents[1] / "text" / "unicode" / "nfc_tables.h"
HANGUL = range(0xAC00, 0xAC00 + 11172)
MAX_CP = 0x110000


def canonical_decomposition(cp: int) -> list[int] | None:
    """One-level canonical decomposition of `cp`, or None (compatibility ones are skipped)."""
    fields = unicodedata.decomposition(chr(cp)).split()
    if not fields or fields[0].startswith("<"):
        return None
    return [int(f, 16) for f in fields]


def hf_combining_class_is_zero(cp: int, nfd: normalizers.NFD) -> bool:
    """True if Hugging Face's NFD leaves `cp` between two marks unsorted (its ccc is 0)."""
    probe = "\u0301" + chr(cp) + "\u0316"
    return nfd.normalize_str(probe) == probe


def collect() -> tuple[dict[int, int], dict[int, list[int]], set[int], list[int], list[int]]:
    """Combining classes, decompositions, primary composites and the two override lists."""
    nfd = normalizers.NFD()
    zeroed: list[int] = []
    dropped: list[int] = []
    ccc: dict[int, int] = {}
    decomp: dict[int, list[int]] = {}
    composites: set[int] = set()
    for cp in range(MAX_CP):
        if 0xD800 <= cp < 0xE000 or cp in HANGUL:
            continue
        c = chr(cp)
        d = canonical_decomposition(cp)
        cls = unicodedata.combining(c)
        if cls and d is None and hf_combining_class_is_zero(cp, nfd):
            zeroed.append(cp)
            cls = 0
        if cls:
            ccc[cp] = cls
        if d is None:
            continue
        full = unicodedata.normalize("NFD", c)
        if nfd.normalize_str(c) != full:
            dropped.append(cp)
            continue
        decomp[cp] = d
        if len(d) == 2 and unicodedata.normalize("NFC", full) == c:
            composites.add(cp)
    return ccc, decomp, composites, zeroed, dropped


def describe(cps: list[int]) -> list[str]:
    """Code points as compact U+XXXX / U+XXXX-U+YYYY items."""
    items: list[list[int]] = []
    for cp in cps:
        if items and items[-1][1] == cp - 1:
            items[-1][1] = cp
        else:
            items.append([cp, cp])
    return [f"U+{a:04X}" if a == b else f"U+{a:04X}-U+{b:04X}" for a, b in items]


def ccc_ranges(ccc: dict[int, int]) -> list[tuple[int, int, int]]:
    ranges: list[tuple[int, int, int]] = []
    for cp in sorted(ccc):
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == ccc[cp]:
            ranges[-1] = (ranges[-1][0], cp, ccc[cp])
        else:
            ranges.append((cp, cp, ccc[cp]))
    return ranges


def wrap(items: list[str], indent: str = "    ", width: int = 100) -> str:
    lines: list[str] = []
    line = indent
    for item in items:
        if len(line) + len(item) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += item + " "
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def render() -> str:
    ccc, decomp, composites, zeroed, dropped = collect()
    ranges = ccc_ranges(ccc)
    entries = sorted(decomp)
    index = {cp: i for i, cp in enumerate(entries)}
    compose_order = sorted(composites, key=lambda cp: (decomp[cp][0], decomp[cp][1]))
    ccc_items = [f"{{0x{a:X}, 0x{b:X}, {c}}}," for a, b, c in ranges]
    decomp_items = []
    for cp in entries:
        d = decomp[cp]
        second = d[1] if len(d) == 2 else 0
        decomp_items.append(f"{{0x{cp:X}, 0x{d[0]:X}, 0x{second:X}}},")
    compose_items = [f"{index[cp]}," for cp in compose_order]
    notes = [
        "Combining class 0 (as in Hugging Face) for: " + ", ".join(describe(zeroed)),
        "No decomposition (as in Hugging Face) for: " + ", ".join(describe(dropped)),
    ]
    note_lines = "\n".join(wrap(notes_line.split(" "), "// ", 100) for notes_line in notes)
    return f"""\
// generated by runtime_cpp/tools/gen_unicode_nfc.py, do not edit.
// Source: Python unicodedata {unicodedata.unidata_version}, with overrides taken from Hugging Face
// tokenizers, whose NFC uses older Unicode data:
{note_lines}
// clang-format off
#pragma once

#include <cstdint>

namespace ninfer::nfc_tables {{

struct CombiningRange {{
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
}};

// Canonical combining classes other than 0, as sorted inclusive ranges.
inline constexpr CombiningRange kCombining[] = {{
{wrap(ccc_items)}
}};

struct Decomposition {{
  uint32_t cp;
  uint32_t first;
  uint32_t second;  // 0 for a singleton decomposition
}};

// One-level canonical decompositions, sorted by code point (Hangul excluded).
inline constexpr Decomposition kDecompositions[] = {{
{wrap(decomp_items)}
}};

// Indexes into kDecompositions of the primary composites, sorted by (first, second).
inline constexpr uint16_t kCompositions[] = {{
{wrap(compose_items)}
}};

}}  // namespace ninfer::nfc_tables
"""


def main() -> int:
    return generator_main(__doc__ or "", OUTPUT, render, __file__)


if __name__ == "__main__":
    sys.exit(main())
