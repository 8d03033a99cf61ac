"""Where an env's sandboxes run: one config class per backend, told apart by the ``backend`` key.

    sandbox: {limits: {memory_mib: 512}}                         # no backend key: bubblewrap here
    sandbox: {backend: bwrap, bwrap: {state_dir: /scratch/sb}}   # the same, with host settings
    sandbox: {backend: remote, url: "http://sandboxes:8080"}     # token: $HORIZON_SANDBOX_TOKEN
    sandbox: {backend: remote, url: "http://sandboxes:8080", token: "${env:MY_TOKEN}"}
    sandbox: {backend: docker, docker_image: "python:3.11"}

:class:`SandboxConfig` is the base of every backend's config and the type env options annotate: a
field ``sandbox: SandboxConfig`` accepts the config of any backend (the class named by ``backend``,
bwrap when it is absent), and ``SandboxConfig(**keys)`` builds one the same way, so
``SandboxConfig()`` is the default (bubblewrap). Each backend's class holds ``limits`` and its own
keys only (a key of another backend is a one-line error naming the valid ones) and makes its backend
with :meth:`SandboxConfig.make_backend`. Adding a backend is one subclass (docs/sandboxes.md)::

    class MyConfig(SandboxConfig):
        backend: Literal["mine"] = "mine"
        endpoint: str

        def make_backend(self) -> SandboxBackend:
            return MyBackend(self.endpoint)

Why not pydantic's ``Field(discriminator="backend")``: a tagged union needs the tag in every input,
default or not (``{}`` is ``union_tag_not_found``), and a recipe without ``backend`` must mean bwrap.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from horizonrl.errors import ConfigError
from horizonrl.sandbox.base import SandboxBackend, SandboxLimits
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions
from horizonrl.sandbox.docker.backend import DEFAULT_IMAGE, DockerBackend
from horizonrl.secret import Secret, SecretFrom

TOKEN_ENV = "HORIZON_SANDBOX_TOKEN"
"""The environment variable a remote config's token defaults to."""

DEFAULT_BACKEND = "bwrap"
"""The backend of a config without a ``backend`` key."""


class SandboxConfig(BaseModel):
    """Where an env's sandboxes run: the base of each backend's config (see the module doc).

    Annotating a field ``SandboxConfig`` accepts any backend's config; calling ``SandboxConfig(...)``
    returns the config of the backend its ``backend`` argument names (bwrap without one)."""

    # Deferred: the schema of this base class is the choice among its subclasses, which exist only
    # once this module has run.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    backend: str = Field(description="Which backend: bwrap (this machine), remote, docker.")
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Limits of every sandbox.")

    _classes: ClassVar[dict[str, type[SandboxConfig]]] = {}

    def __new__(cls, /, **data: Any) -> SandboxConfig:
        if cls is SandboxConfig:  # the generic constructor: the backend's own class
            chosen = SandboxConfig.config_class(data.get("backend", DEFAULT_BACKEND))
            if chosen is None:
                SandboxConfig.model_validate(data)  # raises the one-line "unknown backend" error
                raise AssertionError("unreachable")
            cls = chosen
        return super().__new__(cls)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Register a backend's config under its ``backend`` default (its Literal)."""
        super().__pydantic_init_subclass__(**kwargs)
        name = cls.model_fields["backend"].default
        if not isinstance(name, str) or not name:
            raise TypeError(f'{cls.__name__} needs `backend: Literal["<name>"] = "<name>"`')
        if name in SandboxConfig._classes and SandboxConfig._classes[name] is not cls:
            raise TypeError(
                f"sandbox backend {name!r} is configured by {SandboxConfig._classes[name].__name__} already"
            )
        SandboxConfig._classes[name] = cls

    @classmethod
    def config_class(cls, backend: Any) -> type[SandboxConfig] | None:
        """The config class of backend ``backend`` (None: no backend has that name)."""
        return SandboxConfig._classes.get(backend) if isinstance(backend, str) else None

    @classmethod
    def backends(cls) -> list[str]:
        """The names a ``backend`` key may take."""
        return sorted(SandboxConfig._classes)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        if cls is not SandboxConfig:  # a backend's own class: its ordinary model schema
            return handler(source)
        classes = tuple(SandboxConfig._classes[name] for name in SandboxConfig.backends())
        return core_schema.no_info_plain_validator_function(
            _validate_any,
            json_schema_input_schema=handler.generate_schema(Union[classes]),  # noqa: UP007
        )

    @model_validator(mode="before")
    @classmethod
    def _only_own_keys(cls, data: Any) -> Any:
        """A key this backend does not take is one line naming it and the valid keys (and which
        backend it belongs to, if any), not pydantic's bare "extra inputs are not permitted"."""
        if cls is SandboxConfig or not isinstance(data, dict):
            return data
        name = cls.model_fields["backend"].default
        for key in data:
            if key not in cls.model_fields:
                owners = [n for n, c in SandboxConfig._classes.items() if key in c.model_fields]
                whose = f" (a key of backend {', '.join(map(repr, owners))})" if owners else ""
                raise PydanticCustomError(
                    "sandbox_key",
                    f"the {name} sandbox backend has no key {str(key)!r}{whose}; "
                    f"its keys: {', '.join(cls.model_fields)}",
                )
        return data

    def make_backend(self) -> SandboxBackend:
        """A new backend of this config's kind (each backend's class defines it)."""
        raise NotImplementedError(f"{type(self).__name__} does not define make_backend()")


def _validate_any(value: Any) -> SandboxConfig:
    """A field annotated :class:`SandboxConfig`: a config instance as it is, or a mapping validated
    by the class of its ``backend`` (bwrap without one)."""
    if isinstance(value, SandboxConfig):
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError(
            "sandbox_config",
            f"the sandbox config must be a mapping (e.g. backend: bwrap), got {type(value).__name__}",
        )
    backend = value.get("backend", DEFAULT_BACKEND)
    chosen = SandboxConfig.config_class(backend)
    if chosen is None:
        raise PydanticCustomError(
            "sandbox_backend",
            f"unknown sandbox backend {backend!r}; valid backends: {', '.join(SandboxConfig.backends())}",
        )
    return chosen.model_validate(value)


class BwrapSandboxConfig(SandboxConfig):
    """Bubblewrap sandboxes on this machine (the default; :mod:`horizonrl.sandbox.bwrap`)."""

    backend: Literal["bwrap"] = "bwrap"
    bwrap: BwrapOptions = Field(default_factory=BwrapOptions, description="Host-side settings.")

    def make_backend(self) -> SandboxBackend:
        return BwrapBackend(self.bwrap)


class RemoteSandboxConfig(SandboxConfig):
    """Sandboxes on a ``horizon sandbox serve`` server (:mod:`horizonrl.sandbox.remote`)."""

    backend: Literal["remote"] = "remote"
    url: str = Field(min_length=1, description="The sandbox server's URL, e.g. http://10.0.0.5:8080.")
    token: Annotated[Secret, SecretFrom(TOKEN_ENV)] | None = Field(
        None,
        description=f"The server's bearer token: the value or ${{env:NAME}} (default: the {TOKEN_ENV} "
        f"environment variable). A secret: shown as ***, and a run's config.yaml holds ${{env:{TOKEN_ENV}}}.",
    )

    def resolved_token(self) -> str:
        if self.token is not None:
            return self.token.reveal("sandbox.token")
        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise ConfigError(f"sandbox.token: the remote backend needs a token (or set {TOKEN_ENV})")
        return token

    def make_backend(self) -> SandboxBackend:
        from horizonrl.sandbox.remote import RemoteBackend  # httpx only where it is used

        return RemoteBackend(self.url, self.resolved_token())


class DockerSandboxConfig(SandboxConfig):
    """Containers on a Docker Engine (:mod:`horizonrl.sandbox.docker`)."""

    backend: Literal["docker"] = "docker"
    docker_image: str = Field(
        DEFAULT_IMAGE, description="The image (it needs sh, git and coreutils; -slim has no git)."
    )

    def make_backend(self) -> SandboxBackend:
        return DockerBackend(self.docker_image)
