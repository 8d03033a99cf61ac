"""LLM roles: the policy backend on the run's engine, a local model with its own engine, and an
OpenAI-compatible endpoint through the official ``openai`` client (a real ``horizon serve``)."""

from __future__ import annotations

import asyncio
import re

import pytest

from horizonrl.config import load_config
from horizonrl.engine.hf import HFEngine
from horizonrl.errors import ConfigError
from horizonrl.local_server import free_port
from horizonrl.roles import RoleError, Roles, RolesConfig
from horizonrl.roles.base import as_messages, chat_many
from horizonrl.serve.server import serve_in_subprocess

QUESTION = [{"role": "user", "content": "Is 17 a prime number? Answer yes or no."}]


@pytest.fixture
def engine(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    return HFEngine(model, tokenizer, max_batch_size=16)


async def test_policy_roles_share_the_runs_engine_and_are_batched(engine, tokenizer):
    roles = Roles(RolesConfig(), engine, tokenizer)
    judge = roles.get("judge")
    assert roles.get("judge") is judge and judge.engine is engine
    before = engine.stats
    replies = await chat_many(judge, [QUESTION] * 12, max_tokens=6, temperature=1.0)
    after = engine.stats
    assert len(replies) == 12 and all(isinstance(r, str) and r for r in replies)
    rows = after["decode_rows"] - before["decode_rows"]
    steps = after["decode_steps"] - before["decode_steps"]
    assert rows / steps > 4
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert generated <= 12 * 6
    usage = roles.usage()["judge"]  # what the role cost: its calls and the tokens read and written
    assert usage["calls"] == 12 and usage["completion_tokens"] == generated
    assert usage["prompt_tokens"] == 12 * len(judge.chat_format.prompt_ids(as_messages(QUESTION)))
    greedy = await judge.chat(QUESTION, max_tokens=6)
    assert greedy == await judge.chat(QUESTION, max_tokens=6)  # the role's default temperature is 0


async def test_local_roles_load_their_own_model_once():
    roles = Roles(
        RolesConfig.model_validate(
            {
                "judge": {"backend": "local", "path": "tiny-random"},
                "verifier": {"backend": "local", "path": "tiny-random"},
            }
        )
    )
    judge, verifier = roles.get("judge"), roles.get("verifier")
    assert judge.engine is verifier.engine  # one engine per local model
    assert isinstance(await judge.chat(QUESTION, max_tokens=4), str)
    with pytest.raises(RoleError, match="no policy engine"):
        roles.get("explorer")  # default backend policy, and this Roles has no engine


async def test_unknown_roles_and_sampling_keywords_are_errors(engine, tokenizer):
    roles = Roles(RolesConfig(), engine, tokenizer)
    with pytest.raises(RoleError, match="unknown role 'jugde'"):
        roles.get("jugde")
    with pytest.raises(RoleError, match="unknown sampling keywords"):
        await roles.get("judge").chat(QUESTION, temprature=0.5)


def test_roles_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="backend openai needs base_url and model"):
        load_config("configs/calc.yaml", ["roles.judge={backend: openai}"])
    with pytest.raises(ConfigError, match=r"Did you mean 'roles\.judge'"):
        load_config("configs/calc.yaml", ["roles.jduge={backend: policy}"])


@pytest.fixture(scope="module")
def server():
    overrides = ["model.path=tiny-random", "name=judge-model", "model.dtype=float32"]
    with serve_in_subprocess("configs/calc.yaml", overrides, token="role-key") as (url, _):
        yield url


def _openai_roles(url: str, **extra) -> Roles:
    spec = {
        "backend": "openai",
        "base_url": url,
        "model": "judge-model",
        "api_key_env": "TEST_ROLE_KEY",
        **extra,
    }
    return Roles(RolesConfig.model_validate({"judge": spec}))


async def test_openai_roles_through_the_official_client_against_horizon_serve(server, monkeypatch):
    monkeypatch.setenv("TEST_ROLE_KEY", "role-key")
    roles = _openai_roles(f"{server}/v1")
    judge = roles.get("judge")
    replies = await asyncio.gather(*(judge.chat(QUESTION, max_tokens=5, seed=i) for i in range(8)))
    assert len(replies) == 8 and all(isinstance(r, str) for r in replies)
    usage = roles.usage()["judge"]  # the server's usage figures, summed
    assert usage["calls"] == 8 and 0 < usage["completion_tokens"] <= 8 * 5 and usage["prompt_tokens"] > 8
    monkeypatch.setenv("TEST_ROLE_KEY", "wrong")
    with pytest.raises(RoleError, match="answered 401"):
        await _openai_roles(f"{server}/v1").get("judge").chat(QUESTION)


async def test_openai_roles_fail_with_one_line_when_the_endpoint_is_down_or_the_key_is_missing(monkeypatch):
    monkeypatch.delenv("TEST_ROLE_KEY", raising=False)
    with pytest.raises(RoleError, match="TEST_ROLE_KEY"):
        _openai_roles("http://127.0.0.1:9/v1").get("judge")
    monkeypatch.setenv("TEST_ROLE_KEY", "k")
    port = free_port()  # nothing listens here
    judge = _openai_roles(f"http://127.0.0.1:{port}/v1", max_retries=1, timeout_s=2).get("judge")
    expected = re.escape(f"no answer from http://127.0.0.1:{port}/v1 after 2 tries")
    with pytest.raises(RoleError, match=expected):
        await judge.chat(QUESTION)


@pytest.mark.slow
async def test_the_embedded_model_answers_as_a_role():
    """The embedded SmolLM2-135M as a judge: weak, but a real model answering in words."""
    from horizonrl.train.runtime import build_runtime

    runtime = build_runtime(load_config("configs/calc.yaml", ["engine.dtype=auto"]))  # the exact sampler
    judge = Roles(RolesConfig(), runtime.engine, runtime.tokenizer).get("judge")
    reply = await judge.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=24)
    assert "Paris" in reply
