"""The local sandbox backend: one bubblewrap sandbox per workspace, built by root or, rootless, by
an ordinary user in user namespaces of its own.

How a sandbox is built (``BwrapBackend.create``)::

    unshare --mount              root: a private mount namespace, gone with the sandbox
    unshare --user --map-root-user --mount
                                 rootless: a user namespace of its own (uid 0 inside is the user
                                 outside, nothing more) with a private mount namespace
      sh: join the sandbox's cgroup (where there is one), set rlimits, mount an overlay
          lower = the template (+ a cached layer holding its git repository), upper = per sandbox
          (rootless: ``userxattr``)
        [rootless: prlimit --nproc=PROCESSES, so the sandbox's own user namespace caps its processes]
          exec bwrap --unshare-all --cap-drop ALL --die-with-parent ...   (user, PID, IPC, UTS, net,
              cgroup namespaces; read-only /usr and a few /etc files; private /proc, /dev, /tmp;
              the overlay bound at /workspace)
            cat > /dev/null  (holds the namespaces while the sandbox is idle; its stdin is a pipe from
                              this process, so the sandbox ends when this process ends, however)

Each ``exec`` enters those namespaces with ``nsenter`` (like ``docker exec``), drops every
capability with ``setpriv`` and runs ``/bin/sh -c CMD`` in /workspace: processes an agent starts in
the background, files in /tmp and the workspace all persist between calls, and nothing outside the
sandbox is visible. Starting a sandbox costs the same for a 10-file and a 10,000-file template (the
overlay copies a file only when it is written), and the template is never modified.

Limits: where the sandbox has a cgroup (root: v1 or v2; rootless: a delegated v2 subtree, e.g.
systemd's ``Delegate=yes``) its processes share one memory and one process limit. Without one,
memory is RLIMIT_AS per process and, rootless, processes are capped per sandbox through
RLIMIT_NPROC, which the kernel counts per user namespace; which applies is ``SandboxInfo.limits_by``
and a one-time note on stderr. Every process also gets RLIMIT_CPU and RLIMIT_FSIZE, and /tmp is a
tmpfs of ``tmp_mib``. Output beyond ``output_bytes`` per stream is cut (the head and the tail are
kept, with ``truncated: true``); a command that keeps writing far past it is killed.

``read_file``/``write_file`` resolve the path *inside* the sandbox (after symlinks) and refuse
anything outside /workspace, so neither ``..`` nor a symlink planted by the agent reaches a host file.
``diff`` is ``git diff --binary`` of the workspace (new files included) against the template's commit.

Writable layers live in a directory of the user's own (:func:`default_state_dir`), never in a
directory shared between users.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    SandboxCapacityError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfo,
    SandboxLimits,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
    check_path,
    workspace_diff_script,
)

ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "mime.types",
    "bash.bashrc",
    "profile",
    "inputrc",
)
"""The host's /etc entries a sandbox sees (read-only); everything else in /etc (shadow, ssh keys,
sudoers, ...) is absent."""

SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
}
KILL_AFTER_FACTOR = 64
"""A command is killed once it has written this many times ``output_bytes`` to one stream."""
START_TIMEOUT_S = 30.0
"""Seconds a sandbox may take to start before bwrap is killed and create fails."""
DRAIN_S = 0.05
"""After a command exits, how long to wait for the rest of its output (background processes it
started may keep the pipes open for as long as they live)."""
_FILE_EXIT_OUTSIDE = 97
_FILE_EXIT_MISSING = 98
_GIT_IDENTITY = [
    "-c",
    "user.name=horizonrl",
    "-c",
    "user.email=horizonrl@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
]
_GIT_DATE = "2000-01-01T00:00:00+0000"


class BwrapOptions(BaseModel):
    """Host-side settings of the bubblewrap backend."""

    model_config = ConfigDict(extra="forbid")

    state_dir: str = Field(
        default_factory=lambda: default_state_dir(),
        description="Where each sandbox's writable layer lives (removed when the sandbox closes); "
        "a directory of this user's that nobody else can write (default: default_state_dir()).",
    )
    cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "horizonrl" / "templates"),
        description="Cached git layers of templates (one per template content).",
    )
    ro_binds: list[str] = Field(
        default_factory=list,
        description="Host paths bound read-only at the same path (e.g. a venv and its base interpreter).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of every command.")
    max_sandboxes: int = Field(512, ge=1, description="Live sandboxes this backend may hold at once.")
    cgroups: bool = Field(
        True, description="Limit memory and processes per sandbox with cgroups if possible."
    )


# --- where sandboxes live, and who builds them ----------------------------------------------------


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
    uid_map = _read_sysctl("/proc/self/uid_map").split()
    if uid_map[:3] == ["0", "0", "4294967295"] or not uid_map:
        return ()  # the initial namespace: root is root
    if any(uid_map[i + 1] == "0" for i in range(0, len(uid_map) - 2, 3)):
        return ()  # the host's root is mapped and shows as itself
    overflow = _read_sysctl("/proc/sys/kernel/overflowuid")
    return (int(overflow),) if overflow.isdigit() else ()


def _read_sysctl(path: str) -> str:
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
        if _read_sysctl(path) == bad:
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


def _note(text: str) -> None:
    """Print ``text`` on stderr, once per process."""
    if text not in _NOTES:
        _NOTES.add(text)
        print(f"horizonrl: {text}", file=sys.stderr, flush=True)


_NOTES: set[str] = set()


# --- templates ----------------------------------------------------------------------------------


class _Template:
    """The overlay's lower layers for one template and the commit the workspace starts at."""

    def __init__(self, name: str | None, lowers: list[Path], base: str) -> None:
        self.name, self.lowers, self.base = name, lowers, base


def _git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "GIT_AUTHOR_DATE": _GIT_DATE, "GIT_COMMITTER_DATE": _GIT_DATE, **(env or {})}
    done = subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, env=full_env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SandboxError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _fingerprint(root: Path) -> str:
    """A digest of a directory tree's names, sizes and modification times (not contents)."""
    digest = hashlib.sha256(str(root).encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):
                st = path.lstat()
                digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def _git_layer(cache_dir: Path, key: str, work_tree: Path | None) -> Path:
    """A cached directory holding only ``.git``: a repository whose one commit is ``work_tree``'s
    files (or an empty commit). Built once per key, atomically (concurrent builders race harmlessly)."""
    layer = cache_dir / key
    if (layer / ".git" / "HEAD").exists():
        return layer
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
    try:
        _git("init", "-q", "-b", "main", str(tmp))
        env = {"GIT_DIR": str(tmp / ".git"), "GIT_WORK_TREE": str(work_tree or tmp)}
        if work_tree is not None:
            _git("add", "-A", env=env)
        _git("commit", "-q", "--allow-empty", "-m", "workspace template", env=env)
        try:
            tmp.rename(layer)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return layer


def prepare_template(template: str | os.PathLike[str] | None, cache_dir: Path) -> _Template:
    """The lower layers and base commit of a workspace seeded from ``template`` (None: empty).

    A template that is a git repository itself is used as is (its HEAD is the base commit, so
    uncommitted changes in it show up in ``diff``); any other directory gets a cached git layer
    keyed by its path, names, sizes and mtimes. Templates must not change while sandboxes use them.
    """
    if template is None:
        layer = _git_layer(cache_dir, "empty", None)
        return _Template(None, [layer], _git("rev-parse", "HEAD", cwd=layer))
    root = Path(template).expanduser().resolve()
    if not root.is_dir():
        raise SandboxError(f"sandbox template {str(template)!r} is not a directory")
    bad = {",", ":", "\\"} & set(str(root))
    if bad:
        raise SandboxError(f"sandbox template path {str(root)!r} must not contain {' '.join(sorted(bad))}")
    if (root / ".git").exists():
        return _Template(str(root), [root], _git("rev-parse", "HEAD", cwd=root))
    layer = _git_layer(cache_dir, _fingerprint(root), root)
    return _Template(str(root), [layer, root], _git("rev-parse", "HEAD", cwd=layer))


# --- cgroups ------------------------------------------------------------------------------------


class _Cgroup:
    """One sandbox's cgroup(s): a ``pids`` and a ``memory`` limit, v1 or v2 (best effort)."""

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    @classmethod
    def create(cls, name: str, limits: SandboxLimits, delegated: Path | None = None) -> _Cgroup | None:
        """The cgroup(s) of one sandbox: as root under the hierarchy's ``horizonrl`` group (v1 or
        v2), rootless under ``delegated`` (a v2 group of this user's with memory and pids enabled)."""
        try:
            if delegated is not None:
                return cls._create_v2(delegated / name, limits)
            if (cls.ROOT / "cgroup.controllers").exists():  # v2
                parent = cls.ROOT / "horizonrl"
                parent.mkdir(exist_ok=True)
                for ctl in ((cls.ROOT / "cgroup.subtree_control"), (parent / "cgroup.subtree_control")):
                    ctl.write_text("+pids +memory")
                return cls._create_v2(parent / name, limits)
            return cls._create_v1(name, limits)
        except OSError:
            return None

    @classmethod
    def _create_v2(cls, group: Path, limits: SandboxLimits) -> _Cgroup:
        group.mkdir()
        (group / "pids.max").write_text(str(limits.processes))
        (group / "memory.max").write_text(str(limits.memory_mib * 1024 * 1024))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        return cls([group])

    @classmethod
    def _create_v1(cls, name: str, limits: SandboxLimits) -> _Cgroup | None:
        pids, mem = cls.ROOT / "pids" / "horizonrl" / name, cls.ROOT / "memory" / "horizonrl" / name
        if not (cls.ROOT / "pids").is_dir() or not (cls.ROOT / "memory").is_dir():
            return None
        dirs = [pids, mem]
        if (cls.ROOT / "freezer").is_dir():
            dirs.append(cls.ROOT / "freezer" / "horizonrl" / name)
        for d in dirs:
            d.mkdir(parents=True)
        (pids / "pids.max").write_text(str(limits.processes))
        (mem / "memory.limit_in_bytes").write_text(str(limits.memory_mib * 1024 * 1024))
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


_NEEDED_CONTROLLERS = {"memory", "pids"}
_SCOPE_HINT = "start horizon under `systemd-run --user --scope -p Delegate=yes` for one"


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
        return None, f"the delegated cgroup {own} holds other processes ({_SCOPE_HINT})"
    return own, ""


# --- output capture -----------------------------------------------------------------------------


class _Capture:
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


class _CommandProtocol(asyncio.SubprocessProtocol):
    """Collects one command's output (head and tail within the limit) and says when it exits.

    A command that floods a stream far past the limit is killed. ``exited`` resolves when the
    process exits, ``closed`` when its pipes are closed too (never, while a background process it
    started holds them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.out, self.err = _Capture(limit), _Capture(limit)
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


# --- the sandbox --------------------------------------------------------------------------------


def _refuse_uvloop() -> None:
    """uvloop's subprocesses inherit the parent's open file descriptors (measured: host pipes
    showed up inside sandboxes), which would hand host resources to the sandbox."""
    loop_type = type(asyncio.get_running_loop())
    if loop_type.__module__.split(".")[0] == "uvloop":
        raise SandboxError(
            "the bwrap sandbox backend does not run under uvloop (its subprocesses inherit the host's "
            "open file descriptors); use the default asyncio event loop (uvicorn: loop='asyncio')"
        )


def _usr_merged_binds() -> list[str]:
    """/bin, /lib, ... as on the host: symlinks into /usr (merged /usr) or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args


def _close_output_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of a started sandbox's stdout and stderr pipes: an idle sandbox then holds one
    file descriptor here (the holder's stdin), not three (an ordinary user's default soft limit of
    1024 open files would otherwise cap a process at ~330 sandboxes)."""
    transport = getattr(proc, "_transport", None)
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        if pipe is not None:
            pipe.close()


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a sandbox's PID 1: the holder and whatever commands left
    running in the background, which it inherits)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += _children(current)
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


def _end_pid_namespace(init_pid: int, wait_s: float = 5.0) -> None:
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


def _stop_and_kill(pid_ns: tuple[int, int], keep: frozenset[int]) -> int:
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


class BwrapSandbox:
    """One live bubblewrap sandbox (created by :meth:`BwrapBackend.create`)."""

    backend = "bwrap"

    def __init__(
        self,
        sandbox_id: str,
        proc: asyncio.subprocess.Process,
        holder_pid: int,
        directory: Path,
        template: _Template,
        limits: SandboxLimits,
        cgroup: _Cgroup | None,
        env: dict[str, str],
        owner: BwrapBackend | None = None,
        rootless: bool = False,
    ) -> None:
        self.id = sandbox_id
        self._proc, self._pid, self._dir = proc, holder_pid, directory
        self._template, self.limits, self._cgroup, self._env = template, limits, cgroup, env
        self._owner = owner
        self.rootless = rootless
        self._closed = False
        self.created_at = self.last_used_at = time.time()
        self._keep = frozenset({proc.pid, holder_pid, *_children(holder_pid)})  # bwrap, PID 1, holder
        ns = os.stat(f"/proc/{holder_pid}/ns/pid")
        self._pid_ns = (ns.st_dev, ns.st_ino)
        own_user_ns = os.readlink(f"/proc/{holder_pid}/ns/user") != os.readlink("/proc/self/ns/user")
        self._enter = [
            "nsenter",
            f"--target={holder_pid}",
            # rootless: uid 0 inside already is this user; nsenter's setgroups is not allowed there
            *(["--preserve-credentials"] if rootless else []),
            *(["--user"] if own_user_ns else []),
            "--mount",
            "--pid",
            "--ipc",
            "--uts",
            "--net",
            "--root",
            "--wd",
            "--",
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.id,
            backend=self.backend,
            template=self._template.name,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            limits=self.limits,
            mode="rootless" if self.rootless else "root",
            limits_by=self.limits_by,
        )

    @property
    def limits_by(self) -> Literal["cgroup", "rlimit"]:
        return "cgroup" if self._cgroup is not None else "rlimit"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        if self._proc.returncode is not None or not os.path.exists(f"/proc/{self._pid}"):
            raise SandboxError(
                f"sandbox {self.id} has stopped (its holder process was killed, and every process in "
                "it with it); create a new sandbox"
            )

    def _reclaim_processes(self, force: bool = False) -> str:
        """When the sandbox's process limit is used up (e.g. a fork bomb still running in the
        background), kill every process in it but its holder so the next command can start; the
        returned note (prepended to stderr) tells the agent."""
        if self._cgroup is not None:
            if not (force or self._cgroup.processes_full()):
                return ""
            with self._cgroup.frozen():  # frozen, a fork bomb cannot outrun the kills
                killed = self._cgroup.kill_all(self._keep)
        elif self.rootless:  # no cgroup: the processes of the sandbox's PID namespace
            if not (force or len(_descendants(self._pid)) + 1 >= self.limits.processes - 2):
                return ""
            killed = _stop_and_kill(self._pid_ns, self._keep)
        else:
            return ""
        return (
            f"[sandbox: the process limit ({self.limits.processes}) was reached; "
            f"{killed} processes were killed to run this command]\n"
        )

    def _prologue(self) -> str:
        """Shell run on the host before entering: join the cgroups, set the per-process rlimits."""
        lines = [f"echo $$ > {_shell_quote(f)}" for f in (self._cgroup.procs_files if self._cgroup else [])]
        lines.append(f"ulimit -t {self.limits.cpu_s}")
        lines.append(f"ulimit -f {self.limits.file_size_mib * 2048}")  # 512-byte blocks
        lines.append("ulimit -c 0")
        if self._cgroup is None:
            lines.append(f"ulimit -v {self.limits.memory_mib * 1024}")
        return " && ".join(lines)

    async def _run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, output_bytes: int | None = None
    ) -> tuple[int, _Capture, _Capture, bool, float]:
        """Run ``argv`` inside the sandbox; return (exit code, stdout, stderr, timed out, seconds)."""
        self._check_alive()
        _refuse_uvloop()
        self.last_used_at = time.time()
        loop = asyncio.get_running_loop()
        protocol = _CommandProtocol(loop, output_bytes or self.limits.output_bytes)
        start = time.perf_counter()
        transport, _ = await loop.subprocess_exec(
            lambda: protocol,
            "/bin/sh",
            "-c",
            self._prologue() + ' && exec "$@"',
            "sh",
            *self._enter,
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
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

    async def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` in /workspace."""
        if not isinstance(cmd, str) or not cmd or "\0" in cmd:
            raise SandboxError("cmd must be a non-empty string without NUL bytes")
        note = self._reclaim_processes()
        code, out, err, timed_out, seconds = await self._run(["/bin/sh", "-c", cmd], timeout)
        limited = self._cgroup is not None or self.rootless
        if code and not note and "fork failed" in err.text()[:200] and limited:
            note = self._reclaim_processes(force=True)  # the limit filled up between check and start
            code, out, err, timed_out, seconds = await self._run(["/bin/sh", "-c", cmd], timeout)
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=note + err.text(),
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            duration=seconds,
        )

    _RESOLVE = (
        f'p=$(realpath -m -- "$1") || exit {_FILE_EXIT_OUTSIDE}; '
        f'case "$p" in {WORKSPACE}|{WORKSPACE}/*) ;; '
        f'*) echo "$1 resolves to $p, outside {WORKSPACE}" >&2; exit {_FILE_EXIT_OUTSIDE};; esac; '
    )

    async def read_file(self, path: str, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """The bytes of a file inside /workspace (symlinks resolved inside the sandbox)."""
        check_path(path)
        script = self._RESOLVE + f'[ -f "$p" ] || exit {_FILE_EXIT_MISSING}; exec cat -- "$p"'
        code, out, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script, "sh", path], 60.0, output_bytes=max_bytes
        )
        self._raise_file_error(path, code, err, timed_out)
        if out.truncated:
            raise SandboxError(f"{path} is larger than {max_bytes} bytes; read it in parts with exec")
        return out.data()

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to a file inside /workspace (parent directories are created)."""
        check_path(path)
        if not isinstance(data, bytes | bytearray):
            raise SandboxError(f"write_file data must be bytes, not {type(data).__name__}")
        script = self._RESOLVE + 'mkdir -p -- "$(dirname -- "$p")" && exec cat > "$p"'
        code, _, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script, "sh", path], 60.0, stdin=bytes(data)
        )
        self._raise_file_error(path, code, err, timed_out)

    def _raise_file_error(self, path: str, code: int, err: _Capture, timed_out: bool) -> None:
        if code == 0 and not timed_out:
            return
        if code == _FILE_EXIT_OUTSIDE:
            raise SandboxPathError(f"path {path!r} is outside the workspace: {err.text().strip()}")
        if code == _FILE_EXIT_MISSING:
            raise SandboxFileNotFoundError(f"no file {path!r} in the workspace of sandbox {self.id}")
        reason = "timed out" if timed_out else f"failed (exit {code}): {err.text().strip()}"
        raise SandboxError(f"file operation on {path!r} in sandbox {self.id} {reason}")

    async def diff(self) -> str:
        """``git diff --binary`` of the workspace (new files included) against its starting commit;
        the agent's own git index is left alone."""
        script = workspace_diff_script(self._template.base)
        code, out, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script], 300.0, output_bytes=256 * 1024 * 1024
        )
        if code or timed_out:
            raise SandboxError(f"diff of sandbox {self.id} failed (exit {code}): {err.text().strip()}")
        return out.text()

    async def close(self) -> None:
        """Kill every process in the sandbox and delete its writable layer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        with contextlib.suppress(ProcessLookupError):
            await self._proc.wait()
        await asyncio.to_thread(self._cleanup)
        if self._owner is not None:
            self._owner._forget(self)

    def _cleanup(self) -> None:
        if self._cgroup is not None:
            with self._cgroup.frozen():
                self._cgroup.kill_all()
            self._cgroup.remove()
        else:
            _end_pid_namespace(self._pid)
        _rmtree(self._dir)

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class BwrapBackend:
    """Creates bubblewrap sandboxes on this machine (see the module doc)."""

    name = "bwrap"

    def __init__(self, options: BwrapOptions | None = None) -> None:
        self.options = options or BwrapOptions()
        self.rootless = os.geteuid() != 0
        self.mode: Literal["root", "rootless"] = "rootless" if self.rootless else "root"
        _check_tools(self.rootless)
        if self.rootless and (problem := rootless_problem()):
            raise SandboxUnavailableError(problem)
        self.state_dir = ensure_private_dir(Path(self.options.state_dir))
        self.cache_dir = Path(self.options.cache_dir)
        self._delegated = self._rootless_cgroup() if self.rootless else None
        self._templates: dict[str | None, _Template] = {}
        self._template_locks: dict[str | None, asyncio.Lock] = {}
        self._live: dict[str, BwrapSandbox] = {}
        self._env = {**SANDBOX_ENV, **self.options.env}
        self._base_args = self._bwrap_args()
        cgroup_parents = (self._delegated,) if self._delegated else ()
        reap_stale(self.state_dir, None if not self.rootless else cgroup_parents)

    def _rootless_cgroup(self) -> Path | None:
        """The delegated cgroup rootless sandboxes go under, or None with a one-time note saying
        which limits apply instead."""
        parent, why = delegated_cgroup() if self.options.cgroups else (None, "cgroups are off")
        if parent is None:
            hint = "" if "systemd-run" in why or "no cgroup v2" in why else f"; {_SCOPE_HINT}"
            _note(
                f"rootless sandboxes (uid {os.geteuid()}) without a cgroup ({why}{hint}): memory is "
                "limited per process (RLIMIT_AS), processes per sandbox (RLIMIT_NPROC of its user "
                "namespace)"
            )
        return parent

    def _bwrap_args(self) -> list[str]:
        args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--ro-bind", "/usr", "/usr", *_usr_merged_binds()]
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for path in self.options.ro_binds:
            real = str(Path(path).expanduser())
            if not Path(real).exists():
                raise SandboxError(f"sandbox ro_binds: {path!r} does not exist")
            args += ["--ro-bind", real, real]
        args += ["--proc", "/proc", "--dev", "/dev", "--hostname", "sandbox"]
        return args

    @property
    def live(self) -> int:
        return len(self._live)

    async def template(self, template: str | None) -> _Template:
        """The prepared template (its git layer is built once, in a worker thread: the first
        sandbox over a large repository does not stall the event loop)."""
        key = None if template is None else str(Path(template).expanduser().resolve())
        if key not in self._templates:
            lock = self._template_locks.setdefault(key, asyncio.Lock())
            async with lock:
                if key not in self._templates:
                    self._templates[key] = await asyncio.to_thread(prepare_template, key, self.cache_dir)
        return self._templates[key]

    async def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        if len(self._live) >= self.options.max_sandboxes:
            raise SandboxCapacityError(
                f"{len(self._live)} sandboxes are open, the most this backend allows "
                f"(max_sandboxes={self.options.max_sandboxes}); close some or raise the cap"
            )
        _refuse_uvloop()
        template = await self.template(spec.template)
        limits = spec.limits
        sandbox_id = uuid.uuid4().hex[:16]
        directory = self.state_dir / f"{os.getpid()}-{sandbox_id}"
        upper, work, merged = directory / "upper", directory / "work", directory / "workspace"
        for d in (upper, work, merged):
            d.mkdir(parents=True)
        cgroup = self._cgroup(f"{os.getpid()}-{sandbox_id}", limits)
        info_r, info_w = os.pipe()
        lower = ":".join(str(p) for p in template.lowers)
        overlay = f"{'userxattr,' if self.rootless else ''}lowerdir={lower},upperdir={upper},workdir={work}"
        bwrap = [
            "bwrap",
            *self._base_args,
            "--size",
            str(limits.tmp_mib * 1024 * 1024),
            "--tmpfs",
            "/tmp",
            "--bind",
            str(merged),
            WORKSPACE,
            "--chdir",
            WORKSPACE,
            # the root (with its /bin, /lib symlinks) and /dev read-only: `rm -rf /` cannot break
            # the sandbox; /workspace and /tmp are the writable places
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--info-fd",
            str(info_w),
            "--",
            "/bin/sh",
            "-c",
            # says when the sandbox is set up, then holds it until its stdin (a pipe from this
            # process) closes: when this process dies, however it dies, the holder exits, bwrap
            # (PID 1 of the sandbox) exits with it and the kernel kills every process inside
            "echo ready && exec cat > /dev/null",
        ]
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._start_argv(limits, cgroup, overlay, merged),
                *bwrap,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(info_w,),
                env=self._env,
            )
        except BaseException:
            os.close(info_r)
            os.close(info_w)
            self._discard(directory, cgroup)
            raise
        os.close(info_w)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_json, info_r), START_TIMEOUT_S)
            holder = int(info["child-pid"])
            assert proc.stdout is not None
            if await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S) != b"ready\n":
                raise ValueError("the sandbox's holder process did not start")
        except (ValueError, KeyError, TimeoutError) as exc:
            stderr = b""
            with contextlib.suppress(Exception):
                proc.kill()
                stderr = await asyncio.wait_for(proc.stderr.read(), 5) if proc.stderr else b""
                await proc.wait()
            self._discard(directory, cgroup)
            reason = " ".join(stderr.decode(errors="replace").split()) or str(exc)
            raise SandboxError(f"bubblewrap failed to start a sandbox ({self.mode} mode): {reason}") from None
        _close_output_pipes(proc)
        sandbox = BwrapSandbox(
            sandbox_id, proc, holder, directory, template, limits, cgroup, self._env, self, self.rootless
        )
        self._live[sandbox_id] = sandbox
        return sandbox

    def _cgroup(self, name: str, limits: SandboxLimits) -> _Cgroup | None:
        """The new sandbox's cgroup, or None (a one-time note says so where root gets none)."""
        if not self.options.cgroups or (self.rootless and self._delegated is None):
            return None
        cgroup = _Cgroup.create(name, limits, self._delegated)
        if cgroup is None and not self.rootless:
            _note(
                "no cgroup for root's sandboxes (cannot create one under /sys/fs/cgroup): memory is "
                "limited per process (RLIMIT_AS) and the process limit is not enforced"
            )
        return cgroup

    def _start_argv(
        self, limits: SandboxLimits, cgroup: _Cgroup | None, overlay: str, merged: Path
    ) -> list[str]:
        """The command that bwrap's argv follows: a private mount namespace (rootless: in a user
        namespace of its own) whose shell joins the cgroup, sets rlimits and mounts the overlay;
        rootless, ``prlimit`` caps the processes of the user namespace bwrap creates (RLIMIT_NPROC is
        counted per user namespace: the limit of its creator caps everything inside)."""
        joins = [f"echo $$ > {_shell_quote(f)}" for f in (cgroup.procs_files if cgroup else [])]
        script = " && ".join(
            [
                *joins,
                f"ulimit -t {limits.cpu_s}",
                "ulimit -c 0",
                'mount -t overlay horizonrl -o "$1" "$2"',
                'shift 2 && exec "$@"',
            ]
        )
        user = ["--user", "--map-root-user"] if self.rootless else []
        nproc = ["prlimit", f"--nproc={limits.processes}", "--"] if self.rootless else []
        return [
            *("unshare", *user, "--mount", "--propagation", "private", "--"),
            *("/bin/sh", "-c", script, "sh", overlay, str(merged)),
            *nproc,
        ]

    def _discard(self, directory: Path, cgroup: _Cgroup | None) -> None:
        if cgroup is not None:
            cgroup.remove()
        _rmtree(directory)

    def _forget(self, sandbox: BwrapSandbox) -> None:
        self._live.pop(sandbox.id, None)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._live.values())), return_exceptions=True)


def _check_tools(rootless: bool) -> None:
    for tool in ("bwrap", "unshare", "nsenter", "setpriv", "git", *(("prlimit",) if rootless else ())):
        if shutil.which(tool) is None:
            hint = " (Debian: apt-get install -y bubblewrap)" if tool == "bwrap" else " (util-linux)"
            raise SandboxUnavailableError(f"the bwrap sandbox backend needs {tool!r} on PATH{hint}")


def _rmtree(path: Path) -> None:
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


def _read_json(fd: int) -> dict[str, Any]:
    """Read bwrap's ``--info-fd`` document: until it parses, or the pipe closes (bwrap failed)."""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
            with contextlib.suppress(ValueError):
                return json.loads(data)
    finally:
        os.close(fd)
    raise ValueError(f"no sandbox info from bwrap (got {data[:200]!r})")


_CGROUP_PARENTS = (
    _Cgroup.ROOT / "pids" / "horizonrl",
    _Cgroup.ROOT / "memory" / "horizonrl",
    _Cgroup.ROOT / "freezer" / "horizonrl",
    _Cgroup.ROOT / "horizonrl",
)


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
            _rmtree(entry)
            removed += 1
    parents = _CGROUP_PARENTS if cgroup_parents is None else cgroup_parents
    stale = {d.name for parent in parents if parent.is_dir() for d in parent.iterdir() if d.is_dir()}
    for name in filter(_owner_gone, stale):
        _Cgroup([parent / name for parent in parents]).remove(wait_s=0.2)
    return removed
