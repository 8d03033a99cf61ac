"""Running one command on the host and collecting its output: the head and the tail of each stream
within a limit (a command that floods far past it is killed), a timeout that kills the command's
whole process group, and cancellation that never leaves it running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import deque

KILL_AFTER_FACTOR = 64
"""A command is killed once it has written this many times ``output_bytes`` to one stream."""
DRAIN_S = 0.05
"""After a command exits, how long to wait for the rest of its output (background processes it
started may keep the pipes open for as long as they live)."""


class Capture:
    """Keeps the head and the tail of a stream within ``limit`` bytes and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_size += len(chunk)
            while self.tail and self.tail_size - len(self.tail[0]) >= self.limit - self.limit // 2:
                self.tail_size -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def data(self) -> bytes:
        tail = b"".join(self.tail)
        if not self.truncated:
            return bytes(self.head) + tail
        keep = self.limit - self.limit // 2
        tail = tail[-keep:]
        cut = self.total - len(self.head) - len(tail)
        return bytes(self.head) + f"\n[... {cut} bytes cut ...]\n".encode() + tail

    def text(self) -> str:
        return self.data().decode("utf-8", errors="replace")


class CommandProtocol(asyncio.SubprocessProtocol):
    """Collects one command's output (head and tail within the limit) and says when it exits.

    A command that floods a stream far past the limit is killed. ``exited`` resolves when the
    process exits, ``closed`` when its pipes are closed too (never, while a background process it
    started holds them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.out, self.err = Capture(limit), Capture(limit)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.pid: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.pid = transport.get_pid()  # type: ignore[attr-defined]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        capture = self.out if fd == 1 else self.err
        capture.add(data)
        if capture.total > capture.limit * KILL_AFTER_FACTOR:
            self.kill()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def kill(self) -> None:
        """SIGKILL the command's process group (the command and everything it started in it)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


async def run_command(
    argv: list[str],
    *,
    env: dict[str, str],
    timeout: float,
    output_bytes: int,
    stdin: bytes | None = None,
) -> tuple[int, Capture, Capture, bool, float]:
    """Run ``argv`` (a host command, in a process group of its own) with ``stdin`` (None: none);
    return (exit code, stdout, stderr, timed out, seconds). A timeout SIGKILLs the whole process
    group; so does cancellation, before it propagates."""
    loop = asyncio.get_running_loop()
    protocol = CommandProtocol(loop, output_bytes)
    start = time.perf_counter()
    transport, _ = await loop.subprocess_exec(
        lambda: protocol,
        *argv,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: a timeout kills the whole command
    )
    try:
        if stdin is not None:
            pipe = transport.get_pipe_transport(0)
            pipe.write(stdin)
            pipe.write_eof()
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), timeout)
        except TimeoutError:
            timed_out = True
            protocol.kill()
            await protocol.exited
        # The command has exited; what it started in the background lives on (sandbox state)
        # and may hold the pipes open: take what output is already there, then let go.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(protocol.closed), DRAIN_S)
    except BaseException:  # cancelled (e.g. a client went away): never leave the command running
        protocol.kill()
        raise
    finally:
        transport.close()
    code = transport.get_returncode()
    assert code is not None
    return code, protocol.out, protocol.err, timed_out, time.perf_counter() - start
