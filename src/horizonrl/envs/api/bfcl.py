"""``bfcl``: the Berkeley Function Calling Leaderboard's multi-turn worlds as an env.

BFCL (``bfcl-eval``, installed ``--no-deps``: ``pip install --no-deps bfcl-eval==2026.3.23`` or
``make setup``) ships stateful Python APIs — a file system, a math library, messaging, a Twitter-like
feed, support tickets, a trading bot, travel booking, a car — and multi-turn tasks over them: a user
asks for something, the agent calls tools until the request is done and answers in text, then the
user asks the next thing. The ``test`` split is BFCL's ``multi_turn_base`` category (200 tasks, file
order). What is loaded and what is left out, and BFCL's rule for a correct turn, are in
:mod:`.bfcl_world`: WebSearchAPI is left out (it needs the network and serpapi/bs4) and so are the
Memory APIs (vector stores on sentence-transformers + faiss, ``overrides``; not multi-turn).

An episode: ``reset`` builds fresh API instances for the model and a second set for the ground truth
and answers with the first user turn; the tools are the docs of the task's classes less its excluded
functions (set per task in ``reset``). Every tool call runs on the model's instances (a failure is an
``Error during execution: ...`` observation). A reply without a tool call ends the user turn: the
turn's ground-truth calls run on the ground-truth instances and BFCL's check decides; a failed turn
ends the episode with reward 0, a passed one brings the next user turn, and the last one passing
ends it with reward 1. Functions excluded from a task's tools still execute when called, as in BFCL.

A task's ``data``: ``query`` (the first user message), ``turns`` (per turn, its user messages),
``initial_config``, ``involved_classes``, ``excluded_function``, ``ground_truth`` (BFCL's call
strings per turn) and ``reference_solution`` (the same as ``{name, arguments}`` per turn).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from horizonrl.envs.api import data_text
from horizonrl.envs.api.bfcl_state import assigned_fields, state_schema, state_view
from horizonrl.envs.api.bfcl_world import (
    CLASSES,
    BfclEpisode,
    BfclWorld,
    CallResult,
    class_docs,
    num_tasks,
    require_bfcl,
    task_data,
    tool_specs,
)
from horizonrl.envs.api.checker import Check, CheckerError, holds, parse_checker
from horizonrl.envs.base import Env, EnvOptions
from horizonrl.errors import ConfigError, DataError
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Action, Message, StepResult, Task, Trajectory

SYSTEM_PROMPT = (
    "You help a user through the tools below. Do what the user asks with tool calls, one or more per "
    "reply, and read each result before the next step. When the current request is done (or cannot be "
    "done), answer in plain text without a tool call; the user may then ask for something else."
)
END_OF_TURN = "Done."
PROFILE_FILE = "bfcl_profile.json"


@cache
def bfcl_profile() -> dict[str, Any]:
    """The worlds' hand-written environment profile: one entity per API class, its operations the
    class's functions (what self-questioning reads; it needs no ``bfcl-eval`` to load)."""
    return json.loads(data_text(PROFILE_FILE))


class BfclOptions(EnvOptions):
    pass


@cache
def world_config(world_seed: int) -> dict[str, Any]:
    """World ``world_seed``'s initial state: the ``initial_config`` of multi_turn_base task
    ``world_seed`` (modulo the 200), for the classes it configures; the others load BFCL's
    defaults. Exploration and synthesized tasks live in these worlds."""
    entries = task_data(num_tasks())
    return entries[world_seed % len(entries)][1]["initial_config"]


@cache
def _default_state() -> dict[str, Any]:
    return state_view(BfclWorld(list(CLASSES), world_config(0)).instances)


@cache
def _function_owners() -> dict[str, str]:
    """Each loaded function's class (a later class wins a name, as in BFCL)."""
    return {doc["name"]: name for name in CLASSES for doc in class_docs(name)}


def owning_classes(calls: list[dict[str, Any]]) -> list[str]:
    """The loaded classes whose functions ``calls`` name, in :data:`CLASSES` order; every class when
    none is named."""
    owner = _function_owners()
    named = {owner[c["name"]] for c in calls if isinstance(c, dict) and c.get("name") in owner}
    return [name for name in CLASSES if name in named] or list(CLASSES)


def _turn_position(messages: list[Message]) -> tuple[int, int]:
    """(index of the current user turn, assistant messages since its user message(s))."""
    turn, since, after_user = -1, 0, False
    for message in messages:
        if message.role == "user":
            if not after_user:
                turn, since = turn + 1, 0
            after_user = True
            continue
        after_user = False
        if message.role == "assistant":
            since += 1
    return turn, since


class ReferenceOracle:
    """Scripted policy: per user turn, the turn's reference calls one per reply, then ``Done.``
    (a synthesized task's reference is one flat list of calls: its only turn)."""

    def act(self, task: Task, messages: list[Message]) -> str:
        turn, since = _turn_position(messages)
        reference = task.data.get("reference_solution") or []
        if reference and isinstance(reference[0], dict):
            reference = [reference]
        calls = reference[turn] if 0 <= turn < len(reference) else []
        if since < len(calls):
            return format_tool_call(calls[since]["name"], dict(calls[since].get("arguments") or {}))
        return END_OF_TURN


def _user_messages(turn: list[dict[str, Any]]) -> list[Message]:
    return [Message(role="user", content=str(m.get("content", ""))) for m in turn]


class BfclEnv(Env[BfclOptions]):
    """BFCL's multi-turn API worlds; reward 1 when every user turn passes BFCL's check."""

    name = "bfcl"
    Options = BfclOptions
    accepts_text = True  # a reply without a tool call ends the user turn

    def __init__(self, options: BfclOptions | None = None) -> None:
        super().__init__(options)
        self.task: Task | None = None
        self.episode: BfclEpisode | None = None
        self.world: BfclWorld | None = None  # a world session: exploration or a synthesized task
        self.checker: Check | None = None

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: BfclOptions) -> list[Task]:
        if split != "test":
            raise ConfigError(
                f"unknown split {split!r} for env 'bfcl'; valid splits: test (BFCL's multi_turn_base)"
            )
        require_bfcl()
        total = num_tasks()
        if n > total:
            raise ConfigError(f"env 'bfcl' has {total} multi_turn_base tasks, {n} were asked for")
        return [Task(id=task_id, env=cls.name, split=split, data=data) for task_id, data in task_data(n)]

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        return ("test",)

    @classmethod
    def profile(cls) -> dict[str, Any]:
        """The hand-written environment profile of BFCL's worlds."""
        return bfcl_profile()

    @classmethod
    def oracle(cls, options: BfclOptions | None = None) -> ReferenceOracle:
        return ReferenceOracle()

    @classmethod
    def answer_of(cls, trajectory: Trajectory) -> str | None:
        """The calls the episode made, per user turn, as canonical JSON (``[[[name, arguments], ...],
        ...]``): BFCL judges a turn by the state and results its calls leave, so samples that made the
        same calls agree."""
        turns: list[list[list[Any]]] = []
        after_user = False
        for message in trajectory.messages:
            if message.role == "user" and not after_user:
                turns.append([])
            elif message.role == "assistant" and turns:
                turns[-1].extend([c.name, c.arguments] for c in message.tool_calls or [])
            after_user = message.role == "user"
        return json.dumps(turns, sort_keys=True)

    async def reset(self, task: Task) -> list[Message]:
        require_bfcl()
        data = task.data
        self.world, self.checker, self.episode = None, None, None
        if data.get("explore") or "checker" in data:
            return self._reset_world(task)
        needed = ("turns", "involved_classes", "reference_solution")
        missing = [key for key in needed if key not in data]
        if missing:
            raise DataError(f"bfcl task {task.id!r} needs data.{', data.'.join(missing)}")
        turns, reference = data["turns"], data["reference_solution"]
        if not turns or len(turns) != len(reference):
            raise DataError(
                f"bfcl task {task.id!r}: {len(turns)} user turns but {len(reference)} reference turns"
            )
        self.task = task
        self.tools = tool_specs(data["involved_classes"], data.get("excluded_function") or [])
        self.episode = BfclEpisode(
            list(data["involved_classes"]), dict(data.get("initial_config") or {}), reference
        )
        self.metrics = {
            "success": 0.0,
            "turns_passed": 0.0,
            "turns_total": float(len(turns)),
            "world_errors": 0.0,
        }
        return [Message(role="system", content=SYSTEM_PROMPT), *_user_messages(turns[0])]

    # ------------------------------------------------------------------ world sessions
    def _reset_world(self, task: Task) -> list[Message]:
        """An exploration session (``data.explore``: every class, no checker) or a synthesized task
        (``data.checker`` over :meth:`world_state`; the classes its reference calls), in world
        ``data.world_seed``; one user request, answered when a reply has no tool call."""
        data = task.data
        if "query" not in data:
            raise DataError(f"bfcl task {task.id!r} needs data.query")
        explore = bool(data.get("explore"))
        seed = data.get("world_seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DataError(f"bfcl task {task.id!r}: data.world_seed must be an integer, got {seed!r}")
        reference = data.get("reference_solution")
        calls = reference if isinstance(reference, list) else []
        classes = list(CLASSES) if explore else owning_classes(calls)
        self.world = BfclWorld(classes, world_config(seed))
        if not explore:
            try:
                self.checker = parse_checker(data["checker"], self.state_schema)
            except CheckerError as exc:
                raise DataError(f"bfcl task {task.id!r}: {exc}") from None
        self.task = task
        self.tools = tool_specs(classes)
        self.metrics = {"success": 0.0, "world_errors": 0.0}
        request = Message(role="user", content=str(data["query"]))
        return [Message(role="system", content=SYSTEM_PROMPT), request]

    def world_state(self) -> dict[str, Any]:
        """The world's state as checkers read it (:func:`.bfcl_state.state_view`); before a reset,
        world 0's with every class loaded (what a caller reads the schema from)."""
        if self.world is None:
            return _default_state()
        return state_view(self.world.instances)

    @property
    def state_schema(self) -> dict[str, Any]:  # type: ignore[override]
        return state_schema(self.world_state())

    @property
    def assigned_fields(self) -> dict[str, tuple[str, ...]]:
        return assigned_fields(self.state_schema)

    def _run_calls(
        self, action: Action, execute: Callable[[str, Any], CallResult], refusals_as_errors: bool
    ) -> StepResult:
        """Every tool call of ``action`` through ``execute``, an observation each; an API's refusal
        (``{"error": ...}``) counts as a world error, and reads ``Error: ...`` when
        ``refusals_as_errors`` (world sessions: so the explorer and replay see it refused)."""
        result = StepResult()
        for call in action.tool_calls:
            out = execute(call.name, call.arguments)
            if out.raised:
                result.info["tool_errors"] = result.info.get("tool_errors", 0) + 1
            if out.api_error:
                self.metrics["world_errors"] += 1
            text = f"Error: {out.text}" if out.api_error and refusals_as_errors else out.text
            result.observations.append(
                Message(role="tool", content=text, tool_call_id=call.id, name=call.name)
            )
        return result

    def _success(self) -> float:
        """A world session's checker holds, or every user turn of an episode passed (in metrics too)."""
        if self.world is not None:
            ok = self.checker is not None and holds(self.checker, self.world_state())
        else:
            ok = self.episode is not None and self.episode.passed
        self.metrics["success"] = float(ok)
        return float(ok)

    async def step(self, action: Action) -> StepResult:
        if self.world is not None:
            if action.tool_calls:
                return self._run_calls(action, self.world.call, refusals_as_errors=True)
            return StepResult(done=True, reward=self._success())  # the request is answered
        if self.episode is None or self.task is None:
            raise RuntimeError("step() before reset()")
        episode, result = self.episode, StepResult()
        if action.tool_calls:
            return self._run_calls(action, episode.execute, refusals_as_errors=False)
        verdict = episode.end_turn()
        self.metrics["turns_passed"] = float(sum(v.valid for v in episode.verdicts))
        result.info.update(turn=verdict.turn, turn_valid=verdict.valid, turn_reason=verdict.reason)
        if not verdict.valid or episode.done:
            result.done = True
            result.reward = float(episode.passed)
            self.metrics["success"] = float(episode.passed)
            return result
        result.observations = _user_messages(self.task.data["turns"][episode.turn])
        return result

    async def evaluate(self) -> float | None:
        return self._success()
