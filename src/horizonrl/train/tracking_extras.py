"""The optional extras of tracking (MLflow, W&B): importing one only when it is chosen, with one line
naming the extra when it is not installed, and the flat params both log a run's config as."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from horizonrl.errors import ConfigError

#: what each external backend imports, and the extra that installs it
EXTRAS = {
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
#: the modules the SQLite store of MLflow needs beyond its client (the mlflow extra has them)
SQLITE_MODULES = ("sqlalchemy", "alembic")


def not_installed(backend: str, exc: ImportError) -> ConfigError:
    module, extra = EXTRAS[backend]
    return ConfigError(
        f"tracking lists {backend} but {exc.name or module} is not installed; install the extra: "
        f"pip install 'horizonrl[{extra}]' (or remove {backend} from tracking)"
    )


def import_backend(backend: str, module: str | None = None) -> Any:
    """Import ``module`` (default: the backend's own) for ``backend``; one line naming the extra if absent."""
    try:
        return importlib.import_module(module or EXTRAS[backend][0])
    except ImportError as exc:
        raise not_installed(backend, exc) from None


def flat_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"a.b.c": "value"}`` (lists and empty mappings as JSON, None as null)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True)
    return out
