"""Chat completions (``/v1/chat/completions``) on the served engine: a request laid out as choices
(prompt tokens and sampling per choice, each held to the request's constraint:
:mod:`horizonrl.serve.structured`), then answered whole (:func:`complete`) or streamed as OpenAI's
``chat.completion.chunk`` objects (:func:`stream`). Every choice is one call of the engine's
``generate``, so concurrent requests are batched by the engine as the agent loop's are; a request
in a session continues that session's token record (:mod:`horizonrl.serve.sessions`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from horizonrl.chat import ChatFormat
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.constraints import ConstraintError
from horizonrl.seeds import derive_seed
from horizonrl.serve.admission import ServedEngine
from horizonrl.serve.messages import assistant_turn, to_messages, tool_specs
from horizonrl.serve.protocol import (
    APIError,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    HorizonInfo,
    Usage,
    bad_request,
)
from horizonrl.serve.sessions import Session
from horizonrl.serve.structured import ChatStructure, chat_structure, constraint_error, finish_reason
from horizonrl.toolcalls import TOOL_CALL_OPEN
from horizonrl.types import ToolSpec


@dataclass
class _Turn:
    """One choice being generated: its prompt, sampling parameters, LoRA adapter (None: the base
    model) and (when streaming) its task."""

    prompt: list[int]
    params: SamplingParams
    adapter: str | None = None
    task: asyncio.Task[Completion] | None = None


def plan(
    served: ServedEngine, req: ChatCompletionRequest, session: Session | None
) -> tuple[ChatFormat, list[ToolSpec], ChatStructure, list[_Turn]]:
    """Validate ``req`` and lay out its choices (prompt tokens and sampling per choice, each held
    to the request's constraint: :mod:`horizonrl.serve.structured`)."""
    req.check_neutral()
    adapter = served.check_model(req.model)
    messages = to_messages(req.messages)
    tools = tool_specs(req.tools, req.tool_choice)
    structure = chat_structure(req, tools)
    chat = served.chat_format(tools)
    if session is not None:
        if req.n != 1:
            raise bad_request(
                "n must be 1 for a request in a session (X-Session-Id or user): a session is one trajectory",
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
    limit = served.completion_limit(len(prompt), asked, "messages")
    turns = []
    for i in range(req.n):
        if forced is not None:
            seed = (
                derive_seed(forced.seed, session.id, session.num_turns) if forced.seed is not None else None
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
        turns.append(_Turn(prompt, params, adapter))
    return chat, tools, structure, turns


async def complete(
    served: ServedEngine, req: ChatCompletionRequest, session: Session | None
) -> ChatCompletion:
    """A chat completion, all choices at once (``session``: the conversation it continues, its lock
    held by the caller)."""
    chat, tools, structure, turns = plan(served, req, session)
    adapter = turns[0].adapter
    await served.admit(len(turns), adapter)
    try:
        started = time.perf_counter()
        completions = await asyncio.gather(*(served.generate(t.prompt, t.params, adapter) for t in turns))
        engine_ms = 1000 * (time.perf_counter() - started)
    except ConstraintError as exc:
        raise constraint_error(exc, structure.param) from None
    finally:
        served.release(len(turns), adapter)
    choices = []
    for i, completion in enumerate(completions):
        text = chat.decode(list(completion.token_ids))
        prefix = _call_prefix(session, i)
        internal, message = assistant_turn(text, bool(tools), prefix, structure.max_calls)
        if session is not None:
            session.record_turn(completion, chat, internal, turns[i].params.constraint)
        finish = finish_reason(completion, bool(message.tool_calls))
        logprobs = (
            ChoiceLogprobs(content=served.logprob_entries(completion, req.top_logprobs or 0))
            if req.logprobs
            else None
        )
        choices.append(ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=finish))
    prompt_tokens = len(turns[0].prompt)
    completion_tokens = sum(len(c.token_ids) for c in completions)
    version = completions[0].weights_version if completions else served.policy_version
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        created=int(time.time()),
        model=req.model,  # the base model's name or the adapter's
        system_fingerprint=f"horizonrl-w{version}",
        choices=choices,
        usage=Usage.counted(prompt_tokens, completion_tokens),
        horizon=HorizonInfo(
            session_id=session.id if session else None,
            policy_version=version,
            engine_ms=round(engine_ms, 3),
        ),
    )


def _call_prefix(session: Session | None, choice: int) -> str:
    turn = session.num_turns + 1 if session is not None else 1
    return f"call_{uuid.uuid4().hex[:8]}_{turn}_{choice}"


async def stream(
    served: ServedEngine, req: ChatCompletionRequest, session: Session | None
) -> AsyncIterator[dict[str, Any]]:
    """A chat completion as ``chat.completion.chunk`` objects (:meth:`PolicyService.chat_stream
    <horizonrl.serve.service.PolicyService.chat_stream>`); the caller holds ``session``'s lock
    while it runs."""
    chat, tools, structure, turns = plan(served, req, session)
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: Usage | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "system_fingerprint": f"horizonrl-w{served.policy_version}",
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage.model_dump()
        return body

    admitted, adapter = False, turns[0].adapter
    try:
        await served.admit(len(turns), adapter)
        admitted = True
        merged: asyncio.Queue[tuple[int, int, float] | tuple[int, None, None]] = asyncio.Queue()
        for i, turn in enumerate(turns):

            def on_token(tok: int, lp: float, i: int = i) -> None:
                merged.put_nowait((i, tok, lp))

            streaming = {"on_token": on_token} if served.streams_tokens else {}
            turn.task = asyncio.ensure_future(served.generate(turn.prompt, turn.params, adapter, **streaming))
            turn.task.add_done_callback(lambda _t, i=i: merged.put_nowait((i, None, None)))
        for i in range(len(turns)):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
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
                yield chunk([{"index": i, "delta": {"content": visible[shown[i] :]}, "finish_reason": None}])
                shown[i] = len(visible)
        completions = [t.task.result() for t in turns]  # type: ignore[union-attr]
        for i, completion in enumerate(completions):
            text = chat.decode(list(completion.token_ids))
            prefix = _call_prefix(session, i)
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
                Usage.counted(prompt_tokens, completion_tokens),
            )
    finally:
        for turn in turns:
            if turn.task is not None and not turn.task.done():
                turn.task.cancel()  # the engine drops the row at its next step
        if admitted:
            served.release(len(turns), adapter)


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
