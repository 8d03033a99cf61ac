"""A training run's Weights & Biases run (``tracking: [..., wandb]``), through the wandb package.

Offline by default: the run is written under the run directory (``wandb/offline-run-*``), nothing
is sent, and ``wandb sync`` uploads it later. Online (``wandb.mode: online``) needs a W&B login,
checked before the model loads. The config is the resolved recipe (secrets as their references),
every ``metrics.jsonl`` value is logged at its step, and a finished run gets ``summary.json`` as
its summary, the run's files, and ``policy/`` as a model artifact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from horizonrl.config.tracking import WandbConfig
from horizonrl.errors import ConfigError
from horizonrl.train.tracking_extras import import_backend


def check_wandb(cfg: WandbConfig) -> None:
    """Before the model loads: online mode needs a W&B login (an API key it can find)."""
    if cfg.mode != "online":
        return
    wandb = import_backend("wandb")
    try:
        logged_in = wandb.login(prompt=False, verify=False)
    except Exception as exc:  # whatever W&B says, said in one line
        logged_in, why = False, " ".join(str(exc).split())[:300]
    else:
        why = "no API key found"
    if not logged_in:
        raise ConfigError(
            f"wandb.mode=online needs a W&B login ({why}): run `wandb login` or export WANDB_API_KEY; "
            "or use wandb.mode=offline (the default) and upload later with `wandb sync`"
        )


def artifact_name(run_name: str) -> str:
    """``<run name>-policy`` as W&B accepts an artifact's name (alphanumerics, ``-``, ``_``, ``.``)."""
    return re.sub(r"[^\w.-]", "_", run_name) + "-policy"


class WandbBackend:
    """One W&B run."""

    name = "wandb"

    def __init__(self, run: Any, cfg: WandbConfig, run_name: str) -> None:
        self.run, self.cfg, self.run_name = run, cfg, run_name

    @classmethod
    def open(
        cls,
        cfg: WandbConfig,
        run_name: str,
        run_dir: Path,
        config_data: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        say: Callable[[str], None],
    ) -> WandbBackend:
        """Start the run (on resume, continue the one ``previous`` names)."""
        wandb = import_backend("wandb")
        run_id = str(previous["id"]) if previous and previous.get("id") else None
        wandb.setup(settings=wandb.Settings(silent=True))  # W&B's own lines would cut the progress display
        run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=run_name,
            id=run_id,
            resume="allow" if run_id else None,
            mode=cfg.mode,
            dir=str(run_dir),
            job_type="train",
            config=dict(config_data),
            # no console capture (it would fight the progress display), no banner, no global run
            settings=wandb.Settings(console="off", silent=True, reinit="create_new"),
        )
        where, verb = run.settings.sync_dir, "continuing run" if run_id else "run"
        if cfg.mode == "offline":
            say(f"W&B (offline): {verb} {run.id} in {where}; upload it with `wandb sync {where}`")
        else:
            say(f"W&B: {verb} {run.id} at {run.url}")
        return cls(run, cfg, run_name)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self, status: str, files: list[Path], policy: Path | None, summary: Mapping[str, Any]) -> None:
        if status == "FINISHED":
            import wandb

            if summary:
                self.run.summary.update(dict(summary))
            for path in files:
                self.run.save(str(path), base_path=str(path.parent), policy="now")
            if policy is not None and self.cfg.log_policy and policy.is_dir():
                artifact = wandb.Artifact(artifact_name(self.run_name), type="model")
                artifact.add_dir(str(policy))
                self.run.log_artifact(artifact)
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "mode": self.cfg.mode, "dir": str(self.run.settings.sync_dir)}
