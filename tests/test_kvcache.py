"""The engine's in-place KV cache layer: the same contents as transformers' concatenating layer,
without a fresh copy of the cache per decoded token."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.cache_utils import DynamicCache, DynamicLayer

from horizonrl.engine.kvcache import GrowingLayer, concat_caches, concat_growing, growing, make_room


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
