"""A training run's MLflow run (``tracking: [..., mlflow]``), through MLflow's own client.

By default the store is SQLite in the run directory (``mlflow/mlflow.db``, artifacts in
``mlflow/artifacts``); ``mlflow.tracking_uri`` names another (an MLflow server, a database).
Params are the resolved config, flattened (``train.lr``), secrets as their references; metrics are
every ``metrics.jsonl`` value by step; a finished run gets ``summary.json``, ``config.yaml``,
``metrics.jsonl``, ``curves.png`` and the ``policy/`` directory as artifacts.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from horizonrl.config.tracking import MlflowConfig
from horizonrl.errors import ConfigError
from horizonrl.train.tracking_extras import SQLITE_MODULES, flat_params, import_backend

STORE_DIR = "mlflow"
#: seconds the check before the model loads waits for an MLflow server to answer
CONNECT_TIMEOUT = 5.0
#: MLflow's HTTP retries and timeout unless the user sets them: its defaults (7 retries with backoff,
#: 120 s) would stall a training step for minutes on a server that went away
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
#: MLflow's limits: a param value's characters, a key's characters, params and metrics per request
MAX_PARAM_VALUE = 6000
MAX_KEY = 250
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


def default_uri(run_dir: Path) -> str:
    """The SQLite store in the run directory."""
    return "sqlite:///" + str((Path(run_dir) / STORE_DIR / "mlflow.db").resolve())


def _is_http(uri: str) -> bool:
    return urlsplit(uri).scheme in ("http", "https")


def _quiet_client(uri: str) -> Any:
    """MLflow's client on ``uri`` with its HTTP retries bounded and its INFO chatter (database
    migrations) kept off the progress display."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def check_server(uri: str) -> None:
    """An MLflow server at ``uri`` must answer (any HTTP status) within :data:`CONNECT_TIMEOUT`."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=CONNECT_TIMEOUT):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"mlflow.tracking_uri {uri} does not answer ({reason}); start the MLflow server "
            "(mlflow server --host HOST --port PORT), fix the URI, or leave mlflow.tracking_uri unset "
            "for a SQLite store in the run directory"
        ) from None


def check_mlflow(cfg: MlflowConfig) -> None:
    """Before the model loads: the store's modules are there, and a chosen store answers and has
    (or can make) the experiment."""
    uri = cfg.tracking_uri
    if uri is None or uri.startswith("sqlite:"):
        for module in SQLITE_MODULES:
            import_backend("mlflow", module)
    if uri is None:
        return  # made in the run directory once it is claimed
    if _is_http(uri):
        check_server(uri)
    try:
        _quiet_client(uri).get_experiment_by_name(cfg.experiment)
    except Exception as exc:  # whatever MLflow says, said in one line
        first = " ".join(str(exc).split())[:400]
        raise ConfigError(f"mlflow.tracking_uri {uri} cannot be used: {first}") from None


def metric_key(name: str) -> str:
    """``name`` as MLflow accepts it: alphanumerics, ``_ - . / : `` and spaces, no ``..`` or ``//``
    path tricks, at most 250 characters (anything else becomes ``_``)."""
    key = re.sub(r"[^/\w.\- :]", "_", name)[:MAX_KEY] or "_"
    if posixpath.normpath(key) != key or key.startswith((".", "/")):
        key = key.replace("/", "_").lstrip(".") or "_"
    return key


def _param_value(value: str) -> str:
    if len(value) <= MAX_PARAM_VALUE:
        return value
    note = f"... (cut: {len(value)} characters; config.yaml has it whole)"
    return value[: MAX_PARAM_VALUE - len(note)] + note


class MlflowBackend:
    """One MLflow run."""

    name = "mlflow"

    def __init__(self, client: Any, run_id: str, uri: str, cfg: MlflowConfig) -> None:
        self.client, self.run_id, self.uri, self.cfg = client, run_id, uri, cfg

    @classmethod
    def open(
        cls,
        cfg: MlflowConfig,
        run_name: str,
        run_dir: Path,
        config_data: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        say: Callable[[str], None],
    ) -> MlflowBackend:
        """Start the run (on resume, continue the one ``previous`` names when it is in the same store)."""
        uri = cfg.tracking_uri or default_uri(run_dir)
        if cfg.tracking_uri is None:
            (Path(run_dir) / STORE_DIR).mkdir(parents=True, exist_ok=True)
        client = _quiet_client(uri)
        if previous and previous.get("tracking_uri") == uri and previous.get("run_id"):
            run_id = str(previous["run_id"])
            client.update_run(run_id, status="RUNNING")
            say(f"MLflow: continuing run {run_id} in {uri}")
            return cls(client, run_id, uri, cfg)
        experiment = client.get_experiment_by_name(cfg.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            location = None
            if cfg.tracking_uri is None:
                location = (Path(run_dir) / STORE_DIR / "artifacts").resolve().as_uri()
            experiment_id = client.create_experiment(cfg.experiment, artifact_location=location)
        tags = {"horizonrl.run_dir": str(Path(run_dir).resolve())}
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        backend = cls(client, run.info.run_id, uri, cfg)
        backend._log_params(config_data)
        ui = f"mlflow ui --backend-store-uri {uri}" if not _is_http(uri) else uri
        say(f"MLflow: run {run.info.run_id} in experiment {cfg.experiment!r} ({ui})")
        return backend

    def _log_params(self, config_data: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params: dict[str, str] = {}
        for key, value in flat_params(config_data).items():
            params.setdefault(metric_key(key), _param_value(value))
        items = [Param(key, value) for key, value in sorted(params.items())]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_BATCH])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_key(key), value, now, step) for key, value in metrics.items()]
        for i in range(0, len(items), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + METRICS_PER_BATCH])

    def finish(self, status: str, files: list[Path], policy: Path | None, summary: Mapping[str, Any]) -> None:
        if status == "FINISHED":
            for path in files:
                self.client.log_artifact(self.run_id, str(path))
            if policy is not None and self.cfg.log_policy and policy.is_dir():
                self.client.log_artifacts(self.run_id, str(policy), artifact_path="policy")
        self.client.set_terminated(self.run_id, status=status)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}
