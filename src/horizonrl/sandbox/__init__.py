"""Sandboxes: isolated, stateful workspaces for agent actions, local or remote behind one API.

    from horizonrl.sandbox import SandboxConfig, make_backend

    backend = make_backend(SandboxConfig())              # bubblewrap on this machine
    async with await backend.create(SandboxSpec(template="repo/")) as box:
        result = await box.exec("python -m pytest -q", timeout=120)
        patch = await box.diff()

``SandboxConfig(backend="remote", url=..., token=...)`` gives the same API through a sandbox server
(``horizon sandbox serve``); ``backend="docker"`` runs containers. Each backend's config is a class
of its own (:mod:`horizonrl.sandbox.config`). See docs/sandboxes.md.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from horizonrl.sandbox.base import (
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
)
from horizonrl.sandbox.config import (
    TOKEN_ENV,
    BwrapSandboxConfig,
    DockerSandboxConfig,
    RemoteSandboxConfig,
    SandboxConfig,
)

__all__ = [
    "TOKEN_ENV",
    "BwrapSandboxConfig",
    "DockerSandboxConfig",
    "ExecResult",
    "RemoteSandboxConfig",
    "Sandbox",
    "SandboxBackend",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "make_backend",
    "shared_backend",
]


_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[str, Any], SandboxBackend]] = weakref.WeakKeyDictionary()


def shared_backend(config: SandboxConfig | None = None) -> SandboxBackend:
    """One backend per config and event loop, shared by every env instance of a rollout (a remote
    backend keeps one connection pool; a bwrap backend its template cache)."""
    config = config or SandboxConfig()
    backends = _SHARED.setdefault(asyncio.get_running_loop(), {})
    # a secret dumps as its reference: its value (hashed by the Secret) tells two tokens apart
    key = (config.model_dump_json(), getattr(config, "token", None))
    if key not in backends:
        backends[key] = make_backend(config)
    return backends[key]


def make_backend(config: SandboxConfig | None = None) -> SandboxBackend:
    """The backend ``config`` names (bubblewrap by default)."""
    return (config or SandboxConfig()).make_backend()
