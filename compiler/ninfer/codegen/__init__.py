"""Codegen: Jinja2 templates -> the generated C++ tree of one compiled model."""

from ninfer.codegen.render import GeneratedTree, render_tree

__all__ = ["GeneratedTree", "render_tree"]
