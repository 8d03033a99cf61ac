"""The CLI's bad inputs: numeric options with no bound or the wrong sign (``sandbox run``, ``swe eval
--workers 0``, ``--n``, ``--k``, ``--rounds``, ``--window``, ``--steps``), counts in a recipe that
multiply work (``eval.num_tasks``, ``train.group_size``, ...) and a seed past 64 bits, ``tasks
build`` sources that are neither ``pypi:NAME`` nor a directory (or smuggle a pip option), a port
another process listens on (``horizon serve``, ``horizon sandbox serve``), YAML alias bombs in a
recipe and in an override, a recipe or task file that is a device, an error line a huge value would
blow up, and a task line whose ``env`` names a ``module:Class`` (which must import nothing).

Each case runs the real CLI in its own process (``python -m horizonrl.cli``) and holds when it ends
with exit status 2 and exactly one ``error:`` line on stderr (no traceback, at most 1000 characters)
that says what the case expects; the control case (a recipe that really uses aliases) holds when it
loads. No model is loaded: every command that would load one names a model path that does not
exist, so reaching the model is itself a failure (the error would name the model)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from abuse_probes import Case

FAMILY = "CLI"

REPO = Path(__file__).resolve().parents[2]
CALC = str(REPO / "configs" / "calc.yaml")
NO_MODEL = "model.path=/nonexistent/model"  # what a command reaches only if it loads the model
MAX_LINE = 1000 + len("error: ")
TIMEOUT_S = 120.0


def horizon(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str, float]:
    """The real CLI: exit status (124 when it ran past TIMEOUT_S), stdout, stderr, seconds."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "horizonrl.cli", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=cwd or REPO,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return 124, "", f"(no answer in {TIMEOUT_S:.0f} s: it hangs)", time.perf_counter() - start
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def one_line(name: str, args: list[str], expect: str | tuple[str, ...], **kw: object) -> Callable[[], Case]:
    """A case that holds on exit 2 and one short error line containing ``expect`` (each of them)."""
    expected = (expect,) if isinstance(expect, str) else expect

    def attempt() -> Case:
        code, out, err, seconds = horizon(*args, **kw)  # type: ignore[arg-type]
        lines = [x for x in err.splitlines() if x.strip()]
        line = lines[-1] if lines else ""
        held = (
            code == 2
            and len(lines) == 1
            and line.startswith("error: ")
            and "Traceback" not in err + out
            and "serving" not in out  # a server that announced itself before it failed
            and len(line) <= MAX_LINE
            and all(e in line for e in expected)
        )
        return Case(name, held, f"exit {code} in {seconds:.1f} s, {len(lines)} stderr lines: {line[:240]}")

    return attempt


def _alias_bomb(levels: int, last_key: str) -> str:
    lines = ["a0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    for i in range(1, levels):
        key = last_key if i == levels - 1 else f"a{i}"
        lines.append(f"{key}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _planted_task_file(workdir: Path) -> tuple[Path, Path]:
    """A module that leaves a marker when imported, and a task file one line of which names it as
    its env (``planted:X``)."""
    (workdir / "planted.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('IMPORTED').write_text('yes')\nclass X: pass\n"
    )
    line = '{"id": "t%d", "env": "%s", "split": "test", "data": {"question": "1+1", "answer": 2}}'
    tasks = workdir / "tasks.jsonl"
    tasks.write_text("\n".join([line % (0, "calc"), line % (1, "planted:X")]) + "\n")
    return tasks, workdir / "IMPORTED"


def probe(workdir: Path) -> list[Case]:
    workdir.mkdir(parents=True, exist_ok=True)
    bomb = workdir / "bomb.yaml"
    bomb.write_text(_alias_bomb(9, "name"))  # 9**9 values once expanded, in a few hundred bytes
    loop = workdir / "loop.yaml"
    loop.write_text("env:\n  options: &o {again: *o}\n")
    reuse = workdir / "reuse.yaml"
    reuse.write_text("eval: &e {num_tasks: 3, concurrency: 2}\nrollout: *e\n")
    deep = workdir.joinpath(*["d" * 200] * 20) / "recipe.yaml"  # a 4000-character path
    override_bomb = (
        "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]"
    )
    override_bomb += ", &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"
    tasks, marker = _planted_task_file(workdir)
    out = workdir / "dataset"
    planted_env = {"PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    taken = str(listener.getsockname()[1])
    where = f"127.0.0.1:{taken}"

    attempts: list[Callable[[], Case]] = [
        one_line(
            "sandbox run --memory-mib 0",
            ["sandbox", "run", "--memory-mib", "0", "--", "true"],
            "--memory-mib",
        ),
        one_line(
            "sandbox run --timeout -1", ["sandbox", "run", "--timeout", "-1", "--", "true"], "--timeout"
        ),
        one_line(
            "sandbox run --timeout nan", ["sandbox", "run", "--timeout", "nan", "--", "true"], "not a number"
        ),
        one_line(
            "sandbox run --processes 0", ["sandbox", "run", "--processes", "0", "--", "true"], "--processes"
        ),
        one_line(
            "swe eval --workers 0 (Semaphore(0) hung)",
            ["swe", "eval", "--gold", "--workers", "0"],
            "--workers=0",
        ),
        one_line("swe eval --workers 100000", ["swe", "eval", "--gold", "--workers", "100000"], "limit of"),
        one_line("tasks build notasource", ["tasks", "build", "notasource", "--out", str(out)], "notasource"),
        one_line(
            "tasks build pypi:<a pip option>",
            ["tasks", "build", "pypi:--index-url=http://127.0.0.1:9/", "--out", str(out)],
            "pypi:NAME",
        ),
        one_line(
            "tasks build --per-package 0",
            ["tasks", "build", ".", "--per-package", "0", "--out", str(out)],
            "--per-package",
        ),
        one_line(
            "sandbox serve on a port in use", ["sandbox", "serve", "--token", "t", "--port", taken], where
        ),
        one_line(
            "serve on a port in use (before the model)", ["serve", CALC, NO_MODEL, "--port", taken], where
        ),
        one_line(
            "eval.num_tasks=1000000000",
            ["eval", CALC, NO_MODEL, "eval.num_tasks=1000000000"],
            "limit of 100000",
        ),
        one_line(
            "train.group_size=1000000", ["train", CALC, NO_MODEL, "train.group_size=1000000"], "limit of 1024"
        ),
        one_line(
            "train.steps and rollout.concurrency over their limits",
            ["rollout", CALC, NO_MODEL, "train.steps=10000000000", "rollout.concurrency=1000000"],
            ("train.steps=", "rollout.concurrency=1000000 is over the limit of 4096"),
        ),
        one_line(
            "engine.max_batch_size and sampling.max_new_tokens over their limits",
            [
                "rollout",
                CALC,
                NO_MODEL,
                "engine.max_batch_size=1000000",
                "sampling.max_new_tokens=1000000000",
            ],
            ("limit of 4096", "limit of 131072"),
        ),
        one_line(
            "seed=10**29 (overflowed torch once the model had loaded)",
            ["rollout", CALC, NO_MODEL, "seed=100000000000000000000000000000"],
            "seed=100000000000000000000000000000 is over the limit of",
        ),
        one_line("rollout --n 0", ["rollout", CALC, NO_MODEL, "--n", "0"], "--n=0"),
        one_line("rollout --n 10**9", ["rollout", CALC, NO_MODEL, "--n", "1000000000"], "limit of"),
        one_line("tasks filter --k 0", ["tasks", "filter", CALC, NO_MODEL, "--k", "0"], "--k=0"),
        one_line("analyze --window 0", ["analyze", str(workdir), "--window", "0"], "--window=0"),
        one_line("malt online --rounds 0", ["malt", "online", CALC, NO_MODEL, "--rounds", "0"], "--rounds=0"),
        one_line("worlds validate --steps -5", ["worlds", "validate", "maze", "--steps", "-5"], "--steps=-5"),
        one_line("a 9-level YAML alias bomb in a recipe", ["eval", str(bomb), NO_MODEL], "aliases"),
        one_line(
            "a YAML alias bomb in an override", ["eval", CALC, NO_MODEL, f"name={override_bomb}"], "aliases"
        ),
        one_line("a YAML alias that contains itself", ["eval", str(loop), NO_MODEL], "contains it"),
        one_line(
            "a 10000-character bad value", ["eval", CALC, NO_MODEL, "name=" + "x/" * 5000], "characters"
        ),
        one_line("a 4000-character recipe path", ["eval", str(deep)], "cut:"),
        one_line("a recipe that is /dev/zero", ["eval", "/dev/zero"], "is a device"),
        one_line(
            "a task file that is /dev/zero",
            ["eval", CALC, NO_MODEL, "env.tasks_file=/dev/zero"],
            "is a device",
        ),
        one_line(
            'a task line with "env": "planted:X"',
            ["eval", CALC, NO_MODEL, f"env.tasks_file={tasks}"],
            "not a registered env",
            env=planted_env,
        ),
    ]

    def control() -> Case:
        code, out_text, _, seconds = horizon("config", "show", str(reuse), "--json")
        held = code == 0 and '"value": 3' in out_text
        return Case(
            "control: a recipe that reuses a block by alias loads", held, f"exit {code} in {seconds:.1f} s"
        )

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            cases = list(pool.map(lambda attempt: attempt(), [*attempts, control]))
    finally:
        listener.close()
    imported = marker.exists()
    cases.append(
        Case(
            "the planted module named by a task line was not imported",
            not imported,
            "imported" if imported else "not imported",
        )
    )
    cases.append(Case("tasks build wrote nothing for refused sources", not out.exists(), str(out)))
    return cases
