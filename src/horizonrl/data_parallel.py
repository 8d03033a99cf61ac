"""Data-parallel training steps over several ranks (``torch.distributed``).

Every rank holds the same policy and optimizer and is given the same rollout batch. In each
mini-batch a rank runs forward and backward over its share of the trajectories (``part[rank::world]``)
with the loss scaled by the *whole* mini-batch's totals, so the gradients summed over the ranks are
exactly the gradient one rank would compute over the whole mini-batch (up to the order of the float
additions). :func:`reduce_gradients` sums them in one flat all-reduce before the optimizer step;
every rank then clips and steps on the same gradient, so the weights stay identical without being
broadcast. :func:`combine_stats` merges the ranks' loss statistics the way one rank's micro-batches
are merged (losses summed, the rest token-weighted).

On CPU the process group uses gloo, on GPUs NCCL; the master address comes from rank 0
(:mod:`horizonrl.runtime.trainer` starts the ranks as Ray actors).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class Collective(Protocol):
    """What a training step needs from the ranks' process group."""

    rank: int
    world_size: int

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the ranks, in place."""

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""


class TorchCollective:
    """A ``torch.distributed`` process group of ``world_size`` ranks (gloo on CPU, NCCL on GPUs)."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 300.0,
    ) -> None:
        import torch.distributed as dist

        self.rank, self.world_size, self.backend = rank, world_size, backend
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self._dist = dist

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.SUM)

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Leave the group together: every rank waits at a barrier before tearing its gloo pairs down,
        so no rank closes a connection a peer is still using (which aborts the peer's process with
        "terminate called without an active exception")."""
        if self._dist.is_initialized():
            self._dist.barrier()
            self._dist.destroy_process_group()


def my_share(items: Sequence[int], collective: Collective | None) -> list[int]:
    """The items of a mini-batch this rank trains on (all of them without a collective)."""
    if collective is None:
        return list(items)
    return list(items[collective.rank :: collective.world_size])


def reduce_gradients(params: Sequence[torch.nn.Parameter], collective: Collective) -> None:
    """Sum the gradients of ``params`` over the ranks in one flat buffer (a rank whose share of the
    mini-batch was empty contributes zeros); afterwards every rank holds the same ``.grad``."""
    if not params:
        return
    device = params[0].device
    flat = torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p))
            .detach()
            .reshape(-1)
            .to(device, torch.float32)
            for p in params
        ]
    )
    collective.all_reduce_sum(flat)
    offset = 0
    for p in params:
        n = p.numel()
        reduced = flat[offset : offset + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = reduced.clone()
        else:
            p.grad.copy_(reduced)
        offset += n


def combine_stats(per_rank: Sequence[tuple[dict[str, float], float]]) -> dict[str, float]:
    """One mini-batch's stats from each rank's (stats, loss tokens): the loss terms are each rank's
    share of the whole loss (summed), the other stats token-weighted means (merged by weight)."""
    total_tokens = sum(tokens for _, tokens in per_rank)
    out: dict[str, float] = {"loss": sum(stats.get("loss", 0.0) for stats, _ in per_rank)}
    keys = sorted({key for stats, _ in per_rank for key in stats if key != "loss"})
    for key in keys:
        weighted = sum(stats[key] * tokens for stats, tokens in per_rank if key in stats)
        out[key] = weighted / total_tokens if total_tokens else 0.0
    return out
