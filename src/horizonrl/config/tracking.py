"""Where a training run's metrics go: the ``tracking:`` list and the ``mlflow:`` and ``wandb:`` blocks.

``metrics.jsonl`` is always written (a resume, ``summary.json``, the curves and the viewer read it);
TensorBoard, MLflow and W&B are chosen by name. MLflow and W&B are optional extras
(``pip install 'horizonrl[mlflow]'``, ``'horizonrl[wandb]'``), imported only when chosen.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from horizonrl.config.section import Section

#: the tracking backends a recipe may list, in the order the docs give them
TrackingBackend = Literal["jsonl", "tensorboard", "mlflow", "wandb"]
TRACKING_BACKENDS: tuple[str, ...] = ("jsonl", "tensorboard", "mlflow", "wandb")
DEFAULT_TRACKING: list[str] = ["jsonl", "tensorboard"]


def check_tracking_list(value: list[str]) -> list[str]:
    """``tracking:`` as given: each backend once, and ``jsonl`` among them."""
    seen = [name for i, name in enumerate(value) if name in value[:i]]
    if seen:
        raise ValueError(f"names {', '.join(sorted(set(seen)))} more than once; list each backend once")
    if "jsonl" not in value:
        raise ValueError(
            "must include jsonl: metrics.jsonl is the run's own record (resume, summary.json, curves.png "
            f"and the viewer read it); e.g. tracking=[{', '.join(['jsonl', *value])}]"
        )
    return value


class MlflowConfig(Section):
    """MLflow tracking (``tracking: [..., mlflow]``): one MLflow run per training run."""

    tracking_uri: str | None = Field(
        None,
        description="Where the MLflow run goes: http(s)://host:port (an MLflow server; checked to answer "
        "before the model loads), sqlite:///PATH, or another MLflow store URI. null: a SQLite store in "
        "the run directory (mlflow/mlflow.db, artifacts in mlflow/artifacts). Credentials go in "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN, never in the URI.",
    )
    experiment: str = Field(
        "horizonrl", min_length=1, description="The MLflow experiment of the run (created if new)."
    )
    log_policy: bool = Field(
        True,
        description="Log the final policy/ directory as artifacts (policy/) beside summary.json, "
        "config.yaml and curves.png.",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return value
        value = value.strip()
        if not value:
            raise ValueError("is empty; give a store URI (http://127.0.0.1:5000) or null for the default")
        parts = urlsplit(value)
        if parts.scheme in ("http", "https") and (parts.username or parts.password):
            reason = (
                "holds credentials (user:password@; the value is not shown); remove them and export "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN): a run's "
                "config.yaml and the MLflow params would otherwise hold them"
            )
            raise PydanticCustomError("secret", "{reason}", {"reason": reason})  # never echoed
        if parts.scheme in ("http", "https") and not parts.hostname:
            raise ValueError(f"{value!r} names no host; e.g. http://127.0.0.1:5000")
        return value


class WandbConfig(Section):
    """Weights & Biases tracking (``tracking: [..., wandb]``): one W&B run per training run."""

    mode: Literal["offline", "online"] = Field(
        "offline",
        description="offline: the W&B run is written under the run directory (wandb/), nothing is sent "
        "(upload it later with `wandb sync`); online: sent as it goes, which needs a W&B login "
        "(`wandb login` or WANDB_API_KEY), checked before the model loads.",
    )
    project: str = Field("horizonrl", min_length=1, description="The W&B project.")
    entity: str | None = Field(None, description="The W&B team or user (null: the login's default).")
    log_policy: bool = Field(
        True, description="Log the final policy/ directory as a model artifact ('<name>-policy')."
    )
