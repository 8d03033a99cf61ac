"""The engine's token-selection functions against torch's own argmax / log_softmax."""

from __future__ import annotations

import pytest
import torch

from horizonrl.engine.sampling import first_argmax, greedy_pick

SHAPES = [(1, 49152), (7, 49152), (32, 49152), (5, 50257), (3, 5000), (4, 100)]


@pytest.mark.parametrize(("rows", "vocab"), SHAPES)
def test_first_argmax_matches_torch_argmax_including_ties(rows: int, vocab: int) -> None:
    g = torch.Generator().manual_seed(rows * vocab)
    for trial in range(6):
        x = torch.randn(rows, vocab, generator=g)
        if trial % 2:  # coarse values: many ties, the first maximal index must win
            x = (x * 2).round()
        assert torch.equal(first_argmax(x), x.argmax(-1))


def test_first_argmax_picks_the_first_of_equal_maxima_across_blocks() -> None:
    x = torch.zeros(2, 8192)
    x[0, [5000, 6000, 7000]] = 3.0  # three blocks hold the maximum
    x[1, [8191, 100]] = 1.0  # the last column and an early one
    assert first_argmax(x).tolist() == [5000, 100]


def test_first_argmax_of_a_non_contiguous_tensor() -> None:
    x = torch.randn(49152, 3).t()
    assert torch.equal(first_argmax(x), x.argmax(-1))


def test_greedy_pick_returns_the_argmax_and_its_log_softmax() -> None:
    logits = torch.randn(4, 49152, generator=torch.Generator().manual_seed(1)) * 3
    tokens, logprobs = greedy_pick(logits)
    expected = torch.log_softmax(logits, -1)
    assert torch.equal(tokens, logits.argmax(-1))
    torch.testing.assert_close(logprobs, expected[torch.arange(4), tokens])
