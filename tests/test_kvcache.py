"""The engine's in-place KV cache layer: the same contents as transformers' concatenating layer,
without a fresh copy of the cache per decoded token, nor when rows finish or join."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.cache_utils import DynamicCache, DynamicLayer

from horizonrl.engine.kvcache import (
    GrowingLayer,
    concat_caches,
    concat_growing,
    drop_unattended_columns,
    growing,
    hole_filling_order,
    join_in_place,
    make_room,
)


def kv(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, length, 4, generator=g), torch.randn(rows, 2, length, 4, generator=g)


def test_updates_equal_concatenation_in_one_buffer_whose_spare_columns_are_zero() -> None:
    keys, values = kv(3, 5, 0)
    plain = DynamicLayer()
    plain.update(keys, values)
    layer = GrowingLayer(keys, values, spare=4)
    buffer = layer._keys.data_ptr()
    for step in range(4):
        new_k, new_v = kv(3, 1, step + 1)
        expect_k, expect_v = plain.update(new_k, new_v)
        whole_k, whole_v = layer.update(new_k, new_v)
        filled = 6 + step
        assert whole_k.shape[2] == layer.capacity == 9 and whole_k.is_contiguous()  # the whole buffer
        assert torch.equal(whole_k[:, :, :filled], expect_k) and torch.equal(whole_v[:, :, :filled], expect_v)
        assert not whole_k[:, :, filled:].any() and not whole_v[:, :, filled:].any()
        assert torch.equal(layer.keys, expect_k) and layer.get_seq_length() == filled
    assert layer._keys.data_ptr() == buffer  # written in place, never copied


def test_grows_by_the_spare_columns_when_full_and_keeps_the_contents() -> None:
    keys, values = kv(2, 3, 0)
    layer = GrowingLayer(keys, values, spare=2)
    chunks = [kv(2, 1, s) for s in range(5)]
    for k, v in chunks:
        layer.update(k, v)
    assert layer.capacity == 9  # 3 + 2 spare, then grown by 2 twice
    assert torch.equal(layer.keys, torch.cat([keys, *(k for k, _ in chunks)], dim=2))


def test_select_rows_keeps_room_and_an_outside_replacement_is_adopted() -> None:
    keys, values = kv(4, 3, 0)
    layer = GrowingLayer(keys, values, spare=3)
    layer.batch_select_indices(torch.tensor([0, 2]))
    kept = keys[[0, 2]]
    assert torch.equal(layer.keys, kept) and layer.capacity == 6
    new_k, new_v = kv(2, 1, 9)
    layer.update(new_k, new_v)
    assert torch.equal(layer.keys[:, :, -1:], new_k)
    layer.keys, layer.values = layer.keys[:, :, 1:], layer.values[:, :, 1:]  # e.g. a crop from outside
    layer.update(new_k, new_v)
    assert torch.equal(layer.keys, torch.cat([kept[:, :, 1:], new_k, new_k], dim=2))


def test_growing_and_make_room_over_a_whole_cache() -> None:
    cache = DynamicCache()
    keys, values = kv(2, 3, 0)
    cache.update(keys, values, 0)
    cache.update(keys, values, 1)
    assert make_room(cache, 1) is None  # no growing layers yet
    growing(cache, spare=1)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert make_room(cache, 1) == 4
    cache.update(*kv(2, 1, 1), 0)
    assert make_room(cache, 1) == 5  # layer 0 was full: grown by one column, layer 1 along with it
    assert [layer.capacity for layer in cache.layers] == [5, 5]
    assert torch.equal(cache.layers[1].keys, keys) and cache.layers[0].get_seq_length() == 4


def _batch(rows: int, width: int, pads: list[int], seed: int) -> tuple[DynamicCache, torch.Tensor]:
    """A two-layer left-padded batch: row i has ``pads[i]`` masked (zero) columns on the left."""
    cache = DynamicCache()
    mask = torch.ones(rows, width, dtype=torch.long)
    for i, pad in enumerate(pads):
        mask[i, :pad] = 0
    for layer in range(2):
        keys, values = kv(rows, width, seed + layer)
        cache.update(keys * mask[:, None, :, None], values * mask[:, None, :, None], layer)
    return cache, mask


def test_merging_into_growing_buffers_equals_concatenating_then_growing() -> None:
    # a: 2 rows over 6 columns, both padded by >= 2; b: 3 rows over 4 columns, one of them padded.
    # The merged width is 6; the first column nobody attends to any more is dropped.
    cache_a, mask_a = _batch(2, 6, [2, 3], seed=0)
    cache_b, mask_b = _batch(3, 4, [0, 1, 0], seed=10)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=2)
    expect, expect_mask = concat_caches(cache_a, mask_a, cache_b, mask_b, config)
    expect = growing(expect, spare=3)
    merged, mask = concat_growing(cache_a, mask_a, cache_b, mask_b, config, spare=3)
    assert torch.equal(mask, expect_mask) and mask.shape == (5, 4)
    for got, want in zip(merged.layers, expect.layers, strict=True):
        assert isinstance(got, GrowingLayer) and got.capacity == want.capacity == 7
        assert torch.equal(got._keys, want._keys) and torch.equal(got._values, want._values)
        assert torch.equal(got.keys, want.keys) and got.get_seq_length() == 4
    merged.update(*kv(5, 1, 99), 0)  # and the merged cache decodes on in place
    assert merged.layers[0].get_seq_length() == 5 and merged.layers[0].capacity == 7


def test_finished_rows_leave_holes_the_last_rows_fill_in_the_same_buffer() -> None:
    keys, values = kv(5, 3, 0)
    layer = GrowingLayer(keys, values, spare=2)
    buffer = layer._buffer_k.data_ptr()
    assert hole_filling_order([0, 3, 4]) == [0, 3, 4]  # rows 1 and 2 finished: 3 and 4 fill them
    assert hole_filling_order([0, 2, 4]) == [0, 4, 2]  # row 2 stays, row 4 fills the hole at 1
    layer.batch_select_indices(torch.tensor(hole_filling_order([0, 2, 4])))
    assert torch.equal(layer.keys, keys[[0, 4, 2]]) and torch.equal(layer.values, values[[0, 4, 2]])
    assert layer._buffer_k.data_ptr() == buffer and layer.row_capacity == 5  # no new buffer
    layer.keep_rows([2, 0])  # any order still comes out right (gathered)
    assert torch.equal(layer.keys, keys[[2, 0]]) and layer._buffer_k.data_ptr() == buffer


def test_shifting_moves_the_filled_columns_in_place_and_zeros_come_in() -> None:
    keys, values = kv(2, 5, 0)
    layer = GrowingLayer(keys, values, spare=7)
    layer.shift(3)
    assert layer.get_seq_length() == 8 and torch.equal(layer.keys[:, :, 3:], keys)
    assert not layer.keys[:, :, :3].any() and not layer._keys[:, :, 8:].any()
    layer.shift(-4)  # drop the 3 zero columns and the first filled one
    assert torch.equal(layer.keys, keys[:, :, 1:]) and torch.equal(layer.values, values[:, :, 1:])
    assert not layer._keys[:, :, 4:].any() and not layer._values[:, :, 4:].any()
    with pytest.raises(ValueError, match="capacity"):
        layer.shift(layer.capacity)


@pytest.mark.parametrize("joining_width", [3, 6])
def test_rows_join_into_free_rows_as_merging_would_place_them(joining_width: int) -> None:
    """Rows joining a batch with free rows are written into them (the batch's rows moved right
    first when the newcomers are wider): each row attends to the same keys and values as after a
    fresh merge, in the same buffers."""
    config = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=2)
    batch, mask_a = _batch(3, 4, [1, 0, 2], seed=0)
    joining, mask_b = _batch(2, joining_width, [1, 0], seed=10)
    first_row = DynamicCache()
    for i, (k, v, *_) in enumerate(batch):
        first_row.update(k[:1].clone(), v[:1].clone(), i)
    expect, expect_mask = concat_caches(first_row, mask_a[:1], joining, mask_b, config)
    growing(batch, spare=4)
    for layer in batch.layers:
        layer.keep_rows([0])  # two rows finish: room for the two that join
    buffers = [layer._buffer_k.data_ptr() for layer in batch.layers]
    mask = join_in_place(batch, mask_a[:1], joining, mask_b)
    assert mask is not None and mask.shape[0] == 3 and mask.sum(1).tolist() == expect_mask.sum(1).tolist()
    for layer, (k, v, *_) in zip(batch.layers, expect, strict=True):
        for row in range(3):
            got, want = mask[row].bool(), expect_mask[row].bool()
            assert torch.equal(layer.keys[row, :, got], k[row, :, want])
            assert torch.equal(layer.values[row, :, got], v[row, :, want])
        assert not layer.keys[:, :, ~mask.bool().any(0)].any()  # padding is zeros
    assert [layer._buffer_k.data_ptr() for layer in batch.layers] == buffers
    assert join_in_place(batch, mask, joining, mask_b) is None  # no free rows left: merge instead


def test_leading_columns_nobody_attends_are_dropped_once_there_are_enough() -> None:
    cache, mask = _batch(2, 6, [3, 4], seed=0)
    want = [(k[:, :, 3:].clone(), v[:, :, 3:].clone()) for k, v, *_ in cache]
    growing(cache, spare=2)
    assert torch.equal(drop_unattended_columns(cache, mask, 4), mask)  # 3 < 4: kept
    dropped = drop_unattended_columns(cache, mask, 3)
    assert torch.equal(dropped, mask[:, 3:])
    for layer, (k, v) in zip(cache.layers, want, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


def test_engine_passes_the_cache_by_the_keyword_the_model_takes(tiny_model_and_tokenizer) -> None:
    """transformers 5.2x renamed ``past_key_values`` to ``cache`` and warns on every call that uses the
    old name: a generate (prefill, admission, decode) must not."""
    import asyncio
    import inspect
    import warnings

    from horizonrl.engine.base import SamplingParams
    from horizonrl.engine.hf import HFEngine
    from horizonrl.engine.kvcache import cache_kwargs

    model, tokenizer = tiny_model_and_tokenizer
    (keyword,) = cache_kwargs(model, None)
    assert keyword in inspect.signature(type(model).forward).parameters
    engine = HFEngine(model, tokenizer, max_batch_size=4, seed=0)

    async def two_turns() -> None:
        params = SamplingParams(temperature=0.0, max_new_tokens=6)
        first = await engine.generate([1, 2, 3, 4, 5], params)
        await asyncio.gather(
            engine.generate([1, 2, 3, 4, 5, *first.token_ids, 7], params), engine.generate([9, 8, 7], params)
        )
        await engine.close()

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        asyncio.run(two_turns())
