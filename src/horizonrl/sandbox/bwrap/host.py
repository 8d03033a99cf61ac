"""What the bwrap backend checks about this host and this user before it builds a sandbox, and
where the user's sandboxes keep their state.

- the state directory (:func:`default_state_dir`, :func:`ensure_private_dir`): a directory of the
  user's own that no other user can tamper with, never one shared between users;
- rootless mode (:func:`rootless_problem`): whether this user can create a user namespace that can
  mount, and if not, the one-line cause and what would work;
- the tools on PATH and the event loop (uvloop is refused);
- rlimits a rootless sandbox cannot set (:func:`rlimit_problem`: above the user's hard limits);
- what sandboxes of crashed processes left behind (:func:`reap_stale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from horizonrl.sandbox.base import SandboxError, SandboxLimits, SandboxUnavailableError
from horizonrl.sandbox.bwrap.cgroup import CGROUP_PARENTS, Cgroup

# --- where sandboxes live -----------------------------------------------------------------------


def default_state_dir() -> str:
    """Where this user's sandboxes keep their writable layers: ``$XDG_RUNTIME_DIR/horizonrl/sandboxes``
    when that variable names a directory of the user's own, else ``<tmp>/horizonrl-<uid>/sandboxes``
    (``<tmp>``: ``$TMPDIR`` or /tmp). :func:`ensure_private_dir` creates and checks it."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _owned_directory(Path(runtime), uid):
        return str(Path(runtime) / "horizonrl" / "sandboxes")
    return str(Path(tempfile.gettempdir()) / f"horizonrl-{uid}" / "sandboxes")


def _owned_directory(path: Path, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (missing directories 0700) and check that no other user can tamper with it:
    it is this user's directory, writable by nobody else, and every directory above it belongs to
    this user or root and is writable by nobody else or sticky (like /tmp). Raises a one-line
    :class:`SandboxUnavailableError` naming the culprit otherwise."""
    path = Path(os.path.abspath(path))
    try:
        for directory in [*reversed(path.parents), path]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
        problem = _tamper_risk(path) or _tamper_risk(path.resolve())
    except OSError as exc:
        existing = next(d for d in path.parents if os.path.lexists(d))
        owner = os.lstat(existing).st_uid
        whose = f", which belongs to uid {owner}" if owner not in (0, os.geteuid()) else ""
        problem = f"cannot create it in {existing}{whose} ({exc.strerror})"
    if problem:
        raise SandboxUnavailableError(
            f"sandbox state directory {path}: {problem}; remove it, or set sandbox.bwrap.state_dir "
            "(or TMPDIR) to a directory only you can write"
        )
    return path


def _tamper_risk(path: Path) -> str:
    """Why another user could swap or plant entries in ``path`` ('' when none can)."""
    uid = os.geteuid()
    above = (uid, 0, *_unmapped_root())  # who may own the directories above (read once)
    for directory in (path, *path.parents):
        st = os.lstat(directory)
        owners = (uid,) if directory == path else above
        if st.st_uid not in owners:
            return f"{directory} belongs to uid {st.st_uid}, not to you (uid {uid})" + (
                "" if directory == path else " or root"
            )
        if stat.S_ISLNK(st.st_mode):
            continue  # a link of this user's or root's; the resolved path is checked too
        if directory == path and not stat.S_ISDIR(st.st_mode):
            return "it is not a directory"
        writable = st.st_mode & 0o022 and not (directory != path and st.st_mode & stat.S_ISVTX)
        if writable:
            return f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _unmapped_root() -> tuple[int, ...]:
    """Inside a user namespace that does not map the host's root (``unshare --map-current-user``, a
    rootless container), root's directories such as / and /tmp show the overflow uid: count it as
    root's there (the directories above the state directory must still be writable by nobody else,
    or sticky)."""
    uid_map = read_sysctl("/proc/self/uid_map").split()
    if uid_map[:3] == ["0", "0", "4294967295"] or not uid_map:
        return ()  # the initial namespace: root is root
    if any(uid_map[i + 1] == "0" for i in range(0, len(uid_map) - 2, 3)):
        return ()  # the host's root is mapped and shows as itself
    overflow = read_sysctl("/proc/sys/kernel/overflowuid")
    return (int(overflow),) if overflow.isdigit() else ()


def read_sysctl(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


_USERNS_SWITCHES = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone", "1"),
    ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces", "15000"),
    (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1",
        "kernel.apparmor_restrict_unprivileged_userns",
        "0",
    ),
)


@functools.cache
def rootless_problem() -> str:
    """Why this (non-root) user cannot build rootless sandboxes here: a one-line cause and what would
    work, or '' when it can (probed once per process: a user namespace that can mount)."""
    probe = ["unshare", "--user", "--map-root-user", "--mount", "--"]
    probe += ["mount", "-t", "tmpfs", "horizonrl", "/tmp"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return ""
    for path, bad, name, good in _USERNS_SWITCHES:
        if read_sysctl(path) == bad:
            return (
                f"unprivileged user namespaces are disabled ({name}={bad}): run as root, or enable "
                f"them (sysctl -w {name}={good})"
            )
    reason = " ".join(done.stderr.split())[:200] or f"exit {done.returncode}"
    return (
        f"this user (uid {os.geteuid()}) cannot create a user namespace that can mount ({reason}; a "
        "container's seccomp profile may forbid it): run as root, or on a host that allows "
        "unprivileged user namespaces, or use the remote or docker sandbox backend"
    )


def rlimit_problem(limits: SandboxLimits, rootless: bool, cgroup: bool) -> str:
    """Why a rootless sandbox's rlimits cannot be set ('' when they can): a limit above this user's
    hard limit, which only root may raise (``ulimit``/``prlimit`` would fail as the sandbox starts).
    Root raises hard limits freely; memory is an rlimit only where no cgroup limits it."""
    if not rootless:
        return ""
    wanted = [
        (resource.RLIMIT_CPU, "RLIMIT_CPU", limits.cpu_s, "cpu_s"),
        (resource.RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.file_size_mib * 1024 * 1024, "file_size_mib"),
        (resource.RLIMIT_NPROC, "RLIMIT_NPROC", limits.processes, "processes"),
    ]
    if not cgroup:
        wanted.append((resource.RLIMIT_AS, "RLIMIT_AS", limits.memory_mib * 1024 * 1024, "memory_mib"))
    for which, name, value, field in wanted:
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and value > hard:
            return (
                f"cannot set {name}={value} (limits.{field}): above this user's hard limit of {hard}, "
                "which only root can raise"
            )
    return ""


def note(text: str) -> None:
    """Print ``text`` on stderr, once per process."""
    if text not in _NOTES:
        _NOTES.add(text)
        print(f"horizonrl: {text}", file=sys.stderr, flush=True)


_NOTES: set[str] = set()


# --- tools and event loop ------------------------------------------------------------------------


def check_tools(rootless: bool) -> None:
    for tool in ("bwrap", "unshare", "nsenter", "setpriv", "git", *(("prlimit",) if rootless else ())):
        if shutil.which(tool) is None:
            hint = " (Debian: apt-get install -y bubblewrap)" if tool == "bwrap" else " (util-linux)"
            raise SandboxUnavailableError(f"the bwrap sandbox backend needs {tool!r} on PATH{hint}")


def refuse_uvloop() -> None:
    """uvloop's subprocesses inherit the parent's open file descriptors (measured: host pipes
    showed up inside sandboxes), which would hand host resources to the sandbox."""
    loop_type = type(asyncio.get_running_loop())
    if loop_type.__module__.split(".")[0] == "uvloop":
        raise SandboxError(
            "the bwrap sandbox backend does not run under uvloop (its subprocesses inherit the host's "
            "open file descriptors); use the default asyncio event loop (uvicorn: loop='asyncio')"
        )


# --- what sandboxes of crashed processes left behind ----------------------------------------------


def rmtree(path: Path) -> None:
    """Remove a sandbox's directory. Rootless, nothing bypasses permissions: a directory the agent
    made unwritable, or the overlay's 0000 work directory, is made writable first (they are all
    this user's)."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
                shutil.rmtree(target, ignore_errors=True)
            else:
                func(target)

    if path.exists():
        shutil.rmtree(path, onerror=retry)


def _owner_gone(name: str) -> bool:
    """Whether the process that created the sandbox named ``<pid>-<id>`` no longer exists."""
    owner = name.split("-", 1)[0]
    return owner.isdigit() and "-" in name and not Path(f"/proc/{owner}").exists()


def reap_stale(state_dir: Path, cgroup_parents: tuple[Path, ...] | None = None) -> int:
    """Remove what sandboxes whose owning process is gone left behind (a crash or SIGKILL skipped
    their close): their writable layers under ``state_dir`` and their cgroups under
    ``cgroup_parents`` (default: root's, machine-wide; any process still in one is killed first).
    Returns how many writable layers were removed."""
    removed = 0
    for entry in state_dir.glob("*-*"):
        if _owner_gone(entry.name):
            rmtree(entry)
            removed += 1
    parents = CGROUP_PARENTS if cgroup_parents is None else cgroup_parents
    stale = {d.name for parent in parents if parent.is_dir() for d in parent.iterdir() if d.is_dir()}
    for name in filter(_owner_gone, stale):
        Cgroup([parent / name for parent in parents]).remove(wait_s=0.2)
    return removed
