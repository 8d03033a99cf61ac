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

Multi-turn agents come and go: a row finishes each turn, and the conversation's next turn joins
the running batch a moment later. Copying the cache into fresh buffers at each of those events
cost a third of a 100-episode calc eval (SmolLM2-135M, float16 copy, 24 episodes in flight: 89 of
261 s, mostly page faults of the fresh memory). A growing layer keeps its buffers instead: finished
rows leave holes the last rows fill (:meth:`GrowingLayer.keep_rows`), joining rows are written into
free rows (:func:`join_in_place`), and leading columns no row needs any more are dropped in place
once there are enough of them (:func:`drop_unattended_columns`): the same eval took 160 s, with
the same completions.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``update`` writes into spare columns instead of concatenating, and
    whose rows are kept and taken in place.

    The buffers ``[row capacity, heads, capacity, dim]`` hold the batch's rows first; ``keys`` /
    ``values`` are views of their filled columns, followed by ``spare`` more (zeros). ``update``
    returns the rows in use over the whole buffer width (see the module doc). When the buffer is
    full it grows by ``spare`` columns again, and when ``keys`` was replaced from outside (e.g. a
    transformers method that slices it) the buffer is rebuilt from it. Rows a batch drops stay
    allocated (:meth:`keep_rows` moves the rows kept into the holes) and rows that join are written
    into them (:func:`join_in_place`): on a CPU a fresh buffer costs five times the copy itself in
    page faults (measured: 340 ms against 60 ms for a 24-row, 716-column cache of SmolLM2-135M).
    """

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, spare: int, dtype: torch.dtype | None = None
    ) -> None:
        self._setup(keys.device, spare, dtype or keys.dtype)
        self._reserve(keys, values, self.spare, keys.shape[0])

    @classmethod
    def adopt(cls, keys: torch.Tensor, values: torch.Tensor, length: int, spare: int) -> GrowingLayer:
        """A layer over buffers already holding ``length`` filled columns followed by zeros (no copy)."""
        layer = cls.__new__(cls)
        layer._setup(keys.device, spare, keys.dtype)
        layer._buffer_k, layer._buffer_v, layer._length = keys, values, length
        layer._rows = keys.shape[0]
        layer._publish()
        return layer

    def _setup(self, device: torch.device, spare: int, dtype: torch.dtype) -> None:
        DynamicLayer.__init__(self)
        self.device = device
        #: the buffers' dtype (keys and values written in are cast to it)
        self.dtype = dtype
        self.is_initialized = True
        self.spare = max(int(spare), 1)

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, spare: int, row_capacity: int) -> None:
        rows, heads, length, dim = keys.shape
        v_heads, v_dim = values.shape[1], values.shape[-1]
        row_capacity = max(row_capacity, rows)
        self._buffer_k = keys.new_zeros((row_capacity, heads, length + spare, dim), dtype=self.dtype)
        self._buffer_v = values.new_zeros((row_capacity, v_heads, length + spare, v_dim), dtype=self.dtype)
        self._buffer_k[:rows, :, :length].copy_(keys)
        self._buffer_v[:rows, :, :length].copy_(values)
        self._rows, self._length = rows, length
        self._publish()

    def _publish(self) -> None:
        self._keys = self._buffer_k[: self._rows]
        self._values = self._buffer_v[: self._rows]
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]
        self._published = self.keys

    def _adopt_outside_keys(self) -> None:
        if self.keys is not self._published:
            self._reserve(self.keys, self.values, self.spare, self.row_capacity)

    @property
    def capacity(self) -> int:
        """Columns the buffer holds (filled + spare)."""
        return int(self._buffer_k.shape[2])

    @property
    def row_capacity(self) -> int:
        """Rows the buffer holds (in use + free)."""
        return int(self._buffer_k.shape[0])

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
            self._reserve(self.keys, self.values, target - self.get_seq_length(), self.row_capacity)
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

    def keep_rows(self, order: list[int]) -> None:
        """Keep the rows at ``order`` (row ``i`` becomes the row that was at ``order[i]``), in the same
        buffer. A row that stays where it is is not copied; one that moves into a row another kept
        row still needs is gathered with a copy of the rows kept (see :func:`hole_filling_order`,
        which needs neither)."""
        self._adopt_outside_keys()
        kept = len(order)
        if any(src != i and src < kept for i, src in enumerate(order)):
            index = torch.tensor(order, dtype=torch.long, device=self._buffer_k.device)
            for buffer in (self._buffer_k, self._buffer_v):
                buffer[:kept].copy_(buffer.index_select(0, index))
        else:
            for i, src in enumerate(order):
                if src != i:
                    self._buffer_k[i].copy_(self._buffer_k[src])
                    self._buffer_v[i].copy_(self._buffer_v[src])
        self._rows = kept
        self._publish()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keep_rows(indices.tolist())

    def copy_rows(self, indices: torch.Tensor) -> None:
        """Keep the rows at ``indices`` in fresh buffers of just those rows (how finished rows were
        dropped before :meth:`keep_rows`; kept for measuring the difference)."""
        self._adopt_outside_keys()
        self._buffer_k = self._keys.index_select(0, indices)
        self._buffer_v = self._values.index_select(0, indices)
        self._rows = len(indices)
        self._publish()

    def shift(self, columns: int) -> None:
        """Move the filled columns ``columns`` to the right (negative: to the left, dropping as many
        leading columns), in place: zeros come in on the other side. Right needs the capacity."""
        self._adopt_outside_keys()
        if columns == 0:
            return
        length = self._length + columns
        if length > self.capacity or length < 0:
            raise ValueError(
                f"cannot shift {self._length} columns by {columns} in a capacity of {self.capacity}"
            )
        for buffer in (self._keys, self._values):
            _move_columns(buffer, self._length, columns)
        self._length = length
        self._publish()


def _move_columns(buffer: torch.Tensor, length: int, by: int) -> None:
    """Move columns ``[0, length)`` of ``buffer`` (dim 2) by ``by`` in place, in chunks that do not
    overlap (a copy between overlapping views is refused by PyTorch), zeroing the columns left."""
    step = abs(by)
    if by > 0:  # right: from the last chunk back
        end = length
        while end > 0:
            start = max(0, end - step)
            buffer[:, :, start + by : end + by].copy_(buffer[:, :, start:end])
            end = start
        buffer[:, :, :by].zero_()
    else:  # left: from the first kept column on
        for start in range(step, length, step):
            end = min(length, start + step)
            buffer[:, :, start - step : end - step].copy_(buffer[:, :, start:end])
        buffer[:, :, max(0, length - step) : length].zero_()


def hole_filling_order(keep: list[int]) -> list[int]:
    """An order of the rows ``keep`` (ascending) for :meth:`GrowingLayer.keep_rows` that moves as few
    rows as possible: rows kept below ``len(keep)`` stay, kept rows beyond it fill the holes."""
    kept = len(keep)
    staying = {i for i in keep if i < kept}
    movers = iter(i for i in keep if i >= kept)
    return [i if i in staying else next(movers) for i in range(kept)]


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


def cast_layers(cache: DynamicCache, dtype: torch.dtype | None) -> DynamicCache:
    """``cache`` with its plain layers' keys and values in ``dtype`` (None, or already in it: as
    they are, no copy)."""
    for layer in cache.layers:
        if type(layer) is DynamicLayer and layer.is_initialized and dtype is not None:
            layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
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


def join_in_place(
    cache: Any, mask: torch.Tensor, other: Any, other_mask: torch.Tensor
) -> torch.Tensor | None:
    """Write the rows of the left-padded batch ``other`` (its cache and mask) into the free rows of
    ``cache``'s :class:`GrowingLayer` buffers, right-aligned with the batch's rows (which move right
    within their spare columns first where ``other`` is wider): no allocation. Returns the mask of
    the batch with ``other``'s rows appended, or None where they do not fit (not enough free rows
    or columns, or layers of another kind: then :func:`concat_growing`)."""
    rows, width = mask.shape
    joining, other_width = other_mask.shape
    layers = list(cache.layers)
    if not layers or not all(
        isinstance(layer, GrowingLayer)
        and layer.keys is layer._published
        and layer.get_seq_length() == width
        and layer._rows == rows
        and rows + joining <= layer.row_capacity
        and other_width <= layer.capacity
        for layer in layers
    ):
        return None
    if other_width > width:
        for layer in layers:
            layer.shift(other_width - width)
        mask, width = _pad_left(mask, other_width, 1), other_width
    start = width - other_width
    for layer, (keys, values, *_) in zip(layers, other, strict=True):
        for buffer, source in ((layer._buffer_k, keys), (layer._buffer_v, values)):
            block = buffer[rows : rows + joining]
            block[:, :, :start].zero_()
            block[:, :, start:width].copy_(source)
            block[:, :, width:].zero_()
        layer._rows = rows + joining
        layer._publish()
    return torch.cat([mask, _pad_left(other_mask, width, 1)])


def drop_unattended_columns(cache: Any, mask: torch.Tensor, at_least: int) -> torch.Tensor:
    """Drop the leading columns no row attends to any more (the rows that needed them are gone)
    from ``cache``'s :class:`GrowingLayer` s, in place, when there are ``at_least`` of them (moving
    the cache costs a copy; fewer columns cost attention in every step); returns the mask."""
    if mask.shape[0] == 0 or not mask.shape[1]:
        return mask
    attended = mask.any(0).nonzero()
    first = int(attended[0]) if len(attended) else mask.shape[1]
    layers = list(cache.layers)
    if first < at_least or not all(
        isinstance(layer, GrowingLayer) and layer.get_seq_length() == mask.shape[1] for layer in layers
    ):
        return mask
    for layer in layers:
        layer.shift(-first)
    return mask[:, first:]


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
