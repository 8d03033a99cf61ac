"""Where a run's workers live: ``runtime.backend: local`` (everything in this process, the
default) or ``ray`` (env/sandbox workers and engine replicas as Ray actors; :mod:`.ray_backend`).

A backend gives a run two things — the env factory its episodes use and the engine its agent
samples from — and the driver loop and the trainer are the same on both. Ray is an optional
extra (``pip install 'horizonrl[ray]'``), imported only when a recipe chooses it.
"""

from __future__ import annotations

from typing import Any

from horizonrl.runtime.config import RuntimeConfig


class LocalBackend:
    """Everything in this process: the recipe's env factory and an in-process engine."""

    name = "local"

    def __init__(self, config: Any) -> None:
        self.config = config

    def env_factory(self) -> Any:
        from horizonrl.build import env_factory

        return env_factory(self.config)

    def engine(self, base: Any, tokenizer: Any) -> Any:
        from horizonrl.build import engine_from_config

        return engine_from_config(base, tokenizer, self.config)

    def trainer_group(self) -> None:
        """The driver trains in this process."""
        return None

    def where(self) -> dict[str, Any]:
        return {"backend": "local"}

    def close(self) -> None:
        return None


def make_backend(config: Any) -> Any:
    """The backend ``config.runtime`` chooses (a Ray cluster is joined or started here)."""
    if config.runtime.backend == "ray":
        from horizonrl.runtime.ray_backend import RayBackend

        return RayBackend(config)
    return LocalBackend(config)


__all__ = ["LocalBackend", "RuntimeConfig", "make_backend"]
