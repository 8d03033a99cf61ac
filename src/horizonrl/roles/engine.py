"""Roles served by an in-process engine: ``policy`` (the run's own engine, whose weights follow
training) and ``local`` (another Hugging Face model with an engine of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.constraints import Constraint
from horizonrl.roles.base import RoleError, RoleUsage, as_messages, check_sampling
from horizonrl.roles.config import RoleConfig
from horizonrl.roles.structured import StructuredReply, output_schema, parse_reply
from horizonrl.types import Message


class EngineRole:
    """A role answered by ``engine`` (anything with the Engine contract and ``max_context``): the
    messages are rendered with the tokenizer's chat template, generated, and decoded."""

    def __init__(self, name: str, engine: Any, tokenizer: Any, config: RoleConfig) -> None:
        self.name = name
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.chat_format = ChatFormat(
            tokenizer, [], frozenset(getattr(engine, "eos_token_ids", ()) or ()) or None
        )
        self._slots = asyncio.Semaphore(config.concurrency)
        self.usage = RoleUsage()

    async def chat(self, messages: Sequence[Message | dict[str, Any]], **sampling: Any) -> str:
        return await self._generate(messages, sampling, None)

    async def structured(
        self, messages: Sequence[Message | dict[str, Any]], schema: type[BaseModel], **sampling: Any
    ) -> StructuredReply[Any]:
        """A reply validated as ``schema``; with ``structured: enforce`` the engine holds it to the
        schema's JSON while generating (see :mod:`horizonrl.roles.structured`)."""
        enforce = self.config.structured == "enforce"
        constraint = Constraint(json_schema=output_schema(schema)) if enforce else None
        text = await self._generate(messages, sampling, constraint)
        reply = parse_reply(text, schema, enforced=enforce)
        self.usage.count(reply)
        return reply

    async def _generate(
        self, messages: Sequence[Message | dict[str, Any]], sampling: dict[str, Any], constraint: Any
    ) -> str:
        check_sampling(self.name, sampling)
        prompt = self.chat_format.prompt_ids(as_messages(messages))
        context = int(getattr(self.engine, "max_context", 0) or 0)
        wanted = int(sampling.get("max_tokens", self.config.max_tokens))
        if context:
            if len(prompt) >= context:
                raise RoleError(
                    f"role {self.name!r}: the messages take {len(prompt)} tokens, the model's context "
                    f"is {context}"
                )
            wanted = min(wanted, context - len(prompt))
        stop = sampling.get("stop") or ()
        params = SamplingParams(
            temperature=float(sampling.get("temperature", self.config.temperature)),
            top_p=float(sampling.get("top_p", self.config.top_p)),
            max_new_tokens=wanted,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=sampling.get("seed"),
            constraint=constraint,
        )
        async with self._slots:
            completion = await self.engine.generate(prompt, params)
        self.usage.add(len(prompt), len(completion.token_ids))
        return self.chat_format.decode(list(completion.token_ids))


def local_engine(path: str, dtype: str, seed: int = 0) -> tuple[Any, Any]:
    """An engine and tokenizer for a local model (``local`` roles)."""
    from horizonrl.engine.hf import HFEngine
    from horizonrl.engine.weights import sampler_model
    from horizonrl.model_config import ModelConfig
    from horizonrl.models import context_length, load_base

    cfg = ModelConfig(path=path, dtype=dtype)
    loaded = load_base(cfg)
    engine = HFEngine(
        sampler_model(loaded.base, "auto"),
        loaded.tokenizer,
        seed=seed,
        max_context=context_length(loaded.base, cfg),
    )
    return engine, loaded.tokenizer
