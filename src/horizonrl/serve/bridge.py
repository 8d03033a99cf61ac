"""The engine on its own thread's event loop, used from the HTTP server's loop.

The in-process engine decodes on its event loop's thread, one step at a time (for SmolLM2 on this
CPU a 32-row step takes ~70-100 ms); anything else on that loop waits for the step to end. With the
HTTP server on the same loop every request waited for a decode step before it was even parsed, and
again before its answer was sent (measured: ~75 ms of overhead per request at 32 concurrent
clients). ``horizon serve`` therefore runs the engine on the main thread (the one that loaded the
model: torch's OpenMP thread team stays one) and the HTTP server on a second thread; this bridge
carries each generate call over and its answer back, so parsing, templating and answering go on
while the engine decodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from horizonrl.engine.base import Completion, SamplingParams, serves_adapters


class EngineBridge:
    """``engine`` (running on ``loop``) as an engine for coroutines on another loop."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self.tokenizer = getattr(engine, "tokenizer", None)
        self.max_context = engine.max_context
        self.eos_token_ids = engine.eos_token_ids
        self.vocab_size = engine.vocab_size
        self.pad_token_id = engine.pad_token_id
        #: whether the engine serves LoRA adapters (:mod:`horizonrl.serve.loras`)
        self.serves_adapters = serves_adapters(engine)

    @property
    def weights_version(self) -> int:
        return int(self.engine.weights_version)

    @property
    def stats(self) -> dict[str, float]:
        return dict(self.engine.stats)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        on_token: Callable[[int, float], None] | None = None,
        adapter: str | None = None,
    ) -> Completion:
        """Run ``engine.generate`` on the engine's loop; cancelling this cancels it there (the engine
        drops the row at its next step). ``on_token`` is called on this loop; ``adapter`` names the
        engine's LoRA adapter (None: the base model)."""
        caller = asyncio.get_running_loop()
        relay = None
        if on_token is not None:

            def relay(token: int, logprob: float) -> None:
                caller.call_soon_threadsafe(on_token, token, logprob)

        kwargs: dict[str, Any] = {"on_token": relay} if relay is not None else {}
        if adapter is not None:
            kwargs["adapter"] = adapter
        future = asyncio.run_coroutine_threadsafe(
            self.engine.generate(prompt_ids, params, **kwargs), self.loop
        )
        return await asyncio.wrap_future(future)

    def update_weights(self, policy: Any, stages: Sequence[Any] = ()) -> None:
        """Update the engine's weights on its own thread (its loop runs no batch then: the service
        drains requests first); blocks until done."""

        async def update() -> None:
            self.engine.update_weights(policy, stages)

        asyncio.run_coroutine_threadsafe(update(), self.loop).result()

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(self.engine.adapters)

    def add_adapter(self, name: str, folder: Any) -> None:
        """The engine's ``add_adapter``, on the calling thread (a worker thread: it waits for the
        engine's running batch to finish, holding new rows back, and the engine's loop goes on)."""
        self.engine.add_adapter(name, folder)

    def remove_adapter(self, name: str) -> None:
        """The engine's ``remove_adapter``, on the calling thread (as :meth:`add_adapter`)."""
        self.engine.remove_adapter(name)

    def drop_caches(self) -> None:
        async def drop() -> None:
            self.engine.drop_caches()

        asyncio.run_coroutine_threadsafe(drop(), self.loop).result()
