"""Exploration: the explorer role probes a reward-free world and every step is recorded.

Two phases (AgentEvolver's): **breadth** — many short sessions, each asked to try one operation of
the world with plausible arguments, so every operation is seen; then **depth** — longer sessions
asked to chain operations, using what one call returns in the next (search, then book the offer).
Each session runs in a fresh world; its steps (the call, the observation, whether the world
accepted it) form an :class:`ExplorationTrace`, the raw material of task synthesis.

The explorer is any :class:`~horizonrl.roles.base.RoleClient` (the policy itself by default). Each
turn is a structured request (``explorer.structured``): the reply is a call of one of the world's
tools with arguments valid under that tool's schema (:func:`~.replies.call_model`; on a guided turn
only the chosen tool's arguments, :func:`~.replies.arguments_model`), which the engine enforces on
the ``policy`` and ``local`` backends and an ``openai`` endpoint gets as ``response_format``. A reply
that is no such object (an endpoint that ignores the schema, ``roles.explorer.structured: parse``, a
reply cut off by ``max_tokens``) is read by the free-text parsers as before (a call in the agent's
``<tool_call>`` format, or the first JSON object of a guided turn), and a turn neither reads is
counted in ``unparsed_turns``. The world's answers come back as user turns, so the same session runs
against a local model or an OpenAI-compatible endpoint. ``finish`` is not offered: a session runs
its turns.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel, Field

from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.profile import CONTROL_TOOLS, EnvProfile
from horizonrl.evolve.replies import arguments_model, arguments_of, call_model, call_of
from horizonrl.evolve.validate import call_once
from horizonrl.seeds import derive_seed
from horizonrl.toolcalls import parse_tool_calls
from horizonrl.types import Message, Task, ToolCall, ToolSpec

OBSERVATION_CHARS = 1200  # a long observation is cut in the explorer's context (not in the trace)


class ExploreStep(BaseModel):
    """One call the explorer made and what the world answered."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    observation: str = ""
    ok: bool = True


class ExplorationTrace(BaseModel):
    """One exploration session: its phase, the operation it focused on (breadth) and its steps."""

    id: str
    phase: str
    focus: str = ""
    world_seed: int = 0  # the world the session explored (``data.world_seed`` of its tasks)
    steps: list[ExploreStep] = Field(default_factory=list)
    turns: int = 0
    unparsed_turns: int = 0
    free_text_turns: int = 0  # turns whose call came from the free-text parsers, not the schema
    replies: list[str] = Field(default_factory=list)  # the explorer's text, turn by turn

    def ok_calls(self) -> list[dict[str, Any]]:
        """The calls the world accepted, in order, as ``{name, arguments}``."""
        return [{"name": s.name, "arguments": s.arguments} for s in self.steps if s.ok]


def _breadth_prompt(operation: str) -> str:
    return (
        f"You are exploring this API to learn how it works. Try the operation {operation} with "
        "plausible arguments; if the world answers with an error, read it and try again differently."
    )


DEPTH_PROMPT = (
    "You are exploring this API to learn how it works. Chain several operations: look things up, "
    "then act on what the results return (use ids from one answer in the next call). Try something "
    "different from the obvious first call."
)


def exploration_task(task_id: str, env_name: str, world_seed: int = 0, query: str = "") -> Task:
    """The task that resets an env for exploration into world ``world_seed``: no checker, reward 0."""
    return Task(id=task_id, env=env_name, data={"query": query, "explore": True, "world_seed": world_seed})


class Session(NamedTuple):
    """One exploration session to run: its id, phase, the operation it probes (breadth) and turns, in
    the world ``world_seed``."""

    id: str
    phase: str
    focus: str
    turns: int
    world_seed: int = 0

    def task(self, env_name: str, query: str = "") -> Task:
        """The exploration task that resets an env into this session's world."""
        return exploration_task(self.id, env_name, self.world_seed, query)


def session_tasks(profile: EnvProfile, config: ExploreConfig) -> list[Session]:
    """Every session: breadth probes per operation, then depth sessions; the k-th session of each
    phase explores world ``k % config.worlds``."""
    operations = [op for op in profile.operations() if op not in CONTROL_TOOLS]
    breadth = [(op, k) for k in range(config.breadth_probes) for op in operations]
    sessions = [
        Session(f"breadth-{op}-{k}", "breadth", op, config.breadth_steps, i % config.worlds)
        for i, (op, k) in enumerate(breadth)
    ]
    sessions += [
        Session(f"depth-{k}", "depth", "", config.depth_steps, k % config.worlds)
        for k in range(config.depth_sessions)
    ]
    return sessions


def _guided_operation(focus: str, operations: list[str], turn_seed: int) -> str:
    """The operation of a guided turn: the probed one in a breadth session, else one drawn by the seed."""
    if focus:
        return focus
    return operations[random.Random(turn_seed).randrange(len(operations))]


def call_instructions(tools: list[ToolSpec]) -> str:
    """The system-prompt section that lists the tools and says how to reply: one JSON object
    naming the tool and its arguments (in words: an example call with placeholders is what a small
    model copies)."""
    specs = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nThe functions you can call are given as JSON schemas within <tools></tools> tags:\n"
        f"<tools>\n{specs}\n</tools>\n\nEach turn, call one function: reply with one JSON object "
        'holding the call, {"call": {"name": <function name>, "arguments": {<parameter>: <value>, ...}}}. '
        "Use real values: those the description above names and those earlier calls returned."
    )


def _arguments_request(spec: ToolSpec) -> str:
    props = spec.parameters.get("properties", {})
    described = "; ".join(f"{k}: {v.get('description', v.get('type', ''))}" for k, v in props.items())
    keys = ", ".join(props) or "none"
    return (
        f"Next call: {spec.name} ({spec.description}). Arguments: {described or 'none'}. Write the "
        f"arguments as one JSON object with the keys {keys}, using values from the world and from "
        "earlier results, and nothing else."
    )


def _guided_calls(text: str, spec: ToolSpec, call_id: str) -> list[ToolCall]:
    """The call of a guided turn: ``spec``'s operation with the arguments the reply's first JSON
    object gives (unknown keys dropped); none when the reply holds no object."""
    arguments = _json_object(text)
    if arguments is None:
        return []
    known = spec.parameters.get("properties", {})
    return [
        ToolCall(id=call_id, name=spec.name, arguments={k: v for k, v in arguments.items() if k in known})
    ]


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (a bare ``{}`` when the operation takes no arguments)."""
    decoder = json.JSONDecoder()
    for start in [i for i, c in enumerate(text) if c == "{"][:8]:
        try:
            obj, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


async def explore_session(
    explorer: Any,
    make_env: Callable[[], Any],
    profile: EnvProfile,
    session: Session,
    config: ExploreConfig,
    seed: int,
) -> ExplorationTrace:
    """One session of the explorer in a fresh world; every call and answer recorded."""
    session_id, phase, focus, turns = session.id, session.phase, session.focus, session.turns
    instruction = _breadth_prompt(focus) if phase == "breadth" else DEPTH_PROMPT
    env = make_env()
    trace = ExplorationTrace(id=session_id, phase=phase, focus=focus, world_seed=session.world_seed)
    try:
        await env.reset(session.task(profile.name, instruction))
        tools = [t for t in env.tools if t.name not in CONTROL_TOOLS]
        messages = [
            Message(role="system", content=f"{profile.background}\n\n{call_instructions(tools)}"),
            Message(role="user", content=instruction),
        ]
        by_name = {t.name: t for t in tools}
        reply_model = call_model(tools)
        for turn in range(turns):
            trace.turns += 1
            turn_seed = derive_seed(seed, "explore", session_id, turn)
            guided = _guided_operation(focus, sorted(by_name), turn_seed) if config.guided else None
            if guided is not None:
                messages.append(Message(role="user", content=_arguments_request(by_name[guided])))
            reply = await explorer.structured(
                messages,
                arguments_model(by_name[guided]) if guided is not None else reply_model,
                temperature=config.temperature,
                max_tokens=config.max_tokens,
                seed=turn_seed % 2**31,
            )
            text = reply.text
            messages.append(Message(role="assistant", content=text))
            trace.replies.append(text)
            call_id = f"{session_id}_{turn}"
            finished = False
            if reply.value is not None and guided is not None:
                calls = [ToolCall(id=call_id, name=guided, arguments=arguments_of(reply.value))]
            elif reply.value is not None:
                name, arguments = call_of(reply.value)
                calls = [ToolCall(id=call_id, name=name, arguments=arguments)]
            elif guided is not None:
                calls = _guided_calls(text, by_name[guided], call_id)
            else:
                parsed = parse_tool_calls(text, id_prefix=call_id).calls
                calls = [c for c in parsed if c.name not in CONTROL_TOOLS]
                finished = bool(parsed) and not calls  # it called finish: the session is over
            trace.free_text_turns += bool(calls) and reply.value is None
            if not calls:
                if finished:
                    break
                trace.unparsed_turns += 1
                why = f" ({reply.error})" if reply.error else ""
                messages.append(
                    Message(role="user", content=f"No tool call found{why}; call one of the tools.")
                )
                continue
            answers = []
            for call in calls:
                outcome = await call_once(env, call, text)
                trace.steps.append(
                    ExploreStep(
                        name=call.name,
                        arguments=dict(call.arguments),
                        observation=outcome.observation,
                        ok=outcome.ok,
                    )
                )
                answers.append(f"{call.name} returned: {outcome.observation[:OBSERVATION_CHARS]}")
            messages.append(Message(role="user", content="\n".join(answers)))
    finally:
        await env.close()
    return trace


async def explore(
    explorer: Any,
    make_env: Callable[[], Any],
    profile: EnvProfile,
    config: ExploreConfig,
    seed: int = 0,
) -> list[ExplorationTrace]:
    """Every session of both phases (``config.concurrency`` at a time), in session order."""
    slots = asyncio.Semaphore(config.concurrency)

    async def run(session: Session) -> ExplorationTrace:
        async with slots:
            return await explore_session(explorer, make_env, profile, session, config, seed)

    return list(await asyncio.gather(*(run(s) for s in session_tasks(profile, config))))
