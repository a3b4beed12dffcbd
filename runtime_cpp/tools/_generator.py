"""Shared command line of the table generators: write the header, or --check it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def generator_main(doc: str, output: Path, render: Callable[[], str], script: str) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--output", type=Path, default=output)
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; rerun {Path(script).name}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    return 0
