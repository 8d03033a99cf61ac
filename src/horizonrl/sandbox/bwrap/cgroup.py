"""Cgroups: one per sandbox, limiting the memory and the processes of all its processes together.

As root under the hierarchy's ``horizonrl`` group (v1 or v2); rootless under a cgroup v2 group
delegated to the user (:func:`delegated_cgroup`, e.g. systemd's ``Delegate=yes``). Where there is
none at all, the backend falls back to rlimits (docs/sandboxes.md, "Limits"); where there is one but
a sandbox's group cannot be made or a limit cannot be set, :class:`CgroupError` says which and the
sandbox is refused (never run without its limits), with the half-made group removed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

from horizonrl.sandbox.base import SandboxLimits

_NEEDED_CONTROLLERS = {"memory", "pids"}


class CgroupError(Exception):
    """A sandbox's cgroup could not be created or its limits set: the message names the file, the
    value and the kernel's reason (the sandbox is refused rather than run without it)."""


def _make_dir(path: Path, made: list[Path]) -> None:
    try:
        path.mkdir()
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {exc.strerror or exc}") from None
    made.append(path)


def _set(path: Path, value: str) -> None:
    """Write ``value`` to a cgroup control file, or raise :class:`CgroupError` naming both."""
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot set {path.name}={value} in {path.parent}: {exc.strerror or exc}") from None


class Cgroup:
    """One sandbox's cgroup(s): a ``pids`` and a ``memory`` limit, v1 or v2."""

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    @classmethod
    def root_hierarchy(cls) -> str:
        """Prepare the hierarchy root's sandboxes go under (the ``horizonrl`` groups, v2 or v1, with
        the memory and pids controllers): '' when it is usable, else why not (then there is no cgroup
        to use at all, and rlimits apply). Once per backend."""
        try:
            if (cls.ROOT / "cgroup.controllers").exists():  # v2
                missing = _NEEDED_CONTROLLERS - set((cls.ROOT / "cgroup.controllers").read_text().split())
                if missing:
                    return f"{cls.ROOT} offers no {' and '.join(sorted(missing))} controller"
                parent = cls.ROOT / "horizonrl"
                parent.mkdir(exist_ok=True)
                for ctl in (cls.ROOT / "cgroup.subtree_control", parent / "cgroup.subtree_control"):
                    _set(ctl, "+pids +memory")
                return ""
            if not (cls.ROOT / "pids").is_dir() or not (cls.ROOT / "memory").is_dir():
                return f"no cgroup v2 and no v1 pids and memory controllers under {cls.ROOT}"
            for controller in ("pids", "memory", "freezer"):
                if (cls.ROOT / controller).is_dir():
                    (cls.ROOT / controller / "horizonrl").mkdir(exist_ok=True)
            return ""
        except CgroupError as exc:
            return str(exc)
        except OSError as exc:
            return f"cannot create a cgroup under {cls.ROOT}: {exc.strerror or exc}"

    @classmethod
    def create(cls, name: str, limits: SandboxLimits, delegated: Path | None = None) -> Cgroup:
        """The cgroup(s) of one sandbox: as root under the hierarchy's ``horizonrl`` group (v1 or
        v2, prepared by :meth:`root_hierarchy`), rootless under ``delegated`` (a v2 group of this
        user's with memory and pids enabled). Every limit is set or :class:`CgroupError` is raised,
        after removing whatever part of the group was already made."""
        made: list[Path] = []
        try:
            if delegated is not None:
                return cls._create_v2(delegated / name, limits, made)
            if (cls.ROOT / "cgroup.controllers").exists():
                return cls._create_v2(cls.ROOT / "horizonrl" / name, limits, made)
            return cls._create_v1(name, limits, made)
        except BaseException:
            cls(list(reversed(made))).remove(wait_s=0.5)
            raise

    @classmethod
    def _create_v2(cls, group: Path, limits: SandboxLimits, made: list[Path]) -> Cgroup:
        _make_dir(group, made)
        _set(group / "pids.max", str(limits.processes))
        _set(group / "memory.max", str(limits.memory_mib * 1024 * 1024))
        if (group / "memory.swap.max").exists():
            _set(group / "memory.swap.max", "0")
        return cls([group])

    @classmethod
    def _create_v1(cls, name: str, limits: SandboxLimits, made: list[Path]) -> Cgroup:
        pids, mem = cls.ROOT / "pids" / "horizonrl" / name, cls.ROOT / "memory" / "horizonrl" / name
        dirs = [pids, mem]
        if (cls.ROOT / "freezer").is_dir():
            dirs.append(cls.ROOT / "freezer" / "horizonrl" / name)
        for d in dirs:
            _make_dir(d, made)
        _set(pids / "pids.max", str(limits.processes))
        _set(mem / "memory.limit_in_bytes", str(limits.memory_mib * 1024 * 1024))
        return cls(dirs)

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    @contextlib.contextmanager
    def frozen(self) -> Any:
        """Freeze every process of the group (none can fork) for the duration of the block."""
        state = next((d / "freezer.state" for d in self.dirs if (d / "freezer.state").exists()), None)
        freeze = next((d / "cgroup.freeze" for d in self.dirs if (d / "cgroup.freeze").exists()), None)
        try:
            if state is not None:
                state.write_text("FROZEN")
                deadline = time.monotonic() + 1.0
                while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                    time.sleep(0.001)
            elif freeze is not None:
                freeze.write_text("1")
            yield
        finally:
            if state is not None:
                state.write_text("THAWED")
            elif freeze is not None:
                freeze.write_text("0")

    def kill_all(self, keep: frozenset[int] = frozenset()) -> int:
        """SIGKILL every process in the group but ``keep``; returns how many were signalled."""
        killed = 0
        for pid in self.pids():
            if pid in keep:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def processes_full(self) -> bool:
        """Whether the process limit is (nearly) reached: no new command could start."""
        pids_dir = next((d for d in self.dirs if (d / "pids.max").exists()), None)
        if pids_dir is None:
            return False
        try:
            limit = (pids_dir / "pids.max").read_text().strip()
            return limit != "max" and int((pids_dir / "pids.current").read_text()) >= int(limit) - 2
        except (OSError, ValueError):
            return False

    def remove(self, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self.kill_all()
                    time.sleep(0.01)


CGROUP_PARENTS = (
    Cgroup.ROOT / "pids" / "horizonrl",
    Cgroup.ROOT / "memory" / "horizonrl",
    Cgroup.ROOT / "freezer" / "horizonrl",
    Cgroup.ROOT / "horizonrl",
)
"""Where root's sandboxes have their cgroups (v1 controllers, v2): what :func:`.host.reap_stale`
searches by default."""


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (None: no v2 hierarchy)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, fs = line.partition(" - ")
            if fs.split()[:1] == ["cgroup2"]:
                return Path(fields.split()[4])
    return None


def _own_cgroup2() -> Path | None:
    """This process's cgroup v2 directory (None: not on a v2 hierarchy)."""
    mount = _cgroup2_mount()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::") and mount is not None:
                return mount / line[3:].strip().lstrip("/")
    return None


SCOPE_HINT = "start horizon under `systemd-run --user --scope -p Delegate=yes` for one"
"""How an ordinary user gets a delegated cgroup (said in the note when there is none)."""


@functools.cache
def delegated_cgroup() -> tuple[Path | None, str]:
    """A cgroup v2 group of this user's under which sandboxes get memory and pids limits, and ''; or
    None and why there is none. systemd delegates one to a user's service or a ``Delegate=yes``
    scope; to enable controllers for children the group itself must hold no process, so this process
    moves into a leaf ``supervisor-<pid>`` of it first (once per process)."""
    own = _own_cgroup2()
    if own is None:
        return None, "no cgroup v2 hierarchy"
    try:
        available = set((own / "cgroup.controllers").read_text().split())
        if not available >= _NEEDED_CONTROLLERS:
            return None, f"cgroup {own} offers no memory and pids controllers"
        files = (own, own / "cgroup.procs", own / "cgroup.subtree_control")
        if not all(os.access(f, os.W_OK) for f in files):
            return None, f"cgroup {own} is not delegated to uid {os.geteuid()}"
        if set((own / "cgroup.subtree_control").read_text().split()) >= _NEEDED_CONTROLLERS:
            return own, ""
        return _enable_controllers(own)
    except OSError as exc:
        return None, f"cgroup {own}: {exc.strerror}"


def _enable_controllers(own: Path) -> tuple[Path | None, str]:
    leaf = own / f"supervisor-{os.getpid()}"
    leaf.mkdir(exist_ok=True)
    (leaf / "cgroup.procs").write_text(str(os.getpid()))
    try:
        (own / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        (own / "cgroup.procs").write_text(str(os.getpid()))  # back where it was
        with contextlib.suppress(OSError):
            leaf.rmdir()
        return None, f"the delegated cgroup {own} holds other processes ({SCOPE_HINT})"
    return own, ""
