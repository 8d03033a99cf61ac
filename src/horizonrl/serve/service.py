"""What ``horizon serve`` does, apart from HTTP: chat and text completions on the engine, token
capture into sessions, and swapping the weights between requests.

Every request goes through the engine's ``generate`` (one call per choice), so concurrent requests
are batched by the engine as the agent loop's are. A weight swap (:meth:`PolicyService.swap_weights`)
stops admitting requests, waits until none is in flight, updates the engine and lets requests in
again, so no completion mixes two versions of the weights; each completion reports the version it
was sampled from (``horizon.policy_version``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.agent.chat import ChatFormat
from horizonrl.agent.parsing import TOOL_CALL_OPEN
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import ConstraintError
from horizonrl.seeds import derive_seed
from horizonrl.serve.messages import assistant_turn, to_messages, tool_specs
from horizonrl.serve.protocol import (
    APIError,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    CompletionLogprobs,
    CompletionRequest,
    HorizonInfo,
    ModelCard,
    TextChoice,
    TextCompletion,
    TokenLogprob,
    TopLogprob,
    Usage,
    bad_request,
)
from horizonrl.serve.sessions import Session, SessionStore
from horizonrl.serve.structured import (
    ChatStructure,
    chat_structure,
    constraint_error,
    finish_reason,
    from_structured_outputs,
)
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


@dataclass
class SwapRecord:
    """One weight swap: how long requests were held back, and how long the update itself took."""

    version: int
    paused_s: float
    update_s: float


@dataclass
class _Turn:
    """One choice being generated: its prompt, sampling parameters and (when streaming) its queue."""

    prompt: list[int]
    params: SamplingParams
    task: asyncio.Task[Completion] | None = None


@dataclass
class PolicyService:
    """Chat and text completions on ``engine`` (see the module doc)."""

    engine: Any
    tokenizer: Any
    model_name: str
    limits: ServeLimits = field(default_factory=ServeLimits)
    created: int = field(default_factory=lambda: int(time.time()))
    swaps: list[SwapRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sessions = SessionStore(self.limits.max_sessions)
        self.max_context = int(self.engine.max_context)
        self._formats: dict[tuple[str, ...], ChatFormat] = {}
        self._in_flight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        #: the engine calls back per token (an engine in another process answers whole completions:
        #: a stream then carries the text in its last chunk)
        self._streams_tokens = "on_token" in inspect.signature(self.engine.generate).parameters

    # ------------------------------------------------------------------------------ plumbing
    def chat_format(self, tools: list[ToolSpec]) -> ChatFormat:
        key = tuple(t.model_dump_json() for t in tools)
        if key not in self._formats:
            self._formats[key] = ChatFormat(self.tokenizer, tools, frozenset(self.engine.eos_token_ids))
        return self._formats[key]

    def models(self) -> list[ModelCard]:
        return [ModelCard(id=self.model_name, created=self.created)]

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

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

    async def _admit(self, n: int) -> None:
        """Wait while a weight swap holds requests back; refuse (429) past ``max_in_flight``."""
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
        self._in_flight += n
        self._idle.clear()

    def _release(self, n: int) -> None:
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

    def _limit(self, prompt_len: int, asked: int | None, what: str) -> int:
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

    def _logprob_entries(self, completion: Completion, want_top: int) -> list[TokenLogprob]:
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

    # ------------------------------------------------------------------------------ chat
    def _chat_plan(
        self, req: ChatCompletionRequest, session: Session | None
    ) -> tuple[ChatFormat, list[ToolSpec], ChatStructure, list[_Turn]]:
        """Validate ``req`` and lay out its choices (prompt tokens and sampling per choice, each held
        to the request's constraint: :mod:`horizonrl.serve.structured`)."""
        req.check_neutral()
        self.check_model(req.model)
        messages = to_messages(req.messages)
        tools = tool_specs(req.tools, req.tool_choice)
        structure = chat_structure(req, tools)
        chat = self.chat_format(tools)
        if session is not None:
            if req.n != 1:
                raise bad_request(
                    "n must be 1 for a request in a session (X-Session-Id or user): a session is one "
                    "trajectory",
                    param="n",
                )
            prompt = session.prompt_for(messages, chat, tools)
        else:
            prompt = chat.prompt_ids(messages)
        forced = session.forced if session is not None else None
        asked = req.token_limit
        if forced is not None:
            asked = min(asked or forced.max_new_tokens, forced.max_new_tokens)
        if session is not None and session.token_budget is not None:
            left = session.token_budget - len(prompt)
            if left <= 0:
                raise APIError(
                    400,
                    f"session {session.id!r} has used its token budget of {session.token_budget} tokens "
                    f"(agent.max_total_tokens): the conversation is {len(prompt)} tokens long",
                    param="messages",
                    code="context_length_exceeded",
                )
            asked = min(asked, left) if asked is not None else left
        limit = self._limit(len(prompt), asked, "messages")
        turns = []
        for i in range(req.n):
            if forced is not None:
                seed = (
                    derive_seed(forced.seed, session.id, session.num_turns)
                    if forced.seed is not None
                    else None
                )
                params = forced.model_copy(update={"max_new_tokens": limit, "seed": seed})
            else:
                params = SamplingParams(
                    temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    max_new_tokens=limit,
                    stop=req.stops,
                    seed=None if req.seed is None else derive_seed(req.seed, i),
                    top_logprobs=req.top_logprobs or 0,
                )
            if req.top_logprobs and forced is not None:
                params = params.model_copy(update={"top_logprobs": req.top_logprobs})
            if structure.constraint is not None:
                params = params.model_copy(update={"constraint": structure.constraint})
            turns.append(_Turn(prompt, params))
        return chat, tools, structure, turns

    def _session_of(self, session_id: str | None) -> Session | None:
        return self.sessions.get_or_create(session_id) if session_id else None

    async def chat(self, req: ChatCompletionRequest, session_id: str | None = None) -> ChatCompletion:
        """A chat completion (all choices at once)."""
        session = self._session_of(session_id)
        if session is None:
            return await self._chat(req, None)
        async with session.lock:
            return await self._chat(req, session)

    async def _chat(self, req: ChatCompletionRequest, session: Session | None) -> ChatCompletion:
        chat, tools, structure, turns = self._chat_plan(req, session)
        await self._admit(len(turns))
        try:
            started = time.perf_counter()
            completions = await asyncio.gather(*(self.engine.generate(t.prompt, t.params) for t in turns))
            engine_ms = 1000 * (time.perf_counter() - started)
        except ConstraintError as exc:
            raise constraint_error(exc, structure.param) from None
        finally:
            self._release(len(turns))
        choices = []
        for i, completion in enumerate(completions):
            text = chat.decode(list(completion.token_ids))
            prefix = self._call_prefix(session, i)
            internal, message = assistant_turn(text, bool(tools), prefix, structure.max_calls)
            if session is not None:
                session.record_turn(completion, chat, internal, turns[i].params.constraint)
            finish = finish_reason(completion, bool(message.tool_calls))
            logprobs = (
                ChoiceLogprobs(content=self._logprob_entries(completion, req.top_logprobs or 0))
                if req.logprobs
                else None
            )
            choices.append(ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=finish))
        prompt_tokens = len(turns[0].prompt)
        completion_tokens = sum(len(c.token_ids) for c in completions)
        version = completions[0].weights_version if completions else self.policy_version
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
            created=int(time.time()),
            model=self.model_name,
            system_fingerprint=f"horizonrl-w{version}",
            choices=choices,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
            horizon=HorizonInfo(
                session_id=session.id if session else None,
                policy_version=version,
                engine_ms=round(engine_ms, 3),
            ),
        )

    @staticmethod
    def _call_prefix(session: Session | None, choice: int) -> str:
        turn = session.num_turns + 1 if session is not None else 1
        return f"call_{uuid.uuid4().hex[:8]}_{turn}_{choice}"

    async def chat_stream(
        self, req: ChatCompletionRequest, session_id: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """A chat completion as OpenAI's ``chat.completion.chunk`` objects: the role, then content as
        it is sampled (text that may begin a tool call is held back until it is clear), then each
        choice's tool calls and finish reason, then (with ``stream_options.include_usage``) usage.
        A bad request raises before the first chunk (the caller takes the first chunk before it
        answers); closing the iterator cancels generation (the engine drops the rows)."""
        session = self._session_of(session_id)
        if session is None:
            async for item in self._stream(req, None):
                yield item
            return
        async with session.lock:
            async for item in self._stream(req, session):
                yield item

    async def _stream(
        self, req: ChatCompletionRequest, session: Session | None
    ) -> AsyncIterator[dict[str, Any]]:
        chat, tools, structure, turns = self._chat_plan(req, session)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
            body: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "system_fingerprint": f"horizonrl-w{self.policy_version}",
                "choices": choices,
            }
            if usage is not None:
                body["usage"] = usage.model_dump()
            return body

        admitted = False
        try:
            await self._admit(len(turns))
            admitted = True
            merged: asyncio.Queue[tuple[int, int, float] | tuple[int, None, None]] = asyncio.Queue()
            for i, turn in enumerate(turns):

                def on_token(tok: int, lp: float, i: int = i) -> None:
                    merged.put_nowait((i, tok, lp))

                streaming = {"on_token": on_token} if self._streams_tokens else {}
                turn.task = asyncio.ensure_future(self.engine.generate(turn.prompt, turn.params, **streaming))
                turn.task.add_done_callback(lambda _t, i=i: merged.put_nowait((i, None, None)))
            for i in range(len(turns)):
                yield chunk(
                    [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                )
            tokens: list[list[int]] = [[] for _ in turns]
            shown = [0] * len(turns)
            done = 0
            while done < len(turns):
                i, tok, _ = await merged.get()
                if tok is None:
                    done += 1
                    continue
                tokens[i].append(tok)
                text = chat.decode(list(tokens[i]))
                visible = _safe_prefix(text, bool(tools))
                if len(visible) > shown[i]:
                    yield chunk(
                        [{"index": i, "delta": {"content": visible[shown[i] :]}, "finish_reason": None}]
                    )
                    shown[i] = len(visible)
            completions = [t.task.result() for t in turns]  # type: ignore[union-attr]
            for i, completion in enumerate(completions):
                text = chat.decode(list(completion.token_ids))
                prefix = self._call_prefix(session, i)
                internal, message = assistant_turn(text, bool(tools), prefix, structure.max_calls)
                if session is not None:
                    session.record_turn(completion, chat, internal, turns[i].params.constraint)
                delta: dict[str, Any] = {}
                final_text = message.content or ""
                if not message.tool_calls and len(text) > shown[i]:
                    delta["content"] = text[shown[i] :]
                elif message.tool_calls and len(final_text) > shown[i]:
                    delta["content"] = final_text[shown[i] :]
                if message.tool_calls:
                    delta["tool_calls"] = [
                        {"index": k, **c.model_dump()} for k, c in enumerate(message.tool_calls)
                    ]
                finish = finish_reason(completion, bool(message.tool_calls))
                yield chunk([{"index": i, "delta": delta, "finish_reason": finish}])
            if req.stream_options is not None and req.stream_options.include_usage:
                prompt_tokens = len(turns[0].prompt)
                completion_tokens = sum(len(c.token_ids) for c in completions)
                yield chunk(
                    [],
                    Usage(
                        prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens,
                    ),
                )
        finally:
            for turn in turns:
                if turn.task is not None and not turn.task.done():
                    turn.task.cancel()  # the engine drops the row at its next step
            if admitted:
                self._release(len(turns))
            if session is not None:
                session.lock.release()

    # ------------------------------------------------------------------------------ text
    async def complete(self, req: CompletionRequest) -> TextCompletion:
        """A text completion of raw prompts (no chat template)."""
        req.check_neutral()
        self.check_model(req.model)
        constraint = from_structured_outputs(req.structured_outputs)
        prompts = []
        for p in req.prompts():
            ids = (
                list(self.tokenizer(p, add_special_tokens=False)["input_ids"])
                if isinstance(p, str)
                else list(p)
            )
            if not ids:
                raise bad_request("'prompt' must not be empty", param="prompt")
            if min(ids) < 0 or max(ids) >= self.engine.vocab_size:
                raise bad_request(
                    f"prompt token ids must lie in [0, {self.engine.vocab_size})", param="prompt"
                )
            prompts.append(ids)
        jobs = []
        for p_index, ids in enumerate(prompts):
            limit = self._limit(len(ids), req.max_tokens, "prompt")
            for i in range(req.n):
                seed = None if req.seed is None else derive_seed(req.seed, p_index, i)
                params = SamplingParams(
                    temperature=1.0 if req.temperature is None else req.temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    max_new_tokens=limit,
                    stop=req.stops,
                    seed=seed,
                    top_logprobs=req.logprobs or 0,
                    constraint=constraint,
                )
                jobs.append((ids, params))
        await self._admit(len(jobs))
        try:
            completions = await asyncio.gather(*(self.engine.generate(ids, params) for ids, params in jobs))
        except ConstraintError as exc:
            raise constraint_error(exc, "structured_outputs") from None
        finally:
            self._release(len(jobs))
        choices = []
        eos = set(self.engine.eos_token_ids)
        for index, completion in enumerate(completions):
            ids = [t for t in completion.token_ids]
            shown = ids[:-1] if ids and ids[-1] in eos else ids
            text = self.tokenizer.decode(shown, skip_special_tokens=False)
            choices.append(
                TextChoice(
                    index=index,
                    text=text,
                    logprobs=self._text_logprobs(completion, req.logprobs, req.return_tokens_as_token_ids)
                    if req.logprobs is not None
                    else None,
                    finish_reason=completion.finish_reason,
                    token_ids=list(completion.token_ids) if req.return_token_ids else None,
                )
            )
        prompt_tokens = sum(len(ids) for ids in prompts)
        completion_tokens = sum(len(c.token_ids) for c in completions)
        return TextCompletion(
            id=f"cmpl-{uuid.uuid4().hex[:24]}",
            created=int(time.time()),
            model=self.model_name,
            system_fingerprint=f"horizonrl-w{self.policy_version}",
            choices=choices,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )

    def _text_logprobs(self, completion: Completion, top: int, as_ids: bool = False) -> CompletionLogprobs:
        if as_ids:  # vLLM's form, for clients that need the exact tokens
            tokens = [f"token_id:{t}" for t in completion.token_ids]
        else:
            tokens = [self.tokenizer.decode([t]) for t in completion.token_ids]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        tops = None
        if top and completion.top_logprobs is not None:
            tops = [{self.tokenizer.decode([i]): v for i, v in row[:top]} for row in completion.top_logprobs]
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=list(completion.logprobs), top_logprobs=tops, text_offset=offsets
        )


def _safe_prefix(text: str, with_tools: bool) -> str:
    """The part of a growing turn's text that can be streamed as content now: without a trailing
    incomplete character, and (with tools) nothing from a tool-call tag on, nor a tail that may
    still become one."""
    text = text.rstrip("\ufffd")
    if not with_tools:
        return text
    cut = text.find(TOOL_CALL_OPEN)
    if cut >= 0:
        return text[:cut].rstrip()
    for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-k:]):
            text = text[:-k]
            break
    return text.rstrip()  # whitespace waits: it may be all that stands before a tool call
