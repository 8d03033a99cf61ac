"""An in-process engine for Hugging Face causal LMs that batches concurrent requests itself.

Callers ``await engine.generate(prompt_ids, params)`` one prompt at a time. A background batcher
task collects whatever is pending (waiting a few milliseconds for stragglers), runs one batched
decode and resolves each caller's future as its row finishes.

The decode runs on the event loop's own thread, one step at a time, handing the loop back between
steps: environment steps, finished rows' next turns and new requests are served between two decode
steps, and new requests join the running batch (continuous batching). It does not run in a worker
thread because of OpenMP: every thread that runs parallel torch ops gets its own libgomp thread
team, and once a process has more such threads than CPUs, libgomp stops spin-waiting between
parallel regions (its "throttled" spin count), so each op pays a sleep/wake-up. Measured on this
2-core machine with SmolLM2-135M: a 32-row decode step 97 ms on the thread that also loaded the
model, 130 ms on a second thread; a GRPO update 26-29 s before the engine's thread had decoded,
35-40 s after. Keeping all torch work on one thread (the trainer's, which also runs the event loop
of its rollouts) keeps one team.

How a batch is decoded (prefill grouping, the shared-prefix and conversation KV caches, per-row
sampling) is :mod:`horizonrl.engine.decoder`'s job; this module schedules requests into batches,
resolves callers' futures and swaps weights between batches.

One engine serves several LoRA adapters of its base model (:meth:`HFEngine.add_adapter`): a request
names its adapter (``generate(..., adapter=name)``, or an :class:`AdapterView`
per adapter), and requests of different adapters are decoded in the same batches, each row selecting
its adapter in every forward (see :mod:`horizonrl.engine.adapters` for why per row).

On a CPU decoding is memory-bandwidth bound (a step costs about the same for 2 or 16 rows), so a
static batch runs about as fast as ``model.generate``; the gain comes from batching concurrent
agents without callers coordinating, and from cheaper prefill of prompts of different lengths.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from horizonrl.engine.adapters import (
    check_adapter_folder,
    check_adapter_name,
    load_adapter,
    strip_lora,
    unload_adapter,
)
from horizonrl.engine.base import Completion, SamplingParams
from horizonrl.engine.batch import Request, Row
from horizonrl.engine.decoder import Decoder
from horizonrl.engine.fast_copy import EXACT, copy_into_fast_copy, is_fast_copy
from horizonrl.engine.weights import copy_base_weights, copy_weights, is_same_model
from horizonrl.memory import limit_malloc_arenas, release_free_memory


class HFEngine:
    """Batched token-in / token-out generation for an in-process HF causal LM (see module doc).

    ``max_context`` defaults to ``model.config.max_position_embeddings``. ``eos_token_ids`` (the
    tokenizer's EOS plus ``generation_config.eos_token_id``) may be reassigned. Use the engine from
    one event loop at a time; the batcher restarts lazily on a new loop.

    :meth:`add_adapter` loads LoRA adapters onto ``model`` in place (PEFT injects its layers into
    it), so an engine that serves adapters needs a model of its own, not one a trainer also uses.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        seed: int = 0,
        max_context: int | None = None,
        fast_decode: bool = True,
        prefix_cache_mib: float = 384,
        continuous_batching: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_context = int(max_context or model.config.max_position_embeddings)
        self.decoder = Decoder(model, tokenizer, seed, fast_decode, prefix_cache_mib)
        self.continuous_batching = continuous_batching and self.decoder.mergeable_cache
        limit_malloc_arenas()  # threads that allocate (tokenizers, sandboxes) would fragment apart
        self._weights_lock = threading.Lock()  # held by a running batch, between its steps too
        self._batch_thread: int | None = None  # the thread whose event loop runs a batch now
        self._pending: list[Request] = []  # read and written on the event loop's thread only
        self._hold_admission = False  # set while a weights update waits for the running batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._closed = False
        self._peft: Any | None = None  # the PEFT model around ``model`` once an adapter is added
        self._adapter_calls: Counter[str | None] = Counter()  # generate calls running or queued

    # ----------------------------------------------------------------------------- public API
    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a row (the tokenizer's EOS plus ``generation_config.eos_token_id``)."""
        return self.decoder.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self.decoder.eos_token_ids = frozenset(ids)

    @property
    def vocab_size(self) -> int:
        return self.decoder.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.decoder.pad_token_id

    @property
    def weights_version(self) -> int:
        """How many times the weights were updated (KV caches from older versions are not reused)."""
        return self.decoder.weights_version

    @property
    def stats(self) -> dict[str, float]:
        """Counters for metrics: batches (decode runs), requests, tokens, rows per decode step
        (``mean_batch_size``), generate seconds."""
        s = self.decoder.stats
        return {
            "batches": s.batches,
            "requests": s.requests,
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "mean_batch_size": s.decode_rows / s.decode_steps if s.decode_steps else 0.0,
            "decode_steps": s.decode_steps,
            "decode_rows": s.decode_rows,
            "admitted_requests": s.admitted,
            "generate_s": s.generate_s,
            "tokens_per_s": s.generated_tokens / s.generate_s if s.generate_s else 0.0,
            "errors": s.errors,
            "prefix_reused_tokens": s.prefix_reused_tokens,
            "conversation_reused_tokens": s.conversation_reused_tokens,
            "conversation_cache_tokens": self.decoder.conversations.tokens,
            "conversation_cache_mib": self.decoder.conversations.bytes / 2**20,
            "weights_version": self.weights_version,
            "lora_adapters": len(self.adapters),
            **{f"constraint_{k}": v for k, v in self.decoder.constraints.stats.items()},
        }

    @property
    def adapters(self) -> tuple[str, ...]:
        """Names of the LoRA adapters served (:meth:`add_adapter`), in the order they were added."""
        return tuple(self._peft.peft_config) if self._peft is not None else ()

    @property
    def serves_adapters(self) -> bool:
        """Whether :meth:`add_adapter` can serve adapters per row (not on the fast sampling copy)."""
        return not is_fast_copy(self.model)

    def add_adapter(self, name: str, folder: str | Path) -> None:
        """Serve the LoRA adapter saved in ``folder`` (as ``PeftModel.save_pretrained`` writes it:
        ``adapter_config.json`` and ``adapter_model.safetensors``) as ``name``, for requests that name
        it (``generate(..., adapter=name)``, :meth:`view`); a name already served is replaced.

        The adapter stays unmerged, in the dtype of the layers it adapts, next to the others on the
        one base model: each row of a batch selects its own adapter in every forward (see
        :mod:`horizonrl.engine.adapters`). The first adapter wraps the engine's plain model in a PEFT
        model. Waits for a running batch to finish (like :meth:`update_weights`) and drops the kept KV
        caches. The weights version does not move (it counts :meth:`update_weights`).

        ValueError (one line naming the folder) when ``folder`` holds no adapter or one whose target
        modules or shapes do not fit the model, and for the reserved name ``"__base__"``."""
        check_adapter_name(name)
        if is_fast_copy(self.model):
            raise ValueError(
                f"the fast sampling copy (int8 or float16) serves no per-row LoRA adapters ({name!r}); "
                f"{EXACT}"
            )
        folder = Path(folder)
        if self._peft is None and hasattr(self.model, "peft_config"):
            raise RuntimeError(
                "add_adapter: the engine's model is a PEFT model already; give the engine a plain model"
            )
        check_adapter_folder(folder, self.model)  # before waiting for a batch: nothing changes yet
        with self._between_batches("add_adapter"):
            try:
                self._peft = load_adapter(self.model, self._peft, name, folder)
            finally:
                if self._peft is not None and not self._peft.peft_config:  # failed to replace the last one
                    strip_lora(self.model)
                    self._peft = None
                if self._peft is not None:
                    self.decoder.use_model(self._peft, per_row_adapters=True)
                else:
                    self.decoder.use_model(self.model, per_row_adapters=False)

    def remove_adapter(self, name: str) -> None:
        """Stop serving the LoRA adapter ``name`` and free its weights (the last one removed leaves the
        plain model); waits for a running batch to finish and drops the kept KV caches. ValueError
        for a name not served; RuntimeError, changing nothing, while ``generate`` calls of it are
        running or queued (remove it once they have finished: nothing is cut off)."""
        self._check_removable(name)  # at once, before waiting for a batch
        with self._between_batches("remove_adapter"):
            self._check_removable(name)  # a request may have come meanwhile
            self._peft = unload_adapter(self.model, self._peft, name)
            self.decoder.use_model(self._peft or self.model, per_row_adapters=self._peft is not None)
        release_free_memory()

    def _check_removable(self, name: str) -> None:
        self._check_adapter(name)
        if busy := self._adapter_calls[name]:
            raise RuntimeError(
                f"remove_adapter: adapter {name!r} has {busy} request(s) running or queued; "
                "remove it once they have finished"
            )

    def view(self, adapter: str | None) -> AdapterView:
        """This engine as an Engine that decodes with ``adapter`` (None: the base model), for code
        that takes an engine; its requests share batches with every other adapter's."""
        self._check_adapter(adapter)
        return AdapterView(self, adapter)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        on_token: Callable[[int, float], None] | None = None,
        adapter: str | None = None,
    ) -> Completion:
        """Generate a continuation of ``prompt_ids``; concurrent calls share batches. ``on_token`` is
        called with each token id and logprob as it is sampled (for streaming). ``adapter`` names the
        LoRA adapter to decode with (:meth:`add_adapter`; None: the base model). Cancelling the call
        (e.g. a client that disconnected) drops its row from the running batch at the next step."""
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        params = params or SamplingParams()
        ids = [int(t) for t in prompt_ids]
        self._check_request(ids, params)
        self._adapter_calls[adapter] += 1  # before the check: remove_adapter sees it, or it the removal
        try:
            self._check_adapter(adapter)
            loop = asyncio.get_running_loop()
            if self._loop is not loop or self._batcher is None or self._batcher.done():
                self._start_batcher(loop)
            assert self._wakeup is not None
            matcher = self.decoder.constraints.matcher(params.constraint) if params.constraint else None
            future: asyncio.Future[Completion] = loop.create_future()
            self._pending.append(Request(ids, params, future, loop.time(), on_token, adapter, matcher))
            self._wakeup.set()
            return await future
        finally:
            self._adapter_calls[adapter] -= 1

    def update_weights(self, policy: Any, stages: Sequence[Any] = ()) -> None:
        """Sample from ``policy``'s weights from now on; waits for a running batch to finish (call
        it from another thread then, or between rollouts: the batch runs on its event loop's thread).

        With adapters served, ``policy``'s weights (merged, for a LoRA policy) become the base
        weights under the adapters, which stay as they are (replace one with :meth:`add_adapter`)."""
        with self._between_batches("update_weights"):
            if is_fast_copy(self.model):
                copy_into_fast_copy(policy, self.model)
            elif self._peft is not None:
                if policy is not self._peft and not is_same_model(policy, self.model):
                    copy_base_weights(policy, self.model)
            elif not is_same_model(policy, self.model):
                copy_weights(policy, self.model)
            self.decoder.new_weights()

    def drop_caches(self) -> None:
        """Free the KV caches kept for later requests (shared prefix, conversations), e.g. before
        a training stage needs the memory; waits for a running batch to finish."""
        with self._between_batches("drop_caches"):
            self.decoder.forget_caches()
        release_free_memory()

    @contextlib.contextmanager
    def _between_batches(self, what: str) -> Iterator[None]:
        """Hold the weights lock once a running batch has finished (no new rows join it meanwhile).

        A running batch holds the lock between its steps on its event loop's thread, so a call from
        that thread would wait for itself: it is refused."""
        if self._batch_thread == threading.get_ident():
            raise RuntimeError(
                f"HFEngine.{what} was called on the thread whose event loop is running a batch, which "
                "would wait for that batch forever; call it when no generate() is in flight (between "
                "rollouts) or from another thread"
            )
        self._hold_admission = True
        with self._weights_lock:
            self._hold_admission = False
            yield

    async def close(self) -> None:
        """Stop the batcher; pending and in-flight requests fail with RuntimeError."""
        self._closed = True
        batcher, same_loop = self._batcher, self._loop is asyncio.get_running_loop()
        if batcher is not None and not batcher.done() and same_loop:  # a dead loop's task cannot run again
            batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batcher
        self._fail_pending(RuntimeError("HFEngine closed"))

    # ----------------------------------------------------------------------------- batching
    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is not None and adapter not in self.adapters:
            known = ", ".join(repr(a) for a in self.adapters) or "none added"
            raise ValueError(f"unknown adapter {adapter!r} (adapters: {known}; None selects the base model)")

    def _check_request(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise ValueError("generate: the prompt is empty")
        if len(ids) >= self.max_context:
            raise ValueError(
                f"generate: the prompt has {len(ids)} tokens but the model's context is {self.max_context}"
            )
        if len(ids) + params.max_new_tokens > self.max_context:
            raise ValueError(
                f"generate: prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                f"exceeds the model's context of {self.max_context} tokens"
            )
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ValueError(
                f"generate: token ids must lie in [0, {self.vocab_size}), got {min(ids)}..{max(ids)}"
            )

    def _start_batcher(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:  # requests of a previous (closed) loop can never be served
            self._pending.clear()
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._batcher = loop.create_task(self._batch_forever(), name="hfengine-batcher")
        self._batcher.add_done_callback(self._on_batcher_done)

    def _on_batcher_done(self, task: asyncio.Task[None]) -> None:
        """If the batcher dies unexpectedly, fail waiting callers instead of leaving them hanging."""
        if not task.cancelled() and task.exception() is not None:
            self._fail_pending(RuntimeError(f"HFEngine batcher crashed: {task.exception()!r}"))

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, []
        for req in pending:
            if not req.future.done():
                req.future.set_exception(exc)

    def _admit(self, batch_rows: int) -> list[Request]:
        """Take pending requests into a running batch of ``batch_rows`` rows, up to
        ``max_batch_size`` (none while a weights update waits for the batch)."""
        room = self.max_batch_size - batch_rows
        if room <= 0 or self._hold_admission or not self._pending:
            return []
        taken, self._pending = self._pending[:room], self._pending[room:]
        joined = self._servable(taken)
        self._count_requests(joined)
        self.decoder.stats.admitted += len(joined)
        return joined

    def _servable(self, requests: list[Request]) -> list[Request]:
        """``requests`` less the abandoned ones and those whose adapter was removed after they were
        queued (they fail alone, with ValueError, instead of failing the batch in a forward)."""
        served = {None, *self.adapters}
        for r in requests:
            if r.adapter not in served and not r.abandoned:
                r.future.set_exception(ValueError(f"adapter {r.adapter!r} was removed before it ran"))
        return [r for r in requests if not r.abandoned]

    async def _batch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup
        assert wakeup is not None
        while True:
            while not self._pending:
                wakeup.clear()
                await wakeup.wait()
            deadline = self._pending[0].arrival + self.batch_wait_s
            while len(self._pending) < self.max_batch_size and (remaining := deadline - loop.time()) > 0:
                wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), remaining)
            batch = self._servable(self._pending[: self.max_batch_size])
            del self._pending[: self.max_batch_size]
            if batch:
                await self._run_batch(batch)

    #: Event-loop passes handed back after a step that finished rows, so their callers' next turns
    #: (tool call, environment step, next prompt) can arrive and join the running batch.
    settle_passes: int = 8

    async def _run_batch(self, batch: list[Request]) -> None:
        """Decode ``batch`` step by step on this loop's thread, handing the loop back between steps.
        Each request's future is resolved as soon as its row finishes (not when the whole batch
        does); with continuous batching, requests that arrive meanwhile join the running batch
        (``inflight`` grows)."""
        start = time.perf_counter()
        inflight = list(batch)
        self._count_requests(batch)
        self.decoder.stats.batches += 1

        def deliver(row: Row) -> None:
            assert row.request is not None
            if not row.request.future.done():
                row.request.future.set_result(row.completion())

        self._weights_lock.acquire()  # an update from another thread finishes first
        self._batch_thread = threading.get_ident()
        steps = self.decoder.run(inflight, deliver, self._admit if self.continuous_batching else None)
        try:
            while True:
                with torch.inference_mode():  # per step: other coroutines run between steps
                    delivered = next(steps, None)
                if delivered is None:
                    break
                for _ in range(self.settle_passes if delivered else 1):
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            for req in inflight:
                if not req.future.done():
                    req.future.set_exception(RuntimeError("HFEngine closed while generating"))
            raise
        except Exception as exc:
            self.decoder.stats.errors += 1
            for req in inflight:
                if not req.future.done():
                    req.future.set_exception(exc)
            return
        finally:
            steps.close()
            self._batch_thread = None
            self._weights_lock.release()
            self.decoder.stats.generate_s += time.perf_counter() - start

    def _count_requests(self, requests: list[Request]) -> None:
        self.decoder.stats.requests += len(requests)
        self.decoder.stats.prompt_tokens += sum(len(r.prompt_ids) for r in requests)


class AdapterView:
    """One adapter of an :class:`HFEngine` (None: its base model) behind the
    Engine contract, for code that takes an engine (an agent, a rollout worker): its requests are
    decoded by the owning engine, batched with every other adapter's.

    Everything but ``generate`` is the owning engine's (its counters, context, weights version);
    the view cannot change weights (an adapter is replaced with ``HFEngine.add_adapter``, the base
    weights with ``HFEngine.update_weights``) and ``close`` leaves the engine open (its owner closes
    it)."""

    def __init__(self, engine: HFEngine, adapter: str | None) -> None:
        self.engine = engine
        self.adapter = adapter

    def __repr__(self) -> str:
        return f"AdapterView({self.adapter!r})"

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Completion:
        """``HFEngine.generate`` with this view's adapter."""
        return await self.engine.generate(prompt_ids, params, on_token, adapter=self.adapter)

    def update_weights(self, policy: Any, stages: Sequence[Any] = ()) -> None:
        what = f"adapter {self.adapter!r}" if self.adapter is not None else "the base model"
        raise RuntimeError(
            f"an adapter view cannot update weights: replace {what} on the owning engine "
            "(HFEngine.add_adapter(name, folder) for an adapter, HFEngine.update_weights for the base)"
        )

    async def close(self) -> None:
        """Nothing to do: the engine that owns the view closes."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.engine.eos_token_ids

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.engine.pad_token_id

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def stats(self) -> dict[str, float]:
        return self.engine.stats
