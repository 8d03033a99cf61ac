"""The processes of a sandbox without a cgroup: found through its PID namespace (or its PID 1's
descendants), stopped and killed there. With a cgroup, :class:`.cgroup.Cgroup` does the same."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a sandbox's PID 1: the holder and whatever commands left
    running in the background, which it inherits)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children(current)
    return found


def _pids_in_namespace(pid_ns: tuple[int, int]) -> list[int]:
    """Every live process in the PID namespace ``(st_dev, st_ino)`` (a scan of /proc)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ns = os.stat(f"/proc/{entry.name}/ns/pid")
                if (ns.st_dev, ns.st_ino) == pid_ns:
                    pids.append(int(entry.name))
    return pids


def end_pid_namespace(init_pid: int, wait_s: float = 5.0) -> None:
    """SIGKILL a sandbox's PID 1 and wait until the kernel has killed every process of its PID
    namespace (PID 1 finishes exiting, becoming a zombie or gone, only after all of them)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(init_pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{init_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.001)


def stop_and_kill(pid_ns: tuple[int, int], keep: frozenset[int]) -> int:
    """SIGKILL every process of a PID namespace but ``keep``; returns how many. Without a cgroup
    freezer a fork bomb could outrun one pass of kills, so each process is stopped first (a stopped
    process cannot fork) until a pass finds none left running."""
    stopped: set[int] = set()
    for _ in range(100):
        running = [pid for pid in _pids_in_namespace(pid_ns) if pid not in keep and pid not in stopped]
        if not running:
            break
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)
