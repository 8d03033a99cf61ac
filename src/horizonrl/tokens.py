"""Small pure functions over token id sequences, shared by the engine and the trainer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from horizonrl.types import ConstrainedSpan


def common_prefix_len(seqs: Sequence[Sequence[int]], limit: int | None = None) -> int:
    """Length of the longest prefix all ``seqs`` share, at most ``limit`` (0 for no sequences)."""
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    if limit is not None:
        n = min(n, limit)
    for i in range(max(n, 0)):
        token = first[i]
        if any(s[i] != token for s in seqs[1:]):
            return i
    return max(n, 0)


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """Token ids that end an assistant turn: the tokenizer's EOS plus the model's
    ``generation_config.eos_token_id`` (one id or several). The engine stops rows on these and the
    chat format strips them; both ask here so they never disagree."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra is not None:
        ids.update(int(i) for i in extra)
    return frozenset(ids)


def end_of_turn_id(tokenizer: Any, eos_ids: frozenset[int]) -> int:
    """The one id a scripted turn or a training pair ends with: the tokenizer's own EOS when it is
    among ``eos_ids``, else the smallest of them."""
    if tokenizer.eos_token_id is not None and int(tokenizer.eos_token_id) in eos_ids:
        return int(tokenizer.eos_token_id)
    if not eos_ids:
        raise ValueError("the tokenizer and generation config name no end-of-sequence token")
    return min(eos_ids)


def pad_token_id(tokenizer: Any) -> int:
    """The id right-padding uses (the tokenizer's pad token, else its EOS, else 0). Padded positions
    are masked out everywhere, so the choice never changes a result."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


class ResponseStream:
    """Grows a trajectory's response side with its three lists aligned: a record that has
    ``response_ids``, ``loss_mask`` and ``logprobs`` (the agent loop's episode, a served session, a
    role's view of a multi-agent episode) appends model tokens (masked 1, with their sampling
    logprobs) and environment or template tokens (masked 0, logprob 0.0) through it, and marks the
    model turns sampled under a constraint (``constrained`` spans into ``constraints``)."""

    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    constrained: list[ConstrainedSpan]
    constraints: list[dict[str, Any]]

    def append_model(
        self, ids: Sequence[int], logprobs: Sequence[float], constraint: dict[str, Any] | None = None
    ) -> None:
        """Append model tokens; ``constraint`` (a constraint's record fields,
        ``Constraint.as_record()``) marks them as one turn sampled under it."""
        if constraint is not None and ids:
            if constraint not in self.constraints:
                self.constraints.append(constraint)
            start = len(self.response_ids)
            self.constrained.append(
                ConstrainedSpan(
                    start=start, end=start + len(ids), constraint=self.constraints.index(constraint)
                )
            )
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs

    def append_env(self, ids: Sequence[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
