"""Secrets in recipes (the sandbox server's token): typed :class:`~horizonrl.secret.Secret` wherever a
config model holds one, shown as ``***`` by ``horizon config show``, written to a run's config.yaml
(mode 0600) as the reference ``${env:NAME}`` and never as the value, read from that variable by a
resumed run, and never echoed by an error."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import RunConfig, dump_config, format_validation_error, load_config, stored_config
from horizonrl.envs.registry import list_envs, parse_env_options
from horizonrl.errors import CheckpointError, ConfigError
from horizonrl.sandbox import TOKEN_ENV, SandboxConfig
from horizonrl.secret import MASK, Secret, SecretFrom, is_secret_name
from horizonrl.train.rundir import check_same_recipe, claim_run_dir

runner = CliRunner()
TOKEN = "s3cret-Token-0123456789abcdef"
REFERENCE = f"${{env:{TOKEN_ENV}}}"


def recipe(folder: Path, url: str = "http://127.0.0.1:9", token: str = TOKEN, extra: str = "") -> Path:
    """A shell recipe whose sandboxes run on the server at ``url``, the token given as its value."""
    path = folder / "recipe.yaml"
    path.write_text(
        f"name: secret-run\noutput_dir: {folder / 'runs'}\nmodel: {{path: tiny-random}}\n"
        f'env:\n  name: shell\n  options:\n    sandbox: {{backend: remote, url: "{url}", token: "{token}"}}\n'
        + extra,
        encoding="utf-8",
    )
    return path


def remote_token(config: RunConfig) -> str:
    return parse_env_options(config.env.name, config.env.options).sandbox.resolved_token()


def test_a_secret_is_its_value_or_a_variable_read_when_it_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    given = Secret.parse(TOKEN, "DEFAULT_VAR")
    assert not given.is_reference and given.reveal("k") == TOKEN and given.reference == "${env:DEFAULT_VAR}"
    monkeypatch.delenv("MY_TOKEN", raising=False)
    named = Secret.parse(" ${env:MY_TOKEN} ", "DEFAULT_VAR")
    assert named.is_reference and named.reference == "${env:MY_TOKEN}"
    with pytest.raises(ConfigError) as unset:
        named.reveal("env.options.sandbox.token")
    assert str(unset.value).startswith("env.options.sandbox.token: the secret is read from the environment")
    assert "MY_TOKEN, which is not set" in str(unset.value) and "\n" not in str(unset.value)
    monkeypatch.setenv("MY_TOKEN", TOKEN)
    assert named.reveal("k") == TOKEN  # read when used, not when the recipe was loaded
    assert Secret.parse("", "DEFAULT_VAR").reference == "${env:DEFAULT_VAR}"  # empty: its own variable
    for bad in ("${MY_TOKEN}", "${env:}", "${env:1X}"):
        with pytest.raises(ValueError, match=r"is not a reference; write \$\{env:NAME\}"):
            Secret.parse(bad, "DEFAULT_VAR")


def test_a_secret_shows_and_dumps_as_stars_or_its_reference_never_its_value(tmp_path: Path) -> None:
    config = load_config(recipe(tmp_path))
    sandbox = parse_env_options("shell", config.env.options).sandbox
    assert str(sandbox.token) == MASK and repr(sandbox.token) == "Secret('***')"
    assert TOKEN not in repr(sandbox) and TOKEN not in str(sandbox)
    assert sandbox.model_dump(mode="json")["token"] == REFERENCE
    assert TOKEN not in sandbox.model_dump_json()
    assert pickle.loads(pickle.dumps(sandbox)) == sandbox  # to Ray workers: the value travels
    assert pickle.loads(pickle.dumps(sandbox)).resolved_token() == TOKEN
    assert sandbox.model_copy(deep=True).resolved_token() == TOKEN
    schema = type(sandbox).model_json_schema()["properties"]["token"]["anyOf"][0]
    assert schema == {"type": "string", "format": "password", "writeOnly": True}


def test_a_bad_secret_is_one_line_that_never_echoes_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(recipe(tmp_path), ["env.options.sandbox.token=987654321987"])  # YAML reads an int
    message = str(raised.value)
    assert "987654321987" not in message and "\n" not in message
    assert "env.options.sandbox.token: must be a string (quote it in YAML) or a reference" in message
    with pytest.raises(ConfigError, match=r"'\$\{HORIZON_SANDBOX_TOKEN\}' is not a reference"):
        load_config(recipe(tmp_path, token="${HORIZON_SANDBOX_TOKEN}"))
    for problem in ("limits: {memory_mib: -1}", "typo: 1", "url: [5]"):  # another key wrong: no token either
        path = recipe(tmp_path)
        text = path.read_text().replace('url: "http://127.0.0.1:9", ', "")
        path.write_text(text.replace("backend: remote,", f"backend: remote, {problem},"))
        with pytest.raises(ConfigError) as raised:
            load_config(path)
        assert TOKEN not in str(raised.value)

    class Section(BaseModel):  # a typed field named as a secret: its bad value is not echoed either
        api_key: int
        retries: int

    with pytest.raises(ValidationError) as invalid:
        Section.model_validate({"api_key": "sk-live-abcdef", "retries": "many"})
    line = format_validation_error(invalid.value, "recipe.yaml")
    assert "sk-live-abcdef" not in line and "api_key: Input should be a valid integer" in line
    assert "(got 'many')" in line


def _secret_fields(model: type[BaseModel], prefix: str, seen: set[type]) -> list[tuple[str, bool]]:
    """Every field under ``model`` whose name says it holds a secret, and whether it is typed one."""
    found: list[tuple[str, bool]] = []
    for name, field in model.model_fields.items():
        key, annotation = f"{prefix}.{name}", field.annotation
        if is_secret_name(name):
            typed = any(isinstance(m, SecretFrom) for arg in get_args(annotation) for m in get_args(arg))
            found.append((key, typed or any(isinstance(m, SecretFrom) for m in field.metadata)))
        nested = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type)]
        for inner in nested:
            if inner is SandboxConfig:  # any backend's config
                backends = [SandboxConfig.config_class(b) for b in SandboxConfig.backends()]
                subclasses: list[type[BaseModel]] = [c for c in backends if c is not None]
            else:
                subclasses = [inner] if issubclass(inner, BaseModel) else []
            for sub in subclasses:
                if sub not in seen:
                    seen.add(sub)
                    found += _secret_fields(sub, f"{key}[{sub.__name__}]", seen)
    return found


def test_every_secret_in_the_config_models_is_typed_a_secret() -> None:
    """Tokens, keys and passwords anywhere in a recipe (its sections, every env's options, every
    sandbox backend's config) are Secret fields; a key that names a variable is ``*_env``."""
    seen: set[type] = set()
    found = _secret_fields(RunConfig, "run", seen)
    for name, cls in list_envs().items():
        found += _secret_fields(cls.Options, f"env.options[{name}]", seen)
    # the remote sandbox's token, reached through the first env (by name) whose options hold a sandbox
    assert any(key.endswith(".sandbox[RemoteSandboxConfig].token") and typed for key, typed in found), found
    assert [key for key, typed in found if not typed] == []
    assert not is_secret_name("api_key_env") and not is_secret_name("max_tokens")
    assert all(map(is_secret_name, ("token", "api_key", "password", "client_secret", "hf_token")))


def test_config_show_prints_a_token_as_stars_in_every_format(tmp_path: Path) -> None:
    path = recipe(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", "config", "show", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert shown.returncode == 0, shown.stderr
    assert TOKEN not in shown.stdout + shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.startswith("env.options.sandbox.token "))
    assert line.split()[1:3] == ["'***'", "file"]
    as_json = runner.invoke(app, ["config", "show", str(path), "--json"])
    assert as_json.exit_code == 0 and TOKEN not in as_json.output
    entries = {e["key"]: e for e in json.loads(as_json.output)}
    assert entries["env.options.sandbox.token"]["value"] == MASK
    as_yaml = runner.invoke(app, ["config", "show", str(path), "--yaml"])
    assert as_yaml.exit_code == 0 and TOKEN not in as_yaml.output
    assert yaml.safe_load(as_yaml.output)["env"]["options"]["sandbox"]["token"] == REFERENCE
    named = runner.invoke(app, ["config", "show", str(path), "env.options.sandbox.token=${env:MY_TOKEN}"])
    assert "env.options.sandbox.token                 ${env:MY_TOKEN}" in named.output  # not a secret


def test_a_runs_config_yaml_holds_the_reference_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = f'{{backend: remote, url: "http://h:1", token: "{TOKEN}"}}'
    learn_env = f"{{name: shell, options: {{sandbox: {sandbox}}}}}"
    config = load_config(recipe(tmp_path), [f"learn.envs=[{learn_env}]"])
    run_dir = config.run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("old\n")
    os.chmod(run_dir / "config.yaml", 0o644)  # a file already there gets the mode too
    claim_run_dir(run_dir, config, overwrite=False)
    saved_path = run_dir / "config.yaml"
    text = saved_path.read_text()
    assert TOKEN not in text and stat.S_IMODE(saved_path.stat().st_mode) == 0o600
    assert text.startswith("# Secrets are not stored here: each ${env:NAME} is read from")
    saved = yaml.safe_load(text)
    assert saved["env"]["options"]["sandbox"]["token"] == REFERENCE
    assert saved["learn"]["envs"][0]["options"]["sandbox"]["token"] == REFERENCE
    assert TOKEN not in dump_config(config)

    resumed = load_config(saved_path)  # what `horizon train runs/<name>/config.yaml --resume` reads
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"environment variable {TOKEN_ENV}, which is not set"):
        remote_token(resumed)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert remote_token(resumed) == TOKEN
    # the recipe (the value), its config.yaml (the reference) or another value: the same recipe
    for again in (config, resumed, load_config(recipe(tmp_path, token="rotated"))):
        check_same_recipe(run_dir, again, ("env",))
    assert stored_config(config) == stored_config(resumed)
    with pytest.raises(CheckpointError, match="'env' section differs"):
        check_same_recipe(run_dir, load_config(recipe(tmp_path, url="http://elsewhere:9")), ("env",))


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@needs_bwrap
def test_a_run_stores_its_token_nowhere_and_resumes_from_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `horizon train` (in this process) on a real sandbox server, the token given as its
    value in the recipe: no file of the run holds it, the sandboxes were authenticated, and the run's
    config.yaml resumes with the token from $HORIZON_SANDBOX_TOKEN (and without it, fails in one line
    before the model)."""
    import asyncio

    from horizonrl.envs.shell import ShellEnv
    from horizonrl.sandbox.server import serve_in_subprocess

    (tmp_path / "state").mkdir()
    with serve_in_subprocess(str(tmp_path / "state")) as (url, token):
        path = recipe(tmp_path, url=url, token=token)
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        tiny = ["sampling.max_new_tokens=8", "agent.max_turns=1", "eval.num_tasks=1", "sft.enabled=false"]
        tiny += ["train.steps=1", "train.tasks_per_step=1", "train.group_size=2"]
        run = runner.invoke(app, ["train", str(path), *tiny])
        assert run.exit_code == 0, run.output[-3000:]
        assert token not in run.output
        run_dir = tmp_path / "runs" / "secret-run"
        files = [p for p in run_dir.rglob("*") if p.is_file()]
        assert {"config.yaml", "metrics.jsonl", "summary.json"} <= {p.name for p in files}
        leaked = [p for p in files if token.encode() in p.read_bytes()]
        assert leaked == []
        assert stat.S_IMODE((run_dir / "config.yaml").stat().st_mode) == 0o600
        records: list[dict[str, Any]] = [
            json.loads(line) for p in run_dir.glob("*/*.jsonl") for line in p.read_text().splitlines()
        ]
        errors = [r.get("error") for r in records if r.get("finish") in (None, "error")]
        assert records and errors == []  # every episode's sandbox was made: the token was accepted

        refused = runner.invoke(app, ["train", str(run_dir / "config.yaml"), "--resume"])
        assert refused.exit_code == 2
        assert f"environment variable {TOKEN_ENV}, which is not set" in refused.output
        monkeypatch.setenv(TOKEN_ENV, token)
        resumed = load_config(run_dir / "config.yaml")
        check_same_recipe(run_dir, resumed, ("model", "env", "train"))
        options = parse_env_options("shell", resumed.env.options)

        async def one_sandbox() -> None:  # the resumed recipe's env on the real server, authenticated
            shell = ShellEnv(options)
            try:
                await shell.reset(ShellEnv.make_tasks("test", 1, 0, options)[0])
            finally:
                await shell.close()

        asyncio.run(one_sandbox())
