"""Self-navigating inside a training run (``experience.enabled``): the experience pool between
rollouts and updates.

Each RL step: the step's tasks retrieve their top-k experiences (:meth:`ExperienceStage.notes`),
which go as an ``<EXP>`` block into ``round(eta * n)`` of each task's ``n`` samples; after the
rollouts the extractor role writes new experiences from some finished groups — a success beside a
failure where the group has both (:meth:`ExperienceStage.extract`; a structured reply,
:func:`~horizonrl.evolve.experience.lessons_model`, read from its text where it is not one);
before the update every sample is stripped of its block and the experience-guided ones get the
wider upper clip (:meth:`ExperienceStage.prepare`). The pool is saved in every checkpoint
(``experience_pool.json``) and restored on resume.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horizonrl.evolve.attribution import first_request, trajectory_steps
from horizonrl.evolve.config import ExperienceConfig
from horizonrl.evolve.experience import (
    ExperiencePool,
    experience_block,
    extraction_prompt,
    has_experiences,
    lesson_bounds,
    lessons_model,
    read_experiences,
    read_seed_experiences,
    strip_trajectory,
    task_query,
)
from horizonrl.types import Task, Trajectory

POOL_FILE = "experience_pool.json"


class ExperienceStage:
    """The pool of a run, its extractor role and the tokenizer that strips the blocks."""

    def __init__(
        self,
        cfg: ExperienceConfig,
        extractor: Any,
        tokenizer: Any,
        tools: list[str] | None = None,
        embedder: Any = None,
    ) -> None:
        """``tools``: the env's tool names, which an experience may call (None: they vary by task,
        and are not checked)."""
        if embedder is None:
            from horizonrl.evolve.embed import QueryEmbedder

            embedder = QueryEmbedder()  # one line naming the install command when it is missing
        self.cfg = cfg
        self.pool = ExperiencePool(embedder, cfg.max_size, cfg.duplicate)
        self.extractor = extractor
        self.tokenizer = tokenizer
        self.tools = tools
        # read (and validated) now, so that a bad seed file stops the run before SFT, not after it
        self._seeds = read_seed_experiences(cfg.seed, set(tools) if tools else None) if cfg.seed else []

    def seed_pool(self) -> dict[str, float]:
        """Put the seed file's experiences (``experience.seed``) in the pool; the counts as metrics
        (nothing when no seed file is set)."""
        if not self._seeds:
            return {}
        counts = self.pool.add(self._seeds, step=0)
        return {f"experience/seed_{k}": float(v) for k, v in counts.items()}

    def notes(self, tasks: Sequence[Task]) -> dict[str, str]:
        """Each task's retrieved experiences as the ``<EXP>`` block its guided samples get."""
        notes = {}
        for task in tasks:
            block = experience_block(self.pool.retrieve(task_query(task), self.cfg.top_k))
            if block:
                notes[task.id] = block
        return notes

    async def extract(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        """New experiences from the first ``extract_per_step`` groups of finished samples; the
        step's counts (added, duplicates, drops by reason, replies that were not the structured
        object and were read as text, the pool's size)."""
        groups: dict[str, list[Trajectory]] = {}
        for traj in trajectories:
            if traj.finish != "error":
                groups.setdefault(traj.group_id, []).append(traj)
        chosen = list(groups.values())[: self.cfg.extract_per_step]
        lessons = lesson_bounds(self.cfg.max_tokens)[0]
        prompts = []
        for members in chosen:
            wins = [t for t in members if t.success]
            losses = [t for t in members if not t.success]
            picked = (wins[:1] + losses[:1]) if wins and losses else members[:2]
            attempts = [([(s.action, s.observation) for s in trajectory_steps(t)], t.success) for t in picked]
            prompts.append(extraction_prompt(first_request(picked[0]), attempts, self.tools or [], lessons))
        schema = lessons_model(self.cfg.max_tokens)
        replies = await asyncio.gather(
            *(
                self.extractor.structured(p, schema, temperature=0.0, max_tokens=self.cfg.max_tokens)
                for p in prompts
            )
        )
        counts: Counter = Counter()
        names = set(self.tools) if self.tools else None
        for members, reply in zip(chosen, replies, strict=True):
            found, dropped = read_experiences(reply, names, source=members[0].task_id)
            counts["unstructured"] += not reply.ok
            counts.update({f"dropped_{k}": v for k, v in dropped.items()})
            counts.update(self.pool.add(found, step))
        out = {f"experience/{k}": float(v) for k, v in counts.items()}
        out["experience/pool_size"] = float(len(self.pool))
        out["experience/extraction_groups"] = float(len(chosen))
        return out

    def prepare(
        self, trajectories: Sequence[Trajectory]
    ) -> tuple[list[Trajectory], list[float | None], dict[str, float]]:
        """The samples to train on, stripped of their blocks, with each one's upper clip (the wider
        ``clip_high`` for experience-guided samples, None for the rest); a sample whose block cannot
        be cut out cleanly is left out and counted."""
        kept: list[Trajectory] = []
        bounds: list[float | None] = []
        unstrippable = 0
        successes: dict[bool, list[bool]] = {True: [], False: []}  # guided? -> each sample's success
        for traj in trajectories:
            had = has_experiences(traj.messages)
            successes[had].append(traj.success)
            stripped = strip_trajectory(traj, self.tokenizer)
            if stripped is None:
                unstrippable += 1
                continue
            kept.append(stripped)
            bounds.append(self.cfg.clip_high if had else None)
        metrics = {
            "experience/guided_samples": float(sum(b is not None for b in bounds)),
            "experience/unstrippable": float(unstrippable),
        }
        for had, name in ((True, "guided"), (False, "unguided")):
            if successes[had]:  # how the pool's advice changes what the same policy achieves
                metrics[f"experience/{name}_success"] = sum(successes[had]) / len(successes[had])
        return kept, bounds, metrics

    def save(self, checkpoint: Path) -> None:
        self.pool.save(checkpoint / POOL_FILE)

    def load(self, checkpoint: Path) -> bool:
        """Restore the pool saved in ``checkpoint``; False when it holds none (the pool was off)."""
        path = checkpoint / POOL_FILE
        if not path.exists():
            return False
        self.pool.load(path)
        return True
