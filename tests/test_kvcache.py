"""The engine's in-place KV cache layer: the same contents as transformers' concatenating layer,
without a fresh copy of the cache per decoded token."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from horizonrl.engine.kvcache import GrowingLayer, growing, make_room


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
