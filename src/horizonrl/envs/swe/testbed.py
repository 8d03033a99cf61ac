"""Running a package's tests inside sandboxes: the shared test venv, the pytest command, its results,
and the workspace's git state (commit the buggy state, diff since it, apply a patch with SWE-bench's
fallbacks).

The test venv (pytest and the shipped packages' test dependencies) is created once per machine under
the cache directory — by ``make setup`` (:mod:`horizonrl.envs.swe.offline`) or by the task factory,
the only steps that may download — and bound read-only into every sandbox together with the base
interpreter it links to. Evaluating and running episodes never download: a missing venv is an error
naming ``make setup``; tests never reach the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from horizonrl.envs.swe.instances import cache_root
from horizonrl.errors import HorizonError
from horizonrl.sandbox.base import Sandbox, SandboxLimits, workspace_diff_script

TEST_REQUIREMENTS = ("pytest==8.4.2", "text-unidecode==1.3")
"""What the test venv holds: pytest and the shipped packages' test dependencies."""

PYTEST_ARGS = "-q -rA -p no:cacheprovider -o addopts= -o console_output_style=classic --tb=line --color=no"
PASSING = {"PASSED", "XFAIL"}
TEST_LIMITS = SandboxLimits(memory_mib=2048, processes=512, output_bytes=16 * 1024 * 1024)
"""Sandboxes that run test suites keep all of pytest's report (every node id's status line)."""
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S.*?)(?: - (.*))?$")


class TestVenvError(HorizonError):
    """The test venv is missing (run ``make setup``) or could not be created (e.g. PyPI unreachable)."""


def base_prefix() -> Path:
    """The interpreter installation a venv's python links to (bound read-only into sandboxes)."""
    return Path(sys.base_prefix).resolve()


def venv_path(requirements: tuple[str, ...] = TEST_REQUIREMENTS) -> Path:
    """Where the venv with ``requirements`` lives (one per interpreter and set of requirements)."""
    key = hashlib.sha256(" ".join((sys.version, *requirements)).encode()).hexdigest()[:12]
    return cache_root() / "swe" / f"test-venv-{key}"


def ensure_test_venv(requirements: tuple[str, ...] = TEST_REQUIREMENTS, download: bool = False) -> Path:
    """The venv with ``requirements``. Created once (``python -m venv`` + ``pip install``) only with
    ``download`` (``make setup``, the task factory); otherwise a missing one is a TestVenvError."""
    venv = venv_path(requirements)
    if (venv / ".ready").exists():
        return venv
    if not download:
        raise TestVenvError(
            f"the SWE test venv ({' '.join(requirements)}) is missing under {venv.parent}: run `make setup` "
            "(for another dataset: python -m horizonrl.envs.swe.offline DATASET)"
        )
    venv.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".venv-", dir=venv.parent))
    try:
        _install_venv(tmp, requirements)
        (tmp / ".ready").touch()
        try:
            tmp.rename(venv)
        except OSError:  # built concurrently by another process
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the venv's python must keep working after the rename: it links to the base interpreter
    return venv


def base_python() -> str:
    """The interpreter the test venvs are created from (the one running HorizonRL, outside its venv)."""
    python = base_prefix() / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(python) if python.exists() else sys.executable


def _install_venv(target: Path, requirements: tuple[str, ...]) -> None:
    python = base_python()
    subprocess.run([python, "-m", "venv", "--without-pip", str(target)], check=True, capture_output=True)
    pip = [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install", "-q"]
    done = subprocess.run([*pip, *requirements], capture_output=True, text=True)
    if done.returncode:
        reason = " ".join(done.stderr.split())[-400:]
        raise TestVenvError(f"could not install {' '.join(requirements)} into a SWE test venv: {reason}")


def environment_fingerprint() -> str:
    """What the environment's test results depend on beyond the snapshot and the venv's pins: the
    interpreter's version and path (its build: tkinter or not, sqlite's version...)."""
    return f"python {platform.python_version()} {Path(base_python()).resolve()}"


def env_record_path() -> Path:
    """The environment validation record, next to the test venvs (see :mod:`horizonrl.envs.swe.offline`)."""
    return cache_root() / "swe" / "env-validation.json"


def load_env_record(fingerprint: str | None = None) -> dict[str, dict[str, object]]:
    """This environment's validation entries by snapshot key (empty: never validated here)."""
    try:
        data = json.loads(env_record_path().read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get(fingerprint or environment_fingerprint()) if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def save_env_record(entries: dict[str, dict[str, object]], fingerprint: str | None = None) -> None:
    """Merge ``entries`` into this environment's record (atomically: a crash leaves the old file)."""
    path = env_record_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    key = fingerprint or environment_fingerprint()
    data[key] = {**(data.get(key) or {}), **entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def package_requirements(snapshot: Path) -> list[str]:
    """The package's own runtime dependencies (``Requires-Dist`` without an extra), from its sdist's
    PKG-INFO: installed into its test venv next to pytest."""
    info = snapshot / "PKG-INFO"
    if not info.exists():
        return []
    requirements = []
    for line in info.read_text(errors="replace").splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            requirements.append(" ".join(line.split(":", 1)[1].split()))  # markers kept: pip reads them
    return sorted(set(requirements))


def venv_requirements(extra: list[str]) -> tuple[str, ...]:
    """Our pins plus ``extra`` (a package's dependencies and declared test dependencies): a pin the
    package's own requirement excludes (e.g. ``pytest>=9``) gives way to it, and a requirement our
    pin already satisfies is not repeated (fewer distinct venvs)."""
    pins = {canonicalize_name(Requirement(p).name): p for p in TEST_REQUIREMENTS}
    keep = dict(pins)
    rest = []
    for spec in extra:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            rest.append(spec)
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # not for this interpreter: pip would skip it too
        name = canonicalize_name(req.name)
        if name not in pins:
            rest.append(spec)
            continue
        pinned = str(next(iter(Requirement(pins[name]).specifier)).version)
        if req.extras or not req.specifier.contains(pinned, prereleases=True):
            keep.pop(name, None)
            rest.append(spec)
    return tuple(sorted(set(keep.values()) | set(rest)))


def sandbox_binds(venv: Path) -> list[str]:
    """Host paths a sandbox needs read-only to run the test venv."""
    return [str(venv), str(base_prefix())]


def test_command(venv: Path, snapshot: Path) -> str:
    """The pytest command for a package laid out like ``snapshot`` (src/ layout or flat)."""
    pythonpath = "/workspace/src" if (snapshot / "src").is_dir() else "/workspace"
    return f"COLUMNS=400 PYTHONPATH={pythonpath} {venv}/bin/python -m pytest {PYTEST_ARGS}"


@dataclass
class TestRun:
    """The outcome of one pytest run: each node id's status, and whether the run finished."""

    statuses: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0
    timed_out: bool = False
    duration: float = 0.0
    output: str = ""

    def passed(self, test: str) -> bool:
        return self.statuses.get(test) in PASSING

    @property
    def passing(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s in PASSING}

    @property
    def failing(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s not in PASSING and s != "SKIPPED"}


def parse_pytest(output: str) -> tuple[dict[str, str], dict[str, str]]:
    """Statuses and failure messages by node id from pytest's ``-rA`` summary."""
    statuses: dict[str, str] = {}
    messages: dict[str, str] = {}
    for line in output.splitlines():
        match = _RESULT.match(line.rstrip())
        if not match or match.group(1) == "SKIPPED":
            continue
        status, test, message = match.groups()
        statuses[test] = status
        if message:
            messages[test] = message
    return statuses, messages


async def run_tests(
    box: Sandbox, command: str, tests: list[str] | None = None, timeout: float = 300.0
) -> TestRun:
    """Run ``command`` (see :func:`test_command`) on ``tests`` (node ids; None: the whole suite)."""
    line = command + ("" if not tests else " " + " ".join(shlex.quote(t) for t in tests))
    result = await box.exec(line, timeout=timeout)
    statuses, messages = parse_pytest(result.stdout)
    return TestRun(statuses, messages, result.exit_code, result.timed_out, result.duration, result.stdout)


_GIT = "git -c user.name=horizonrl -c user.email=horizonrl@localhost -c commit.gpgsign=false"


async def commit_state(box: Sandbox, message: str) -> str:
    """Commit the whole workspace (e.g. the injected bug) and return the commit's hash."""
    result = await box.exec(
        f"{_GIT} add -A >/dev/null && {_GIT} commit -q --allow-empty -m {shlex.quote(message)} "
        "&& git rev-parse HEAD",
        timeout=120,
    )
    if not result.ok:
        raise HorizonError(f"could not commit the workspace: {result.stderr.strip()}")
    return result.stdout.strip().splitlines()[-1]


async def diff_since(box: Sandbox, commit: str) -> str:
    """The workspace's changes since ``commit`` (new files included, binary-safe), leaving the
    agent's git index alone."""
    result = await box.exec(workspace_diff_script(commit), timeout=300)
    if not result.ok:
        raise HorizonError(f"could not diff the workspace: {result.stderr.strip()}")
    return result.stdout


APPLY_STRATEGIES = (
    ("git apply", "git apply --verbose"),
    ("git apply --3way", "git apply --verbose --3way"),
    ("patch --fuzz", "patch --batch --fuzz=5 -p1 -i"),
)


async def apply_patch(box: Sandbox, patch: str) -> tuple[str | None, str, str]:
    """Apply ``patch`` in /workspace trying SWE-bench's fallbacks in order; returns (the strategy
    that worked or None, the log, why the first strategy failed in one line — "" when it applied)."""
    if not patch.strip():
        return "empty", "", ""
    await box.write_file(".git/horizonrl-model.patch", patch.encode())  # inside .git: never in a diff
    log, reason = [], ""
    for name, command in APPLY_STRATEGIES:
        result = await box.exec(f"{command} .git/horizonrl-model.patch", timeout=120)
        log.append(f"$ {command}\n{result.stdout}{result.stderr}")
        if result.ok:
            return name, "\n".join(log), reason
        reason = reason or f"{name}: {one_line(result.stderr or result.stdout)}"
        await box.exec("git reset -q --hard && git clean -qfd", timeout=60)  # undo a partial apply
    return None, "\n".join(log), reason


def one_line(text: str, limit: int = 300) -> str:
    """A tool's output as one line: its error lines (or all lines), joined, cut to ``limit``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error", "fatal"))] or lines
    joined = "; ".join(errors) or "(no output)"
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."
