"""What ``horizon serve`` does, apart from HTTP: chat and text completions on the engine, token
capture into sessions, and swapping the weights between requests.

:class:`PolicyService` is the app's one object; each job is a module of its own:

- :mod:`horizonrl.serve.admission`: sharing the engine among requests (admission, the weight
  swap, the model's name and context room, token logprobs) — :class:`PolicyService` is one;
- :mod:`horizonrl.serve.chat_completions`: chat completions, whole or streamed, in a session or not;
- :mod:`horizonrl.serve.text_completions`: text completions of raw prompts;
- :mod:`horizonrl.serve.sessions`: the token record of each client-named session.

Every request goes through the engine's ``generate`` (one call per choice), so concurrent requests
are batched by the engine as the agent loop's are. A weight swap (:meth:`PolicyService.swap_weights`)
stops admitting requests, waits until none is in flight, updates the engine and lets requests in
again, so no completion mixes two versions of the weights; each completion reports the version it
was sampled from (``horizon.policy_version``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from horizonrl.serve import chat_completions, text_completions
from horizonrl.serve.admission import ServedEngine, ServeLimits, SwapRecord
from horizonrl.serve.protocol import ChatCompletion, ChatCompletionRequest, CompletionRequest, TextCompletion
from horizonrl.serve.sessions import Session, SessionStore

__all__ = ["PolicyService", "ServeLimits", "SwapRecord"]


@dataclass
class PolicyService(ServedEngine):
    """Chat and text completions on ``engine`` (see the module doc), with the sessions they continue."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sessions = SessionStore(self.limits.max_sessions)

    def _session_of(self, session_id: str | None) -> Session | None:
        return self.sessions.get_or_create(session_id) if session_id else None

    async def chat(self, req: ChatCompletionRequest, session_id: str | None = None) -> ChatCompletion:
        """A chat completion (all choices at once)."""
        session = self._session_of(session_id)
        if session is None:
            return await chat_completions.complete(self, req, None)
        async with session.lock:
            return await chat_completions.complete(self, req, session)

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
            async for item in chat_completions.stream(self, req, None):
                yield item
            return
        async with session.lock:
            async for item in chat_completions.stream(self, req, session):
                yield item

    async def complete(self, req: CompletionRequest) -> TextCompletion:
        """A text completion of raw prompts (no chat template)."""
        return await text_completions.complete(self, req)
