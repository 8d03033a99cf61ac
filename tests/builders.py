"""Small builders shared by the trainer tests: trajectory records, parameter snapshots, the tiny-run
settings on the toy coin env, a tiny calc run on a saved tiny random model, and a scripted stand-in
for an LLM role."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from horizonrl.types import Message, Trajectory


def make_traj(
    tid: str,
    prompt: list[int],
    response: list[int],
    mask: list[int] | None = None,
    reward: float = 0.0,
    group: str = "g",
    finish: str = "finished",
) -> Trajectory:
    mask = mask if mask is not None else [1] * len(response)
    return Trajectory(
        id=tid,
        task_id=group,
        group_id=group,
        env="test",
        messages=[Message(role="user", content="x")],
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        logprobs=[0.0] * len(response),
        reward=reward,
        finish=finish,
    )


def params_copy(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same_params(model, saved) -> bool:
    return all(torch.equal(p, s) for p, s in zip(model.parameters(), saved, strict=True))


def two_groups(finish_last: str = "finished") -> list[Trajectory]:
    """Two groups of three with mixed rewards, ragged lengths, an observation gap in one
    trajectory and a different prompt per group (the last one's finish reason is ``finish_last``)."""
    return [
        make_traj("a0", [1, 2, 3], [4, 5, 6], reward=1.0, group="a"),
        make_traj("a1", [1, 2, 3], [7, 8, 9, 10, 11], mask=[1, 1, 0, 0, 1], reward=0.0, group="a"),
        make_traj("a2", [1, 2, 3], [12, 13], reward=0.0, group="a"),
        make_traj("b0", [1, 2, 20], [21, 22, 23], reward=0.0, group="b"),
        make_traj("b1", [1, 2, 20], [24, 25], reward=1.0, group="b"),
        make_traj("b2", [1, 2, 20], [26, 27, 28, 29], reward=0.25, group="b", finish=finish_last),
    ]


#: a training run in seconds: the tiny random model on the toy ``coin`` env (tests/toy_envs.py,
#: which the test module imports); add the steps, rates and checkpoints a test needs
TINY_COIN = [
    "model.path=tiny-random",
    "env.name=coin",
    "env.options={}",
    "sampling.max_new_tokens=8",
    "agent.max_turns=2",
    "agent.max_malformed=2",
    "eval.num_tasks=2",
    "sft.enabled=false",
    # the plain GRPO path, without the recipe's demonstration term (the coin env has no oracle)
    "train.algorithm=dr_grpo",
    "train.demo_coef=0",
    "train.negative_weight=1",  # the recipe reinforces only above-baseline samples; these tests count all
    "train.tasks_per_step=2",
    "train.group_size=4",
    "train.eval_every=0",
]


ROOT = Path(__file__).resolve().parents[1]
#: ``python -c TOY_ENVS_CLI ARGS...``: the horizon command line in its own process, with the toy envs
#: of tests/toy_envs.py registered
TOY_ENVS_CLI = (
    "import sys; sys.path.insert(0, 'tests'); import toy_envs; from horizonrl.cli import app; app()"
)
#: the latency env with 3 s per step: a signal sent a second after a step's trajectory file appears
#: lands while its episodes are in flight
SLOW_LATENCY = [
    "env.name=latency",
    "env.options={min_turns: 2, max_turns: 2, step_mean_s: 3.0, step_sigma: 0, init_mean_s: 0.01, "
    "eval_mean_s: 0.01}",
]


def horizon_process(*args: str) -> subprocess.Popen:
    """``horizon ARGS`` (with the toy envs) as a real process in the repository, output captured."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", TOY_ENVS_CLI, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(proc: subprocess.Popen, done: Callable[[], bool], what: str, timeout: float = 240) -> None:
    """Poll ``done`` until it holds; fail with the process's output if it exits first, or with
    ``what`` (what never happened) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def script_role(monkeypatch, name: str, role) -> None:
    """Make the roles registry hand out ``role`` for the role ``name`` (a scripted stand-in for a
    capable model, which cannot run on this machine); every other role is built as configured."""
    from horizonrl.roles.registry import Roles

    real_get = Roles.get
    monkeypatch.setattr(Roles, "get", lambda self, asked: role if asked == name else real_get(self, asked))


def tiny_settings(base: Path) -> list[str]:
    """Overrides of configs/calc.yaml for a run of seconds on the tiny model saved at ``base``: SFT on
    4 demos, then two RL steps of 2 tasks x 2 samples, a checkpoint after each."""
    return [
        f"model.path={base}",
        "model.dtype=float32",
        "engine.dtype=float32",
        "sampling.max_new_tokens=12",
        "agent.max_turns=4",
        "eval.num_tasks=6",
        "sft.num_demos=4",
        "sft.batch_size=2",
        "train.steps=2",
        "train.tasks_per_step=2",
        "train.group_size=2",
        "train.save_every=1",
        "train.lr=5e-2",  # large, so the RL adapter moves the logits well above float noise
        "train.entropy_coef=0.1",  # a gradient even when every reward of the random model is 0
    ]


def save_base(folder: Path, seed: int) -> Path:
    """A tiny random model saved as a plain Hugging Face model directory (with the tokenizer)."""
    from horizonrl.models import tiny_random_model

    model, tokenizer = tiny_random_model(seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def completions(path: Path) -> dict[str, list[int]]:
    """Each task's sampled response tokens in a trajectory file."""
    from horizonrl.types import read_trajectories

    return {t.task_id: t.response_ids for t in read_trajectories(path)}
