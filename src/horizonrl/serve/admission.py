"""The engine as the policy server shares it among requests: who is admitted (at most
``max_in_flight`` choices at once, none while a weight swap runs), the swap itself, and what every
endpoint checks (the model's name, the room the context leaves) and renders (token logprobs).

Requests name the base model or one of the LoRA adapters served over it
(:mod:`horizonrl.serve.loras`); a request's choices are admitted under its adapter, which is not
unloaded before they have finished.

A weight swap (:meth:`ServedEngine.swap_weights`) stops admitting requests, waits until none is in
flight, updates the engine and lets requests in again, so no completion mixes two versions of the
weights; each completion reports the version it was sampled from (``horizon.policy_version``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.serve.loras import DEFAULT_MAX_LORAS, ServedLoras
from horizonrl.serve.protocol import APIError, ModelCard, TokenLogprob, TopLogprob
from horizonrl.types import ToolSpec


@dataclass
class ServeLimits:
    """Bounds of one server."""

    #: completion tokens when a request names no max_tokens (capped by what the context leaves)
    default_max_tokens: int = 512
    #: most choices generating or waiting at once; more answer 429
    max_in_flight: int = 256
    #: most client-named sessions kept (least recently used forgotten first)
    max_sessions: int = 4096
    #: most LoRA adapters loaded at once (``--max-loras``); another load is refused
    max_loras: int = DEFAULT_MAX_LORAS

    @classmethod
    def for_engine(
        cls, default_max_tokens: int, engine_batch_size: int, max_loras: int = DEFAULT_MAX_LORAS
    ) -> ServeLimits:
        """The bounds ``horizon serve`` runs with: ``default_max_tokens`` (the recipe's
        ``sampling.max_new_tokens``), requests in flight for eight batches of an engine that
        decodes ``engine_batch_size`` together (``engine.max_batch_size``), at least 64, and
        ``max_loras`` adapters."""
        return cls(
            default_max_tokens=default_max_tokens,
            max_in_flight=max(8 * engine_batch_size, 64),
            max_loras=max_loras,
        )


@dataclass
class SwapRecord:
    """One weight swap: how long requests were held back, and how long the update itself took."""

    version: int
    paused_s: float
    update_s: float


@dataclass
class ServedEngine:
    """``engine`` and ``tokenizer`` served as ``model_name`` within ``limits`` (see the module doc)."""

    engine: Any
    tokenizer: Any
    model_name: str
    limits: ServeLimits = field(default_factory=ServeLimits)
    created: int = field(default_factory=lambda: int(time.time()))
    swaps: list[SwapRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_context = int(self.engine.max_context)
        self._formats: dict[tuple[str, ...], ChatFormat] = {}
        self._in_flight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        #: the engine calls back per token (an engine in another process answers whole completions:
        #: a stream then carries the text in its last chunk)
        self.streams_tokens = "on_token" in inspect.signature(self.engine.generate).parameters
        self.loras = ServedLoras(self.engine, self.model_name, self.limits.max_loras)

    def chat_format(self, tools: list[ToolSpec]) -> ChatFormat:
        key = tuple(t.model_dump_json() for t in tools)
        if key not in self._formats:
            self._formats[key] = ChatFormat(self.tokenizer, tools, frozenset(self.engine.eos_token_ids))
        return self._formats[key]

    def models(self) -> list[ModelCard]:
        """The base model, then each LoRA adapter served over it."""
        return self.loras.cards(self.created)

    def check_model(self, name: str) -> str | None:
        """The engine's adapter for a request's ``model`` (None: the base model); 404 for a name
        that is neither the base model nor an adapter served."""
        return self.loras.resolve(name)

    def generate(self, prompt: list[int], params: SamplingParams, adapter: str | None, **kwargs: Any) -> Any:
        """The engine's ``generate`` of one choice under ``adapter`` (None: the base model)."""
        if adapter is not None:
            kwargs["adapter"] = adapter
        return self.engine.generate(prompt, params, **kwargs)

    @property
    def policy_version(self) -> int:
        return int(getattr(self.engine, "weights_version", 0))

    def engine_stats(self) -> dict[str, float]:
        """The engine's counters (requests, tokens, decode steps and rows: batching)."""
        stats = getattr(self.engine, "stats", None)
        return dict(stats) if isinstance(stats, dict) else {}

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def admit(self, n: int, adapter: str | None = None) -> None:
        """Wait while a weight swap holds requests back; refuse (429) past ``max_in_flight``, and
        (404) under an adapter unloaded meanwhile. Each admission is released (:meth:`release`)."""
        while not self._open.is_set():
            await self._open.wait()
        if self._in_flight + n > self.limits.max_in_flight:
            raise APIError(
                429,
                f"the server is full: {self._in_flight} completions in flight, at most "
                f"{self.limits.max_in_flight}; retry later",
                type="requests",
                code="rate_limit_exceeded",
            )
        self.loras.hold(adapter, n)
        self._in_flight += n
        self._idle.clear()

    def release(self, n: int, adapter: str | None = None) -> None:
        self.loras.let_go(adapter, n)
        self._in_flight -= n
        if self._in_flight == 0:
            self._idle.set()

    async def swap_weights(self, update: Callable[[], None]) -> SwapRecord:
        """Hold new requests back, wait for those in flight, run ``update`` (e.g.
        ``engine.update_weights(policy)``), let requests in again."""
        start = time.perf_counter()
        self._open.clear()
        try:
            await self._idle.wait()
            t0 = time.perf_counter()
            update()
            update_s = time.perf_counter() - t0
        finally:
            self._open.set()
        record = SwapRecord(self.policy_version, time.perf_counter() - start, update_s)
        self.swaps.append(record)
        return record

    def completion_limit(self, prompt_len: int, asked: int | None, what: str) -> int:
        """The completion tokens a request gets: what it asked for, if the context has room for it (else
        400), or the default held to the room left."""
        room = self.max_context - prompt_len
        if asked is not None and prompt_len + asked > self.max_context:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_context} tokens. However, you requested "
                f"{prompt_len + asked} tokens ({prompt_len} in the {what}, {asked} in the completion). "
                "Please reduce the length of the messages or the completion.",
                param="messages" if what == "messages" else "prompt",
                code="context_length_exceeded",
            )
        if room <= 0:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_context} tokens, and the {what} alone "
                f"take {prompt_len}. Please reduce the length of the {what}.",
                param="messages" if what == "messages" else "prompt",
                code="context_length_exceeded",
            )
        return asked if asked is not None else min(self.limits.default_max_tokens, room)

    def logprob_entries(self, completion: Completion, want_top: int) -> list[TokenLogprob]:
        entries = []
        tops = completion.top_logprobs or [[] for _ in completion.token_ids]
        for tok, lp, top in zip(completion.token_ids, completion.logprobs, tops, strict=True):
            text = self.tokenizer.decode([tok])
            entries.append(
                TokenLogprob(
                    token=text,
                    logprob=lp,
                    bytes=list(text.encode("utf-8")),
                    top_logprobs=[
                        TopLogprob(token=(t := self.tokenizer.decode([i])), logprob=v, bytes=list(t.encode()))
                        for i, v in top[:want_top]
                    ],
                )
            )
        return entries
