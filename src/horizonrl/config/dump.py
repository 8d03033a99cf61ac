"""A config written out: one value as an override writes it, a whole config as YAML — with every
secret as its reference (``${env:NAME}``), never its value — and a run's ``config.yaml``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from horizonrl.config.run import RunConfig
from horizonrl.errors import HorizonError
from horizonrl.secret import MASK, Secret, is_secret_name

#: the mode of a run's config.yaml: its owner's alone (it names where its secrets are read from)
CONFIG_FILE_MODE = 0o600


def format_value(value: Any) -> str:
    """``value`` as one line of YAML, the way an override writes it (``null``, ``true``, ``0.0005``,
    ``[a, b]``; a string quoted only where YAML would read it as something else)."""
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=1 << 20).strip()
    return text.removesuffix("\n...").strip()


def _stored(raw: dict[str, Any], typed: Any) -> dict[str, Any]:
    """``raw`` (a mapping of env options as the recipe gives them) with each value that ``typed``
    (the same options validated; None where they did not validate) holds as a :class:`Secret` put as
    its reference; where nothing is typed, a string under a secret's name (token, api_key, ...) is
    put as ``***``."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        inner = getattr(typed, str(key), None) if isinstance(typed, BaseModel) else None
        if isinstance(inner, Secret):
            out[key] = inner.reference
        elif isinstance(value, dict):
            out[key] = _stored(value, inner)
        elif typed is None and isinstance(value, str) and is_secret_name(str(key)):
            out[key] = MASK
        else:
            out[key] = value
    return out


def stored_options(env_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """An env's options as a run's config.yaml holds them: each secret (a field the env's options
    model types :class:`Secret`) as its reference ``${env:NAME}``."""
    from horizonrl.envs.registry import parse_env_options

    try:
        typed: Any = parse_env_options(env_name, options)
    except HorizonError:  # options that do not validate: their run fails as it reads them
        typed = None
    return _stored(options, typed)


def stored_data(config: RunConfig) -> dict[str, Any]:
    """``config`` as the plain data a run's config.yaml holds: secrets as references, never values."""
    data = config.model_dump(mode="json")  # a Secret field dumps as its reference
    data["env"]["options"] = stored_options(config.env.name, config.env.options)
    for env, dumped in zip(config.learn.envs, data["learn"]["envs"], strict=True):
        dumped["options"] = stored_options(env.name, env.options)
    return data


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML (what runs/<name>/config.yaml holds), every secret as its
    reference ``${env:NAME}``, which a run started from this YAML reads the secret from."""
    return yaml.safe_dump(stored_data(config), sort_keys=False)


def stored_config(config: RunConfig) -> RunConfig:
    """``config`` as a run's config.yaml holds it (secrets as references): two recipes that differ
    only in a secret's value, or in giving it as a value or as its reference, store the same."""
    return RunConfig.model_validate(stored_data(config))


def write_config(config: RunConfig, path: Path) -> None:
    """Write ``config`` to ``path`` (a run's config.yaml) as :func:`dump_config` does, readable by its
    owner only, with a header that says where its secrets are read from."""
    text = dump_config(config)
    if "${env:" in text:
        text = (
            "# Secrets are not stored here: each ${env:NAME} is read from the environment variable NAME\n"
            "# when the run uses it (export it before `--resume`).\n" + text
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CONFIG_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), CONFIG_FILE_MODE)  # an existing file keeps its mode through O_CREAT
        f.write(text)
