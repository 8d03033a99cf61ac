"""Where a training run starts: a fresh directory, its own last checkpoint, or another run's start.

Every check here runs before a model is loaded or a file is touched, so a refused command leaves
the run directory as it was; ``claim_run_dir`` is the one function that changes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.config import RunConfig, load_config, stored_config, write_config
from horizonrl.errors import CheckpointError, ConfigError
from horizonrl.train.checkpoint import latest_checkpoint, list_checkpoints, verify_checkpoint
from horizonrl.train.run_lock import relock_after_move
from horizonrl.train.trash import move_to_trash

#: sections a resumed run must share with the run it continues
RESUME_SECTIONS = ("model", "env", "train", "sft", "sampling", "agent")
#: sections a run started from another run's start must share with it (RL settings may differ)
START_FROM_SECTIONS = ("model", "env", "sft", "agent", "eval")


@dataclass(frozen=True)
class Start:
    """A verified checkpoint to start from and the trainer state saved with it."""

    checkpoint: Path
    state: dict[str, Any]


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """A new run may not silently replace a run that holds checkpoints."""
    if not overwrite and latest_checkpoint(run_dir) is not None:
        raise ConfigError(
            f"run directory {str(run_dir)!r} already holds checkpoints: pass --resume to "
            "continue it, --overwrite to move it to output_dir/.trash and start afresh, or choose "
            "another name (name=...)"
        )


def resume_start(run_dir: Path, config: RunConfig) -> Start:
    """The run's last finished checkpoint (verified), which must have been made with the same recipe."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(f"--resume: no finished checkpoint under {str(run_dir / 'checkpoints')!r}")
    verify_checkpoint(ckpt)
    check_same_recipe(run_dir, config, RESUME_SECTIONS)
    return Start(ckpt, read_trainer_state(ckpt))


def check_same_recipe(run_dir: Path, config: RunConfig, sections: tuple[str, ...]) -> None:
    """``--resume``: ``config`` must equal, in ``sections``, the recipe the run in ``run_dir`` was
    started with (its ``config.yaml``; a run without one is not checked)."""
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return
    # as stored, secrets are references: a recipe that gives a token's value matches its config.yaml
    saved, current = stored_config(load_config(cfg_path)), stored_config(config)
    for key in sections:
        if getattr(saved, key) != getattr(current, key):
            raise CheckpointError(
                f"--resume: the config's {key!r} section differs from the one the run in "
                f"{str(run_dir)!r} was started with ({cfg_path}); resume with the same recipe"
            )


def borrowed_start(source: Path, config: RunConfig) -> Start:
    """The verified step-0 checkpoint of the run in ``source``, whose recipe must match ``config`` in
    everything but the RL settings."""
    ckpts = list_checkpoints(source)
    if not ckpts or ckpts[0].name != "step_000000":
        raise CheckpointError(
            f"--start-from: {str(source)!r} holds no step-0 checkpoint (a run of `horizon train` "
            "keeps it until keep_checkpoints prunes it; `horizon compare` keeps it)"
        )
    verify_checkpoint(ckpts[0])
    saved_cfg, current = stored_config(load_config(source / "config.yaml")), stored_config(config)
    for key in START_FROM_SECTIONS:
        if getattr(saved_cfg, key) != getattr(current, key):
            raise CheckpointError(
                f"--start-from: the config's {key!r} section differs from the one of {str(source)!r}; "
                "only RL settings (train, rollout, sampling, engine) may differ from the starting run"
            )
    state = read_trainer_state(ckpts[0])
    if state.get("sft") and config.model.finetune != "lora":
        raise CheckpointError("--start-from needs model.finetune=lora when the starting run used SFT")
    return Start(ckpts[0], state)


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of a run in ``run_dir`` that finished, or None (no run, an unreadable
    summary, or a run that stopped before its end)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if summary.get("finished") else None


def claim_run_dir(run_dir: Path, config: RunConfig, overwrite: bool) -> Path | None:
    """Make ``run_dir`` a fresh run's directory and write the resolved config into it; with
    ``overwrite`` an old run there is first moved to ``output_dir/.trash`` (returned)."""
    moved = None
    if overwrite and (run_dir.exists() or run_dir.is_symlink()):
        moved = move_to_trash(run_dir, config.output_dir)
        relock_after_move(run_dir, moved)  # the run's lock moved with it: take the fresh run_dir's
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(config, run_dir / "config.yaml")  # secrets as ${env:NAME}, mode 0600
    return moved
