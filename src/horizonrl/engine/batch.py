"""The state the engine's decode loop works on: requests, rows, the running batch, the KV caches kept
between batches (a shared prompt prefix, finished conversations) and the engine's counters.

Requests and rows carry the LoRA adapter they are decoded with (None: the base model), and so does
every kept KV cache: keys and values computed under one adapter are never reused for another.

Plain data and small pure functions; :mod:`horizonrl.engine.decoder` runs the model over them and
:mod:`horizonrl.engine.hf` schedules requests into them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from horizonrl.engine.base import Completion, FinishReasonT, SamplingParams
from horizonrl.engine.kvcache import (
    GrowingLayer,
    concat_caches,
    concat_growing,
    drop_unattended_columns,
    hole_filling_order,
    join_in_place,
)


@dataclass
class Request:
    """One ``generate`` call waiting for, or being decoded in, a batch."""

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    arrival: float
    #: called with each token id and its logprob as it is sampled (streaming), on the engine's thread
    on_token: Callable[[int, float], None] | None = None
    #: the LoRA adapter to decode with (None: the base model)
    adapter: str | None = None
    #: the llguidance matcher holding the row to ``params.constraint`` (None: unconstrained)
    matcher: Any = None

    @property
    def abandoned(self) -> bool:
        """The caller no longer waits (its future was cancelled, e.g. a timed-out episode)."""
        return self.future.done()


@dataclass
class EngineStats:
    """Counters behind ``HFEngine.stats``."""

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


@dataclass
class PrefixCache:
    """KV cache (one row per layer: keys and values [1, heads, length, dim]) of a token prefix,
    computed under ``adapter`` (None: the base model) and reused only for rows of that adapter."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    weights_version: int
    adapter: str | None = None


def cache_bytes(entry: PrefixCache) -> int:
    """Bytes the keys and values of ``entry`` hold."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry.layers)


class ConversationCache:
    """KV caches of finished rows (keys and values [1, heads, length, dim] per layer) keyed by the
    tokens they hold, for the next turn of the same conversation; bounded in bytes (a token's keys
    and values take twice the bytes in float32 as in bfloat16), least recently stored evicted first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.tokens = 0
        self.bytes = 0
        self._entries: OrderedDict[int, tuple[PrefixCache, int]] = OrderedDict()
        self._next_key = 0

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = self.bytes = 0

    def put(self, entry: PrefixCache) -> None:
        size = cache_bytes(entry)
        if size > self.max_bytes or not entry.ids:
            return
        while self.bytes + size > self.max_bytes:
            self._forget(next(iter(self._entries)))
        self._entries[self._next_key] = (entry, size)
        self._next_key += 1
        self.tokens += len(entry.ids)
        self.bytes += size

    def keep(
        self, cache: Any, mask: torch.Tensor, rows: list[Row], batch_rows: list[int], version: int
    ) -> None:
        """Store the KV cache of ``rows`` that just finished, at ``batch_rows`` of the batch's
        ``cache`` and ``mask`` (prompt and all but the last sampled token, whose keys and values were
        never computed), for the conversation's next turn under the same adapter."""
        if not self.max_bytes:
            return
        layers = [(keys, values) for keys, values, *_ in cache]
        for row, j in zip(rows, batch_rows, strict=True):
            ids = row.prompt + row.token_ids[:-1]
            cols = mask[j].nonzero().squeeze(-1)
            if len(cols) != len(ids):  # never expected; keep nothing rather than a wrong cache
                continue
            self.put(
                PrefixCache(
                    ids,
                    [(k[j : j + 1, :, cols], v[j : j + 1, :, cols]) for k, v in layers],
                    version,
                    row.adapter,
                )
            )

    def _forget(self, key: int) -> PrefixCache:
        entry, size = self._entries.pop(key)
        self.tokens -= len(entry.ids)
        self.bytes -= size
        return entry

    def take(self, prompt: list[int], adapter: str | None = None) -> PrefixCache | None:
        """Remove and return the longest kept entry ``prompt`` extends by at least one token, among
        those computed under ``adapter``."""
        best_key, best_len = None, 0
        for key, (entry, _) in self._entries.items():
            n = len(entry.ids)
            if best_len < n < len(prompt) and entry.adapter == adapter and prompt[:n] == entry.ids:
                best_key, best_len = key, n
        return None if best_key is None else self._forget(best_key)


@dataclass
class Row:
    """Decode state of one request inside a batch."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt: list[int] = field(default_factory=list)
    request: Request | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish: FinishReasonT | None = None
    weights_version: int = 0
    #: the LoRA adapter the row is decoded with (None: the base model)
    adapter: str | None = None
    #: the llguidance matcher of the row's constraint, advanced token by token (None: unconstrained)
    matcher: Any = None

    @classmethod
    def of(cls, request: Request, weights_version: int = 0) -> Row:
        """A fresh row for ``request``; a seeded request samples from its own generator."""
        seed = request.params.seed
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        row = cls(
            request.params,
            generator,
            request.prompt_ids,
            request,
            weights_version=weights_version,
            adapter=request.adapter,
            matcher=request.matcher,
        )
        if request.params.top_logprobs:
            row.top_logprobs = []
        return row

    def completion(self) -> Completion:
        return Completion(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish or "length",
            top_logprobs=self.top_logprobs,
            weights_version=self.weights_version,
            constraint_met=None if self.matcher is None else bool(self.matcher.is_accepting()),
        )


@dataclass
class Batch:
    """The rows being decoded together and their per-row state: KV cache, attention mask (left
    padded), next position, last sampled token and sampling parameters."""

    rows: list[Row]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    tokens: torch.Tensor
    temps: torch.Tensor
    top_ps: torch.Tensor

    def select(self, keep: list[int], drop_columns_at: int = 0, in_place: bool = True) -> None:
        """Keep only the rows at ``keep`` (ascending; none: the batch is empty and its tensors unused).
        Rows may change places: kept rows beyond ``len(keep)`` fill the holes, the only rows a KV
        cache of growing layers copies (in its own buffer; ``in_place=False``: into fresh buffers of
        the rows kept, in order). With ``drop_columns_at``, leading columns no kept row attends to
        are dropped from such a cache once there are that many."""
        if keep and len(keep) < len(self.rows):
            fresh = not in_place and all(isinstance(layer, GrowingLayer) for layer in self.cache.layers)
            keep = keep if fresh else hole_filling_order(keep)
            index = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
            if fresh:
                for layer in self.cache.layers:
                    layer.copy_rows(index)
            else:
                self.cache.batch_select_indices(index)
            self.mask, self.next_pos, self.tokens = self.mask[index], self.next_pos[index], self.tokens[index]
            self.temps, self.top_ps = self.temps[index], self.top_ps[index]
            if drop_columns_at:
                self.mask = drop_unattended_columns(self.cache, self.mask, drop_columns_at)
        self.rows = [self.rows[j] for j in keep]

    def extend(self, other: Batch, config: Any, grow_by: int = 0, in_place: bool = True) -> Batch:
        """This batch with ``other``'s rows appended (their KV caches merged; with ``grow_by``, into
        this batch's growing layers where they fit and ``in_place``, else into new ones with that
        many spare columns)."""
        if not other.rows:
            return self
        if not self.rows:
            return other
        if grow_by:
            mask = join_in_place(self.cache, self.mask, other.cache, other.mask) if in_place else None
            cache = self.cache
            if mask is None:
                cache, mask = concat_growing(self.cache, self.mask, other.cache, other.mask, config, grow_by)
        else:
            cache, mask = concat_caches(self.cache, self.mask, other.cache, other.mask, config)
        return Batch(
            self.rows + other.rows,
            cache,
            mask,
            torch.cat([self.next_pos, other.next_pos]),
            torch.cat([self.tokens, other.tokens]),
            torch.cat([self.temps, other.temps]),
            torch.cat([self.top_ps, other.top_ps]),
        )


def prefill_groups(lengths: list[int], overhead_tokens: int, max_tokens: int) -> list[list[int]]:
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
