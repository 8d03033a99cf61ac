"""Self-attributing inside a training run (``attribution.enabled``): ADCA-GRPO advantages.

Before each update the judge role labels every step of the step's samples GOOD or BAD
(:class:`~horizonrl.evolve.attribution.StepJudge`; groups whose outcomes are all equal are skipped
with ``skip_no_signal``), :func:`~horizonrl.algos.advantages.adca` fuses the labels with the
outcomes into per-step advantages, and each model token gets its step's advantage — a step being
one assistant turn, i.e. one run of model tokens in the loss mask. The judge's cache is saved in
every checkpoint (``judge_cache.json``) and restored on resume.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from horizonrl.algos.advantages import adca, broadcast_steps
from horizonrl.errors import DataError
from horizonrl.evolve.attribution import StepJudge, first_request
from horizonrl.evolve.config import AttributionConfig
from horizonrl.types import Trajectory

CACHE_FILE = "judge_cache.json"


def token_steps(loss_mask: Sequence[int]) -> list[int]:
    """The step of every response token: runs of model tokens (mask 1) are steps 0, 1, ...;
    environment tokens (mask 0) get -1."""
    out, step, inside = [], -1, False
    for m in loss_mask:
        if m and not inside:
            step += 1
        inside = bool(m)
        out.append(step if m else -1)
    return out


def write_labels(path: Path, rows: Sequence[tuple[str, list[bool | None]]]) -> None:
    """Append ``(trajectory id, per-step labels)`` rows to ``path`` as JSONL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = {True: "GOOD", False: "BAD", None: None}
    with path.open("a", encoding="utf-8") as f:
        for tid, labels in rows:
            f.write(json.dumps({"trajectory_id": tid, "labels": [names[x] for x in labels]}) + "\n")


class AttributionStage:
    """The judge of a run and the ADCA settings."""

    def __init__(self, cfg: AttributionConfig, judge_role: Any) -> None:
        self.cfg = cfg
        self.judge = StepJudge(judge_role, max_tokens=cfg.max_tokens)

    async def advantages(
        self, trajectories: Sequence[Trajectory], record: Path | None = None
    ) -> tuple[list[list[float]], dict[str, float]]:
        """Per-response-token ADCA advantages of ``trajectories`` (0 on environment tokens), and the
        step's counts: judged trajectories, steps, labels defaulted to GOOD, GOOD share, misaligned.
        ``record``: a JSONL file that gets each judged trajectory's labels, one per step
        (``{"trajectory_id", "labels": ["GOOD", "BAD", ...]}``; null where the judge gave none), which
        the viewer shows beside the turns."""
        rewards: dict[str, set[float]] = {}
        for traj in trajectories:
            rewards.setdefault(traj.group_id, set()).add(traj.reward)
        judged = [
            i
            for i, t in enumerate(trajectories)
            if not self.cfg.skip_no_signal or len(rewards[t.group_id]) > 1
        ]
        defaulted_before = self.judge.stats.defaulted
        labels_of = dict(
            zip(
                judged,
                await asyncio.gather(
                    *(self.judge.label(first_request(trajectories[i]), trajectories[i]) for i in judged)
                ),
                strict=True,
            )
        )
        steps_of = [token_steps(t.loss_mask) for t in trajectories]
        labels: list[list[bool | None]] = []
        misaligned = 0
        for i, steps in enumerate(steps_of):
            n = max(steps, default=-1) + 1
            got: list[bool | None] = list(labels_of.get(i, []))
            if i in labels_of and len(got) != n:
                misaligned += 1
            labels.append((got + [None] * n)[:n] if i in labels_of else [None] * n)
        if record is not None:
            write_labels(record, [(trajectories[i].id, labels[i]) for i in judged])
        step_adv = adca(
            labels,
            [t.reward for t in trajectories],
            [t.group_id for t in trajectories],
            alpha=self.cfg.alpha,
            step_reward=self.cfg.step_reward,
            prm_steps=self.cfg.prm_steps,
        )
        per_token = [
            broadcast_steps(adv, torch.tensor(steps, dtype=torch.long)).tolist()
            for adv, steps in zip(step_adv, steps_of, strict=True)
        ]
        given = [label for row in labels for label in row if label is not None]
        metrics = {
            "attribution/judged": float(len(judged)),
            "attribution/steps": float(len(given)),
            "attribution/good_share": sum(given) / len(given) if given else 0.0,
            "attribution/defaulted": float(self.judge.stats.defaulted - defaulted_before),
            "attribution/misaligned": float(misaligned),
        }
        return per_token, metrics

    def save(self, checkpoint: Path) -> None:
        (checkpoint / CACHE_FILE).write_text(json.dumps(self.judge.state_dict()), encoding="utf-8")

    def load(self, checkpoint: Path) -> bool:
        path = checkpoint / CACHE_FILE
        if not path.exists():
            return False
        try:
            self.judge.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(
                f"judge cache {str(path)!r} is corrupt ({exc}); resume from an earlier checkpoint"
            ) from None
        return True
