"""KV caches of the engine's decode loop: merging left-padded batches, and appending in place.

A batch's cache holds, per layer, keys and values ``[rows, kv_heads, width, head_dim]`` with every
row right-aligned (left padding masked out), so one decode step appends one column for all rows.
transformers' ``DynamicLayer`` appends with ``torch.cat``: a fresh copy of the whole cache for
every token (measured: 20% of the engine's time in a 100-episode eval of SmolLM2-135M, 32 rows x
~600 tokens). :class:`GrowingLayer` keeps the keys and values in a zeroed buffer with a few spare
columns and writes each step's column in place, copying the cache once per ``spare`` tokens.

``update`` returns the *whole* buffer, spare columns included: CPU matmuls in bfloat16 are fast
only on contiguous operands (measured: query x keys for 32 rows x 600 tokens took 0.40 ms
contiguous, 2.3 ms on a strided view of a larger buffer). The caller's attention mask covers
:attr:`GrowingLayer.capacity` columns and masks the spare ones out (their zeros add nothing).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``update`` writes into spare columns instead of concatenating.

    ``keys``/``values`` are views of the filled columns of a buffer with ``spare`` more (zeros);
    ``update`` returns the whole buffer (see the module doc). When the buffer is full it grows by
    ``spare`` columns again, and when ``keys`` was replaced from outside (e.g. a transformers method
    that slices it) the buffer is rebuilt from it.
    """

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, spare: int, dtype: torch.dtype | None = None
    ) -> None:
        self._setup(keys.device, spare, dtype or keys.dtype)
        self._reserve(keys, values, self.spare)

    @classmethod
    def adopt(cls, keys: torch.Tensor, values: torch.Tensor, length: int, spare: int) -> GrowingLayer:
        """A layer over buffers already holding ``length`` filled columns followed by zeros (no copy)."""
        layer = cls.__new__(cls)
        layer._setup(keys.device, spare, keys.dtype)
        layer._keys, layer._values, layer._length = keys, values, length
        layer._publish()
        return layer

    def _setup(self, device: torch.device, spare: int, dtype: torch.dtype) -> None:
        DynamicLayer.__init__(self)
        self.device = device
        #: the buffers' dtype (keys and values written in are cast to it)
        self.dtype = dtype
        self.is_initialized = True
        self.spare = max(int(spare), 1)

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        rows, heads, length, dim = keys.shape
        v_heads, v_dim = values.shape[1], values.shape[-1]
        self._keys = keys.new_zeros((rows, heads, length + spare, dim), dtype=self.dtype)
        self._values = values.new_zeros((rows, v_heads, length + spare, v_dim), dtype=self.dtype)
        self._keys[:, :, :length].copy_(keys)
        self._values[:, :, :length].copy_(values)
        self._length = length
        self._publish()

    def _publish(self) -> None:
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]
        self._published = self.keys

    @property
    def capacity(self) -> int:
        """Columns the buffer holds (filled + spare)."""
        return int(self._keys.shape[2])

    def needed_capacity(self, tokens: int) -> int:
        """The capacity this layer needs to take ``tokens`` more columns (its own if they fit)."""
        if self.keys is not self._published or self._length + tokens > self.capacity:
            return self.get_seq_length() + max(tokens, self.spare)
        return self.capacity

    def make_room(self, tokens: int, capacity: int | None = None) -> int:
        """Make sure ``tokens`` more columns fit, growing to ``capacity`` columns if given (adopting
        ``keys`` if it was replaced from outside); returns the capacity."""
        target = max(self.needed_capacity(tokens), capacity or 0)
        if target != self.capacity or self.keys is not self._published:
            self._reserve(self.keys, self.values, target - self.get_seq_length())
        return self.capacity

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        self.make_room(new)
        end = self._length + new
        self._keys[:, :, self._length : end].copy_(key_states)
        self._values[:, :, self._length : end].copy_(value_states)
        self._length = end
        self._publish()
        return self._keys, self._values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.keys is not self._published:
            self._reserve(self.keys, self.values, self.spare)
        self._keys = self._keys.index_select(0, indices)
        self._values = self._values.index_select(0, indices)
        self._publish()


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``cache`` under the keyword ``model``'s forward takes it by: ``cache`` in the transformers
    versions that renamed it (5.2x, which warn on every ``past_key_values``), else ``past_key_values``.
    A PEFT wrapper forwards keywords to its base model, whose signature decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): cache}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned (``output.cache``, or ``output.past_key_values`` before the
    rename)."""
    cache = output.get("cache")  # never output.past_key_values when it has one: that warns
    return cache if cache is not None else output.past_key_values


def make_room(cache: DynamicCache, tokens: int) -> int | None:
    """Grow the :class:`GrowingLayer` s of ``cache`` so each can take ``tokens`` more columns, all
    to one capacity (one attention mask serves every layer); returns it, None without such layers."""
    layers = [layer for layer in cache.layers if isinstance(layer, GrowingLayer)]
    if not layers:
        return None
    capacity = max(layer.needed_capacity(tokens) for layer in layers)
    for layer in layers:
        layer.make_room(tokens, capacity)
    return capacity


def mergeable_cache(config: Any) -> bool:
    """Whether a model's caches can be merged and grown here (every layer a plain DynamicLayer)."""
    try:
        layers = DynamicCache(config=config).layers
    except Exception:
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]], config: Any) -> DynamicCache:
    """A DynamicCache holding ``layers`` as they are (``DynamicCache(ddp_cache_data=...)`` copies
    every tensor once more, a full extra KV cache at the memory peak of prefill)."""
    cache = DynamicCache(config=config)
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return cache


def growing(cache: DynamicCache, spare: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """``cache`` with each plain layer turned into a :class:`GrowingLayer` with ``spare`` free
    columns (one copy of the cache now instead of one per decoded token), its buffers in ``dtype``
    (None: the cache's own)."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[i] = GrowingLayer(layer.keys, layer.values, spare, dtype)
    return cache


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if not missing:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merged_mask(mask_a: torch.Tensor, mask_b: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The attention mask of two left-padded batches stacked (the narrower padded on the left) with
    the columns no row attends to dropped, and how many leading columns were dropped."""
    width = max(mask_a.shape[1], mask_b.shape[1])
    mask = torch.cat([_pad_left(mask_a, width, 1), _pad_left(mask_b, width, 1)])
    first = int(mask.any(0).nonzero()[0])
    return mask[:, first:], first


def concat_growing(
    cache_a: Any, mask_a: torch.Tensor, cache_b: Any, mask_b: torch.Tensor, config: Any, spare: int
) -> tuple[DynamicCache, torch.Tensor]:
    """:func:`concat_caches` written straight into :class:`GrowingLayer` buffers with ``spare`` free
    columns: one allocation and one copy of the merged cache per layer, where concatenating, then
    growing, allocated and filled the whole cache two or three times (measured: admitting a request
    into a 32-row batch of ~700 columns allocated ~0.5 GB for SmolLM2-135M; those short-lived
    buffers were what fragmented the heap past 4 GiB in a 100-episode eval)."""
    width = max(mask_a.shape[1], mask_b.shape[1])
    mask, first = merged_mask(mask_a, mask_b)
    length = width - first
    rows_a = mask_a.shape[0]
    cache = DynamicCache(config=config)

    def place(buffer: torch.Tensor, source: torch.Tensor, rows: slice) -> None:
        # ``source`` is right-aligned at column ``width``; keep its columns from ``first`` on
        start = max(0, first - (width - source.shape[2]))
        kept = source.shape[2] - start
        buffer[rows, :, length - kept : length].copy_(source[:, :, start:])
        buffer[rows, :, : length - kept].zero_()

    columns = length + max(int(spare), 1)  # the GrowingLayer's own floor of one spare column
    for i, ((ka, va, *_), (kb, vb, *_)) in enumerate(zip(cache_a, cache_b, strict=True)):
        rows = rows_a + kb.shape[0]
        keys = ka.new_empty((rows, ka.shape[1], columns, ka.shape[3]))
        values = va.new_empty((rows, va.shape[1], columns, va.shape[3]))
        for buffer, a, b in ((keys, ka, kb), (values, va, vb)):
            place(buffer, a, slice(0, rows_a))
            place(buffer, b, slice(rows_a, rows))
            buffer[:, :, length:].zero_()
        cache.layers[i] = GrowingLayer.adopt(keys, values, length, spare)
    return cache, mask


def concat_caches(
    cache_a: Any, mask_a: torch.Tensor, cache_b: Any, mask_b: torch.Tensor, config: Any
) -> tuple[DynamicCache, torch.Tensor]:
    """Stack two left-padded batches (KV cache and attention mask) into one: the shorter is padded
    on the left, and columns no row attends to any more are dropped."""
    width = max(mask_a.shape[1], mask_b.shape[1])
    mask, first = merged_mask(mask_a, mask_b)
    layers = [
        (
            torch.cat([_pad_left(ka, width, 2), _pad_left(kb, width, 2)])[:, :, first:],
            torch.cat([_pad_left(va, width, 2), _pad_left(vb, width, 2)])[:, :, first:],
        )
        for (ka, va, *_), (kb, vb, *_) in zip(cache_a, cache_b, strict=True)
    ]
    return cache_of(layers, config), mask
