"""The sandbox config: one class per backend, chosen by ``backend`` (none: bwrap), each with its own
keys only and its own ``make_backend``; ``SandboxConfig`` both annotates env options and builds."""

from __future__ import annotations

import pickle
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

import horizonrl.sandbox.config as config_module
from horizonrl.errors import ConfigError
from horizonrl.sandbox import (
    TOKEN_ENV,
    BwrapSandboxConfig,
    DockerSandboxConfig,
    RemoteSandboxConfig,
    SandboxConfig,
    make_backend,
    shared_backend,
)
from horizonrl.sandbox.base import SandboxBackend
from horizonrl.sandbox.bwrap import BwrapOptions


class Options(BaseModel):
    """An env's options as envs declare them (envs/shell.py)."""

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)


def one_error(data: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ValidationError) as raised:
        Options.model_validate(data)
    errors = raised.value.errors()
    assert len(errors) == 1, errors
    assert "\n" not in errors[0]["msg"]
    return errors[0]


@pytest.mark.parametrize(
    "sandbox",
    [{}, {"limits": {"memory_mib": 512}}, {"bwrap": {"max_sandboxes": 3}}, {"backend": "bwrap"}],
)
def test_no_backend_key_means_bwrap(sandbox: dict[str, Any]) -> None:
    # pydantic's own Field(discriminator=...) refuses a mapping without the tag even when the
    # member defaults it: the config chooses the class itself
    config = Options.model_validate({"sandbox": sandbox}).sandbox
    assert type(config) is BwrapSandboxConfig and config.backend == "bwrap"
    assert config.limits.memory_mib == sandbox.get("limits", {}).get("memory_mib", 1024)


def test_each_backend_gets_its_own_class_and_keys() -> None:
    remote = Options.model_validate({"sandbox": {"backend": "remote", "url": "http://h:8080", "token": "t"}})
    assert type(remote.sandbox) is RemoteSandboxConfig
    assert (remote.sandbox.url, remote.sandbox.resolved_token()) == ("http://h:8080", "t")
    docker = Options.model_validate({"sandbox": {"backend": "docker", "docker_image": "img:1"}})
    assert type(docker.sandbox) is DockerSandboxConfig and docker.sandbox.docker_image == "img:1"
    assert set(BwrapSandboxConfig.model_fields) == {"backend", "limits", "bwrap"}
    assert set(RemoteSandboxConfig.model_fields) == {"backend", "limits", "url", "token"}
    assert set(DockerSandboxConfig.model_fields) == {"backend", "limits", "docker_image"}
    assert SandboxConfig.backends() == ["bwrap", "docker", "remote"]


def test_a_key_of_another_backend_is_one_line_naming_it_and_the_valid_keys() -> None:
    error = one_error({"sandbox": {"url": "http://h:8080"}})
    assert error["loc"] == ("sandbox",)
    assert error["msg"] == (
        "the bwrap sandbox backend has no key 'url' (a key of backend 'remote'); "
        "its keys: backend, limits, bwrap"
    )
    error = one_error({"sandbox": {"backend": "remote", "url": "http://h", "bwrap": {}}})
    assert "remote sandbox backend has no key 'bwrap'" in error["msg"]
    assert error["msg"].endswith("its keys: backend, limits, url, token")
    error = one_error({"sandbox": {"backend": "docker", "typo": 1}})
    assert error["msg"] == (
        "the docker sandbox backend has no key 'typo'; its keys: backend, limits, docker_image"
    )


@pytest.mark.parametrize("backend", ["kubernetes", 3, None, ["bwrap"]])
def test_an_unknown_backend_names_the_valid_ones(backend: Any) -> None:
    error = one_error({"sandbox": {"backend": backend}})
    assert error["loc"] == ("sandbox",)
    assert error["msg"] == f"unknown sandbox backend {backend!r}; valid backends: bwrap, docker, remote"


def test_errors_inside_a_backend_point_at_the_key() -> None:
    assert one_error({"sandbox": {"backend": "remote"}})["loc"] == ("sandbox", "url")
    assert one_error({"sandbox": {"backend": "remote", "url": ""}})["loc"] == ("sandbox", "url")
    assert one_error({"sandbox": {"limits": {"memory_mib": 1}}})["loc"] == ("sandbox", "limits", "memory_mib")
    assert one_error({"sandbox": "bwrap"})["msg"].startswith("the sandbox config must be a mapping")


def test_env_options_give_one_line_config_errors() -> None:
    from horizonrl.envs.registry import parse_env_options

    with pytest.raises(ConfigError) as raised:
        parse_env_options("shell", {"sandbox": {"url": "http://h"}})
    assert str(raised.value).startswith("env.options.sandbox: the bwrap sandbox backend has no key 'url'")
    valid = "valid backends: bwrap, docker, remote"
    with pytest.raises(ConfigError, match=f"unknown sandbox backend 'k8s'; {valid}"):
        parse_env_options("shell", {"sandbox": {"backend": "k8s"}})


def test_calling_sandbox_config_builds_the_named_backends_config(tmp_path) -> None:
    assert type(SandboxConfig()) is BwrapSandboxConfig
    options = BwrapOptions(state_dir=str(tmp_path / "s"), cache_dir=str(tmp_path / "c"))
    config = SandboxConfig(bwrap=options)
    assert type(config) is BwrapSandboxConfig and config.bwrap == options
    remote = SandboxConfig(backend="remote", url="http://h")
    assert type(remote) is RemoteSandboxConfig and isinstance(remote, SandboxConfig)
    assert SandboxConfig.model_validate({"backend": "docker"}) == DockerSandboxConfig()
    with pytest.raises(ValidationError, match="unknown sandbox backend 'nope'"):
        SandboxConfig(backend="nope")
    with pytest.raises(ValidationError, match="bwrap sandbox backend has no key 'docker_image'"):
        SandboxConfig(docker_image="img")
    with pytest.raises(ValidationError, match="bwrap sandbox backend has no key 'url'"):
        BwrapSandboxConfig(url="http://h")


def test_configs_round_trip_through_json_and_pickle() -> None:
    for data in ({}, {"backend": "remote", "url": "http://h", "token": "t"}, {"backend": "docker"}):
        options = Options.model_validate({"sandbox": data})
        dumped = options.model_dump(mode="json")
        assert dumped["sandbox"]["backend"] == data.get("backend", "bwrap")
        if "token" in data:  # a secret goes out as its reference, never its value (tests/test_secrets.py)
            assert dumped["sandbox"]["token"] == f"${{env:{TOKEN_ENV}}}"
            options = Options.model_validate(dumped)
        assert Options.model_validate(dumped) == options
        assert Options.model_validate_json(options.model_dump_json()) == options
        assert pickle.loads(pickle.dumps(options)) == options
        assert options.model_copy(deep=True) == options
    schema = Options.model_json_schema()
    assert {"BwrapSandboxConfig", "RemoteSandboxConfig", "DockerSandboxConfig"} <= set(schema["$defs"])


def test_make_backend_is_the_configs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, Any]] = []
    monkeypatch.setattr(config_module, "BwrapBackend", lambda options: made.append(("bwrap", options)))
    monkeypatch.setattr(config_module, "DockerBackend", lambda image: made.append(("docker", image)))
    make_backend(SandboxConfig())
    make_backend(None)
    DockerSandboxConfig(docker_image="img:2").make_backend()
    assert [kind for kind, _ in made] == ["bwrap", "bwrap", "docker"] and made[2][1] == "img:2"
    assert isinstance(made[0][1], BwrapOptions)


async def test_remote_config_makes_a_remote_backend_with_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from horizonrl.sandbox.remote import RemoteBackend

    monkeypatch.setenv(TOKEN_ENV, "from-env")
    backend = make_backend(RemoteSandboxConfig(url="http://h:1/"))
    assert isinstance(backend, RemoteBackend) and backend.url == "http://h:1"
    assert backend._headers["Authorization"] == "Bearer from-env"
    await backend.aclose()
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(ConfigError, match=f"needs a token \\(or set {TOKEN_ENV}\\)"):
        make_backend(RemoteSandboxConfig(url="http://h:1"))
    shared = shared_backend(RemoteSandboxConfig(url="http://h:1", token="t"))
    assert shared is shared_backend(SandboxConfig(backend="remote", url="http://h:1", token="t"))
    await shared.aclose()


def test_adding_a_backend_is_one_class() -> None:
    class FakeBackend:
        name = "fake"

        def __init__(self, endpoint: str) -> None:
            self.endpoint = endpoint

    try:

        class FakeSandboxConfig(SandboxConfig):
            backend: Literal["fake"] = "fake"
            endpoint: str = "here"

            def make_backend(self) -> SandboxBackend:
                return FakeBackend(self.endpoint)  # type: ignore[return-value]

        config = Options.model_validate({"sandbox": {"backend": "fake", "endpoint": "there"}}).sandbox
        assert type(config) is FakeSandboxConfig
        backend = make_backend(config)
        assert isinstance(backend, FakeBackend) and backend.endpoint == "there"
        assert "fake" in one_error({"sandbox": {"backend": "?"}})["msg"]
        assert "(a key of backend 'fake')" in one_error({"sandbox": {"endpoint": "x"}})["msg"]
        with pytest.raises(TypeError, match="configured by FakeSandboxConfig already"):

            class Again(SandboxConfig):
                backend: Literal["fake"] = "fake"

        with pytest.raises(TypeError, match="needs `backend"):

            class Nameless(SandboxConfig):
                pass

    finally:
        SandboxConfig._classes.pop("fake", None)
    assert SandboxConfig.backends() == ["bwrap", "docker", "remote"]
