"""Secrets in recipes: a sandbox server's token given as its value in a real recipe
(``env.options.sandbox.token``), and every place it could leak: ``horizon config show`` (table, --json,
--yaml), the error line of a bad recipe, the run's config.yaml (content and mode), the run's other
files (metrics.jsonl, summary.json, trajectories, checkpoints) and its output, the viewer's run info,
and ``--resume`` from the run's config.yaml (one line without the variable, the token read from
$HORIZON_SANDBOX_TOKEN with it).

Real components: a real ``horizon sandbox serve`` on 127.0.0.1 (its token is the secret), the real
CLI in subprocesses (``horizon train`` on the tiny random model, never SmolLM2's weights), a real
``horizon view``."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from abuse_probes import Case

FAMILY = "secrets"

TOKEN_ENV = "HORIZON_SANDBOX_TOKEN"
REFERENCE = "${env:" + TOKEN_ENV + "}"
#: a run of seconds: the tiny random model, one RL step of two samples, one eval task
TINY = [
    "sampling.max_new_tokens=8",
    "agent.max_turns=1",
    "eval.num_tasks=1",
    "sft.enabled=false",
    "train.steps=1",
    "train.tasks_per_step=1",
    "train.group_size=2",
]


def horizon(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """The real CLI in its own process, output captured; without the token's variable unless given."""
    base = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=timeout,
    )


def first_line(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    return f"exit {proc.returncode}: {(lines or [''])[-1].strip()[:200]}"


def write_recipe(workdir: Path, url: str, token: str, sandbox_extra: str = "") -> Path:
    """A shell recipe whose sandboxes run on the server at ``url``, the token as given (``token`` is
    written as YAML: quote it to make it a string)."""
    path = workdir / f"recipe{len(list(workdir.glob('recipe*.yaml')))}.yaml"
    path.write_text(
        f"name: secret-run\noutput_dir: {workdir / 'runs'}\nmodel: {{path: tiny-random}}\n"
        f"env:\n  name: shell\n  options:\n"
        f'    sandbox: {{backend: remote, url: "{url}", token: {token}{sandbox_extra}}}\n',
        encoding="utf-8",
    )
    return path


def one_line_error(proc: subprocess.CompletedProcess, secret: str) -> tuple[bool, str]:
    """Exit 2 with one error line on stderr (a progress display may have started on stdout), no
    traceback, and the secret nowhere."""
    text = proc.stdout + proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.strip()]
    held = proc.returncode == 2 and len(errors) == 1 and secret not in text and "Traceback" not in text
    return held, f"exit {proc.returncode}: {(errors or [''])[-1].strip()[:200]}"


@contextlib.contextmanager
def viewer(runs: Path) -> Iterator[str]:
    """A real ``horizon view`` over ``runs`` on a free loopback port, ready when this yields its URL."""
    import httpx

    from horizonrl.local_server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "horizonrl.cli", "view", str(runs), "--port", str(port)],
        env=base,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/info", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"horizon view did not answer on {url} (exit {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def trajectory_errors(run_dir: Path) -> list[str]:
    """The errors of the run's episodes (a refused token is one): empty when every episode ran."""
    errors = []
    for path in [*run_dir.glob("trajectories/*.jsonl"), *run_dir.glob("eval/*.jsonl")]:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("finish") in (None, "error"):
                errors.append(str(record.get("error"))[:160])
    return errors


def probe(workdir: Path) -> list[Case]:
    from concurrent.futures import ThreadPoolExecutor

    from horizonrl.sandbox.server import serve_in_subprocess

    cases: list[Case] = []

    def case(name: str, check: Callable[[], tuple[bool, str]]) -> None:
        try:
            held, detail = check()
        except Exception as exc:  # a case that crashes did not hold, and says why
            held, detail = False, f"{type(exc).__name__}: {str(exc)[:200]}"
        cases.append(Case(name, held, detail))

    state = workdir / "sandbox-state"
    state.mkdir()
    digits = "918273645546372819"  # a token YAML reads as a number: the wrong type
    with serve_in_subprocess(str(state)) as (url, token), ThreadPoolExecutor(4) as pool:
        recipe = write_recipe(workdir, url, f'"{token}"')
        bad_key = write_recipe(workdir, url, f'"{token}"', ", limits: {memory_mib: -1}")
        bad_type = write_recipe(workdir, url, digits)
        run_dir = workdir / "runs" / "secret-run"
        # the commands that only read the recipes run while the model trains
        shown = {
            flag: pool.submit(horizon, "config", "show", str(recipe), *([flag] if flag else []))
            for flag in ("", "--json", "--yaml")
        }
        refused = {path: pool.submit(horizon, "config", "show", str(path)) for path in (bad_key, bad_type)}
        train = horizon("train", str(recipe), *TINY, timeout=600)
        trained = train.returncode == 0

        def show_table() -> tuple[bool, str]:
            proc = shown[""].result()
            line = next(
                (x for x in proc.stdout.splitlines() if x.startswith("env.options.sandbox.token ")), ""
            )
            held = proc.returncode == 0 and token not in proc.stdout + proc.stderr and "'***'" in line
            return held, " ".join(line.split()[:3]) or first_line(proc)

        def show_json_yaml() -> tuple[bool, str]:
            as_json, as_yaml = shown["--json"].result(), shown["--yaml"].result()
            leaked = [p.args[-1] for p in (as_json, as_yaml) if token in p.stdout + p.stderr]
            held = (
                not leaked and as_json.returncode == as_yaml.returncode == 0 and REFERENCE in as_yaml.stdout
            )
            return held, f"leaked in: {leaked}" if leaked else "json: ***, yaml: " + REFERENCE

        def bad_recipe_error() -> tuple[bool, str]:
            held_key, detail_key = one_line_error(refused[bad_key].result(), token)
            held_type, detail_type = one_line_error(refused[bad_type].result(), digits)
            return held_key and held_type, f"{detail_key} | {detail_type}"

        def config_yaml() -> tuple[bool, str]:
            text = (run_dir / "config.yaml").read_text(encoding="utf-8")
            return trained and token not in text and f"token: {REFERENCE}" in text, (
                first_line(train) if not trained else f"config.yaml holds token: {REFERENCE}"
            )

        def config_mode() -> tuple[bool, str]:
            mode = stat.S_IMODE((run_dir / "config.yaml").stat().st_mode)
            return mode == 0o600, f"mode {mode:o}"

        def run_files() -> tuple[bool, str]:
            files = [p for p in run_dir.rglob("*") if p.is_file()]
            leaked = [str(p.relative_to(run_dir)) for p in files if token.encode() in p.read_bytes()]
            names = {p.name for p in files}
            ran = trained and {"metrics.jsonl", "summary.json"} <= names and not trajectory_errors(run_dir)
            leaked += ["the run's output"] if token in train.stdout + train.stderr else []
            detail = f"leaked in: {leaked}" if leaked else f"{len(files)} files clean"
            return ran and not leaked, detail if ran else f"{detail}; run: {first_line(train)}"

        def viewer_info() -> tuple[bool, str]:
            import httpx

            with viewer(workdir / "runs") as base:
                runs = httpx.get(f"{base}/api/runs", timeout=30)
                bodies = [runs.text]
                for row in runs.json():
                    for path in ("", "/metrics", "/trajectories"):
                        bodies.append(httpx.get(f"{base}/api/runs/{row['id']}{path}", timeout=30).text)
            env = runs.json()[0].get("env") if runs.json() else None
            return not any(token in b for b in bodies) and env == "shell", f"run info env={env!r}"

        def resume_without_variable() -> tuple[bool, str]:
            held, detail = one_line_error(without.result(), token)
            return held and TOKEN_ENV in detail, detail

        def resume_with_variable() -> tuple[bool, str]:
            proc = horizon(
                "train", str(run_dir / "config.yaml"), "--resume", env={TOKEN_ENV: token}, timeout=600
            )
            errors = trajectory_errors(run_dir)
            held = proc.returncode == 0 and not errors and token not in proc.stdout + proc.stderr
            return held, first_line(proc) + (f"; episode errors: {errors[:1]}" if errors else "")

        case("config show prints the token as ***", show_table)
        case("config show --json / --yaml never print the token", show_json_yaml)
        case("a bad recipe's error line never echoes the token (a key wrong; a number)", bad_recipe_error)
        case("the run's config.yaml holds ${env:NAME}, not the token", config_yaml)
        case("the run's config.yaml is readable by its owner only (0600)", config_mode)
        case("no file of the run (metrics, summary, trajectories, checkpoints) holds the token", run_files)
        # refused before the model loads, while the viewer runs
        without = pool.submit(horizon, "train", str(run_dir / "config.yaml"), "--resume")
        case("the viewer's run info never shows the token", viewer_info)
        case("--resume from config.yaml without the variable: one line naming it", resume_without_variable)
        case("--resume from config.yaml reads the token from $HORIZON_SANDBOX_TOKEN", resume_with_variable)
    return cases
