"""One writer per run directory, and writes that fail for the disk's sake said in one line.

A command that writes a run directory holds its lock (``RUN_DIR/.writer.lock``) from before the model
loads to its end: a second writer, a real second process, is refused with one line naming the
holder's pid and host (exit 2), ``--overwrite`` of a live run moves nothing, and ``--resume`` after a
SIGKILL takes the lock at once and finishes, removing the dead writer's leftovers. A full disk or a
read-only output_dir is one line naming the path and the OS's reason (exit 2), before the model
loads or when a checkpoint does not fit, and what was written stays valid. The disk cases run the CLI
in a private mount namespace with a tiny tmpfs (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.io import HOST, replace_dir_atomic, temp_sibling
from horizonrl.train.run_lock import LOCK_FILE, hold_run_dir, read_holder

CALC = "configs/calc.yaml"
TINY = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=8",
    "agent.max_turns=2",
    "eval.num_tasks=2",
    "sft.enabled=false",
    "train.steps=1",
    "train.tasks_per_step=1",
    "train.group_size=2",
]
ENV = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
TIMEOUT = 300  # generous: the machine may be loaded


def horizon(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def train_args(output_dir: Path, *extra: str) -> list[str]:
    return ["train", CALC, *TINY, f"output_dir={output_dir}", "name=run", *extra]


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The refusal: exit 2, no traceback, one line on stderr (returned)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


def refused_in_process(*args: str) -> str:
    """``horizon ARGS`` run in this process (quicker than a new one): exit 2, one error line."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    return line


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class Holder:
    """A real second process that holds ``run_dir``'s lock until stopped."""

    def __init__(self, run_dir: Path) -> None:
        code = (
            "import sys, time\nfrom horizonrl.train.run_lock import hold_run_dir\n"
            f"with hold_run_dir({str(run_dir)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture
def holder(tmp_path):
    held: list[Holder] = []

    def start(run_dir: Path) -> Holder:
        held.append(Holder(run_dir))
        return held[-1]

    yield start
    for h in held:
        h.stop()


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------ one writer


def test_a_second_writer_is_refused_naming_the_holder_before_the_model_loads(tmp_path, holder):
    runs = tmp_path / "runs"
    first = holder(runs / "run")
    assert read_holder(runs / "run")["pid"] == first.proc.pid
    before = snapshot(tmp_path)
    line = one_error_line(horizon(*train_args(runs)))
    assert f"pid {first.proc.pid} on host {HOST}" in line and "being written by another process" in line
    assert snapshot(tmp_path) == before  # nothing loaded, nothing written
    assert first.proc.poll() is None  # the first writer goes on


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_overwrite_or_resume_of_a_live_run_is_refused_and_moves_nothing(tmp_path, holder, flag):
    runs = tmp_path / "runs"
    (runs / "run" / "checkpoints").mkdir(parents=True)
    (runs / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    first = holder(runs / "run")
    before = snapshot(tmp_path)
    line = refused_in_process(*train_args(runs, flag))
    assert f"pid {first.proc.pid}" in line
    assert snapshot(tmp_path) == before and not (runs / ".trash").exists()


def test_other_run_writers_take_the_same_lock(tmp_path, holder):
    runs = tmp_path / "runs"
    first = holder(runs / "calc")
    commands = [
        ["sft", CALC],
        ["dpo", "configs/dpo_calc.yaml"],
        ["stream", "configs/stream.yaml"],
        ["learn", "configs/learn.yaml"],
        ["malt", "sample", "configs/malt.yaml"],
        ["evolve", "train", "configs/evolve_flights.yaml"],
    ]
    for command in commands:
        line = refused_in_process(*command, f"output_dir={runs}", "name=calc", "model.path=tiny-random")
        assert f"pid {first.proc.pid}" in line, command


def test_the_lock_is_reentrant_and_leaves_no_trace(tmp_path):
    run_dir = tmp_path / "out" / "run"
    with hold_run_dir(run_dir):
        with hold_run_dir(run_dir):
            assert (run_dir / LOCK_FILE).is_file()
        assert read_holder(run_dir)["pid"] == os.getpid()
    assert not (tmp_path / "out").exists()  # the directories it made to take the lock, empty, are gone


def test_resume_after_sigkill_takes_the_lock_finishes_and_removes_the_dead_writers_leftovers(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "run"
    args = train_args(runs, "train.steps=2", "train.save_every=1")
    first = subprocess.Popen(
        [sys.executable, "-m", "horizonrl.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (run_dir / "checkpoints" / "step_000000" / "manifest.json").is_file():
            assert first.poll() is None, "the first run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGSTOP)  # a live writer, held still
        assert read_holder(run_dir)["pid"] == first.pid
        line = refused_in_process(*args, "--resume")
        assert f"pid {first.pid} on host {HOST}" in line
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait(timeout=60)
    assert (run_dir / LOCK_FILE).exists()  # a SIGKILL leaves the lock file, but not the lock
    leftover = run_dir / f".policy.tmp-{first.pid}@{HOST}"  # as a publish killed midway leaves it
    (leftover / "sub").mkdir(parents=True)
    proc = horizon(*args, "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 2
    assert not leftover.exists() and not (run_dir / LOCK_FILE).exists()
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_killed_writers_policy_temp_is_removed_and_a_live_writers_kept(tmp_path):
    dest = tmp_path / "policy"
    dead = tmp_path / f".policy.tmp-{dead_pid()}@{HOST}"
    dead_old = tmp_path / f".policy.old-{dead_pid()}@{HOST}"
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        live = tmp_path / f".policy.tmp-{sleeper.pid}@{HOST}"
        elsewhere = tmp_path / f".policy.tmp-{dead_pid()}@another-host"  # cannot be checked: kept
        for folder in (dead, dead_old, live, elsewhere):
            folder.mkdir()
        replace_dir_atomic(dest, lambda out: out.mkdir())
        assert dest.is_dir() and not dead.exists() and not dead_old.exists()
        assert live.is_dir() and elsewhere.is_dir()
        assert temp_sibling(dest).name == f".policy.tmp-{os.getpid()}@{HOST}"
    finally:
        sleeper.kill()
        sleeper.wait()


# ------------------------------------------------------------------ a full disk, a read-only output_dir


def _can_mount() -> str | None:
    """None when this process can mount a tmpfs in a private mount namespace, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k t /mnt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return None if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def mountable() -> None:
    reason = _can_mount()
    if reason is not None:
        print(f"skipped: {reason}")
        pytest.skip(reason)


def on_tmpfs(tmp_path: Path, setup: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``horizon ARGS`` with ``$MNT`` a fresh 1 MiB tmpfs (``setup`` runs first, in sh); the
    tmpfs's content is copied to the returned folder after the command."""
    mnt, kept = tmp_path / "mnt", tmp_path / "kept"
    mnt.mkdir()
    kept.mkdir()
    script = (
        f'mount -t tmpfs -o size=1m horizon "$MNT" && {setup} && '
        f'{{ "$@"; rc=$?; cp -a "$MNT"/. "{kept}"/; exit $rc; }}'
    )
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]
    command = [sys.executable, "-m", "horizonrl.cli", *args]
    proc = subprocess.run(
        [*argv, *command], capture_output=True, text=True, env={**ENV, "MNT": str(mnt)}, timeout=TIMEOUT
    )
    return proc, kept


def test_a_full_disk_is_one_line_before_the_model_loads(tmp_path, mountable):
    fill = 'dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null; mkdir -p "$MNT/runs"'
    proc, kept = on_tmpfs(tmp_path, fill, *train_args(tmp_path / "mnt" / "runs"))
    line = one_error_line(proc)
    assert "No space left on device (ENOSPC)" in line and str(tmp_path / "mnt" / "runs" / "run") in line
    assert "loading model" not in proc.stdout
    assert not (kept / "runs" / "run").exists()  # the directory it made to try is gone again


def test_a_checkpoint_that_does_not_fit_is_one_line_and_leaves_the_run_valid(tmp_path, mountable):
    proc, kept = on_tmpfs(tmp_path, "true", *train_args(tmp_path / "mnt" / "runs"))
    line = one_error_line(proc)
    assert "No space left on device (ENOSPC)" in line and "checkpoints" in line
    run_dir = kept / "runs" / "run"
    assert (run_dir / "config.yaml").is_file() and not (run_dir / LOCK_FILE).exists()
    assert not list((run_dir / "checkpoints").iterdir())  # no half checkpoint, no temporary left
    for line in (run_dir / "eval" / "base.jsonl").read_text().splitlines():
        json.loads(line)


def test_a_read_only_output_dir_is_one_line_before_the_model_loads(tmp_path, mountable):
    setup = 'mkdir "$MNT/runs" && mount -o remount,ro "$MNT"'
    proc, _ = on_tmpfs(tmp_path, setup, *train_args(tmp_path / "mnt" / "runs"))
    line = one_error_line(proc)
    assert "Read-only file system (EROFS)" in line and str(tmp_path / "mnt" / "runs" / "run") in line
    assert "loading model" not in proc.stdout
