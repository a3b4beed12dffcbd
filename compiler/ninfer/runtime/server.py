"""`Server`: start a compiled ninfer-server, wait for /health, stop it cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import httpx

_LISTEN = re.compile(r"listening on (http://\S+)")


class ServerError(RuntimeError):
    """The server did not start, or exited; the message has its last output lines."""


class Server:
    """Run `ninfer-server` from a build directory (or a path to the binary).

    Use as a context manager so the process is stopped even when a test fails::

        with Server("build/ninfer-demo-cpu") as srv:
            srv.client.get("/health")
    """

    def __init__(self, path: str | Path, *, port: int = 0, host: str = "127.0.0.1",
                 threads: int | None = None, extra_args: tuple[str, ...] = (),
                 startup_timeout: float = 120.0) -> None:
        path = Path(path)
        self.binary = path / "ninfer-server" if path.is_dir() else path
        if not self.binary.exists():
            raise ServerError(f"{self.binary} does not exist; compile a model first")
        self.args = [str(self.binary), "--host", host, "--port", str(port), *extra_args]
        if threads:
            self.args += ["--threads", str(threads)]
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.output: deque[str] = deque(maxlen=200)
        self._client: httpx.Client | None = None

    def start(self, *, ready: bool = True) -> Server:
        """Starts the process and waits until it listens and, with `ready`, until /health
        says the model is loaded (it answers 503 while loading)."""
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        found = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line.rstrip("\n"))
                m = _LISTEN.search(line)
                if m and not found.is_set():
                    self.base_url = m.group(1)
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerError("ninfer-server did not start:\n" + "\n".join(self.output))
        if not ready:
            return self
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise ServerError("ninfer-server never became healthy:\n" + "\n".join(self.output))

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=300)
        return self._client

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
