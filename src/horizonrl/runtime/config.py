"""The ``runtime:`` block of a recipe: where the workers of a run live."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RuntimeConfig(BaseModel):
    """``local``: everything in this process (the default). ``ray``: envs and sandboxes in env-worker
    actors, generation in engine-replica actors behind a router, on a local Ray cluster or an
    existing one (``address``); the driver loop and the trainer are the same on both."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "ray"] = Field("local", description="'local' (in-process) or 'ray' (actors).")
    address: str | None = Field(
        None,
        description="ray: an existing cluster ('host:port' or 'auto'); none starts a local one for the run.",
    )
    env_workers: int = Field(
        2, ge=1, le=1_024, description="ray: env/sandbox worker actors (envs are spread over them)."
    )
    env_worker_cpus: float = Field(0.5, gt=0, description="ray: CPUs each env worker reserves.")
    env_worker_resources: dict[str, float] = Field(
        default_factory=dict,
        description="ray: custom resources each env worker needs, to place them on chosen nodes "
        "(e.g. {sandbox_node: 1} with `ray start --resources '{\"sandbox_node\": 4}'`).",
    )
    engine_replicas: int = Field(
        1,
        ge=0,
        le=1_024,
        description="ray: engine actors behind the router (0: the engine stays in the driver).",
    )
    engine_cpus: float = Field(
        1.0,
        gt=0,
        description="ray: CPUs each engine replica reserves (it decodes with that many threads, rounded up).",
    )
    engine_gpus: float = Field(0.0, ge=0, description="ray: GPUs each engine replica reserves.")
    trainer_ranks: int = Field(
        0,
        ge=0,
        le=1_024,
        description="ray: data-parallel trainer ranks (torch.distributed: gloo on CPU, NCCL on GPUs) "
        "as actors; 0 trains in the driver.",
    )
    trainer_cpus: float = Field(
        1.0, gt=0, description="ray: CPUs each trainer rank reserves (its torch threads, rounded up)."
    )
    trainer_gpus: float = Field(
        0.0, ge=0, description="ray: GPUs each trainer rank reserves (>0: NCCL, the rank trains on its GPU)."
    )
    placement_timeout_s: float = Field(
        60.0, gt=0, description="ray: seconds to wait for the workers' resources before failing (never hang)."
    )
    start_timeout_s: float = Field(
        300.0, gt=0, description="ray: seconds for the placed workers to start (import, load the model)."
    )
    connect_timeout_s: float = Field(30.0, gt=0, description="ray: seconds to wait for `address` to answer.")
    max_replica_retries: int = Field(
        2, ge=0, description="ray: a request whose replica died is retried on another this many times."
    )

    @model_validator(mode="after")
    def _ray_fields(self) -> RuntimeConfig:
        if self.backend == "local":
            changed = [
                name
                for name, info in type(self).model_fields.items()
                if name != "backend" and getattr(self, name) != info.get_default(call_default_factory=True)
            ]
            if changed:
                raise ValueError(
                    f"{changed} apply to runtime.backend ray, not local (set runtime.backend=ray)"
                )
        return self
