"""The learning objects: a candidate (one version of the agent: its components, where it came from,
its metrics and its recent trajectories) and the store that keeps every candidate of a run.

A candidate's components are the parts a method may change:

- ``prompt``: guidelines appended to the env's system message;
- ``agent_code``: a small agent module (:mod:`horizonrl.learn.agent_code`) run in a sandbox;
  ``None`` is the plain turn loop (the model's reply is the action);
- ``model``: a directory of full model weights (a run-local copy); ``None`` is the recipe's model.

On disk (``learn/ENV/candidates/ID/``): ``candidate.json``, ``prompt.md``, ``agent.py``,
``model/``, and the episodes it was measured on (``train.jsonl``, ``val.jsonl``). A candidate
directory appears whole or not at all (written aside, then renamed), so a crash never leaves one
half-written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.errors import DataError
from horizonrl.io import replace_dir_atomic
from horizonrl.types import Trajectory, read_trajectories

CANDIDATE_FILE = "candidate.json"


class Components(BaseModel):
    """The modifiable parts of an agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = ""
    agent_code: str | None = None
    model: str | None = Field(None, description="A full-weights directory, relative to the run directory.")

    def key(self) -> str:
        """A content hash: two candidates with the same components are the same agent."""
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class Metrics(BaseModel):
    """What a candidate scored and cost. Rewards are mean episode rewards (a world's is normalized:
    achieved / the level's maximum); cost is the policy's tokens per validation episode."""

    model_config = ConfigDict(extra="forbid")

    train_reward: float = 0.0
    train_success: float = 0.0
    val_reward: float = 0.0
    val_success: float = 0.0
    #: the validation success rate's 95% interval over tasks (Wilson for one episode per task)
    val_success_low: float = 0.0
    val_success_high: float = 0.0
    cost_tokens: float = 0.0
    eval_tokens: int = 0
    eval_wall_s: float = 0.0
    train_episodes: int = 0
    val_episodes: int = 0
    finishes: dict[str, int] = Field(default_factory=dict)


class Candidate(BaseModel):
    """One version of the agent."""

    model_config = ConfigDict(extra="forbid")

    id: str
    env: str
    components: Components
    parent: str | None = None
    method: str | None = Field(None, description="The method that made it (None: the baseline).")
    iteration: int = 0
    metrics: Metrics = Field(default_factory=Metrics)


class CandidateStore:
    """Every candidate of one env in a run: ``root/candidates/ID/``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = self.root / "candidates"
        self._by_id: dict[str, Candidate] = {}
        self._by_key: dict[str, str] = {}
        self.reload()

    def reload(self) -> None:
        self._by_id.clear()
        self._by_key.clear()
        if not self.dir.is_dir():
            return
        for folder in sorted(self.dir.iterdir()):
            file = folder / CANDIDATE_FILE
            if folder.name.startswith(".") or not file.is_file():
                continue  # a candidate being written when a run stopped
            try:
                cand = Candidate.model_validate_json(file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise DataError(f"{file}: not a candidate record ({str(exc).splitlines()[0]})") from None
            self._by_id[cand.id] = cand
            self._by_key.setdefault(cand.components.key(), cand.id)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, cand_id: str) -> Candidate:
        return self._by_id[cand_id]

    def all(self) -> list[Candidate]:
        return list(self._by_id.values())

    def find(self, components: Components) -> Candidate | None:
        """The candidate already holding exactly these components."""
        found = self._by_key.get(components.key())
        return self._by_id[found] if found is not None else None

    def next_id(self) -> str:
        return f"c{len(self._by_id):04d}"

    def folder(self, cand_id: str) -> Path:
        return self.dir / cand_id

    def add(
        self,
        cand: Candidate,
        train: list[Trajectory],
        val: list[Trajectory],
        extra: Callable[[Path], None] | None = None,
    ) -> Candidate:
        """Write ``cand`` with its episodes (and whatever ``extra`` puts in its folder, e.g. model
        weights) as one directory, atomically."""

        def write(tmp: Path) -> None:
            tmp.mkdir(parents=True)
            if extra is not None:
                extra(tmp)
            (tmp / "prompt.md").write_text(cand.components.prompt, encoding="utf-8")
            if cand.components.agent_code is not None:
                (tmp / "agent.py").write_text(cand.components.agent_code, encoding="utf-8")
            for name, trajs in (("train.jsonl", train), ("val.jsonl", val)):
                (tmp / name).write_text("".join(t.to_json() + "\n" for t in trajs), encoding="utf-8")
            (tmp / CANDIDATE_FILE).write_text(cand.model_dump_json(indent=2) + "\n", encoding="utf-8")

        self.dir.mkdir(parents=True, exist_ok=True)
        replace_dir_atomic(self.folder(cand.id), write)
        self._by_id[cand.id] = cand
        self._by_key.setdefault(cand.components.key(), cand.id)
        return cand

    def trajectories(self, cand_id: str, split: str = "train") -> list[Trajectory]:
        """The episodes a candidate was measured on (``train`` or ``val``)."""
        file = self.folder(cand_id) / f"{split}.jsonl"
        return read_trajectories(file) if file.is_file() else []

    def remove_partial(self) -> None:
        """Drop hidden half-written candidate folders left by a crash."""
        if self.dir.is_dir():
            for folder in self.dir.iterdir():
                if folder.name.startswith("."):
                    shutil.rmtree(folder, ignore_errors=True)
