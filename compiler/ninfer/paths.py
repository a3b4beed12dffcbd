"""Where the project's data directories live (the package is installed editable)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS_DIR = ROOT / "targets"
TEMPLATES_DIR = ROOT / "templates"
RUNTIME_DIR = ROOT / "runtime_cpp"
DEFAULT_BUILD_DIR = ROOT / "build"
