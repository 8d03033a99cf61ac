"""After `make setup`, SWE episodes and `horizon swe eval --gold` run with no network at all: both run
here inside a network namespace with no interface but loopback (`unshare -n`, as root), on a few
shipped instances; and a missing test venv is one line naming `make setup`, never a download."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horizonrl.envs.swe.instances import Dataset, write_instances
from horizonrl.envs.swe.offline import prepare
from horizonrl.envs.swe.testbed import TestVenvError as VenvError

BIN = Path(sys.executable).parent
PACKAGES = ("inflection", "six", "toolz")


def _no_network_prefix() -> list[str]:
    """A command prefix that runs its command in a new network namespace, or a skip with why."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: cannot cut the network off")
    # an ordinary user keeps its own uid (-c) in the user namespace that lets it cut the network
    prefix = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "--map-current-user", "--net"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot create a network namespace here ({' '.join(prefix)}): {probe.stderr.strip()}")
    return prefix


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The no-network prefix and a dataset of one shipped instance from each of three packages."""
    prefix = _no_network_prefix()
    try:
        prepare(factory=False)  # what `make setup` did (instant when done; downloads otherwise)
    except VenvError as exc:
        pytest.skip(f"the SWE test venv is not prepared and cannot be now (run `make setup`): {exc}")
    shipped = Dataset.shipped()
    root = tmp_path_factory.mktemp("offline") / "dataset"
    (root / "packages").mkdir(parents=True)
    chosen = [
        min((i for i in shipped.instances.values() if i.repo == p), key=lambda i: i.instance_id)
        for p in PACKAGES
    ]
    for inst in chosen:
        shutil.copy(shipped.root / "packages" / inst.snapshot, root / "packages" / inst.snapshot)
    write_instances(root / "instances.jsonl", chosen)
    (root / "splits.json").write_text(json.dumps({"train": list(PACKAGES), "test": []}))
    return prefix, root


def test_the_namespace_really_has_no_network(offline: tuple[list[str], Path]) -> None:
    prefix, _ = offline
    probe = "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"
    done = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and ("gaierror" in done.stderr or "unreachable" in done.stderr), done.stderr


def test_swe_eval_gold_resolves_shipped_instances_with_no_network(
    offline: tuple[list[str], Path], tmp_path: Path
) -> None:
    prefix, root = offline
    out = tmp_path / "report.jsonl"
    args = [str(BIN / "horizon"), "swe", "eval", "--gold", "--dataset", str(root), "--out", str(out)]
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["resolved"] == summary["instances"] == len(PACKAGES), summary


EPISODE = """
import asyncio, json, sys
from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.swe.env import SWEEnv, SWEOptions
from horizonrl.models import load_tokenizer
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.pipeline import run_pipeline

options = SWEOptions(dataset=sys.argv[1])
tasks = SWEEnv.make_tasks("train", 2, 0, options)
agent = Agent(load_tokenizer("smollm2-135m"), None, SamplingParams(max_new_tokens=64),
              AgentConfig(max_turns=8, max_total_tokens=16000), context_length=32768)
result = asyncio.run(run_pipeline(agent, lambda: SWEEnv(options), make_jobs(tasks, 1, policy=SWEEnv.oracle()),
                                  RolloutLimits.uniform(2)))
print(json.dumps([[t.task_id, t.finish, t.reward, t.error] for t in result]))
"""


def test_a_swe_episode_resolves_its_instance_with_no_network(offline: tuple[list[str], Path]) -> None:
    prefix, root = offline
    done = subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(EPISODE), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    episodes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(episodes) == 2 and all(e[1:3] == ["finished", 1.0] for e in episodes), episodes


def test_a_missing_test_venv_is_one_line_naming_make_setup(
    offline: tuple[list[str], Path], tmp_path: Path
) -> None:
    prefix, root = offline
    env = dict(os.environ, HORIZONRL_CACHE=str(tmp_path / "empty-cache"))  # no test venv there
    args = [
        str(BIN / "horizon"),
        "swe",
        "eval",
        "--gold",
        "--dataset",
        str(root),
        "--out",
        str(tmp_path / "r"),
    ]
    done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120, env=env)
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and len(errors) == 1, errors
    assert "test venv" in errors[0] and "make setup" in errors[0], errors
    cache = tmp_path / "empty-cache" / "swe"
    assert not [p for p in cache.glob("*") if "venv" in p.name]  # nothing was downloaded or started
