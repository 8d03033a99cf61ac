"""The trainer as a group of ranks (``runtime.trainer_ranks``): data-parallel ``torch.distributed``
ranks in Ray actors, driven by the unchanged driver loop.

- :class:`TrainerRank` is what runs in each actor (a plain class; the Ray backend wraps it): it
  loads the recipe's base model, replays the adapters merged before RL (the SFT stage), builds the
  same policy, optimizer and schedule as the driver and takes the driver's trainable weights and
  optimizer state, so every rank starts from exactly the driver's policy (checked by fingerprint).
  It joins the process group at rank 0's address (gloo on CPU, NCCL when the ranks reserve GPUs)
  and runs the update on its share of each mini-batch (:mod:`horizonrl.data_parallel`). What it
  builds and runs comes from a :class:`RankRecipe` it is handed (the run's is
  :class:`horizonrl.train.workers.TrainerRecipe`: the base,
  :func:`~horizonrl.trainable.build_policy` and :func:`~horizonrl.train.update.train_step` under
  the run's config).
- :class:`TrainerGroup` is the driver's handle: it loads the ranks, sends each rollout batch once
  through the object store, checks after every step that the ranks' weights are still identical,
  and pulls rank 0's trainable weights back into the driver's policy, from where they go to the
  engines as before. The optimizer state comes back only when a checkpoint is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from horizonrl.data_parallel import TorchCollective
from horizonrl.errors import HorizonError
from horizonrl.local_server import free_port


def _trained_tensors(policy: Any, modules: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The policy's trainable parameters and the extra modules' weights, by name (not copied)."""
    tensors = {f"policy.{name}": p for name, p in policy.named_parameters() if p.requires_grad}
    for module_name, module in modules.items():
        for name, tensor in module.state_dict().items():
            tensors[f"{module_name}.{name}"] = tensor
    return tensors


def trainable_state(policy: Any, modules: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What a rank trains: the policy's trainable parameters and the extra modules' weights (on the CPU)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in _trained_tensors(policy, modules).items()}


def load_trainable_state(policy: Any, modules: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (from :func:`trainable_state`) into ``policy`` and ``modules`` in place; the
    names must match exactly."""
    targets = _trained_tensors(policy, modules)
    missing, unexpected = sorted(set(targets) - set(state)), sorted(set(state) - set(targets))
    if missing or unexpected:
        raise HorizonError(
            f"trainer weights do not fit the policy: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, target in targets.items():
            target.copy_(state[name].to(target.device, target.dtype))


def exact_fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (bit-exact)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensors[name].shape)};".encode())
        digest.update(memoryview(tensor.view(torch.uint8).numpy()).cast("B"))
    return digest.hexdigest()


def policy_fingerprint(policy: Any, modules: dict[str, Any]) -> str:
    """Bit-exact fingerprint of every weight a rank's forward pass uses (not only the trained ones)."""
    state = {f"policy.{k}": v for k, v in policy.state_dict().items()}
    for module_name, module in modules.items():
        state.update({f"{module_name}.{k}": v for k, v in module.state_dict().items()})
    return exact_fingerprint(state)


class RankRecipe(Protocol):
    """What a trainer rank builds and runs, from the run's recipe. Handed to each rank by whoever
    starts the ranks; picklable, as it travels to the rank's actor."""

    def load_base(self, device: str) -> tuple[Any, Any]:
        """The recipe's base model on ``device`` and its tokenizer (process settings applied first)."""

    def build_policy(self, base: Any) -> Any:
        """The policy around ``base`` as the driver builds its own: a
        :class:`~horizonrl.trainable.TrainablePolicy` (model, modules, optimizer, scheduler)."""

    def replay(self, tokenizer: Any, base: Any) -> Any:
        """What rebuilds the masks of constrained turns for the update, or None (no constraints)."""

    def train_step(
        self,
        policy: Any,
        optimizer: Any,
        scheduler: Any,
        trajectories: list[Any],
        pad_id: int,
        temperature: float,
        **options: Any,
    ) -> dict[str, float]:
        """The optimizer step(s) of one rollout batch (``options``: ``value_head``, ``seed``,
        ``collective``, ``clip_high``, ``token_advantages``, ``replay``); the batch's metrics."""


class TrainerRank:
    """One data-parallel rank of the trainer (the body of a Ray actor). ``cpus`` and ``gpus`` are
    what its actor reserved: it uses that many torch threads, and its GPU when it reserved one."""

    def __init__(self, recipe: RankRecipe, rank: int, world_size: int, cpus: float, gpus: float) -> None:
        self.recipe = recipe
        self.rank, self.world_size = rank, world_size
        # Ray sets OMP_NUM_THREADS to the whole CPUs an actor reserves: use what it reserved, rounded up
        torch.set_num_threads(max(1, math.ceil(cpus)))
        self.device = "cuda" if gpus > 0 else "cpu"
        self.collective: Any = None
        self.policy: Any = None

    def address(self) -> tuple[str, int]:
        """Where the process group meets (rank 0's node and a free port)."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def join(self, master_addr: str, master_port: int, timeout_s: float) -> int:
        backend = "nccl" if self.device == "cuda" else "gloo"
        self.collective = TorchCollective(
            master_addr, master_port, self.rank, self.world_size, backend, timeout_s
        )
        return self.rank

    def load(
        self,
        stages: Sequence[Any],
        trainable: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any],
        scheduler_state: dict[str, Any],
    ) -> str:
        """Build the driver's policy here: base, merged stages, fresh wrap, then the driver's trained
        weights and optimizer state. Returns the policy's exact fingerprint."""
        from horizonrl.policy import apply_adapter, write_adapter

        base, tokenizer = self.recipe.load_base(self.device)  # on its GPU, or the CPU
        self.replay = self.recipe.replay(tokenizer, base)
        for stage in stages:  # the adapters merged into the base before RL, merged the same way here
            with tempfile.TemporaryDirectory(prefix="horizonrl-stage-") as folder:
                write_adapter(Path(folder), stage, None)
                base = apply_adapter(base, Path(folder)).merge_and_unload()
        built = self.recipe.build_policy(base)
        self.policy, self.modules = built.model, built.modules
        self.optimizer, self.scheduler = built.optimizer, built.scheduler
        load_trainable_state(self.policy, self.modules, trainable)  # all on the base's device already
        self.optimizer.load_state_dict(optimizer_state)
        if scheduler_state:
            self.scheduler.load_state_dict(scheduler_state)
        self.policy.eval()
        return policy_fingerprint(self.policy, self.modules)

    def train_step(
        self,
        trajectories: list[Any],
        pad_id: int,
        temperature: float,
        seed: int,
        clip_high: list[float | None] | None = None,
        token_advantages: list[list[float]] | None = None,
    ) -> dict[str, Any]:
        """One rollout batch's optimizer step(s) on this rank's share; the metrics of the whole batch
        and the fingerprint of the trained weights afterwards."""
        metrics = self.recipe.train_step(
            self.policy,
            self.optimizer,
            self.scheduler,
            trajectories,
            pad_id,
            temperature,
            value_head=self.modules.get("value_head"),
            seed=seed,
            collective=self.collective,
            clip_high=clip_high,
            token_advantages=token_advantages,
            replay=self.replay,
        )
        return {"metrics": metrics, "trained": exact_fingerprint(trainable_state(self.policy, self.modules))}

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.policy, self.modules)

    def optimizer_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.optimizer.state_dict(), self.scheduler.state_dict()

    def where(self) -> dict[str, Any]:
        import ray

        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def close(self) -> None:
        if self.collective is not None:
            self.collective.close()


class TrainerGroup:
    """The driver's handle on the trainer ranks (started and joined by the Ray backend)."""

    def __init__(self, ray: Any, ranks: Sequence[Any], timeout_s: float) -> None:
        self.ray, self.ranks, self.timeout_s = ray, list(ranks), timeout_s

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def _get(self, refs: Any, what: str) -> Any:
        ray = self.ray
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise HorizonError(
                f"the trainer ranks did not {what} within runtime.start_timeout_s={self.timeout_s:g}"
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise HorizonError(f"a trainer rank died while it was to {what}: {exc}") from None

    def join(self) -> None:
        """Form the process group at rank 0's address (every rank must join, or it is an error)."""
        addr, port = self._get(self.ranks[0].address.remote(), "report rank 0's address")
        self._get([r.join.remote(addr, port, self.timeout_s) for r in self.ranks], "join the process group")

    def load(
        self, stages: Sequence[Any], policy: Any, modules: dict[str, Any], optimizer: Any, scheduler: Any
    ) -> None:
        """Start every rank from the driver's policy and optimizer; refuse a rank that differs."""
        ray = self.ray
        refs = [
            ray.put(list(stages)),
            ray.put(trainable_state(policy, modules)),
            ray.put(optimizer.state_dict()),
            ray.put(scheduler.state_dict()),
        ]
        prints = self._get([r.load.remote(*refs) for r in self.ranks], "load the policy")
        mine = policy_fingerprint(policy, modules)
        wrong = [i for i, fp in enumerate(prints) if fp != mine]
        if wrong:
            raise HorizonError(
                f"trainer ranks {wrong} built a policy that differs from the driver's (another model "
                f"file on their node, or another library version); every rank must hold the same weights"
            )

    def train_step(
        self,
        trajectories: Sequence[Any],
        pad_id: int,
        temperature: float,
        seed: int,
        clip_high: Sequence[float | None] | None = None,
        token_advantages: Sequence[list[float]] | None = None,
    ) -> dict[str, float]:
        batch = self.ray.put(list(trajectories))
        bounds = list(clip_high) if clip_high is not None else None
        advantages = list(token_advantages) if token_advantages is not None else None
        results = self._get(
            [r.train_step.remote(batch, pad_id, temperature, seed, bounds, advantages) for r in self.ranks],
            "finish a training step",
        )
        prints = {res["trained"] for res in results}
        if len(prints) != 1:
            raise HorizonError(
                f"the trainer ranks' weights diverged after a step ({len(prints)} different states): "
                "their gradients were not the same"
            )
        metrics = dict(results[0]["metrics"])
        metrics["trainer_ranks"] = float(len(self.ranks))
        return metrics

    def pull_weights(self, policy: Any, modules: dict[str, Any]) -> None:
        """Rank 0's trained weights into the driver's policy (which then syncs the engines)."""
        load_trainable_state(
            policy, modules, self._get(self.ranks[0].trainable_state.remote(), "send weights")
        )

    def pull_optimizer(self, optimizer: Any, scheduler: Any) -> None:
        """Rank 0's optimizer and schedule state into the driver's (for a checkpoint)."""
        opt, sched = self._get(self.ranks[0].optimizer_state.remote(), "send the optimizer state")
        optimizer.load_state_dict(opt)
        scheduler.load_state_dict(sched)

    def where(self) -> list[dict[str, Any]]:
        return list(self._get([r.where.remote() for r in self.ranks], "report where they run"))

    def close(self) -> None:
        # all ranks leave the process group at once (its close is a barrier), then the actors go
        with contextlib.suppress(Exception):
            self.ray.get([rank.close.remote() for rank in self.ranks], timeout=30)
        for rank in self.ranks:
            with contextlib.suppress(Exception):
                self.ray.kill(rank)
