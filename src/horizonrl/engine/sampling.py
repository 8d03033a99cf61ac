"""Small, pure tensor functions of the engine's token selection.

Measured on this machine (2-core CPU, 32 rows x SmolLM2's 49,152-token vocabulary): ``torch.argmax``
over the vocabulary takes 0.67 ms and ``torch.logsumexp`` 1.0 ms, while ``amax`` takes 0.04 ms and
``log_softmax`` 0.47 ms — for a tiny model the greedy pick cost more than its decoder layers.
"""

from __future__ import annotations

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
