"""Token capture: the completions of one session become one schema-v1 trajectory.

A session is named by the client (header ``X-Session-Id``, or the request's ``user`` field). Its
first request is rendered with the chat template; the model's tokens are appended as sampled (loss
mask 1, their sampling logprobs), then the template's end-of-turn tokens. A later request whose
messages extend the session's conversation (every message the session holds, the assistant turns
as the server returned them, then new tool or user messages) is answered on the session's own
token sequence plus the tokens of the new messages only — what the model produced is never
re-tokenized, exactly as the agent loop builds its sequence (:mod:`horizonrl.chat`), so the
trained tokens are the sampled ones.

A request that does not extend the session (the client rewrote or cut its history, or changed the
tools) starts the session's sequence again from a fresh rendering; this is *drift*, counted in the
trajectory's ``metrics``: ``drift_resets`` (how often) and ``dropped_model_tokens`` (model tokens of
the abandoned sequences, which are not trained on). The trajectory is the last sequence.

A session opened by a runner (:meth:`SessionStore.open`) belongs to one task: its conversation must
start with the task's messages, it may hold the env that ``/step`` acts on, and it may force the
sampling parameters (training samples at the recipe's temperature, whatever a client asks, so the
trainer's logprobs compare with the sampler's).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import Constraint
from horizonrl.envs.base import Env
from horizonrl.serve.messages import same_turn
from horizonrl.serve.protocol import APIError, bad_request
from horizonrl.tokens import ResponseStream
from horizonrl.types import ConstrainedSpan, FinishReason, Message, ToolSpec, Trajectory


def _tools_key(tools: list[ToolSpec]) -> tuple[str, ...]:
    return tuple(t.model_dump_json() for t in tools)


@dataclass
class Session(ResponseStream):
    """One client conversation's token sequence and what the runner bound to it."""

    id: str
    task_id: str | None = None
    group_id: str | None = None
    env: Env | None = None
    env_name: str = "external"
    #: the task's initial messages (a runner's session): a conversation must start with them
    initial: list[Message] | None = None
    #: sampling parameters every request of this session uses (a runner's session), else None
    forced: SamplingParams | None = None
    #: most tokens (prompt + response) the session's sequence may reach (a runner's agent budget)
    token_budget: int | None = None
    messages: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    num_turns: int = 0
    tools_key: tuple[str, ...] | None = None
    drift_resets: int = 0
    #: turns sampled under a constraint, and the distinct constraints (see Trajectory)
    constrained: list[ConstrainedSpan] = field(default_factory=list)
    constraints: list[dict[str, Any]] = field(default_factory=list)
    dropped_model_tokens: int = 0
    policy_versions: list[int] = field(default_factory=list)
    reward: float | None = None
    reward_metrics: dict[str, float] = field(default_factory=dict)
    env_done: bool = False
    closed: bool = False
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # ------------------------------------------------------------------------ building the sequence
    def prompt_for(self, messages: list[Message], chat: ChatFormat, tools: list[ToolSpec]) -> list[int]:
        """The token sequence to generate the next turn from (see the module doc); updates the
        session's conversation to ``messages``."""
        if self.closed:
            raise APIError(
                409,
                f"session {self.id!r} is closed (its reward was posted); use a new session id",
                code="session_closed",
            )
        if self.initial is not None and not _starts_with(messages, self.initial):
            raise bad_request(
                f"session {self.id!r} belongs to task {self.task_id!r}: its conversation must start with "
                "that task's messages (a session id cannot be reused for another task)",
                param="messages",
                code="session_task_mismatch",
            )
        key = _tools_key(tools)
        if self.prompt_ids and key == self.tools_key and self._extends(messages):
            new = messages[len(self.messages) :]
            self.append_env(chat.observation_ids(new))
            self.messages = self.messages + new
            return self.sequence
        if self.prompt_ids:  # drift: the client's conversation does not extend ours
            self.drift_resets += 1
            self.dropped_model_tokens += sum(self.loss_mask)
        self.tools_key = key
        self.messages = list(messages)
        self.prompt_ids = chat.prompt_ids(messages)
        self.response_ids, self.loss_mask, self.logprobs = [], [], []
        self.constrained = []
        return self.sequence

    def _extends(self, messages: list[Message]) -> bool:
        held = self.messages
        if len(messages) <= len(held) or not held or held[-1].role != "assistant":
            return False
        return all(same_turn(sent, kept) for sent, kept in zip(messages, held, strict=False))

    def record_turn(
        self, completion: Completion, chat: ChatFormat, message: Message, constraint: Constraint | None = None
    ) -> None:
        """Append a sampled turn (the model's tokens, then the template's end-of-turn tokens); a
        turn sampled under ``constraint`` is marked so that the trainer replays its masks."""
        ids = list(completion.token_ids)
        self.append_model(ids, completion.logprobs, constraint.as_record() if constraint else None)
        self.append_env(chat.close_turn_ids(ids))
        self.messages = [*self.messages, message]
        self.num_turns += 1
        self.policy_versions.append(completion.weights_version)
        self.last_used = time.monotonic()

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    # ------------------------------------------------------------------------ the record
    def trajectory(
        self,
        finish: FinishReason,
        reward: float,
        *,
        error: str | None = None,
        metrics: dict[str, float] | None = None,
        chat: ChatFormat | None = None,
    ) -> Trajectory:
        """The session as a schema-v1 trajectory (the last sequence; see the module doc)."""
        numbers: dict[str, float] = {
            "model_tokens": float(sum(self.loss_mask)),
            "env_tokens": float(len(self.loss_mask) - sum(self.loss_mask)),
            "drift_resets": float(self.drift_resets),
            "dropped_model_tokens": float(self.dropped_model_tokens),
        }
        if self.policy_versions:
            numbers["policy_version_min"] = float(min(self.policy_versions))
            numbers["policy_version_max"] = float(max(self.policy_versions))
        if chat is not None and self.messages:
            numbers["retokenize_drift"] = float(chat.drift(self.messages, self.sequence))
        numbers.update(self.reward_metrics)
        numbers.update(metrics or {})
        return Trajectory(
            id=self.id,
            task_id=self.task_id or self.id,
            group_id=self.group_id or self.task_id or self.id,
            env=self.env_name,
            messages=self.messages,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            reward=reward,
            turn_rewards=self.turn_rewards,
            num_turns=self.num_turns,
            finish=finish,
            error=error,
            metrics=numbers,
            constrained=list(self.constrained) or None,
            constraints=list(self.constraints) if self.constrained else None,
        )


def _starts_with(messages: list[Message], initial: list[Message]) -> bool:
    if len(messages) < len(initial):
        return False
    return all(m.role == i.role and m.content == i.content for m, i in zip(messages, initial, strict=False))


class SessionStore:
    """The server's sessions by id. Sessions a client opened by naming them are kept up to
    ``max_sessions`` (the least recently used is forgotten first); sessions a runner opened stay
    until the runner takes them (:meth:`take`)."""

    def __init__(self, max_sessions: int = 4096) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def open(self, session_id: str, **fields: Any) -> Session:
        """A runner's session (task, env, initial messages, forced sampling); the id must be new."""
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} is already open")
        session = Session(id=session_id, **fields)
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        """The session ``session_id``; raises 404 when there is none."""
        session = self._sessions.get(session_id)
        if session is None:
            raise APIError(
                404, f"no session {session_id!r} on this server", type="not_found_error", code="not_found"
            )
        return session

    def get_or_create(self, session_id: str) -> Session:
        """The session a client names (made on its first request)."""
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(id=session_id)
            self._sessions[session_id] = session
            self._evict()
        self._sessions.move_to_end(session_id)
        return session

    def take(self, session_id: str) -> Session:
        """Remove and return the session (a runner collecting its trajectory)."""
        session = self.get(session_id)
        del self._sessions[session_id]
        return session

    def _evict(self) -> None:
        while len(self._sessions) > self.max_sessions:
            victim = next((k for k, s in self._sessions.items() if s.task_id is None), None)
            if victim is None:
                return
            del self._sessions[victim]
