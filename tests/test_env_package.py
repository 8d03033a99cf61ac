"""An env published as a package (examples/env_package): built into a wheel, installed into a fresh
virtual environment, it is listed by `horizon envs` and runs under `horizon rollout` there, with no
edit to this project. The package declares its env by the ``horizonrl.envs`` entry point group."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from horizonrl.envs.registry import list_envs
from horizonrl.types import read_trajectories

pytest.importorskip(
    "setuptools", reason="building the example wheel offline needs setuptools (the package's backend)"
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "examples" / "env_package"


def run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PIP_NO_INPUT="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Iterator[Path]:
    """A fresh venv holding the example package's wheel (and nothing else of its own). Made with
    --system-site-packages; this project's own environment is a venv too, not the system's, so a
    .pth line adds its site-packages (horizonrl, torch) the way a system install would be seen."""
    work = tmp_path_factory.mktemp("envpkg")
    source = shutil.copytree(PACKAGE, work / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        source,
        "-w",
        work / "dist",
        cwd=work,
    )
    wheel = next((work / "dist").glob("horizonrl_letters-*.whl"))
    venv = work / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv, cwd=work)
    python = venv / "bin" / "python"
    purelib = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work
    ).stdout.strip()
    host = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "horizonrl_host.pth").write_text(f"import site; site.addsitedir({host!r})\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        wheel,
        cwd=work,
    )
    yield python


def test_installed_env_package_is_listed_and_runs_without_editing_the_project(venv, tmp_path):
    assert "letters" not in list_envs()  # not in this project: only the venv that installed it has it
    listed = run(venv, "-m", "horizonrl.cli", "envs", cwd=tmp_path).stdout
    assert "letters" in listed and "submit(count)" in listed and "calc" in listed

    out = tmp_path / "r.jsonl"
    recipe = PACKAGE / "letters.yaml"
    overrides = ["model.path=tiny-random", "sampling.max_new_tokens=8", f"output_dir={tmp_path}"]
    run(venv, "-m", "horizonrl.cli", "rollout", recipe, *overrides, "--n", "2", "--out", out, cwd=tmp_path)
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and {t.env for t in trajs} == {"letters"}
    assert all(t.finish != "error" for t in trajs), [t.error for t in trajs]
    assert {t.task_id for t in trajs} == {"letters-train-0-0", "letters-train-0-1"}  # its own make_tasks
