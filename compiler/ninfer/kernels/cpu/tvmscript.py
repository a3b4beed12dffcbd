"""A faster parser lookup for TVMScript macros, which every CPU kernel builder expands.

TVM 0.27's `ScriptMacro.__call__` finds the active parser with
`inspect.getouterframes(inspect.currentframe())`, which makes a `FrameInfo` for every outer
frame, each with a module lookup over `sys.modules` and a read of its source lines, at
every macro expansion. That was most of a kernel's build: a q8g32 gemv's PrimFunc took
4.6 s, 3.9 s of them in `inspect.getframeinfo`. The same frames, in the same order (the
current one first, then each caller), can be read through `f_back`; the parser is the first
`f_globals` entry of the name TVMScript binds, as before. The built functions are the same
(tests/kernels/test_tvmscript_lookup.py checks them structurally equal to the library's
own lookup; the golden sources do not move).
"""

from __future__ import annotations

import inspect
from typing import Any

from tvm.script.parser.core.parser import ScriptMacro

_LIBRARY_LOOKUP = getattr(ScriptMacro, "_find_parser_def", None)


def _find_parser_def(self: ScriptMacro) -> Any:
    frame = inspect.currentframe()
    while frame is not None:
        parser = frame.f_globals.get(ScriptMacro.parser_object_name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{ScriptMacro.parser_object_name} not available")


def install() -> None:
    """Use the f_back walk for every macro expansion (a TVM without the method is left as
    it is)."""
    if _LIBRARY_LOOKUP is not None:
        ScriptMacro._find_parser_def = _find_parser_def


def uninstall() -> None:
    """Back to the library's lookup (for the equivalence test)."""
    if _LIBRARY_LOOKUP is not None:
        ScriptMacro._find_parser_def = _LIBRARY_LOOKUP
