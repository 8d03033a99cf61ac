"""Running a role graph on a task: each role samples from its own policy (an adapter of the one base,
served by one engine), and every role's turns become an ordinary schema-v1 trajectory of that role.

A role's trajectory is its own view of the episode: its system prompt and a user message holding
the question and the earlier phases' solutions it sees (:func:`role_context`), then its turns; in a
two-role phase the other role's messages arrive as user turns. ``prompt_ids + response_ids`` is the
exact token sequence the role's policy saw and produced (the other role's turns and the template's
tokens masked 0), so a role's trajectory trains that role's adapter and nothing else. All roles'
trajectories carry the episode's id and their role; the :class:`EpisodeRecord` lists the roles in
the order they acted, each phase's solution and answer, the final answer and the reward.

A role with an ``output_schema`` samples its turns under that constraint (the trajectory marks them
``constrained``, as an agent's constrained turns are); a phase whose solution carries a verdict
(a ``{"verdict": ...}`` object, or a last ``Verdict: ...`` line in free text) records it, so the
verifier's verdicts can be scored against the answer they judged (:func:`episode_metrics`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, Field

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import Constraint
from horizonrl.multiagent.answers import extract_answer, is_correct
from horizonrl.multiagent.graph import QUESTION, Phase, RoleGraph, RoleSpec
from horizonrl.roles.structured import first_json_object
from horizonrl.seeds import derive_seed
from horizonrl.tokens import ResponseStream
from horizonrl.types import ConstrainedSpan, Message, Task, Timings, Trajectory


class RoleEngine(Protocol):
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...


#: a role's adapter name (None: the base) -> the engine (view) that samples from it
Policies = Callable[[str | None], RoleEngine]


class PhaseRecord(BaseModel):
    name: str
    roles: list[str]
    turns: int
    solution: str
    answer: str | None
    consensus: bool = False
    verdict: str | None = Field(None, description="The verdict the solution states, if any.")


class EpisodeRecord(BaseModel):
    """One multi-agent episode (one JSONL line of ``episodes.jsonl``)."""

    episode_id: str
    graph: str
    task_id: str
    order: list[str] = Field(description="The roles in the order they acted (one entry per turn).")
    adapters: dict[str, str | None]
    phases: list[PhaseRecord]
    final_answer: str | None
    expected: str
    reward: float
    path: list[int] = Field(default_factory=list, description="Tree sampling: the branch index per phase.")


@dataclass
class EpisodeResult:
    record: EpisodeRecord
    trajectories: list[Trajectory]


def task_question(task: Task) -> str:
    question = task.data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"task {task.id!r} has no data.question: a role graph answers questions in text")
    return question


def role_context(graph: RoleGraph, role: RoleSpec, question: str, solutions: Mapping[str, str]) -> str:
    """The user message opening a role's view: the question and the solutions of the phases it sees."""
    parts: list[str] = []
    for seen in role.sees:
        if seen == QUESTION:
            parts.append(f"Problem:\n{question}")
        elif seen in solutions:
            phase = next(p for p in graph.phases if p.name == seen)
            parts.append(f"{phase.heading}:\n{solutions[seen]}")
    return "\n\n".join(parts)


@dataclass
class RoleView(ResponseStream):
    """One role's side of a phase: its conversation as messages and as exact tokens."""

    role: RoleSpec
    chat: ChatFormat
    messages: list[Message]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    constrained: list[ConstrainedSpan] = field(default_factory=list)
    constraints: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    cut_off: bool = False
    generate_s: float = 0.0

    def __post_init__(self) -> None:
        self.prompt_ids = self.chat.prompt_ids(self.messages)

    @property
    def last_said(self) -> str:
        """The role's last message ('' when it has not spoken)."""
        return next((m.content for m in reversed(self.messages) if m.role == "assistant"), "")

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_own(self, completion: Completion, constraint: Constraint | None = None) -> str:
        ids = list(completion.token_ids)
        text = self.chat.decode(ids)
        self.append_model(ids, completion.logprobs, None if constraint is None else constraint.as_record())
        self.append_env(self.chat.close_turn_ids(ids))
        self.messages.append(Message(role="assistant", content=text))
        self.turns += 1
        self.cut_off = completion.finish_reason == "length"
        return text

    def add_other(self, text: str) -> None:
        self.add_messages([Message(role="user", content=text)])

    def add_messages(self, messages: list[Message]) -> None:
        """Messages the role did not write (another role's turn, tool results), as template tokens."""
        self.append_env(self.chat.observation_ids(messages))
        self.messages.extend(messages)


def role_constraint(role: RoleSpec) -> Constraint | None:
    """The constraint a role's turns are sampled under (its ``output_schema``), or None."""
    return None if role.output_schema is None else Constraint(json_schema=role.output_schema)


def step_params(
    max_new_tokens: int, sampling: SamplingParams, constraint: Constraint | None, *seed_parts: object
) -> SamplingParams:
    """``sampling`` for one role step: its token budget, its constraint, and a seed derived from
    ``seed_parts`` (so a step's sample does not depend on what shares the engine's batch)."""
    seed = None if sampling.seed is None else derive_seed(sampling.seed, *seed_parts)
    update: dict[str, Any] = {"max_new_tokens": max_new_tokens, "seed": seed}
    if constraint is not None:
        update["constraint"] = constraint
    return sampling.model_copy(update=update)


def role_trajectory(
    view: RoleView, task: Task, env: str, traj_id: str, episode_id: str, reward: float, success: bool
) -> Trajectory:
    """One role's view of an episode as its trajectory (the episode's reward on its last turn)."""
    return Trajectory(
        id=traj_id,
        task_id=task.id,
        group_id=task.id,
        env=env,
        messages=view.messages,
        prompt_ids=view.prompt_ids,
        response_ids=view.response_ids,
        loss_mask=view.loss_mask,
        logprobs=view.logprobs,
        constrained=view.constrained or None,
        constraints=view.constraints or None,
        reward=reward,
        turn_rewards=[0.0] * (view.turns - 1) + [reward] if view.turns else [],
        num_turns=view.turns,
        finish="turn_budget" if view.cut_off else "finished",
        metrics={"success": float(success), "model_tokens": float(sum(view.loss_mask))},
        timings=Timings(run_s=view.generate_s),
        episode_id=episode_id,
        role=view.role.name,
    )


class GraphRunner:
    """Runs phases of ``graph`` with each role's policy from ``policies`` (see the module doc)."""

    def __init__(
        self, graph: RoleGraph, policies: Policies, chat: ChatFormat, sampling: SamplingParams, env: str
    ) -> None:
        self.graph, self.policies, self.chat, self.sampling, self.env = graph, policies, chat, sampling, env
        self.constraints = {role.name: role_constraint(role) for role in graph.roles}

    def _view(self, role: RoleSpec, question: str, solutions: Mapping[str, str]) -> RoleView:
        messages = [
            Message(role="system", content=role.system),
            Message(role="user", content=role_context(self.graph, role, question, solutions)),
        ]
        return RoleView(role, self.chat, messages)

    async def _turn(self, view: RoleView, *seed_parts: object) -> str:
        start = time.perf_counter()
        constraint = self.constraints[view.role.name]
        params = step_params(
            view.role.max_new_tokens, self.sampling, constraint, *seed_parts, view.role.name, view.turns
        )
        completion = await self.policies(view.role.adapter).generate(view.sequence, params)
        view.generate_s += time.perf_counter() - start
        return view.add_own(completion, constraint)

    async def run_phase(
        self, phase: Phase, question: str, solutions: Mapping[str, str], *seed_parts: object
    ) -> tuple[list[RoleView], list[str], bool]:
        """Run one phase; returns the roles' views, the roles in turn order, and whether it ended by
        consensus. The phase's solution is its output role's last message."""
        roles = [self.graph.role(name) for name in phase.roles]
        views = [self._view(role, question, solutions) for role in roles]
        order: list[str] = []
        if len(views) == 1:
            await self._turn(views[0], *seed_parts, phase.name)
            return views, [roles[0].name], False
        assert phase.max_turns is not None  # the graph refuses a two-role phase without a turn cap
        speaker, consensus = 0, False
        for _ in range(phase.max_turns):
            text = await self._turn(views[speaker], *seed_parts, phase.name)
            order.append(roles[speaker].name)
            if phase.consensus and phase.consensus in text:
                consensus = True
                break
            speaker = 1 - speaker
            views[speaker].add_other(text)
        return views, order, consensus

    def trajectory(
        self, view: RoleView, task: Task, episode_id: str, reward: float, correct: bool
    ) -> Trajectory:
        return role_trajectory(
            view, task, self.env, f"{episode_id}/{view.role.name}", episode_id, reward, correct
        )

    async def run(self, task: Task, episode_id: str | None = None, *seed_parts: object) -> EpisodeResult:
        """One whole episode on ``task``."""
        episode_id = episode_id or f"ep-{uuid.uuid4().hex[:12]}"
        question = task_question(task)
        solutions: dict[str, str] = {}
        answers: list[str | None] = []
        phases: list[PhaseRecord] = []
        views_all: list[RoleView] = []
        order: list[str] = []
        for phase in self.graph.phases:
            views, turn_order, consensus = await self.run_phase(phase, question, solutions, *seed_parts)
            views_all += views
            order += turn_order
            said = next(v for v in views if v.role.name == phase.solution_role).last_said
            # consensus before the output role spoke: the phase accepted what it was given
            solution = said or (phases[-1].solution if phases else "")
            solutions[phase.name] = solution
            answers.append(
                phase_answer(solution, answers[-1] if answers else None, phase is self.graph.final_phase)
            )
            phases.append(
                PhaseRecord(
                    name=phase.name,
                    roles=list(phase.roles),
                    turns=len(turn_order),
                    solution=solution,
                    answer=answers[-1],
                    consensus=consensus,
                    verdict=read_verdict(solution),
                )
            )
        final = next(i for i, p in enumerate(self.graph.phases) if p is self.graph.final_phase)
        expected = str(task.data.get("answer"))
        correct = is_correct(answers[final], expected)
        reward = 1.0 if correct else 0.0
        record = EpisodeRecord(
            episode_id=episode_id,
            graph=self.graph.name,
            task_id=task.id,
            order=order,
            adapters={r.name: r.adapter for r in self.graph.roles},
            phases=phases,
            final_answer=answers[final],
            expected=expected,
            reward=reward,
        )
        trajectories = [self.trajectory(v, task, episode_id, reward, correct) for v in views_all if v.turns]
        return EpisodeResult(record, trajectories)


def phase_answer(solution: str, previous: str | None, final: bool) -> str | None:
    """The answer a phase's solution stands for: the number it marks as the answer ('Answer: N'); a
    solution that marks none keeps the previous phase's answer (a review that finds no error), except
    the first and the final phase, which fall back to their last number."""
    marked = extract_answer(solution, marked_only=True)
    if marked is not None:
        return marked
    if final or previous is None:
        return extract_answer(solution)
    return previous


_VERDICT_LINE = re.compile(r"verdict\s*[:=]\s*\**\s*(correct|incorrect)\b", re.IGNORECASE)


def read_verdict(text: str) -> str | None:
    """The verdict a reply states: a JSON object's ``verdict`` ('correct' or 'incorrect'), else the
    last ``Verdict: correct|incorrect`` line of free text; None when it states none."""
    try:
        obj = first_json_object(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and obj.get("verdict") in ("correct", "incorrect"):
        return str(obj["verdict"])
    found = _VERDICT_LINE.findall(text)
    return found[-1].lower() if found else None


def episode_metrics(records: list[EpisodeRecord]) -> dict[str, Any]:
    """Accuracy of the final answers, and after each phase (the answer each phase stands for). For a
    phase whose solutions state verdicts (a verifier's): how many do (``verdicts_<phase>``) and how
    often the verdict matches whether the previous phase's answer was right
    (``verdict_accuracy_<phase>``, over the stated ones)."""
    n = len(records)
    out: dict[str, Any] = {"episodes": n, "accuracy": sum(r.reward for r in records) / n if n else 0.0}
    if records:
        for k, phase in enumerate(records[0].phases):
            right = sum(is_correct(r.phases[k].answer, r.expected) for r in records)
            out[f"accuracy_after_{phase.name}"] = right / n
            stated = [r for r in records if r.phases[k].verdict is not None]
            if k > 0 and stated:
                out[f"verdicts_{phase.name}"] = len(stated)
                agree = sum(
                    (r.phases[k].verdict == "correct") == is_correct(r.phases[k - 1].answer, r.expected)
                    for r in stated
                )
                out[f"verdict_accuracy_{phase.name}"] = agree / len(stated)
        out["no_answer"] = sum(r.final_answer is None for r in records)
    return out
