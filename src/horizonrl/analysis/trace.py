"""What failure analysis reads: a trace of numbered steps, from a single-agent trajectory or from the
per-role trajectories of one multi-agent episode.

A step is one model turn: the role that took it (``agent`` for a single agent), its text, the tool
calls it made and the observations that answered them. A multi-agent episode's steps interleave its
roles in the order they acted (from ``episodes.jsonl`` beside the trajectories when there is one,
else the order the trajectories were written). A chat-chain episode's line in ``episodes.jsonl`` also
carries the chain's state (:class:`~horizonrl.multiagent.chain_record.ChainFacts`): which phase each
step belongs to, the tools each phase gave each role, how each phase ended and what the chain's own
test runs said; the trace keeps it as ``chain`` and each step its ``phase``.

A file may also hold traces written out directly, one :class:`TraceRecord` per line (a hand-written
or hand-labelled set: the task, the steps with their roles, phases, calls and observations, the
outcome and the chain's state), read when a line has ``steps``. Reading a file never stops at a bad
line: lines that are neither are skipped and reported with their line numbers.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.errors import DataError, iter_user_lines
from horizonrl.multiagent.chain_record import ChainFacts
from horizonrl.types import ToolCall, Trajectory


@dataclass
class Step:
    index: int
    role: str
    text: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments as JSON)
    observation: str = ""
    phase: str = ""  # the chain phase the step was taken in ('' outside a chat chain)


@dataclass
class Trace:
    id: str
    env: str
    task: str
    steps: list[Step]
    finish: str
    success: bool
    reward: float
    roles: list[str]
    trajectory_ids: list[str]
    chain: ChainFacts | None = None


def _role_steps(traj: Trajectory, role: str) -> list[Step]:
    """The assistant turns of one trajectory as steps (indices filled in later), each with the tool
    observations that follow it."""
    steps: list[Step] = []
    for msg in traj.messages:
        if msg.role == "assistant":
            calls = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in msg.tool_calls or []]
            steps.append(Step(0, role, msg.content, calls))
        elif msg.role == "tool" and steps:
            steps[-1].observation += ("\n" if steps[-1].observation else "") + msg.content
    return steps


def _task_text(traj: Trajectory) -> str:
    return next((m.content for m in traj.messages if m.role == "user"), "")


def trace_of(traj: Trajectory) -> Trace:
    """A single-agent trajectory as a trace."""
    steps = _role_steps(traj, "agent")
    for i, step in enumerate(steps):
        step.index = i
    return Trace(
        traj.id,
        traj.env,
        _task_text(traj),
        steps,
        traj.finish,
        traj.success,
        traj.reward,
        ["agent"],
        [traj.id],
    )


def episode_trace(
    episode_id: str, trajs: list[Trajectory], order: list[str] | None = None, chain: ChainFacts | None = None
) -> Trace:
    """One multi-agent episode's per-role trajectories as one trace; ``order`` (the roles in the
    order they acted, one entry per turn) interleaves their steps; ``chain``: a chat chain's state
    (gives each step its phase)."""
    per_role: OrderedDict[str, list[Step]] = OrderedDict()
    for traj in trajs:
        per_role.setdefault(str(traj.role), []).extend(_role_steps(traj, str(traj.role)))
    steps: list[Step] = []
    if order:
        taken = dict.fromkeys(per_role, 0)
        for role in order:
            if role in per_role and taken[role] < len(per_role[role]):
                steps.append(per_role[role][taken[role]])
                taken[role] += 1
        for role, role_steps in per_role.items():  # anything the order did not name, in file order
            steps.extend(role_steps[taken[role] :])
    else:
        steps = [s for role_steps in per_role.values() for s in role_steps]
    for i, step in enumerate(steps):
        step.index = i
        span = chain.phase_of(i) if chain is not None else None
        step.phase = span.name if span is not None else ""
    cut = [t for t in trajs if t.finish != "finished"]
    last = trajs[-1]
    return Trace(
        episode_id,
        last.env,
        _task_text(trajs[0]),
        steps,
        cut[0].finish if cut else "finished",
        last.success,
        last.reward,
        list(per_role),
        [t.id for t in trajs],
        chain,
    )


class StepRecord(BaseModel):
    """One step of a written trace."""

    model_config = ConfigDict(extra="forbid")

    role: str
    text: str = ""
    phase: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    observation: str = ""


class TraceRecord(BaseModel):
    """A trace written out directly (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    env: str
    task: str
    steps: list[StepRecord]
    finish: str = "finished"
    success: bool
    reward: float = 0.0
    chain: ChainFacts | None = None
    note: str = Field("", description="What the trace shows, in a line (for a reader; not analysed).")

    def trace(self) -> Trace:
        steps = [
            Step(
                i,
                s.role,
                s.text,
                [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in s.tool_calls],
                s.observation,
                s.phase,
            )
            for i, s in enumerate(self.steps)
        ]
        roles = list(dict.fromkeys(s.role for s in self.steps))
        return Trace(
            self.id,
            self.env,
            self.task,
            steps,
            self.finish,
            self.success,
            self.reward,
            roles,
            [self.id],
            self.chain,
        )


@dataclass
class Loaded:
    traces: list[Trace]
    skipped: list[str]  # "file:line: why"
    source: Path


def trajectory_files(path: Path) -> list[Path]:
    """The trajectory files under a run directory (or the file itself)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"{str(path)!r} is neither a run directory nor a trajectory JSONL file")
    found = sorted(
        p
        for p in path.rglob("*.jsonl")
        if p.name not in ("episodes.jsonl", "metrics.jsonl", "trees.jsonl")
        and not p.name.startswith(("pairs_", "sft_"))
        and ".trash" not in p.parts
    )
    if not found:
        raise DataError(
            f"{str(path)!r} holds no trajectory files (*.jsonl): run `horizon eval` or `horizon train` "
            "into it first, or name a trajectory JSONL file"
        )
    return found


def _episode_orders(folder: Path) -> dict[str, tuple[list[str], ChainFacts | None]]:
    """Each episode's turn order and, for a chat chain, its state, from ``episodes.jsonl``."""
    path = folder / "episodes.jsonl"
    if not path.is_file():
        return {}
    orders: dict[str, tuple[list[str], ChainFacts | None]] = {}
    for _, line in iter_user_lines(path, "episode file"):
        try:
            record = json.loads(line)
            chain = ChainFacts.model_validate(record["chain"]) if record.get("chain") else None
            orders[str(record["episode_id"])] = (list(record["order"]), chain)
        except (ValueError, KeyError, TypeError):
            continue
    return orders


def load_traces(path: str | Path) -> Loaded:
    """Every trace in a run directory or trajectory file; bad lines are skipped and reported."""
    path = Path(path)
    traces: list[Trace] = []
    skipped: list[str] = []
    for file in trajectory_files(path):
        episodes: OrderedDict[str, list[Trajectory]] = OrderedDict()
        orders = _episode_orders(file.parent)
        for lineno, line in iter_user_lines(file, "trajectory file"):
            if not line.strip():
                continue
            try:
                if '"steps"' in line and '"prompt_ids"' not in line:
                    traces.append(TraceRecord.model_validate_json(line).trace())
                    continue
                traj = Trajectory.model_validate_json(line)
            except ValueError as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                skipped.append(f"{file}:{lineno}: neither a trajectory nor a trace record ({first})")
                continue
            if traj.episode_id is not None:
                episodes.setdefault(traj.episode_id, []).append(traj)
            else:
                traces.append(trace_of(traj))
        for eid, trajs in episodes.items():
            order, chain = orders.get(eid, (None, None))
            traces.append(episode_trace(eid, trajs, order, chain))
    return Loaded(traces, skipped, path)
