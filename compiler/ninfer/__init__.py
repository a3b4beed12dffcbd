"""ninfer: an ahead-of-time compiler for LLM serving."""

__version__ = "0.1.0"
