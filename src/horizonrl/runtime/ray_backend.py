"""``runtime.backend: ray``: env workers, engine replicas and trainer ranks as Ray actors.

The run connects to ``runtime.address`` (checked to answer within ``connect_timeout_s``, so a wrong
address is one line, not a hang) or starts a local cluster. All workers are placed at once in one
placement group — env workers with ``env_worker_cpus`` and ``env_worker_resources`` each, engine
replicas with ``engine_cpus`` and ``engine_gpus``, trainer ranks with ``trainer_cpus`` and
``trainer_gpus`` — and the run waits ``placement_timeout_s`` for it: a cluster without those
resources is an error that names what is missing. The driver keeps the rollout loop; envs live in
the workers (:class:`~.remote.RemoteEnv`), generation goes through :class:`~.remote.EngineRouter`,
and the update runs in the driver or, with ``trainer_ranks``, in a data-parallel
:class:`~.trainer.TrainerGroup`. A worker that dies is replaced; its episodes end as ``error`` and
the step goes on.

The backend reads no recipe: it is handed the ``runtime`` block and a :class:`~horizonrl.runtime.WorkerSpec`
(the env's name and options, the factory each engine replica builds its engine with, the recipe
each trainer rank builds and runs), whatever its actors need travelling to them as plain data or a
picklable callable.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import Any

from horizonrl.errors import ConfigError, HorizonError
from horizonrl.runtime import WorkerSpec
from horizonrl.runtime.config import RuntimeConfig
from horizonrl.runtime.remote import EngineRouter, EnvPool
from horizonrl.runtime.trainer import TrainerGroup, TrainerRank
from horizonrl.runtime.workers import EngineWorker, EnvWorker

INSTALL_HINT = "Ray is not installed: pip install 'horizonrl[ray]' (or runtime.backend=local)"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray


def _check_answers(address: str, timeout_s: float) -> None:
    """Refuse an address whose port does not accept a connection within ``timeout_s``."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"runtime.address {address!r} is not host:port, 'auto' or ray://host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError(
            f"runtime.address {address!r} does not answer ({exc.strerror or exc}); start the cluster with "
            f"`ray start --head --port {port}` or leave runtime.address empty for a local one"
        ) from None


def driver_paths() -> list[str]:
    """The driver's import path outside the interpreter's own prefixes (its working directory, a
    source tree, a tests directory), followed by whatever ``PYTHONPATH`` already holds."""
    prefixes = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    paths: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(path) and not path.startswith(prefixes) and path not in paths:
            paths.append(path)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    return paths + extra


class RayBackend:
    """Starts (or joins) a cluster and the run's workers; :meth:`close` stops what it started."""

    name = "ray"

    def __init__(self, rc: RuntimeConfig, spec: WorkerSpec) -> None:
        self.rc, self.spec = rc, spec
        self.ray = import_ray()
        self._started_cluster = False
        self._connect()
        try:
            self._place()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------ cluster
    def _connect(self) -> None:
        ray, rc = self.ray, self.rc
        if ray.is_initialized():
            return
        options = {"log_to_driver": False, "namespace": "horizonrl", "configure_logging": False}
        if rc.address:
            _check_answers(rc.address, rc.connect_timeout_s)
            try:
                ray.init(address=rc.address, **options)
            except (ConnectionError, RuntimeError) as exc:
                raise ConfigError(
                    f"runtime.address {rc.address!r}: could not join the cluster ({exc}); a cluster with "
                    "token authentication needs RAY_AUTH_MODE=token (and its token) in this process too"
                ) from None
        else:
            # the workers import what the driver imports (an env given as module:Class from the
            # current directory, a plugin on the driver's path)
            runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(driver_paths())}}
            # "local": a cluster of this run's own, never one that happens to run on the machine
            ray.init(address="local", include_dashboard=False, runtime_env=runtime_env, **options)
            self._started_cluster = True

    def _bundles(self) -> list[dict[str, float]]:
        rc = self.rc
        envs = [{"CPU": rc.env_worker_cpus, **rc.env_worker_resources} for _ in range(rc.env_workers)]
        engines = [
            {"CPU": rc.engine_cpus, **({"GPU": rc.engine_gpus} if rc.engine_gpus else {})}
            for _ in range(rc.engine_replicas)
        ]
        trainers = [
            {"CPU": rc.trainer_cpus, **({"GPU": rc.trainer_gpus} if rc.trainer_gpus else {})}
            for _ in range(rc.trainer_ranks)
        ]
        return envs + engines + trainers

    def _place(self) -> None:
        ray, rc = self.ray, self.rc
        from ray.util.placement_group import placement_group

        bundles = self._bundles()
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=rc.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise HorizonError(self._missing(bundles)) from None
        self._env_actor = ray.remote(EnvWorker)
        self._engine_actor = ray.remote(EngineWorker)
        self._trainer_actor = ray.remote(TrainerRank)
        self.env_workers = [self._start_env_worker(i) for i in range(rc.env_workers)]
        self.replicas = [self._start_replica(i) for i in range(rc.engine_replicas)]
        self.trainer: TrainerGroup | None = None
        if rc.trainer_ranks:
            self.trainer = TrainerGroup(
                ray, [self._start_trainer_rank(i) for i in range(rc.trainer_ranks)], rc.start_timeout_s
            )
        try:
            ray.get([w.live.remote() for w in self.env_workers], timeout=rc.start_timeout_s)
            infos = ray.get([r.info.remote() for r in self.replicas], timeout=rc.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise HorizonError(
                f"the run's Ray workers were placed but did not start within runtime.start_timeout_s="
                f"{rc.start_timeout_s:g} (importing and loading the model on a busy node takes longer)"
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise HorizonError(f"a Ray worker of the run failed while starting: {exc}") from None
        if self.trainer is not None:
            self.trainer.join()
        self.engine_info = infos[0] if infos else None
        self.pool = EnvPool(self.env_workers)
        self.pool.on_lost = self._replace_env_worker

    def _missing(self, bundles: list[dict[str, float]]) -> str:
        wanted: dict[str, float] = {}
        for bundle in bundles:
            for key, value in bundle.items():
                wanted[key] = wanted.get(key, 0.0) + value
        have = self.ray.cluster_resources()
        short = {
            k: f"{v:g} wanted, {have.get(k, 0.0):g} in the cluster"
            for k, v in wanted.items()
            if have.get(k, 0.0) < v
        }
        detail = "; ".join(f"{k}: {v}" for k, v in short.items()) or (
            "the totals exist but no placement fits them (a bundle larger than any one node)"
        )
        return (
            f"the Ray cluster could not place the run's workers within runtime.placement_timeout_s="
            f"{self.rc.placement_timeout_s:g}: {detail} (runtime.env_workers={self.rc.env_workers}, "
            f"env_worker_cpus={self.rc.env_worker_cpus:g}, engine_replicas={self.rc.engine_replicas}, "
            f"engine_cpus={self.rc.engine_cpus:g}, engine_gpus={self.rc.engine_gpus:g}, "
            f"trainer_ranks={self.rc.trainer_ranks}, trainer_cpus={self.rc.trainer_cpus:g}, "
            f"trainer_gpus={self.rc.trainer_gpus:g})"
        )

    def _strategy(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)

    def _start_env_worker(self, index: int) -> Any:
        rc = self.rc
        return self._env_actor.options(
            num_cpus=rc.env_worker_cpus,
            resources=dict(rc.env_worker_resources),
            scheduling_strategy=self._strategy(index),
            max_concurrency=1000,
        ).remote(self.spec.env_name, dict(self.spec.env_options))

    def _start_replica(self, index: int) -> Any:
        rc = self.rc
        return self._engine_actor.options(
            num_cpus=rc.engine_cpus,
            num_gpus=rc.engine_gpus,
            scheduling_strategy=self._strategy(rc.env_workers + index),
            max_concurrency=1000,
        ).remote(self.spec.replica_engine, rc.engine_cpus)

    def _start_trainer_rank(self, rank: int) -> Any:
        rc = self.rc
        return self._trainer_actor.options(
            num_cpus=rc.trainer_cpus,
            num_gpus=rc.trainer_gpus,
            scheduling_strategy=self._strategy(rc.env_workers + rc.engine_replicas + rank),
        ).remote(self.spec.trainer, rank, rc.trainer_ranks, rc.trainer_cpus, rc.trainer_gpus)

    def _replace_env_worker(self) -> Any:
        """A new env worker in place of a dead one (in the dead one's bundle, now free)."""
        index = len(self.env_workers) % max(self.rc.env_workers, 1)
        with contextlib.suppress(Exception):
            worker = self._start_env_worker(index)
            self.env_workers.append(worker)
            return worker
        return None

    def _replace_replica(self, version: int) -> Any:
        index = len(self.replicas) % max(self.rc.engine_replicas, 1)
        with contextlib.suppress(Exception):
            replica = self._start_replica(index)
            if self.router.last_state is not None:
                self.ray.get(replica.update_weights.remote(self.router.last_state, version))
            self.replicas.append(replica)
            return replica
        return None

    # ------------------------------------------------------------------------ what a run uses
    def env_factory(self) -> Any:
        return self.pool.factory

    def engine(self, base: Any, tokenizer: Any) -> Any:
        """The router over the replicas (or, with ``engine_replicas: 0``, an in-process engine)."""
        if not self.replicas:
            return self.spec.engine(base, tokenizer)
        import torch

        from horizonrl.engine.fast_copy import FAST_KINDS

        # the fast replicas (int8, float16 weights) quantize or pack float32 weights themselves
        dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
        dtypes.update(dict.fromkeys((*FAST_KINDS, "fast"), torch.float32))
        dtype = dtypes.get(self._engine_dtype(base))
        self.router = EngineRouter(
            self.replicas, self.engine_info, tokenizer, max_retries=self.rc.max_replica_retries, dtype=dtype
        )
        self.router.on_lost = self._replace_replica
        return self.router

    def trainer_group(self) -> TrainerGroup | None:
        """The trainer ranks (``runtime.trainer_ranks``), joined in their process group; None when
        the driver trains."""
        return self.trainer

    def _engine_dtype(self, base: Any) -> str:
        dtype = self.spec.engine_dtype
        return str(base.dtype).replace("torch.", "") if dtype == "auto" else dtype

    def where(self) -> dict[str, Any]:
        """Where each worker runs (node ids), for logs and the multi-node check."""
        ray = self.ray
        return {
            "env_workers": ray.get([w.where.remote() for w in self.pool.workers]),
            "engine_replicas": ray.get([r.info.remote() for r in self.replicas]),
            "trainer_ranks": self.trainer.where() if self.trainer is not None else [],
        }

    def close(self) -> None:
        ray = self.ray
        if getattr(self, "trainer", None) is not None:
            self.trainer.close()
        for actor in [*getattr(self, "env_workers", []), *getattr(self, "replicas", [])]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if getattr(self, "pg", None) is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)
        if self._started_cluster and ray.is_initialized():
            ray.shutdown()
            time.sleep(0.1)
