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

The decode loop is our own (not ``model.generate``): prefill computes logits only for the last
position, rows of similar prompt length are prefilled together and their KV caches merged into one
left-padded cache (less padding compute than one call at full width), then decoding proceeds token
by token with the cache. Rows that finish are pruned from the batch and the cache. Per-row sampling
parameters (temperature, top_p, max_new_tokens, stop strings, seed) may be mixed in one batch: a
seeded request samples from its own generator (reproducible whatever shares its batch); unseeded
requests share the engine's generator (seeded by ``seed``).

Agent prompts share a long prefix (the system prompt with the tool schemas, and within a GRPO
group the whole task). The engine keeps the KV cache of the longest prefix every row of the last
batch shared and reuses it for the next batch's shared part, so prefill computes each row's own
suffix only (``stats['prefix_reused_tokens']``). The cache is dropped when the weights change.

Multi-turn agents send, turn after turn, a prompt that extends their previous prompt and
completion with a tool observation. When a row finishes, the engine keeps its KV cache (up to
``prefix_cache_tokens`` tokens over all kept rows, least recently stored evicted first); a later
prompt that extends a kept sequence takes that cache and prefills only the new tokens
(``stats['conversation_reused_tokens']``). Without it each turn re-prefills the whole conversation,
the largest cost of a multi-turn rollout on a CPU.

On a CPU the model's decode steps use the attention kernel of :mod:`horizonrl.engine.attention`
(``fast_decode``; 3x faster than ``sdpa`` for a batch with long prompts).

On a CPU decoding is memory-bandwidth bound (a step costs about the same for 2 or 16 rows), so a
static batch runs about as fast as ``model.generate``; the gain comes from batching concurrent
agents without callers coordinating, and from cheaper prefill of prompts of different lengths.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers.cache_utils import DynamicCache

from horizonrl.engine.attention import use_fast_decode
from horizonrl.engine.base import Completion, FinishReasonT, SamplingParams
from horizonrl.engine.kvcache import (
    cache_kwargs,
    cache_of,
    concat_caches,
    concat_growing,
    growing,
    make_room,
    mergeable_cache,
    returned_cache,
)
from horizonrl.engine.sampling import first_argmax, greedy_pick
from horizonrl.memory import limit_malloc_arenas, release_free_memory
from horizonrl.tokens import common_prefix_len


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    arrival: float


@dataclass
class _Stats:
    batches: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0
    errors: int = 0
    prefix_reused_tokens: int = 0
    conversation_reused_tokens: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    admitted: int = 0


class _ConversationCache:
    """KV caches of finished rows (keys and values [1, heads, length, dim] per layer) keyed by the
    tokens they hold, for the next turn of the same conversation; bounded by a token budget."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: OrderedDict[int, _PrefixCache] = OrderedDict()
        self._next_key = 0

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def put(self, entry: _PrefixCache) -> None:
        if len(entry.ids) > self.max_tokens or not entry.ids:
            return
        while self.tokens + len(entry.ids) > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= len(old.ids)
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.tokens += len(entry.ids)

    def take(self, prompt: list[int]) -> _PrefixCache | None:
        """Remove and return the longest kept entry ``prompt`` extends by at least one token."""
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = len(entry.ids)
            if best_len < n < len(prompt) and prompt[:n] == entry.ids:
                best_key, best_len = key, n
        if best_key is None:
            return None
        entry = self._entries.pop(best_key)
        self.tokens -= len(entry.ids)
        return entry


@dataclass
class _PrefixCache:
    """KV cache (one row per layer: keys and values [1, heads, length, dim]) of a token prefix."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    weights_version: int


@dataclass
class _Row:
    """Decode state of one request inside a batch."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt: list[int] = field(default_factory=list)
    request: _Request | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReasonT | None = None

    def completion(self) -> Completion:
        finish = self.finish or "length"
        return Completion(token_ids=self.token_ids, logprobs=self.logprobs, finish_reason=finish)


@dataclass
class _Batch:
    """The rows being decoded together and their per-row state: KV cache, attention mask (left
    padded), next position, last sampled token and sampling parameters."""

    rows: list[_Row]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    tokens: torch.Tensor
    temps: torch.Tensor
    top_ps: torch.Tensor

    def select(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (none: the batch is empty and its tensors unused)."""
        if keep and len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
            self.cache.batch_select_indices(index)
            self.mask, self.next_pos, self.tokens = self.mask[index], self.next_pos[index], self.tokens[index]
            self.temps, self.top_ps = self.temps[index], self.top_ps[index]
        self.rows = [self.rows[j] for j in keep]

    def extend(self, other: _Batch, config: Any, grow_by: int = 0) -> _Batch:
        """This batch with ``other``'s rows appended (their KV caches merged; with ``grow_by``, into
        growing layers with that many spare columns)."""
        if not other.rows:
            return self
        if not self.rows:
            return other
        if grow_by:
            cache, mask = concat_growing(self.cache, self.mask, other.cache, other.mask, config, grow_by)
        else:
            cache, mask = concat_caches(self.cache, self.mask, other.cache, other.mask, config)
        return _Batch(
            self.rows + other.rows,
            cache,
            mask,
            torch.cat([self.next_pos, other.next_pos]),
            torch.cat([self.tokens, other.tokens]),
            torch.cat([self.temps, other.temps]),
            torch.cat([self.top_ps, other.top_ps]),
        )


def contiguous_head_input(model: Any) -> None:
    """Make the output head's input contiguous before its matmul (idempotent).

    With ``logits_to_keep=1`` transformers applies the head to ``hidden[:, -1:, :]``, a strided view
    of a ``[rows, length, hidden]`` tensor. PyTorch cannot fold that 3-D view into one matrix product,
    so it broadcasts the head's weight to ``[rows, hidden, vocab]`` and copies it: for SmolLM2
    (49,152 x 576, bfloat16) 56 MB per row. Measured on this machine for a 32-row prefill: 1.83 s
    and +1.8 GiB of memory, against 10 ms for the same product on a contiguous copy."""
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return
    if head is None or getattr(head, "_horizonrl_contiguous_input", False):
        return
    head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))
    head._horizonrl_contiguous_input = True


def _prefill_groups(lengths: list[int], overhead_tokens: int, max_tokens: int) -> list[list[int]]:
    """Partition rows into prefill groups of similar prompt length.

    Rows sorted by length are cut into contiguous groups minimising the padded tokens computed
    (group size x longest prompt) plus ``overhead_tokens`` per forward call; a group of several rows
    holds at most ``max_tokens`` padded tokens. Exact dynamic programming; ``len(lengths)`` is small.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end - 1, -1, -1):
            size = end - start
            if size > 1 and size * longest > max_tokens:
                break
            cost = best[start] + size * longest + overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end > 0:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


def _resolve(future: asyncio.Future[Completion], completion: Completion) -> None:
    if not future.done():
        future.set_result(completion)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra is not None:
        ids.update(int(i) for i in extra)
    return frozenset(ids)


class _Weight(NamedTuple):
    """A weight to copy: its shape, and a function that makes it (a LoRA merge happens there)."""

    shape: torch.Size
    make: Callable[[], torch.Tensor]


def _as_is(value: torch.Tensor) -> _Weight:
    return _Weight(value.shape, lambda: value)


def _plain_weights(policy: Any) -> dict[str, _Weight]:
    """``policy``'s weights under plain-model names, each made on demand; a PEFT LoRA model is
    merged on the fly, one weight at a time.

    The policy is not modified: a LoRA-adapted weight is a new tensor (base + delta) made when its
    function is called, so a caller copying weight by weight holds one merged weight at a time, not
    a merged copy of every adapted weight (SmolLM2-135M: 106M float32 weights, ~0.4 GiB)."""
    if not (hasattr(policy, "peft_config") and hasattr(policy, "get_base_model")):
        return {key: _as_is(value) for key, value in policy.state_dict().items()}
    base = policy.get_base_model()
    adapted: dict[str, tuple[Any, list[str]]] = {}
    for name, module in base.named_modules():
        if not hasattr(module, "get_delta_weight") or getattr(module, "merged", False):
            continue
        if getattr(module, "disable_adapters", False):
            continue
        adapters = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
        if adapters:
            adapted[name + ".weight"] = (module, adapters)

    def merged(key: str, value: torch.Tensor) -> torch.Tensor:
        module, adapters = adapted[key]
        delta = sum(module.get_delta_weight(a) for a in adapters)
        return value + delta.to(value.dtype)

    weights: dict[str, _Weight] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        if plain in adapted:
            weights[plain] = _Weight(value.shape, lambda plain=plain, value=value: merged(plain, value))
        else:
            weights[plain] = _as_is(value)
    return weights


class HFEngine:
    """Batched token-in / token-out generation for an in-process HF causal LM (see module doc).

    ``max_context`` defaults to ``model.config.max_position_embeddings``. ``eos_token_ids`` (the
    tokenizer's EOS plus ``generation_config.eos_token_id``) may be reassigned. Use the engine from
    one event loop at a time; the batcher restarts lazily on a new loop.
    """

    #: Return freed heap memory to the OS every this many decode steps (KV caches of ever-changing
    #: shapes fragment the heap; measured: without it a continuous batch grew peak memory by 25%
    #: over a 10x longer rollout).
    trim_every_steps: int = 256
    #: Prefill grouping: cost of one extra forward call, in prompt tokens (CPU, small models).
    prefill_overhead_tokens: int = 32
    #: Most padded tokens in one multi-row prefill call (bounds prefill memory).
    max_prefill_tokens: int = 8192
    #: Reuse the KV cache of a prompt prefix shared by every row when it is at least this long
    #: (0 turns prefix caching off).
    min_shared_prefix: int = 32
    #: Decode writes keys and values in place into a buffer this many columns wider than the cache
    #: (one copy per this many tokens instead of one per token; see :mod:`horizonrl.engine.kvcache`).
    kv_grow_tokens: int = 16

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        seed: int = 0,
        max_context: int | None = None,
        fast_decode: bool = True,
        prefix_cache_tokens: int = 16384,
        continuous_batching: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_context = int(max_context or model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.weights_version = 0
        self._mergeable_cache = mergeable_cache(model.config)
        self.continuous_batching = continuous_batching and self._mergeable_cache
        self.fast_decode = fast_decode and use_fast_decode(model)
        contiguous_head_input(model)
        #: in-place KV appends need the fast kernel: it takes the mask over the buffer as given
        self._grow_kv = self.fast_decode and self._mergeable_cache
        self._generator = torch.Generator().manual_seed(seed)
        limit_malloc_arenas()  # threads that allocate (tokenizers, sandboxes) would fragment apart
        self._weights_lock = threading.Lock()  # held by a running batch, between its steps too
        self._batch_thread: int | None = None  # the thread whose event loop runs a batch now
        self._stats = _Stats()
        self._prefix: _PrefixCache | None = None
        if prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be >= 0 (0 turns it off), got {prefix_cache_tokens}")
        self._conversations = _ConversationCache(prefix_cache_tokens if self._mergeable_cache else 0)
        self._pending: list[_Request] = []  # read and written on the event loop's thread only
        self._hold_admission = False  # set while a weights update waits for the running batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._closed = False

    # ----------------------------------------------------------------------------- public API
    @property
    def stats(self) -> dict[str, float]:
        """Counters for metrics: batches (decode runs), requests, tokens, rows per decode step
        (``mean_batch_size``), generate seconds."""
        s = self._stats
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
            "conversation_cache_tokens": self._conversations.tokens,
            "weights_version": self.weights_version,
        }

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        """Generate a continuation of ``prompt_ids``; concurrent calls share batches."""
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        params = params or SamplingParams()
        ids = [int(t) for t in prompt_ids]
        self._check_request(ids, params)
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._batcher is None or self._batcher.done():
            self._start_batcher(loop)
        assert self._wakeup is not None
        future: asyncio.Future[Completion] = loop.create_future()
        self._pending.append(_Request(ids, params, future, loop.time()))
        self._wakeup.set()
        return await future

    def update_weights(self, policy: Any) -> None:
        """Sample from ``policy``'s weights from now on; waits for a running batch to finish (call
        it from another thread then, or between rollouts: the batch runs on its event loop's thread)."""
        with self._between_batches("update_weights"):
            same = policy is self.model or (
                hasattr(policy, "get_base_model") and policy.get_base_model() is self.model
            )
            if not same:
                own = self.model.state_dict()
                state = policy.state_dict()
                if state.keys() == own.keys():
                    weights = {key: _as_is(value) for key, value in state.items()}
                else:  # e.g. a PEFT policy feeding a plain engine model
                    weights = _plain_weights(policy)
                missing = [k for k in own if k not in weights]
                unexpected = [k for k in weights if k not in own]
                shapes = [k for k in own if k in weights and own[k].shape != weights[k].shape]
                if missing or unexpected or shapes:
                    raise ValueError(
                        "update_weights: the policy's weights do not fit the engine's model "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]}, shape mismatch {shapes[:3]})"
                    )
                with torch.no_grad():
                    for key, tensor in own.items():
                        tensor.copy_(weights[key].make())
            self.weights_version += 1
            self._forget_caches()

    def drop_caches(self) -> None:
        """Free the KV caches kept for later requests (shared prefix, conversations), e.g. before
        a training stage needs the memory; waits for a running batch to finish."""
        with self._between_batches("drop_caches"):
            self._forget_caches()
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

    def _forget_caches(self) -> None:
        """Drop the shared-prefix and conversation KV caches (caller holds the weights lock)."""
        self._prefix = None
        self._conversations.clear()

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

    def _admit(self, room: int) -> list[_Request]:
        """Take up to ``room`` pending requests into the running batch."""
        if room <= 0 or self._hold_admission or not self._pending:
            return []
        taken, self._pending = self._pending[:room], self._pending[room:]
        return [r for r in taken if not r.future.done()]

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
            batch = [r for r in self._pending[: self.max_batch_size] if not r.future.done()]
            del self._pending[: self.max_batch_size]
            if batch:
                await self._run_batch(batch)

    #: Event-loop passes handed back after a step that finished rows, so their callers' next turns
    #: (tool call, environment step, next prompt) can arrive and join the running batch.
    settle_passes: int = 8

    async def _run_batch(self, batch: list[_Request]) -> None:
        """Decode ``batch`` step by step on this loop's thread, handing the loop back between steps.
        Each request's future is resolved as soon as its row finishes (not when the whole batch
        does); with continuous batching, requests that arrive meanwhile join the running batch
        (``inflight`` grows)."""
        start = time.perf_counter()
        inflight = list(batch)
        self._count_requests(batch)
        self._stats.batches += 1

        def deliver(row: _Row) -> None:
            assert row.request is not None
            _resolve(row.request.future, row.completion())

        self._weights_lock.acquire()  # an update from another thread finishes first
        self._batch_thread = threading.get_ident()
        steps = self._generate_batch(inflight, deliver)
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
            self._stats.errors += 1
            for req in inflight:
                if not req.future.done():
                    req.future.set_exception(exc)
            return
        finally:
            steps.close()
            self._batch_thread = None
            self._weights_lock.release()
            self._stats.generate_s += time.perf_counter() - start

    def _count_requests(self, requests: list[_Request]) -> None:
        self._stats.requests += len(requests)
        self._stats.prompt_tokens += sum(len(r.prompt_ids) for r in requests)

    # ----------------------------------------------------------------------------- decoding
    def _generate_batch(self, requests: list[_Request], deliver: Callable[[_Row], None]) -> Iterator[int]:
        """One batched decode, a step per iteration (each yields how many rows it delivered);
        ``deliver`` gets each finished row."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield from self._decode(requests, deliver)
        finally:
            self.model.train(was_training)
            release_free_memory()  # KV caches of varying shapes would fragment the heap

    def _shared_prefix(self, prompts: list[list[int]], device: torch.device) -> _PrefixCache | None:
        """The KV cache of the longest prefix all ``prompts`` share (each keeps >= 1 own token),
        reused from the previous batch where it matches and extended by one forward call where the
        batch shares more; None when the shared part is too short to bother."""
        if not self._mergeable_cache or self.min_shared_prefix <= 0:
            return None
        common = common_prefix_len(prompts, min(len(p) for p in prompts) - 1)
        if common < self.min_shared_prefix:
            return None
        cached = (
            self._prefix if self._prefix and self._prefix.weights_version == self.weights_version else None
        )
        reuse = common_prefix_len([cached.ids, prompts[0]], common) if cached else 0
        if reuse < self.min_shared_prefix:
            reuse, cached = 0, None
        layers = [(k[:, :, :reuse], v[:, :, :reuse]) for k, v in cached.layers] if cached else []
        if common > reuse:  # compute the rest of the shared prefix for one row
            past = DynamicCache(ddp_cache_data=layers, config=self.model.config) if layers else None
            ids = torch.tensor([prompts[0][reuse:common]], dtype=torch.long, device=device)
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones((1, common), dtype=torch.long, device=device),
                position_ids=torch.arange(reuse, common, device=device)[None],
                **cache_kwargs(self.model, past),
                use_cache=True,
                logits_to_keep=1,
            )
            layers = [(keys, values) for keys, values, *_ in returned_cache(out)]
        self._prefix = _PrefixCache(list(prompts[0][:common]), layers, self.weights_version)
        self._stats.prefix_reused_tokens += reuse + common * (len(prompts) - 1)
        return self._prefix

    def _prefill(
        self, prompts: list[list[int]], device: torch.device
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model; return (KV cache, last-position logits, attention mask).

        Each row starts from a cached past where one exists: its own earlier turn (from the
        conversation cache) or the prefix the other rows share (:meth:`_shared_prefix`); only the
        rest of the prompt, its suffix, is computed. Prefill is compute-bound, so rather than
        pushing every row through at full width, rows are prefilled in groups of similar suffix
        length (see :func:`_prefill_groups`). A group's cache is laid out as ``[padding | past |
        padding | suffix]`` per row (one group: that is the batch's cache, padded slots masked
        out); several groups' caches are merged, right-aligned and without the inner padding.
        """
        pasts: list[_PrefixCache | None] = [None] * len(prompts)
        if self._mergeable_cache and self._conversations.max_tokens:
            for i, prompt in enumerate(prompts):
                pasts[i] = self._conversations.take(prompt)
                if pasts[i] is not None:
                    self._stats.conversation_reused_tokens += len(pasts[i].ids)
        fresh = [i for i, past in enumerate(pasts) if past is None]
        prefix = self._shared_prefix([prompts[i] for i in fresh], device) if fresh else None
        for i in fresh:
            pasts[i] = prefix
        cached = [len(p.ids) if p is not None else 0 for p in pasts]
        suffixes = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        lengths = [len(p) for p in suffixes]
        width = max(c + n for c, n in zip(cached, lengths, strict=True))
        groups = (
            _prefill_groups(lengths, self.prefill_overhead_tokens, self.max_prefill_tokens)
            if self._mergeable_cache
            else []
        )
        if len(groups) <= 1:  # one call over the whole batch, rows in request order
            groups = [list(range(len(prompts)))]
        logits = torch.empty((len(prompts), self.vocab_size), device=device)
        merged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in groups:
            g_width = max(lengths[i] for i in group)
            g_past = max(cached[i] for i in group)
            rows = len(group)
            ids = torch.full((rows, g_width), self.pad_token_id, dtype=torch.long)
            g_mask = torch.zeros((rows, g_past + g_width), dtype=torch.long)
            positions = torch.zeros((rows, g_width), dtype=torch.long)
            for j, i in enumerate(group):  # left padding: each row's last token is in the last column
                n, c = lengths[i], cached[i]
                ids[j, g_width - n :] = torch.tensor(suffixes[i], dtype=torch.long)
                g_mask[j, g_past - c : g_past] = 1
                g_mask[j, g_past + g_width - n :] = 1
                positions[j, g_width - n :] = torch.arange(c, c + n)
            past = None
            if g_past:
                layers = []
                for layer, (k0, v0) in enumerate(next(pasts[i] for i in group if pasts[i]).layers):
                    shape = (rows, k0.shape[1], g_past, k0.shape[-1])
                    keys, values = k0.new_zeros(shape), v0.new_zeros(shape)
                    for j, i in enumerate(group):
                        if pasts[i] is not None:
                            k, v = pasts[i].layers[layer]
                            keys[j, :, g_past - cached[i] :] = k[0, :, : cached[i]]
                            values[j, :, g_past - cached[i] :] = v[0, :, : cached[i]]
                    layers.append((keys, values))
                past = cache_of(layers, self.model.config)
                del layers, keys, values
            out = self.model(
                input_ids=ids.to(device),
                attention_mask=g_mask.to(device),
                position_ids=positions.to(device),
                **cache_kwargs(self.model, past),
                use_cache=True,
                logits_to_keep=1,
            )
            if len(groups) == 1:  # padded slots stay in place, masked out (no merge copy)
                return returned_cache(out), out.logits[:, -1, :], g_mask.to(device)
            index = torch.tensor(group, dtype=torch.long, device=device)
            logits[index] = out.logits[:, -1, :].to(logits.dtype)
            for layer, (keys, values, *_) in enumerate(returned_cache(out)):
                if len(merged) <= layer:
                    shape = (len(prompts), keys.shape[1], width, keys.shape[-1])
                    merged.append((keys.new_zeros(shape), values.new_zeros(shape)))
                m_keys, m_values = merged[layer]
                for j, i in enumerate(group):  # [past | suffix], right-aligned, inner padding dropped
                    c, n = cached[i], lengths[i]
                    start = width - c - n
                    if c:
                        m_keys[i, :, start : start + c] = keys[j, :, g_past - c : g_past]
                        m_values[i, :, start : start + c] = values[j, :, g_past - c : g_past]
                    m_keys[i, :, width - n :] = keys[j, :, g_past + g_width - n :]
                    m_values[i, :, width - n :] = values[j, :, g_past + g_width - n :]
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for i, (c, n) in enumerate(zip(cached, lengths, strict=True)):
            mask[i, width - c - n :] = 1
        return DynamicCache(ddp_cache_data=merged, config=self.model.config), logits, mask

    def _new_rows(self, requests: list[_Request]) -> list[_Row]:
        return [
            _Row(
                r.params,
                torch.Generator().manual_seed(r.params.seed) if r.params.seed is not None else None,
                r.prompt_ids,
                r,
            )
            for r in requests
        ]

    def _decode(self, requests: list[_Request], deliver: Callable[[_Row], None]) -> Iterator[int]:
        """Decode ``requests`` token by token, yielding after each step how many rows it delivered;
        with continuous batching, admit pending requests between steps (prefilled on their own,
        their KV cache merged into the batch's). ``requests`` grows by the admitted ones (the caller
        fails them all if decoding raises)."""
        device = next(self.model.parameters()).device
        batch = self._start(self._new_rows(requests), device)
        while True:
            delivered = self._retire(batch, deliver)
            if self.continuous_batching:
                joined = self._admit(self.max_batch_size - len(batch.rows))
                if joined:
                    requests.extend(joined)
                    self._count_requests(joined)
                    self._stats.admitted += len(joined)
                    newcomers = self._start(self._new_rows(joined), device)
                    delivered += self._retire(newcomers, deliver)
                    grow_by = self.kv_grow_tokens if self._grow_kv else 0
                    batch = batch.extend(newcomers, self.model.config, grow_by)
            if not batch.rows:
                return
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((batch.mask.shape[0], 1))], dim=-1)
            out = self.model(
                input_ids=batch.tokens[:, None],
                attention_mask=self._decode_mask(batch),
                position_ids=batch.next_pos[:, None],
                **cache_kwargs(self.model, batch.cache),
                use_cache=True,
            )
            batch.cache = returned_cache(out)
            batch.next_pos = batch.next_pos + 1
            batch.tokens = self._step_rows(batch.rows, out.logits[:, -1, :], batch.temps, batch.top_ps)
            self._stats.decode_steps += 1
            self._stats.decode_rows += len(batch.rows)
            if self._stats.decode_steps % self.trim_every_steps == 0:
                release_free_memory()  # a continuous batch can run for minutes: keep the heap compact
            yield delivered

    def _decode_mask(self, batch: _Batch) -> torch.Tensor:
        """The attention mask of a decode step. The fast kernel takes it as a ready 4-D mask (so
        transformers skips building a causal mask every step: measured 6% of a tiny model's decode
        time), over the whole KV buffer when keys and values are appended in place."""
        if not self.fast_decode:
            return batch.mask
        mask = batch.mask
        capacity = make_room(batch.cache, 1) if self._grow_kv else None
        if capacity is not None and capacity > mask.shape[1]:
            mask = torch.nn.functional.pad(mask, (0, capacity - mask.shape[1]))
        return mask[:, None, None, :].bool()

    def _start(self, rows: list[_Row], device: torch.device) -> _Batch:
        """Prefill ``rows`` and sample their first token: a batch ready to decode."""
        cache, logits, mask = self._prefill([r.prompt for r in rows], device)
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=device)
        top_ps = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=device)
        next_pos = torch.tensor([len(r.prompt) for r in rows], dtype=torch.long, device=device)
        tokens = self._step_rows(rows, logits, temps, top_ps)
        if self._grow_kv:  # decode appends in place instead of copying the cache per token
            cache = growing(cache, self.kv_grow_tokens)
        return _Batch(rows, cache, mask, next_pos, tokens, temps, top_ps)

    def _retire(self, batch: _Batch, deliver: Callable[[_Row], None]) -> int:
        """Deliver the rows that just finished, keep their KV cache for the conversation's next
        turn, and drop them from the batch; returns how many."""
        done = [j for j, row in enumerate(batch.rows) if row.finish is not None]
        if not done:
            return 0
        for j in done:
            deliver(batch.rows[j])
        self._keep_conversations(batch.cache, batch.mask, [batch.rows[j] for j in done], done)
        batch.select([j for j, row in enumerate(batch.rows) if row.finish is None])
        return len(done)

    def _step_rows(
        self, rows: list[_Row], logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor
    ) -> torch.Tensor:
        """Sample each row's next token from ``logits`` and record it; rows whose caller gave up
        (a cancelled future, e.g. a timed-out episode) are finished without delivery."""
        tokens, logprobs = self._sample(logits, temps, top_ps, rows)
        for row, tok, lp in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            self._append(row, tok, lp)
            if row.finish is None and row.request is not None and row.request.future.done():
                row.finish = "length"
        self._stats.generated_tokens += len(rows)
        return tokens

    def _keep_conversations(
        self, cache: Any, mask: torch.Tensor, rows: list[_Row], batch_rows: list[int]
    ) -> None:
        """Store the KV cache of rows that just finished (prompt and all but the last sampled token,
        whose keys and values were never computed) for the conversation's next turn."""
        if not self._conversations.max_tokens:
            return
        layers = [(keys, values) for keys, values, *_ in cache]
        for row, j in zip(rows, batch_rows, strict=True):
            ids = row.prompt + row.token_ids[:-1]
            cols = mask[j].nonzero().squeeze(-1)
            if len(cols) != len(ids):  # never expected; keep nothing rather than a wrong cache
                continue
            self._conversations.put(
                _PrefixCache(
                    ids,
                    [(k[j : j + 1, :, cols], v[j : j + 1, :, cols]) for k, v in layers],
                    self.weights_version,
                )
            )

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        """Record a sampled token and decide whether the row is finished."""
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if token in self.eos_token_ids or (
            row.params.stop and self._hits_stop(row.token_ids, row.params.stop)
        ):
            row.finish = "stop"
        elif len(row.token_ids) >= row.params.max_new_tokens:
            row.finish = "length"

    def _hits_stop(self, token_ids: list[int], stops: tuple[str, ...]) -> bool:
        """Whether the recent generated text contains a stop string (decoding only a short tail).

        A stop string completed earlier would have ended the row then, so any hit here was
        completed by the newest token. The tail holds one token per stop-string character plus
        slack, which covers the string since tokens decode to at least one character.
        """
        window = max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
        return any(s in text for s in stops)

    def _sample(
        self, logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, rows: list[_Row]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row; return (tokens, their logprobs).

        Logprobs are under the full softmax of ``logits / T`` (``log_softmax(logits)`` for greedy
        rows), i.e. what a trainer recomputes, regardless of top_p truncation. Sampling uses the
        inverse CDF with one uniform draw per row: a seeded row draws from its own generator, so its
        samples do not depend on which other requests share the batch.
        """
        logits = logits.float()
        greedy = temps == 0
        if bool(greedy.all()):
            return greedy_pick(logits)
        logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
        probs = logp.exp()
        uniform = torch.rand(len(rows), generator=self._generator)
        for j, row in enumerate(rows):
            if row.generator is not None:
                uniform[j] = torch.rand((), generator=row.generator)
        uniform = uniform.to(logits.device)
        if bool((top_ps < 1).any()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
            sorted_probs = sorted_probs.masked_fill(before >= top_ps[:, None], 0.0)
            cdf = sorted_probs.cumsum(-1)
            pos = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
            sampled = order.gather(-1, pos.clamp(max=cdf.shape[-1] - 1)).squeeze(-1)
        else:
            cdf = probs.cumsum(-1)
            pos = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
            sampled = pos.clamp(max=cdf.shape[-1] - 1).squeeze(-1)
        tokens = torch.where(greedy, first_argmax(logits), sampled) if bool(greedy.any()) else sampled
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
