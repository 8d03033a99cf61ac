"""The command lines that build a bubblewrap sandbox and enter it: what a sandbox sees of the host
(read-only /usr, a short list of /etc files, extra read-only binds), the overlay over its template,
the start-up chain (unshare, a shell that joins the cgroup, sets rlimits and mounts the overlay,
[prlimit], bwrap, the holder) and the ``nsenter``/``setpriv`` prefix of every command. Pure
functions of the options and limits: nothing here starts a process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from horizonrl.sandbox.base import WORKSPACE, SandboxError, SandboxLimits

if TYPE_CHECKING:
    from horizonrl.sandbox.bwrap.cgroup import Cgroup

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
"""The environment of every command in a sandbox (``BwrapOptions.env`` adds to it)."""


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


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def bwrap_base_args(ro_binds: list[str]) -> list[str]:
    """bwrap's arguments common to every sandbox of a backend: every namespace unshared, no
    capabilities, read-only /usr (and /bin, /lib, ... as on the host), the :data:`ETC_FILES`,
    ``ro_binds`` at the same path, private /proc and /dev."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args += ["--ro-bind", "/usr", "/usr", *_usr_merged_binds()]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path in ro_binds:
        real = str(Path(path).expanduser())
        if not Path(real).exists():
            raise SandboxError(f"sandbox ro_binds: {path!r} does not exist")
        args += ["--ro-bind", real, real]
    args += ["--proc", "/proc", "--dev", "/dev", "--hostname", "sandbox"]
    return args


def overlay_options(lowers: list[Path], upper: Path, work: Path, rootless: bool) -> str:
    """The overlay's mount options: the template's layers below a sandbox's own writable layer
    (rootless: ``userxattr``, the only overlay a user namespace may mount)."""
    lower = ":".join(str(p) for p in lowers)
    return f"{'userxattr,' if rootless else ''}lowerdir={lower},upperdir={upper},workdir={work}"


def binds_under_tmp(base_args: list[str]) -> list[str]:
    """The read-only binds of ``base_args`` whose target lies under /tmp, to mount again on top of
    the sandbox's private /tmp (which would hide them: a checkout or a venv under /tmp)."""
    out: list[str] = []
    for i, arg in enumerate(base_args[:-2]):
        if arg == "--ro-bind" and base_args[i + 2].startswith("/tmp/"):
            out += base_args[i : i + 3]
    return out


def bwrap_argv(base_args: list[str], limits: SandboxLimits, merged: Path, info_fd: int) -> list[str]:
    """The bwrap command of one sandbox: ``base_args``, a private /tmp of ``tmp_mib`` (with the
    read-only binds that live under /tmp mounted again on top), the mounted overlay ``merged`` at
    /workspace, its info document on ``info_fd``, and the holder."""
    return [
        "bwrap",
        *base_args,
        "--size",
        str(limits.tmp_mib * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        *binds_under_tmp(base_args),
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
        str(info_fd),
        "--",
        "/bin/sh",
        "-c",
        # says when the sandbox is set up, then holds it until its stdin (a pipe from this
        # process) closes: when this process dies, however it dies, the holder exits, bwrap
        # (PID 1 of the sandbox) exits with it and the kernel kills every process inside
        "echo ready && exec cat > /dev/null",
    ]


def start_argv(
    limits: SandboxLimits, cgroup: Cgroup | None, overlay: str, merged: Path, rootless: bool
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
    user = ["--user", "--map-root-user"] if rootless else []
    nproc = ["prlimit", f"--nproc={limits.processes}", "--"] if rootless else []
    return [
        *("unshare", *user, "--mount", "--propagation", "private", "--"),
        *("/bin/sh", "-c", script, "sh", overlay, str(merged)),
        *nproc,
    ]


def enter_argv(holder_pid: int, rootless: bool, own_user_ns: bool) -> list[str]:
    """The prefix of every command run in a sandbox: ``nsenter`` into the namespaces and the root of
    its holder ``holder_pid`` (like ``docker exec``), then ``setpriv`` drops every capability."""
    return [
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


def exec_prologue(limits: SandboxLimits, cgroup: Cgroup | None) -> str:
    """Shell run on the host before a command enters its sandbox: join the cgroups, set the
    per-process rlimits (memory too, where no cgroup limits it)."""
    lines = [f"echo $$ > {_shell_quote(f)}" for f in (cgroup.procs_files if cgroup else [])]
    lines.append(f"ulimit -t {limits.cpu_s}")
    lines.append(f"ulimit -f {limits.file_size_mib * 2048}")  # 512-byte blocks
    lines.append("ulimit -c 0")
    if cgroup is None:
        lines.append(f"ulimit -v {limits.memory_mib * 1024}")
    return " && ".join(lines)
