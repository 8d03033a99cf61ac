"""Secrets in recipes: a token, key or password a config model holds is a :class:`Secret`, never a
plain string.

A secret field takes the value itself, or a reference to an environment variable, ``${env:NAME}``::

    sandbox: {backend: remote, url: "http://sandboxes:8080", token: "${env:HORIZON_SANDBOX_TOKEN}"}

A reference is read only when the secret is used (:meth:`Secret.reveal`), so a recipe can be shown,
checked and stored without the variable set. ``str`` and ``repr`` show a secret as ``***`` (a
reference as itself), and a config dumped to JSON or YAML (a run's ``config.yaml``) holds a reference
only: the one given, or, for a value given in the recipe, the field's own variable, which a resumed
run reads it from. A field declares that variable::

    token: Annotated[Secret, SecretFrom("HORIZON_SANDBOX_TOKEN")] | None = None
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from horizonrl.errors import ConfigError

MASK = "***"
"""How a secret's value is shown."""

_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
#: the last part of a key that names a secret: token, api_key, password, secret, ... (not max_tokens,
#: not api_key_env, which names a variable)
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:token|api_?key|password|passwd|secret|credentials?|private_key|access_key)$", re.IGNORECASE
)


def env_reference(env: str) -> str:
    """``${env:NAME}``: how a recipe (and a run's config.yaml) names a secret held by variable ``env``."""
    return f"${{env:{env}}}"


def is_secret_name(key: str) -> bool:
    """Whether a key's name says it holds a secret (``token``, ``api_key``, ``password``, ``secret``,
    ``*_token``, ...)."""
    return bool(_SECRET_NAME.search(key))


class Secret:
    """A secret: its value, or (``value`` None) a reference to the environment variable ``env``."""

    __slots__ = ("_value", "env")

    def __init__(self, value: str | None = None, *, env: str) -> None:
        self._value = value or None  # an empty value: unset, read from ``env``
        self.env = env

    @classmethod
    def parse(cls, given: Any, env: str) -> Secret:
        """A recipe's value for a secret whose own variable is ``env``: a string (the secret) or
        ``${env:NAME}``. ValueError (naming what is valid, never the value) for anything else."""
        if isinstance(given, Secret):
            return given
        if not isinstance(given, str):
            raise ValueError(
                f"must be a string (quote it in YAML) or a reference ${{env:NAME}}, not of type "
                f"{type(given).__name__} (the value is not shown)"
            )
        stripped = given.strip()
        match = _REFERENCE.fullmatch(stripped)
        if match:
            return cls(env=match.group(1))
        if stripped.startswith("${") and stripped.endswith("}"):
            raise ValueError(
                f"{stripped!r} is not a reference; write ${{env:NAME}}, e.g. {env_reference(env)}"
            )
        return cls(given, env=env)

    @property
    def is_reference(self) -> bool:
        """Whether the secret is read from its variable (no value was given)."""
        return self._value is None

    @property
    def reference(self) -> str:
        """``${env:NAME}``: what a run's config.yaml holds for this secret."""
        return env_reference(self.env)

    def reveal(self, key: str) -> str:
        """The secret's value, read from its variable when it is a reference; ConfigError naming
        ``key`` (the field) and the variable when that is unset."""
        if self._value is not None:
            return self._value
        value = os.environ.get(self.env)
        if not value:
            raise ConfigError(
                f"{key}: the secret is read from the environment variable {self.env}, which is not set; "
                f"export {self.env}=... (a run's config.yaml never holds the value)"
            )
        return value

    def __str__(self) -> str:
        return MASK if self._value is not None else self.reference

    def __repr__(self) -> str:
        return f"Secret({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (self._value, self.env) == (other._value, other.env)

    def __hash__(self) -> int:
        return hash((Secret, self._value, self.env))

    def __getstate__(self) -> tuple[str | None, str]:
        return self._value, self.env

    def __setstate__(self, state: tuple[str | None, str]) -> None:
        self._value, self.env = state


def _serialize(secret: Secret, info: core_schema.SerializationInfo) -> Any:
    return secret.reference if info.mode_is_json() else secret


@dataclass(frozen=True)
class SecretFrom:
    """``Annotated[Secret, SecretFrom("NAME")]``: a config field holding a secret whose own variable
    is ``NAME`` (where a value given in the recipe is read from on resume). It validates a string or
    ``${env:NAME}``, and serializes to JSON as the reference."""

    env: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        env = self.env

        def validate(value: Any) -> Secret:
            try:
                return Secret.parse(value, env)
            except ValueError as exc:
                raise PydanticCustomError("secret", "{reason}", {"reason": str(exc)}) from None

        return core_schema.no_info_plain_validator_function(
            validate,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(_serialize, info_arg=True),
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "format": "password", "writeOnly": True}  # as pydantic's SecretStr
