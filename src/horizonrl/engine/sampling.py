"""The engine's token selection: sampling with per-row temperature, top-p and generators, and a
fast greedy pick.

Measured on this machine (2-core CPU, 32 rows x SmolLM2's 49,152-token vocabulary): ``torch.argmax``
over the vocabulary takes 0.67 ms and ``torch.logsumexp`` 1.0 ms, while ``amax`` takes 0.04 ms and
``log_softmax`` 0.47 ms — for a tiny model the greedy pick cost more than its decoder layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

BLOCK = 1024


def first_argmax(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """``x.argmax(-1)`` for a 2-D ``x`` (the first maximal index, as torch documents), computed as the
    maximum of each block of ``block`` columns, the first block holding the row's maximum, and the
    first maximal index inside that block."""
    rows, width = x.shape
    if width < 4 * block or not x.is_contiguous():
        return x.argmax(-1)
    full = width // block
    maxima = x[:, : full * block].view(rows, full, block).amax(-1)
    if width % block:
        maxima = torch.cat([maxima, x[:, full * block :].amax(-1, keepdim=True)], dim=-1)
    starts = maxima.argmax(-1) * block
    columns = (starts[:, None] + torch.arange(block, device=x.device)).clamp_(max=width - 1)
    return starts + x.gather(-1, columns).argmax(-1)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely token of each row of ``logits`` [rows, vocab] and its log-probability under
    ``log_softmax(logits)``."""
    tokens = first_argmax(logits)
    return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def sample(
    logits: torch.Tensor,
    temps: torch.Tensor,
    top_ps: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    shared: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` [rows, vocab]; return (tokens, their logprobs).

    Rows with temperature 0 are greedy. Logprobs are under the full softmax of ``logits / T``
    (``log_softmax(logits)`` for greedy rows), i.e. what a trainer recomputes, regardless of top_p
    truncation. Sampling uses the inverse CDF with one uniform draw per row: a row with its own
    generator draws from it, so its samples do not depend on which other rows share the batch;
    rows without one draw from ``shared``.
    """
    logits = logits.float()
    greedy = temps == 0
    if bool(greedy.all()):
        return greedy_pick(logits)
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    probs = logp.exp()
    uniform = torch.rand(len(generators), generator=shared)
    for j, generator in enumerate(generators):
        if generator is not None:
            uniform[j] = torch.rand((), generator=generator)
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


def top_candidates(
    logits: torch.Tensor, temps: torch.Tensor, rows: Sequence[int], sampled_rows: Sequence[Any]
) -> list[list[tuple[int, float]]]:
    """The ``params.top_logprobs`` most likely tokens of each row in ``rows`` with their logprobs,
    under the distribution :func:`sample` draws from (``logits / T``; the raw logits for greedy rows),
    most likely first. ``sampled_rows[j].params.top_logprobs`` says how many row ``j`` wants."""
    index = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    sub = logits[index].float()
    t = temps[index]
    logp = torch.log_softmax(sub / torch.where(t == 0, 1.0, t)[:, None], dim=-1)
    k = max(sampled_rows[j].params.top_logprobs for j in rows)
    values, ids = logp.topk(k, dim=-1)
    out = []
    for n, j in enumerate(rows):
        want = sampled_rows[j].params.top_logprobs
        out.append(list(zip(ids[n, :want].tolist(), values[n, :want].tolist(), strict=True)))
    return out
