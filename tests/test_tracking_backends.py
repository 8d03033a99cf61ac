"""`tracking: [jsonl, tensorboard, mlflow, wandb]`: a training run's metrics in MLflow (read back
through MLflow's own client) and W&B (offline; read back from the run file wandb wrote), the
recipe's params with secrets as references, the run's files and policy as artifacts; bad input (a
backend not installed, an MLflow server that does not answer, W&B online without a login) as one
line before the model loads; a backend that fails mid-run warned about once, training going on and
metrics.jsonl keeping every step."""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.config.dump import stored_data
from horizonrl.train.tracking import Tracker, read_metrics
from horizonrl.train.tracking_backends import ExternalTracking
from horizonrl.train.tracking_extras import flat_params

pytest.importorskip("mlflow", reason="the mlflow extra (pip install 'horizonrl[mlflow]')")
pytest.importorskip("wandb", reason="the wandb extra (pip install 'horizonrl[wandb]')")

runner = CliRunner()
CALC = "configs/calc.yaml"
MISSING_MODEL = "model.path=/nonexistent/model"  # what a command reaches only if it loads the model
TINY = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=12",
    "agent.max_turns=5",
    "eval.num_tasks=2",
    "sft.enabled=false",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.eval_every=2",
    "train.save_every=1",
    "train.steps=2",
]
TOKEN = "tok-7f3a-never-stored"


@pytest.fixture(autouse=True)
def wandb_home(tmp_path_factory, monkeypatch):
    """W&B's caches, staging and settings in a temporary folder, and no login."""
    home = tmp_path_factory.getbasetemp() / "wandb-home"
    (home / "netrc").parent.mkdir(parents=True, exist_ok=True)
    (home / "netrc").touch()
    for var, sub in (
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CONFIG_DIR", "config"),
    ):
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> str:
    """One SQLite MLflow store for the unit tests (a fresh store's schema takes seconds to make)."""
    return "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def error_line(result) -> str:
    """The single stderr line of a user error (exit 2, no traceback)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def wandb_records(run_dir: Path) -> list:
    """The records of the W&B run files under ``run_dir`` (a resumed offline run writes another),
    read as wandb writes them: a LevelDB-style log of its own protobuf records (a 7-byte header,
    then 32 KiB blocks of chunks, each with a checksum, a length and a type)."""
    records = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        records += wandb_file(path)
    assert records, f"no W&B run file under {run_dir}"
    return records


def wandb_file(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def by_kind(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def items(update) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in update}


# ------------------------------------------------------------------ end to end
def test_train_logs_params_metrics_and_artifacts_to_mlflow_and_wandb(tmp_path):
    args = ["train", CALC, *TINY, f"output_dir={tmp_path}", "name=run", "tracking=[jsonl,mlflow,wandb]"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "run"
    assert "MLflow: run" in result.output and "W&B (offline): run" in result.output
    assert not (run_dir / "tb").exists()  # tensorboard was not chosen
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    state = json.loads((run_dir / "tracking.json").read_text())
    assert summary["tracking"]["mlflow"]["run_id"] == state["mlflow"]["run_id"]
    assert summary["tracking"]["mlflow"]["error"] is None and summary["tracking"]["wandb"]["error"] is None

    # MLflow, through its own client, from the SQLite store in the run directory
    uri = state["mlflow"]["tracking_uri"]
    assert uri == "sqlite:///" + str((run_dir / "mlflow" / "mlflow.db").resolve())
    mlflow_client = client(uri)
    run = mlflow_client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    config = load_config(run_dir / "config.yaml")
    assert run.data.params == {k: v for k, v in flat_params(stored_data(config)).items()}
    assert (
        run.data.params["train.steps"] == "2"
        and run.data.params["tracking"] == '["jsonl", "mlflow", "wandb"]'
    )
    for key in ("reward_mean", "loss", "eval/success"):
        history = mlflow_client.get_metric_history(run.info.run_id, key)
        expected = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        assert sorted((m.step, m.value) for m in history) == expected, key
    artifacts = {a.path for a in mlflow_client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "config.yaml", "metrics.jsonl", "curves.png", "policy"} <= artifacts
    policy = {a.path for a in mlflow_client.list_artifacts(run.info.run_id, "policy")}
    assert "policy/horizonrl_policy.json" in policy
    local = Path(mlflow_client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(local.read_text())["final_success"] == summary["final_success"]

    # W&B, offline: the run file it wrote under the run directory
    wb = wandb_records(run_dir)
    (header,) = by_kind(wb, "run")
    assert header.run_id == state["wandb"]["id"] and header.display_name == "run"
    assert header.project == "horizonrl"
    wb_config = items(header.config.update)
    assert {k: v for k, v in wb_config.items() if not k.startswith("_")} == stored_data(config)
    history = [items(h.item) for h in by_kind(wb, "history")]
    assert [h["_step"] for h in history] == [0, 1, 2]
    for h, r in zip(history, records, strict=True):
        assert {k: v for k, v in h.items() if not k.startswith("_")} == {
            k: v for k, v in r.items() if k != "step" and v is not None
        }
    summaries: dict = {}
    for update in by_kind(wb, "summary"):
        summaries |= items(update.update)
    assert summaries["final_success"] == summary["final_success"] and summaries["steps"] == 2
    saved = {f.path for files in by_kind(wb, "files") for f in files.files}
    assert {"summary.json", "config.yaml", "metrics.jsonl", "curves.png"} <= saved
    (artifact,) = by_kind(wb, "artifact")
    assert artifact.type == "model" and artifact.name == "run-policy"
    assert "horizonrl_policy.json" in {entry.path for entry in artifact.manifest.contents}
    (exit_record,) = by_kind(wb, "exit")
    assert exit_record.exit_code == 0


# ------------------------------------------------------------------ params, resume, failures
def secret_recipe(folder: Path, *extra: str):
    recipe = folder / "shell.yaml"
    recipe.write_text(
        "name: shelly\nmodel: {path: tiny-random}\n"
        "env:\n  name: shell\n  options:\n"
        f'    sandbox: {{backend: remote, url: "http://127.0.0.1:9", token: "{TOKEN}"}}\n'
    )
    return load_config(recipe, [f"output_dir={folder}", "tracking=[jsonl,mlflow,wandb]", *extra])


def test_params_and_config_hold_a_secret_as_its_reference_never_its_value(tmp_path, mlflow_store):
    config = secret_recipe(tmp_path, f"mlflow.tracking_uri={mlflow_store}")
    messages: list[str] = []
    tracking = ExternalTracking(config.run_dir, messages.append)
    tracking.open(config, resume=False)
    tracking.finish("FINISHED")
    state = json.loads((config.run_dir / "tracking.json").read_text())
    params = client(mlflow_store).get_run(state["mlflow"]["run_id"]).data.params
    assert params["env.options.sandbox.token"] == "${env:HORIZON_SANDBOX_TOKEN}"
    assert not any(TOKEN in value for value in params.values())
    assert not any(TOKEN.encode() in p.read_bytes() for p in config.run_dir.rglob("*") if p.is_file())
    assert not [m for m in messages if m.startswith("warning")], messages


def tracked_config(folder: Path, store: str):
    """configs/calc.yaml with MLflow (to ``store``) and W&B, its run under ``folder``."""
    overrides = [f"output_dir={folder}", "tracking=[jsonl,mlflow,wandb]", f"mlflow.tracking_uri={store}"]
    return load_config(CALC, overrides)


def test_resume_continues_the_same_mlflow_and_wandb_runs(tmp_path, mlflow_store):
    config = tracked_config(tmp_path, mlflow_store)
    first = ExternalTracking(config.run_dir, print)
    first.open(config, resume=False)
    first.log(1, {"step": 1, "loss": 1.5})
    first.finish("KILLED")  # Ctrl-C
    state = json.loads((config.run_dir / "tracking.json").read_text())
    assert client(mlflow_store).get_run(state["mlflow"]["run_id"]).info.status == "KILLED"

    again = ExternalTracking(config.run_dir, print)
    again.open(config, resume=True)
    again.log(2, {"step": 2, "loss": 0.5})
    again.finish("FINISHED")
    resumed = json.loads((config.run_dir / "tracking.json").read_text())
    assert resumed["mlflow"] == state["mlflow"] and resumed["wandb"]["id"] == state["wandb"]["id"]
    run = client(mlflow_store).get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED"
    history = client(mlflow_store).get_metric_history(run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.5), (2, 0.5)]
    runs = [h.run_id for h in by_kind(wandb_records(config.run_dir), "run")]
    assert len(runs) == 2 and set(runs) == {state["wandb"]["id"]}


def test_a_backend_failing_mid_run_is_warned_about_once_and_the_jsonl_keeps_every_step(
    tmp_path, mlflow_store
):
    config = tracked_config(tmp_path, mlflow_store)
    messages: list[str] = []
    tracking = ExternalTracking(config.run_dir, messages.append)
    tracking.open(config, resume=False)
    state = json.loads((config.run_dir / "tracking.json").read_text())
    with Tracker(config.run_dir, tensorboard=False, sinks=[tracking]) as tracker:
        tracker.log(0, {"loss": 3.0})
        client(mlflow_store).delete_run(state["mlflow"]["run_id"])  # deleted in the UI mid-run
        tracking.backends[1].run.finish()  # and the W&B run ended under the trainer
        for step in (1, 2, 3):
            tracker.log(step, {"loss": 3.0 - step})
    tracking.finish("FINISHED")
    assert [(r["step"], r["loss"]) for r in read_metrics(config.run_dir / "metrics.jsonl")] == [
        (0, 3.0),
        (1, 2.0),
        (2, 1.0),
        (3, 0.0),
    ]
    warnings = [m for m in messages if m.startswith("warning")]
    assert len(warnings) == 2, warnings  # once per backend, not once per step
    assert any("mlflow tracking failed at step 1" in w for w in warnings)
    assert any("wandb tracking failed at step 1" in w for w in warnings)
    assert all("metrics.jsonl keeps every step" in w for w in warnings)
    block = tracking.summary()["tracking"]
    assert block["mlflow"]["error"].startswith("at step 1") and block["wandb"]["error"].startswith(
        "at step 1"
    )
    history = client(mlflow_store).get_metric_history(state["mlflow"]["run_id"], "loss")
    assert [(m.step, m.value) for m in history] == [(0, 3.0)]


# ------------------------------------------------------------------ bad input, before the model loads
@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_a_backend_not_installed_is_one_line_naming_the_extra(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # as if the extra were not installed
    result = runner.invoke(
        app, ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", f"tracking=[jsonl,{backend}]"]
    )
    line = error_line(result)
    assert f"tracking lists {backend} but {backend} is not installed" in line
    assert f"pip install 'horizonrl[{backend}]'" in line
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_mlflow_sqlite_store_without_its_modules_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    line = error_line(
        runner.invoke(
            app, ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", "tracking=[jsonl,mlflow]"]
        )
    )
    assert "sqlalchemy is not installed" in line and "pip install 'horizonrl[mlflow]'" in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_mlflow_server_that_does_not_answer_is_one_line_before_the_model_loads(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", "tracking=[jsonl,mlflow]"]
    line = error_line(runner.invoke(app, [*args, f"mlflow.tracking_uri={uri}"]))
    assert f"mlflow.tracking_uri {uri} does not answer" in line and "Connection refused" in line


def test_an_mlflow_server_that_never_replies_is_refused_within_seconds(tmp_path):
    """A server that takes the connection and says nothing: refused after the check's timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
    args = ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", "tracking=[jsonl,mlflow]"]
    start = time.monotonic()
    try:
        line = error_line(runner.invoke(app, [*args, f"mlflow.tracking_uri={uri}"]))
    finally:
        for s in [*held, listener]:
            s.close()
    assert f"mlflow.tracking_uri {uri} does not answer" in line and "timed out" in line
    assert time.monotonic() - start < 60


def test_a_server_that_is_not_mlflow_is_one_line_with_mlflows_reason(tmp_path):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(BaseHTTPRequestHandler):  # some other web server: 404 for MLflow's API
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    args = ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", "tracking=[jsonl,mlflow]"]
    try:
        line = error_line(runner.invoke(app, [*args, f"mlflow.tracking_uri={uri}"]))
    finally:
        server.shutdown()
        server.server_close()
    assert f"mlflow.tracking_uri {uri} cannot be used" in line and "404" in line


def test_wandb_online_without_a_login_is_one_line_before_the_model_loads(tmp_path):
    args = ["train", CALC, MISSING_MODEL, f"output_dir={tmp_path}", "tracking=[jsonl,wandb]"]
    line = error_line(runner.invoke(app, [*args, "wandb.mode=online"]))
    assert "wandb.mode=online needs a W&B login" in line and "wandb login" in line


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("tracking=[tensorboard]", "tracking: must include jsonl"),
        ("tracking=[jsonl,jsonl]", "names jsonl more than once"),
        ("tracking=[jsonl,neptune]", "'jsonl', 'tensorboard', 'mlflow' or 'wandb'"),
        ("mlflow.experiment=x", "mlflow.experiment is set but tracking does not list mlflow"),
        ("wandb.mode=online", "wandb.mode is set but tracking does not list wandb"),
    ],
)
def test_a_bad_tracking_recipe_is_one_line(override, says):
    line = error_line(runner.invoke(app, ["train", CALC, MISSING_MODEL, override]))
    assert says in line


def test_credentials_in_the_mlflow_uri_are_refused_without_echoing_them():
    uri = "mlflow.tracking_uri=http://alice:hunter2@127.0.0.1:5000"
    line = error_line(runner.invoke(app, ["train", CALC, MISSING_MODEL, "tracking=[jsonl,mlflow]", uri]))
    assert "holds credentials" in line and "MLFLOW_TRACKING_PASSWORD" in line and "hunter2" not in line
