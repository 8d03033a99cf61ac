"""Run directories under abuse: two writers of one run, SIGKILL mid-run, a dead writer's leftovers, a
full disk and a read-only output_dir.

- a second ``horizon train`` (and ``sft``, ``dpo``, ``stream``, ``learn``, ``malt sample``, ``evolve
  train``) on a run another process writes: one line naming the holder's pid and host, exit 2, before
  the model loads, nothing touched; ``--overwrite`` and ``--resume`` of a live run likewise;
- a real ``horizon train`` held still mid-run while a second one tries the same run, then killed
  with SIGKILL: ``--resume`` takes the lock and finishes, removes the killed writer's temporary
  folders (a ``policy/`` temp, a checkpoint temp), keeps a live writer's, and ``metrics.jsonl`` holds
  one whole line per step;
- a full disk (before the model loads, and a checkpoint that does not fit) and a read-only
  output_dir: one line naming the path and the OS's reason, exit 2, no half checkpoint. These run the
  CLI in a private mount namespace on a 1 MiB tmpfs (root only; left out, with the reason on stderr,
  where a tmpfs cannot be mounted).

Real components: the real CLI in subprocesses (``horizon train`` on the tiny random model, never
SmolLM2's weights), a real second process holding a run's lock, real tmpfs mounts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from abuse_probes import Case

FAMILY = "runs"

ROOT = Path(__file__).resolve().parents[2]
CALC = str(ROOT / "configs" / "calc.yaml")
#: a run of seconds: the tiny random model, one RL step of two samples, two eval tasks
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
LOCK = ".writer.lock"


def horizon(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        cwd=ROOT,
    )


def one_line(proc: subprocess.CompletedProcess, *fragments: str) -> tuple[bool, str]:
    """Exit 2, one error line on stderr holding every fragment, no traceback anywhere."""
    errors = [x for x in proc.stderr.splitlines() if x.strip()]
    text = proc.stdout + proc.stderr
    held = (
        proc.returncode == 2
        and len(errors) == 1
        and "Traceback" not in text
        and all(f in errors[0] for f in fragments)
    )
    return held, f"exit {proc.returncode}: {(errors or [''])[-1].strip()[:240]}"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def host() -> str:
    from horizonrl.io import HOST

    return HOST


@contextlib.contextmanager
def holding(run_dir: Path) -> Iterator[subprocess.Popen]:
    """A real second process holding ``run_dir``'s lock meanwhile."""
    code = (
        "import time\nfrom horizonrl.train.run_lock import hold_run_dir\n"
        f"with hold_run_dir({str(run_dir)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=60)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def batch(commands: list[list[str]]) -> list[tuple[int, str]]:
    """Each ``horizon ARGS`` run by the real CLI in one other process (one start for them all):
    its exit code and its output (stdout and stderr)."""
    code = (
        "import json, sys\nfrom typer.testing import CliRunner\nfrom horizonrl.cli import app\n"
        "out = []\nfor args in json.loads(sys.argv[1]):\n"
        "    r = CliRunner().invoke(app, args, env={'COLUMNS': '400'})\n"
        "    out.append([r.exit_code, r.output])\nprint(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
        cwd=ROOT,
    )
    try:
        return [tuple(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]
    except (ValueError, IndexError):
        return [(-1, proc.stderr[-300:])] * len(commands)


def live_writers(workdir: Path) -> list[Case]:
    runs = workdir / "held"
    cases = []
    with holding(runs / "calc") as first:
        who = f"pid {first.pid} on host {host()}"
        before = snapshot(workdir)
        start = time.perf_counter()
        proc = horizon("train", CALC, *TINY, f"output_dir={runs}", "name=calc")
        held, detail = one_line(proc, who)
        held = held and "loading model" not in proc.stdout and snapshot(workdir) == before
        detail += f" ({time.perf_counter() - start:.1f} s)"
        name = "a second horizon train on a live run: one line naming the holder, before the model loads"
        cases.append(Case(name, held, detail))
        (runs / "calc" / "checkpoints").mkdir()
        (runs / "calc" / "metrics.jsonl").write_text('{"step": 0}\n')
        before = snapshot(workdir)
        tail = [f"output_dir={runs}", "name=calc", "model.path=tiny-random"]
        commands = {
            "--overwrite of a live run: refused, nothing moved": ["train", CALC, *TINY, "--overwrite"],
            "--resume of a live run: refused, nothing moved": ["train", CALC, *TINY, "--resume"],
            "horizon sft on a live run": ["sft", CALC],
            "horizon dpo on a live run": ["dpo", "configs/dpo_calc.yaml"],
            "horizon stream on a live run": ["stream", "configs/stream.yaml"],
            "horizon learn on a live run": ["learn", "configs/learn.yaml"],
            "horizon malt sample on a live run": ["malt", "sample", "configs/malt.yaml"],
            "horizon evolve train on a live run": ["evolve", "train", "configs/evolve_flights.yaml"],
        }
        results = batch([[*args, *tail] for args in commands.values()])
        untouched = snapshot(workdir) == before and not (runs / ".trash").exists()
        for name, (code, output) in zip(commands, results, strict=True):
            errors = [x for x in output.splitlines() if x.startswith("error:")]
            held = code == 2 and len(errors) == 1 and who in errors[0] and "Traceback" not in output
            cases.append(Case(name, held and untouched, f"exit {code}: {(errors or [''])[0][:240]}"))
    return cases


def killed_run(workdir: Path) -> list[Case]:
    runs = workdir / "killed"
    run_dir = runs / "run"
    args = ["train", CALC, *TINY, "train.steps=2", "train.save_every=1", f"output_dir={runs}", "name=run"]
    first = subprocess.Popen(
        [sys.executable, "-m", "horizonrl.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        cwd=ROOT,
    )
    cases = []
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step_000000" / "manifest.json").is_file():
            if first.poll() is not None or time.monotonic() > deadline:
                return [Case("a real run reaches its first checkpoint", False, f"exit {first.poll()}")]
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGSTOP)
        held, detail = one_line(horizon(*args), f"pid {first.pid} on host {host()}")
        cases.append(Case("two real horizon train runs of one name: the second refused", held, detail))
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait(timeout=60)
    dead = run_dir / f".policy.tmp-{first.pid}@{host()}"
    (dead / "sub").mkdir(parents=True)
    stale = run_dir / "checkpoints" / f".step_000001.tmp-{dead_pid()}@{host()}"
    stale.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"])
    live = run_dir / "checkpoints" / f".step_000001.tmp-{sleeper.pid}@{host()}"
    live.mkdir()
    try:
        proc = horizon(*args, "--resume")
    finally:
        sleeper.kill()
        sleeper.wait()
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    finished = proc.returncode == 0 and summary.get("finished") is True and summary.get("steps") == 2
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    cases.append(
        Case("--resume after SIGKILL takes the lock and finishes", finished, f"exit {proc.returncode} {tail}")
    )
    cases.append(
        Case(
            "a killed writer's policy/ and checkpoint temps are removed",
            not dead.exists() and not stale.exists(),
            f"policy temp left: {dead.exists()}, checkpoint temp left: {stale.exists()}",
        )
    )
    cases.append(Case("a live writer's checkpoint temp is kept", live.is_dir(), f"kept: {live.is_dir()}"))
    try:
        steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        whole = steps == sorted(set(steps)) and steps[-1] == 2
    except (OSError, ValueError, KeyError, IndexError):
        steps, whole = [], False
    cases.append(
        Case("metrics.jsonl: one whole line per step after the kill and resume", whole, f"steps {steps}")
    )
    cases.append(Case("the lock file is gone after the run", not (run_dir / LOCK).exists()))
    return cases


def mount_problem() -> str | None:
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
    return None if probe.returncode == 0 else f"cannot mount a tmpfs: {probe.stderr.strip()[:200]}"


def on_tmpfs(
    workdir: Path, label: str, setup: str, *args: str
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """``horizon ARGS`` with ``$MNT`` a fresh 1 MiB tmpfs (``setup`` first); its content copied out."""
    mnt, kept = workdir / label / "mnt", workdir / label / "kept"
    mnt.mkdir(parents=True)
    kept.mkdir()
    script = (
        f'mount -t tmpfs -o size=1m horizon "$MNT" && {setup} && '
        f'{{ "$@"; rc=$?; cp -a "$MNT"/. "{kept}"/; exit $rc; }}'
    )
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]
    proc = subprocess.run(
        [*argv, sys.executable, "-m", "horizonrl.cli", *args],
        capture_output=True,
        text=True,
        env={**ENV, "MNT": str(mnt)},
        timeout=300,
        cwd=ROOT,
    )
    return proc, mnt, kept


def disk(workdir: Path) -> list[Case]:
    reason = mount_problem()
    if reason is not None:
        print(f"runs: the disk cases are left out: {reason}", file=sys.stderr)
        return []
    cases = []

    def train(mnt: Path, *extra: str) -> list[str]:
        return ["train", CALC, *TINY, f"output_dir={mnt / 'runs'}", "name=run", *extra]

    mnt = workdir / "full" / "mnt"
    fill = 'dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null; mkdir -p "$MNT/runs"'
    proc, _, _ = on_tmpfs(workdir, "full", fill, *train(mnt))
    held, detail = one_line(proc, "No space left on device", str(mnt / "runs" / "run"))
    held = held and "loading model" not in proc.stdout
    cases.append(Case("a full disk: one line naming the path, before the model loads", held, detail))

    mnt = workdir / "small" / "mnt"
    proc, _, kept = on_tmpfs(workdir, "small", "true", *train(mnt))
    held, detail = one_line(proc, "No space left on device", "checkpoints")
    ckpts = kept / "runs" / "run" / "checkpoints"
    clean = ckpts.is_dir() and not list(ckpts.iterdir()) and (kept / "runs" / "run" / "config.yaml").is_file()
    cases.append(Case("a checkpoint that does not fit: one line naming it", held, detail))
    cases.append(
        Case(
            "... and no half checkpoint or temporary left",
            clean,
            f"checkpoints/: {sorted(os.listdir(ckpts)) if ckpts.is_dir() else 'missing'}",
        )
    )

    mnt = workdir / "ro" / "mnt"
    setup = 'mkdir "$MNT/runs" && mount -o remount,ro "$MNT"'
    proc, _, _ = on_tmpfs(workdir, "ro", setup, *train(mnt))
    held, detail = one_line(proc, "Read-only file system", str(mnt / "runs" / "run"))
    cases.append(Case("a read-only output_dir: one line naming the path", held, detail))

    return cases


def probe(workdir: Path) -> list[Case]:
    workdir = Path(workdir)
    try:
        return [*live_writers(workdir), *killed_run(workdir), *disk(workdir)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
