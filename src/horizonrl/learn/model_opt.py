"""The ``sft`` and ``grpo`` optimizers: the model is a component too.

One optimization is one `horizon train` run (:class:`~horizonrl.train.run.TrainingRun`) inside the
learn run's directory, starting from the parent candidate's weights:

- ``sft``: supervised fine-tuning on demonstrations of the env's training levels (the env's
  scripted oracle, or the parent's own successful episodes: ``learn.model.sft_demos``), no RL steps;
- ``grpo``: ``learn.model.grpo_steps`` steps of the recipe's RL algorithm, no SFT.

The trained policy is then merged into full weights (``candidates/ID/model/``), so the child is a
self-contained model directory that the next optimization trains from and an engine loads as is.
The inner run's own held-out evals (before and after training) play one validation level: the
child is measured by the learn loop like every other candidate.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from horizonrl.config import RunConfig
from horizonrl.learn.config import LearnConfig, LearnEnv
from horizonrl.learn.evaluate import env_config, val_split
from horizonrl.types import Trajectory, write_trajectories


def inner_config(
    config: RunConfig,
    learn: LearnConfig,
    env: LearnEnv,
    optimization: str,
    model_path: str,
    work: Path,
    demos_file: Path | None,
    seed: int,
) -> RunConfig:
    """The recipe of the training run one model optimization is. ``seed`` (one per env, method and
    iteration) seeds its adapter, its demonstrations' and its training levels' draws: optimizing the
    same parent twice draws other levels, instead of repeating the same run."""
    base = env_config(config, env).model_dump(mode="json")
    lm = learn.model
    base["seed"] = seed % 2**31
    base["sft"]["seed"] = (seed >> 1) % 2**31
    base["rollout"]["seed"] = (seed >> 2) % 2**31
    base["name"] = "train"
    base["output_dir"] = str(work)
    base["model"]["path"] = model_path
    base["eval"].update(split=val_split(env), num_tasks=1)  # the learn loop measures the child itself
    base["train"].update(eval_every=0, save_every=0)
    if optimization == "sft":
        base["sft"].update(
            enabled=True,
            demos=str(demos_file) if demos_file is not None else "oracle",
            num_demos=lm.sft_num_demos,
            epochs=lm.sft_epochs,
        )
        base["train"]["steps"] = 0
    else:
        base["sft"]["enabled"] = False
        base["train"].update(
            steps=lm.grpo_steps, tasks_per_step=lm.grpo_tasks_per_step, group_size=lm.grpo_group_size
        )
    return RunConfig.model_validate(base)


def self_demos(trajs: list[Trajectory], out: Path) -> Path | None:
    """The parent's successful episodes as a demonstration file (None when it has none)."""
    good = [t for t in trajs if t.success]
    if not good:
        return None
    write_trajectories(out, good)
    return out


def train_model(
    config: RunConfig,
    learn: LearnConfig,
    env: LearnEnv,
    optimization: str,
    parent_model: str,
    parent_train: list[Trajectory],
    work: Path,
    seed: int,
    reporter: Any = None,
) -> tuple[Path | None, str, dict[str, Any]]:
    """Train from ``parent_model``; (the trained policy directory, or None and why, the run's summary)."""
    from horizonrl.train.run import TrainingRun

    shutil.rmtree(work, ignore_errors=True)  # a run this optimization left half-done before a crash
    work.mkdir(parents=True)
    demos = None
    if optimization == "sft" and learn.model.sft_demos == "self":
        demos = self_demos(parent_train, work / "demos.jsonl")
        if demos is None:
            return None, "no demonstrations: the parent solved none of its training levels", {}
    cfg = inner_config(config, learn, env, optimization, parent_model, work, demos, seed)
    summary = TrainingRun(cfg, reporter).run()
    return cfg.run_dir / "policy", "", summary


def merge_into(policy: Path, base_path: str, dtype: str, dest: Path) -> None:
    """Write ``policy`` (trained on ``base_path``) as one full-weights model directory ``dest``."""
    from horizonrl.hf_quiet import quiet_transformers
    from horizonrl.model_config import ModelConfig
    from horizonrl.models import load_model

    model, tokenizer = load_model(ModelConfig(path=base_path, dtype=dtype), policy)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    with quiet_transformers():
        model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
