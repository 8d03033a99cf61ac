"""Sandboxes: isolated, stateful workspaces for agent actions, local or remote behind one API.

    from horizonrl.sandbox import SandboxConfig, make_backend

    backend = make_backend(SandboxConfig())              # bubblewrap on this machine
    async with await backend.create(SandboxSpec(template="repo/")) as box:
        result = await box.exec("python -m pytest -q", timeout=120)
        patch = await box.diff()

``SandboxConfig(backend="remote", url=..., token=...)`` gives the same API through a sandbox server
(``horizon sandbox serve``); ``backend="docker"`` runs containers. See docs/sandboxes.md.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from horizonrl.errors import ConfigError
from horizonrl.sandbox.base import (
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)
from horizonrl.sandbox.bwrap import BwrapOptions

TOKEN_ENV = "HORIZON_SANDBOX_TOKEN"

__all__ = [
    "TOKEN_ENV",
    "ExecResult",
    "Sandbox",
    "SandboxBackend",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "make_backend",
    "shared_backend",
]


class SandboxConfig(BaseModel):
    """Where an env's sandboxes run: locally with bubblewrap, on a sandbox server, or in Docker."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["bwrap", "remote", "docker"] = Field(
        "bwrap",
        description="bwrap: this machine; remote: a `horizon sandbox serve` server; docker: containers.",
    )
    url: str | None = Field(None, description="remote: the sandbox server's URL, e.g. http://10.0.0.5:8080.")
    token: str | None = Field(
        None,
        description=f"remote: the server's bearer token (default: the {TOKEN_ENV} environment variable).",
    )
    docker_image: str = Field(
        "python:3.11", description="docker: the image (it needs sh, git and coreutils; -slim has no git)."
    )
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Limits of every sandbox.")
    bwrap: BwrapOptions = Field(default_factory=BwrapOptions, description="bwrap: host-side settings.")

    @model_validator(mode="after")
    def _check_remote(self) -> SandboxConfig:
        if self.backend == "remote" and not self.url:
            raise ConfigError("sandbox.url: the remote backend needs the sandbox server's URL")
        return self

    def resolved_token(self) -> str:
        token = self.token or os.environ.get(TOKEN_ENV)
        if not token:
            raise ConfigError(f"sandbox.token: the remote backend needs a token (or set {TOKEN_ENV})")
        return token


_SHARED: weakref.WeakKeyDictionary[Any, dict[str, SandboxBackend]] = weakref.WeakKeyDictionary()


def shared_backend(config: SandboxConfig | None = None) -> SandboxBackend:
    """One backend per config and event loop, shared by every env instance of a rollout (a remote
    backend keeps one connection pool; a bwrap backend its template cache)."""
    config = config or SandboxConfig()
    backends = _SHARED.setdefault(asyncio.get_running_loop(), {})
    key = config.model_dump_json()
    if key not in backends:
        backends[key] = make_backend(config)
    return backends[key]


def make_backend(config: SandboxConfig | None = None) -> SandboxBackend:
    """The backend ``config`` names (bubblewrap by default)."""
    config = config or SandboxConfig()
    if config.backend == "remote":
        from horizonrl.sandbox.remote import RemoteBackend

        assert config.url is not None
        return RemoteBackend(config.url, config.resolved_token())
    if config.backend == "docker":
        from horizonrl.sandbox.docker import DockerBackend

        return DockerBackend(config.docker_image)
    from horizonrl.sandbox.bwrap import BwrapBackend

    return BwrapBackend(config.bwrap)
