"""The trainer as a group of ranks (``runtime.trainer_ranks``): data-parallel ``torch.distributed``
ranks in Ray actors, driven by the unchanged driver loop.

- :class:`TrainerRank` is what runs in each actor (a plain class; the Ray backend wraps it): it
  loads the recipe's base model, replays the adapters merged before RL (the SFT stage), builds the
  same policy, optimizer and schedule as the driver (:func:`~horizonrl.train.run.wrap_policy`) and
  takes the driver's trainable weights and optimizer state, so every rank starts from exactly the
  driver's policy (checked by fingerprint). It joins the process group at rank 0's address (gloo on
  CPU, NCCL when the ranks reserve GPUs) and runs :func:`~horizonrl.train.update.train_step` on its
  share of each mini-batch (:mod:`horizonrl.train.distributed`).
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
from typing import Any

import torch

from horizonrl.engine.replay import ConstraintReplay
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


class TrainerRank:
    """One data-parallel rank of the trainer (the body of a Ray actor)."""

    def __init__(self, config: dict[str, Any], rank: int, world_size: int) -> None:
        from horizonrl.config import RunConfig

        self.cfg = RunConfig.model_validate(config)
        self.rank, self.world_size = rank, world_size
        rc = self.cfg.runtime
        # Ray sets OMP_NUM_THREADS to the whole CPUs an actor reserves: use what it reserved, rounded up
        torch.set_num_threads(max(1, math.ceil(rc.trainer_cpus)))
        self.device = "cuda" if rc.trainer_gpus > 0 else "cpu"
        self.collective: Any = None
        self.policy: Any = None

    def address(self) -> tuple[str, int]:
        """Where the process group meets (rank 0's node and a free port)."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def join(self, master_addr: str, master_port: int, timeout_s: float) -> int:
        from horizonrl.train.distributed import TorchCollective

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
        from horizonrl.build import apply_memory_settings
        from horizonrl.models import load_base
        from horizonrl.policy import apply_adapter, write_adapter
        from horizonrl.train.run import wrap_policy

        apply_memory_settings(self.cfg)
        on_own_device = self.cfg.model.model_copy(update={"device": self.device})  # its GPU, or none
        loaded = load_base(on_own_device)
        base = loaded.base
        self.replay = self._constraint_replay(loaded.tokenizer, base)
        for stage in stages:  # the adapters merged into the base before RL, merged the same way here
            with tempfile.TemporaryDirectory(prefix="horizonrl-stage-") as folder:
                write_adapter(Path(folder), stage, None)
                base = apply_adapter(base, Path(folder)).merge_and_unload()
        self.policy, self.modules, self.optimizer, self.scheduler = wrap_policy(self.cfg, base)
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
        from horizonrl.train.update import train_step

        metrics = train_step(
            self.policy,
            self.optimizer,
            self.scheduler,
            trajectories,
            self.cfg.train,
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

    def _constraint_replay(self, tokenizer: Any, base: Any) -> ConstraintReplay | None:
        """The masks of constrained turns, rebuilt for the update (``agent.constrain``)."""
        return ConstraintReplay(tokenizer, base) if self.cfg.agent.constrain != "none" else None

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
