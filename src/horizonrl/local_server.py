"""Servers started as processes of this machine: a free port to give one, and a process that is
ready once its ``/health`` answers (``horizon serve``, ``horizon sandbox serve``), terminated when
the caller is done with it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` now (``""``: on every interface, for a port other
    machines connect to)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def healthy_process(
    command: list[str],
    url: str,
    *,
    env: dict[str, str] | None = None,
    start_timeout_s: float = 60.0,
    error: type[Exception] = RuntimeError,
    poll_s: float = 0.1,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` and yield its process once ``GET {url}/health`` answers 200; raise ``error``
    naming the command when it exits first or does not answer within ``start_timeout_s``. The process
    is terminated on exit (killed if it has not stopped 30 s later)."""
    import httpx

    proc = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise error(
                    f"`{' '.join(command)}` did not answer on {url}/health within {start_timeout_s:.0f} s "
                    f"(exit code {proc.poll()})"
                )
            time.sleep(poll_s)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
