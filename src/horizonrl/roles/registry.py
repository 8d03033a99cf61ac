"""Handing out role clients as the recipe's ``roles:`` block says."""

from __future__ import annotations

from typing import Any

from horizonrl.roles.base import RoleClient, RoleError
from horizonrl.roles.config import ROLE_NAMES, RoleConfig, RolesConfig


class Roles:
    """The role clients of one run. ``policy`` roles share the run's engine (pass it as ``engine``
    with its ``tokenizer``); ``local`` roles on the same model share one engine; clients are built
    on first use, so a recipe with an ``openai`` role loads without its key until the role is used."""

    def __init__(self, config: RolesConfig | None = None, engine: Any = None, tokenizer: Any = None) -> None:
        self.config = config or RolesConfig()
        self.engine = engine
        self.tokenizer = tokenizer
        self._clients: dict[str, RoleClient] = {}
        self._local: dict[tuple[str, str], tuple[Any, Any]] = {}

    def get(self, name: str) -> RoleClient:
        """The client of role ``name`` (one of :data:`ROLE_NAMES`)."""
        if name not in self._clients:
            try:
                config = self.config.for_role(name)
            except KeyError:
                raise RoleError(f"unknown role {name!r}; roles: {', '.join(ROLE_NAMES)}") from None
            self._clients[name] = self._build(name, config)
        return self._clients[name]

    def _build(self, name: str, config: RoleConfig) -> RoleClient:
        from horizonrl.roles.engine import EngineRole, local_engine

        if config.backend == "policy":
            if self.engine is None or self.tokenizer is None:
                raise RoleError(
                    f"role {name!r} uses backend policy, but this command has no policy engine; give the "
                    f"role a local or openai backend (roles.{name}.backend)"
                )
            return EngineRole(name, self.engine, self.tokenizer, config)
        if config.backend == "local":
            assert config.path is not None
            key = (config.path, config.dtype)
            if key not in self._local:
                self._local[key] = local_engine(config.path, config.dtype)
            engine, tokenizer = self._local[key]
            return EngineRole(name, engine, tokenizer, config)
        from horizonrl.roles.openai_backend import OpenAIRole

        return OpenAIRole(name, config)

    def usage(self) -> dict[str, dict[str, int]]:
        """Calls and tokens of each role used so far (clients that count them)."""
        return {
            name: client.usage.as_dict()
            for name, client in self._clients.items()
            if getattr(client, "usage", None) is not None
        }

    def describe(self) -> dict[str, str]:
        """Each role and what serves it (for logs and `horizon roles`)."""
        out = {}
        for name in ROLE_NAMES:
            c: RoleConfig = self.config.for_role(name)
            where = {
                "policy": "the run's policy",
                "local": str(c.path),
                "openai": f"{c.model} at {c.base_url}",
            }
            out[name] = f"{c.backend}: {where[c.backend]}"
        return out
