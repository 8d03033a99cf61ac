"""Roles served by any OpenAI-compatible endpoint, through the official ``openai`` package (its
retries with backoff and its timeouts): a hosted API, a vLLM server, or ``horizon serve``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from horizonrl.roles.base import RoleError, RoleUsage, as_messages, check_sampling
from horizonrl.roles.config import RoleConfig
from horizonrl.roles.structured import StructuredReply, output_schema, parse_reply
from horizonrl.types import Message


class OpenAIRole:
    """A role answered by ``config.base_url``'s ``config.model``; the API key is read from the
    environment variable ``config.api_key_env`` when the role is built."""

    def __init__(self, name: str, config: RoleConfig) -> None:
        import openai

        key = os.environ.get(config.api_key_env)
        if not key:
            raise RoleError(
                f"role {name!r} (backend openai, {config.base_url}): the environment variable "
                f"{config.api_key_env} holding its API key is not set (roles.{name}.api_key_env)"
            )
        self.name = name
        self.config = config
        self._openai = openai
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=key, timeout=config.timeout_s, max_retries=config.max_retries
        )
        self._slots = asyncio.Semaphore(config.concurrency)
        self.usage = RoleUsage()

    async def chat(self, messages: Sequence[Message | dict[str, Any]], **sampling: Any) -> str:
        return await self._complete(messages, sampling, {})

    async def structured(
        self, messages: Sequence[Message | dict[str, Any]], schema: type[BaseModel], **sampling: Any
    ) -> StructuredReply[Any]:
        """A reply validated as ``schema``; with ``structured: enforce`` the schema is sent as
        ``response_format`` (json_schema, strict) for the endpoint to enforce."""
        enforce = self.config.structured == "enforce"
        extra: dict[str, Any] = {}
        if enforce:
            extra["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": output_schema(schema), "strict": True},
            }
        text = await self._complete(messages, sampling, extra)
        reply = parse_reply(text, schema, enforced=enforce)
        self.usage.count(reply)
        return reply

    async def _complete(
        self, messages: Sequence[Message | dict[str, Any]], sampling: dict[str, Any], extra: dict[str, Any]
    ) -> str:
        check_sampling(self.name, sampling)
        payload = [m.to_dict() for m in as_messages(messages)]
        extra = {**extra, **{k: sampling[k] for k in ("stop", "seed") if sampling.get(k) is not None}}
        try:
            async with self._slots:
                reply = await self.client.chat.completions.create(
                    model=self.config.model,
                    messages=payload,
                    temperature=float(sampling.get("temperature", self.config.temperature)),
                    top_p=float(sampling.get("top_p", self.config.top_p)),
                    max_tokens=int(sampling.get("max_tokens", self.config.max_tokens)),
                    **extra,
                )
        except self._openai.APIStatusError as exc:
            message = exc.body.get("message") if isinstance(exc.body, dict) else exc.message
            raise RoleError(
                f"role {self.name!r}: {self.config.base_url} answered {exc.status_code}: {message}"
            ) from None
        except self._openai.APIError as exc:  # connection errors and timeouts, after the retries
            raise RoleError(
                f"role {self.name!r}: no answer from {self.config.base_url} after "
                f"{self.config.max_retries + 1} tries ({type(exc).__name__}: {exc})"
            ) from None
        if reply.usage is not None:
            self.usage.add(reply.usage.prompt_tokens, reply.usage.completion_tokens)
        return reply.choices[0].message.content or ""
