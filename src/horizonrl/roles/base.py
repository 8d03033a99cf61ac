"""The role client contract."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from horizonrl.errors import HorizonError
from horizonrl.roles.structured import StructuredReply
from horizonrl.types import Message

T = TypeVar("T", bound=BaseModel)

#: sampling keywords every backend understands
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "stop", "seed")


@dataclass
class RoleUsage:
    """What a role has cost so far: calls answered and the tokens read and written."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: structured requests, and those whose reply could not be used (no valid object)
    structured: int = 0
    unusable: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def count(self, reply: StructuredReply[Any]) -> None:
        self.structured += 1
        self.unusable += not reply.ok

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class RoleError(HorizonError):
    """A role could not be built or could not answer (says which role and why)."""


@runtime_checkable
class RoleClient(Protocol):
    """``await chat(messages, temperature=..., max_tokens=..., top_p=..., stop=..., seed=...)``
    returns the model's reply text; ``await structured(messages, Model, ...)`` a
    :class:`~horizonrl.roles.structured.StructuredReply` holding a validated ``Model`` (see
    :mod:`horizonrl.roles.structured`). Concurrent calls are batched (an engine batches them; an
    HTTP backend sends them concurrently)."""

    name: str

    async def chat(self, messages: Sequence[Message | dict[str, Any]], **sampling: Any) -> str: ...

    async def structured(
        self, messages: Sequence[Message | dict[str, Any]], schema: type[T], **sampling: Any
    ) -> StructuredReply[T]: ...


def as_messages(messages: Sequence[Message | dict[str, Any]]) -> list[Message]:
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]


def check_sampling(role: str, sampling: dict[str, Any]) -> None:
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise RoleError(
            f"role {role!r}: unknown sampling keywords {unknown}; valid: {', '.join(SAMPLING_KEYS)}"
        )


async def chat_many(
    client: RoleClient, conversations: Sequence[Sequence[Message | dict[str, Any]]], **sampling: Any
) -> list[str]:
    """Replies to many conversations at once (batched by the backend)."""
    return list(await asyncio.gather(*(client.chat(c, **sampling) for c in conversations)))
