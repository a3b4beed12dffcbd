"""Python side of a compiled model: launch ninfer-server and talk to it.

Importing this package must not import TVM (it runs where only the build exists).
"""

from ninfer.runtime.server import Server, ServerError

__all__ = ["Server", "ServerError"]
