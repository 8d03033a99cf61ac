"""The sandbox and SWE modules once more as an ordinary user: laptops and shared clusters run
HorizonRL without root, where sandboxes are rootless (user namespaces of their own, rlimits or a
delegated cgroup instead of root's cgroups).

Run as root (as CI does), this runs those modules in a child pytest as the ordinary user
``horizonrl-ci`` (created if missing) with a private HOME and TMPDIR, asserts that it passes and
prints its summary. Run as an ordinary user it skips: the modules themselves already ran as that
user. The child's first run builds the user's caches (the embedded model, the SWE test venv) in that
HOME, which is kept between runs (``/var/tmp/horizonrl-ci``) like a CI runner's cache.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
MODULES = (
    "tests/test_sandbox_bwrap.py",
    "tests/test_sandbox_base.py",
    "tests/test_shell_env.py",
    "tests/test_swe.py",
    "tests/test_swe_editor.py",
    "tests/test_swe_offline.py",
)
"""The modules whose sandboxes (or sandbox contract) must work rootless."""
CI_USER = "horizonrl-ci"
CI_HOME = Path("/var/tmp/horizonrl-ci")
CHILD_TIMEOUT_S = 900

pytestmark = pytest.mark.slow


def ci_user() -> pwd.struct_passwd:
    """The ordinary user the child runs as (a system user without login, created once)."""
    try:
        return pwd.getpwnam(CI_USER)
    except KeyError:
        useradd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(CI_HOME)]
        subprocess.run(
            [*useradd, "--shell", "/usr/sbin/nologin", CI_USER],
            capture_output=True,
            check=False,  # a concurrent run may have created it: the lookup below decides
        )
        return pwd.getpwnam(CI_USER)


def private_dir(path: Path, user: pwd.struct_passwd) -> Path:
    """``path`` as a 0700 directory of ``user``'s (created if missing)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o700)
    return path


class NoOrdinaryUser(Exception):
    """This project cannot be run as an ordinary user here (the message says why)."""


@dataclass
class UserSession:
    """Running this project's venv as an ordinary user: ``view`` (run as root first, may be empty)
    makes its interpreter reachable, then ``runuser`` with a clean environment, HOME and TMPDIR."""

    user: pwd.struct_passwd
    home: Path
    tmp: Path
    view: list[str]
    how: str

    def env(self) -> list[str]:
        env = {
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "USER": self.user.pw_name,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return ["env", "-i", *(f"{k}={v}" for k, v in env.items())]

    def python(self, *args: str) -> list[str]:
        """The command that runs ``python *args`` (this project's venv) as the user."""
        return [*self.view, "runuser", "-u", self.user.pw_name, "--", *self.env(), sys.executable, *args]


@contextlib.contextmanager
def ordinary_user() -> Iterator[UserSession]:
    """A :class:`UserSession` of ``horizonrl-ci`` (created if missing) with a fresh TMPDIR in its
    persistent HOME; raises :class:`NoOrdinaryUser` where that cannot work."""
    if os.geteuid() != 0:
        raise NoOrdinaryUser(f"running as uid {os.geteuid()}: only root can run commands as another user")
    if shutil.which("runuser") is None or shutil.which("unshare") is None:
        raise NoOrdinaryUser("runuser or unshare (util-linux) is missing")
    user = ci_user()
    home = private_dir(CI_HOME, user)
    tmp = private_dir(Path(tempfile.mkdtemp(prefix="tmp-", dir=home)), user)
    stage = Path(tempfile.mkdtemp(prefix="horizonrl-ci-interpreter-"))
    try:
        session = UserSession(user, home, tmp, [], "the project's venv")
        if not _runs(session):
            session.view, session.how = _interpreter_view(user, stage)
            if not _runs(session):
                raise NoOrdinaryUser(f"user {user.pw_name} cannot run {sys.executable}")
        yield session
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        stage.rmdir()


def _interpreter_view(user: pwd.struct_passwd, stage: Path) -> tuple[list[str], str]:
    """Where the venv's base interpreter lives under a directory the user cannot enter (pyenv under
    a 0700 /root): a private mount namespace that covers that directory with an empty tmpfs and
    binds the interpreter alone back, read-only. The user sees the interpreter, nothing else there."""
    base = Path(sys.base_prefix).resolve()
    closed = next((d for d in [*reversed(base.parents), base] if not _enters(user, d)), None)
    if closed is None or closed == Path("/"):
        raise NoOrdinaryUser(f"user {user.pw_name} cannot run {sys.executable}")
    script = (
        'mount --bind "$1" "$2" && mount -t tmpfs -o mode=0755,size=1m horizonrl "$3" && mkdir -p "$1" '
        '&& mount --bind "$2" "$1" && mount -o remount,bind,ro "$1" && shift 3 && exec "$@"'
    )
    view = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]
    return [*view, str(base), str(stage), str(closed)], f"its interpreter shown alone in a covered {closed}"


def _enters(user: pwd.struct_passwd, directory: Path) -> bool:
    done = subprocess.run(["runuser", "-u", user.pw_name, "--", "test", "-x", str(directory)], check=False)
    return done.returncode == 0


def _runs(session: UserSession) -> bool:
    done = subprocess.run(session.python("-c", "import horizonrl"), capture_output=True, check=False)
    return done.returncode == 0


def user_setup(session: UserSession) -> None:
    """What `make setup` prepares, for the user (kept in its HOME between runs): the embedded model's
    cache (the tokenizer the tests use) and the SWE test venvs and package snapshots."""
    model = "from horizonrl.models import embedded_model_dir; embedded_model_dir()"
    for step in (["-c", model], ["-m", "horizonrl.envs.swe.offline"]):
        done = subprocess.run(session.python(*step), capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"`python {' '.join(step)}` failed as {CI_USER}: {done.stderr[-2000:]}"


def summary(output: str) -> str:
    """The child's short test summary and its final line."""
    lines = output.rstrip().splitlines()
    start = next((i for i, line in enumerate(lines) if "short test summary" in line), len(lines) - 1)
    return "\n".join(lines[start:])


@contextlib.contextmanager
def session_or_skip() -> Iterator[UserSession]:
    try:
        with ordinary_user() as session:
            yield session
    except NoOrdinaryUser as exc:
        pytest.skip(f"{exc} (the modules already ran as this user)")


def test_sandbox_and_swe_modules_pass_as_an_ordinary_user() -> None:
    with session_or_skip() as session:
        start = time.perf_counter()
        user_setup(session)
        setup_s = time.perf_counter() - start
        done = subprocess.run(
            session.python("-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", *MODULES),
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
        seconds = time.perf_counter() - start - setup_s
    user = session.user
    group = grp.getgrgid(user.pw_gid).gr_name
    print(f"\nas {user.pw_name} (uid {user.pw_uid}, group {group}), the project's venv ({session.how}):")
    print(f"setup {setup_s:.0f} s, tests {seconds:.0f} s")
    print(summary(done.stdout))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_disabled_user_namespaces_are_a_one_line_error_naming_the_switch() -> None:
    """An ordinary user in a user namespace whose ``user.max_user_namespaces`` is 0 (set there, not on
    the host) gets one line naming the sysctl and what would work, not a traceback."""
    holder = None
    with session_or_skip() as session:
        holder = subprocess.Popen(["unshare", "--user", "sleep", "60"])
        try:
            time.sleep(0.2)
            for kind in ("uid", "gid"):
                Path(f"/proc/{holder.pid}/{kind}_map").write_text("0 0 65536\n")
            enter = ["nsenter", "--user", f"--target={holder.pid}"]
            subprocess.run([*enter, "sh", "-c", "echo 0 > /proc/sys/user/max_user_namespaces"], check=True)
            user = session.user
            as_user = [*enter, f"--setuid={user.pw_uid}", f"--setgid={user.pw_gid}", *session.env()]
            cli = [sys.executable, "-m", "horizonrl.cli", "sandbox", "run", "--", "echo hi"]
            command = [*session.view, *as_user, *cli]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        finally:
            holder.kill()
            holder.wait()
    print(done.stderr.strip())
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: unprivileged user namespaces are disabled (user.max_user_namespaces=0): run as root, "
        "or enable them (sysctl -w user.max_user_namespaces=15000)"
    ]
