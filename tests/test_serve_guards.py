"""What the policy server refuses of an abusive client, on a real server on 127.0.0.1: weight swaps
without a token or from outside the checkpoint roots (and no reply naming the server's files), JSON
and schemas nested deeper than the bounds (a 400 naming the limit, never a 500), and requests for a
Host the server does not answer to — on ``horizon serve``, the viewer and the sandbox server alike.
The options behind them are checked by the real CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from horizonrl.asgi import MAX_JSON_DEPTH, allowed_hosts, host_name
from horizonrl.engine.hf import HFEngine
from horizonrl.local_server import free_port
from horizonrl.serve.app import create_app
from horizonrl.serve.protocol import MAX_SCHEMA_DEPTH
from horizonrl.serve.server import LiveServer
from horizonrl.serve.service import PolicyService
from horizonrl.serve.weights import WeightSwaps
from horizonrl.train.checkpoint import resolve_policy

ROOT = Path(__file__).resolve().parents[1]
AUTH = {"Authorization": "Bearer t"}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def tiny_engine(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    return HFEngine(copy.deepcopy(model), tokenizer, max_batch_size=4, seed=0)


class _Loader:
    """``load_policy`` that finds the policy as ``--checkpoint`` does (the real resolver, whose errors
    list what a directory holds) and records what it was asked to load; no model is read."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def __call__(self, checkpoint: str):
        resolve_policy(Path(checkpoint))
        self.loaded.append(checkpoint)
        return lambda: None


def _nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _schema(levels: int) -> dict:
    """An object schema with ``levels`` objects inside each other (two JSON levels each)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


async def test_weight_swaps_need_a_token_unless_the_server_opted_out(tiny_engine, tokenizer, tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    loader = _Loader()
    closed = create_app(
        PolicyService(tiny_engine, tokenizer, "calc"), weight_swaps=WeightSwaps(loader, roots=[tmp_path])
    )
    async with LiveServer(closed) as url, httpx.AsyncClient(timeout=60) as http:
        refused = await http.post(f"{url}/v1/horizon/weights", json={"checkpoint": str(tmp_path / "policy")})
    error = refused.json()["error"]
    assert refused.status_code == 403 and error["code"] == "weight_swaps_need_token"
    assert "--token" in error["message"] and "--allow-weight-swaps-without-token" in error["message"]
    assert loader.loaded == []
    opted_in = create_app(
        PolicyService(tiny_engine, tokenizer, "calc"),
        weight_swaps=WeightSwaps(loader, roots=[tmp_path], without_token=True),
    )
    async with LiveServer(opted_in) as url, httpx.AsyncClient(timeout=60) as http:
        swapped = await http.post(f"{url}/v1/horizon/weights", json={"checkpoint": str(tmp_path / "policy")})
    assert swapped.status_code == 200 and set(swapped.json()) >= {"policy_version", "load_s"}
    assert loader.loaded == [str((tmp_path / "policy").resolve())]


async def test_weight_swaps_load_only_under_the_roots_and_never_show_the_servers_files(
    tiny_engine, tokenizer, tmp_path
):
    allowed = tmp_path / "allowed"
    (allowed / "notes").mkdir(parents=True)
    (allowed / "notes" / "private-name.txt").write_text("x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text("{}")
    (allowed / "link").symlink_to(tmp_path / "outside")  # a link out of the root
    loader = _Loader()
    app = create_app(
        PolicyService(tiny_engine, tokenizer, "calc"),
        token="t",
        weight_swaps=WeightSwaps(loader, roots=[allowed]),
    )
    async with LiveServer(app) as url, httpx.AsyncClient(timeout=60, headers=AUTH) as http:

        async def swap(checkpoint: str) -> httpx.Response:
            return await http.post(f"{url}/v1/horizon/weights", json={"checkpoint": checkpoint})

        for outside in ("/root", "/etc", str(ROOT), str(allowed / ".." / "outside"), str(allowed / "link")):
            answer = await swap(outside)
            error = answer.json()["error"]
            assert answer.status_code == 403 and error["code"] == "checkpoint_not_allowed", outside
            assert error["message"].startswith(
                f"checkpoint {outside!r} is not under the allowed checkpoint roots"
            )
            assert str(allowed) in error["message"] and "\n" not in error["message"]
            for name in ("passwd", "src/", "pyproject", "config.json"):  # no listing of any directory
                assert name not in error["message"], (outside, error["message"])
        for bad in (str(allowed / "notes"), str(allowed / "missing")):
            answer = await swap(bad)
            error = answer.json()["error"]
            assert answer.status_code == 400 and error["code"] == "invalid_checkpoint"
            assert "is not a checkpoint" in error["message"] and "private-name" not in error["message"]
        nul = await swap(str(allowed) + "/\x00x")
        assert nul.status_code == 400 and "is not a path" in nul.json()["error"]["message"]
        empty = await swap("")
        assert empty.status_code == 400
    assert loader.loaded == []


async def test_json_and_schemas_nested_too_deep_are_400s_naming_the_limit(tiny_engine, tokenizer):
    app = create_app(PolicyService(tiny_engine, tokenizer, "calc"))
    post = {"model": "calc", "messages": USER, "max_tokens": 1}
    bodies = {
        "a body 100k levels deep": b"[" * 100_000 + b"]" * 100_000,
        "a body just over the limit": json.dumps(
            {**post, "metadata": {"x": _nested(MAX_JSON_DEPTH)}}
        ).encode(),
        "a 300-level tool schema": json.dumps(
            {**post, "tools": [{"type": "function", "function": {"name": "f", "parameters": _schema(300)}}]}
        ).encode(),
        "a tool schema over the schema limit": json.dumps(
            {**post, "tools": [{"type": "function", "function": {"name": "f", "parameters": _schema(40)}}]}
        ).encode(),
        "a response schema over the limit": json.dumps(
            {
                **post,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": _schema(40)},
                },
            }
        ).encode(),
        "a structured_outputs.json string 100k deep": json.dumps(
            {**post, "structured_outputs": {"json": "[" * 100_000}}
        ).encode(),
        "tool call arguments 100k deep": json.dumps(
            {
                **post,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[" * 100_000}}],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "1"},
                ],
            }
        ).encode(),
    }
    async with LiveServer(app) as url, httpx.AsyncClient(timeout=60) as http:
        for what, body in bodies.items():
            answer = await http.post(f"{url}/v1/chat/completions", content=body)
            message = answer.json()["error"]["message"]
            assert answer.status_code == 400, (what, answer.text[:300])
            assert f"at most {MAX_JSON_DEPTH}" in message or f"at most {MAX_SCHEMA_DEPTH}" in message, what
        not_text = {
            "an integer of 5000 digits": b'{"max_tokens": ' + b"9" * 5000 + b"}",
            "bytes that are not UTF-8": b'{"model": "\xff"}',
            "a lone surrogate escape": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        }
        for what, body in not_text.items():
            answer = await http.post(f"{url}/v1/chat/completions", content=body)
            assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"], what
        within = {
            **post,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": _schema(30)}}],
        }
        answer = await http.post(f"{url}/v1/chat/completions", json=within)
        assert answer.status_code == 200, answer.text[:300]


async def test_every_server_answers_only_the_hosts_it_allows(tiny_engine, tokenizer, tmp_path):
    from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions
    from horizonrl.sandbox.server.app import create_app as sandbox_app
    from horizonrl.view import ViewerServer
    from horizonrl.view import create_app as viewer_app

    async def check(url: str, extra_ok: tuple[str, ...] = ()) -> None:
        port = url.rsplit(":", 1)[1]
        async with httpx.AsyncClient(timeout=60) as http:
            for host in (
                "evil.example",
                f"evil.example:{port}",
                "127.0.0.1.nip.io",
                "localhost.evil.example",
            ):
                answer = await http.get(f"{url}/health", headers={"Host": host})
                text = answer.text
                assert answer.status_code == 400 and "host_not_allowed" in text, (url, host, text[:200])
                assert "--allowed-host" in text and "localhost" in text
            for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", *extra_ok):
                answer = await http.get(f"{url}/health", headers={"Host": host})
                assert answer.status_code != 400, (url, host, answer.text[:200])

    served = create_app(
        PolicyService(tiny_engine, tokenizer, "calc"),
        allowed_hosts=allowed_hosts("127.0.0.1", ["*.example.org"]),
    )
    async with LiveServer(served) as url:
        await check(url, ("api.example.org", "API.Example.org:443"))
    backend = BwrapBackend(BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache")))
    try:
        async with LiveServer(sandbox_app(backend, "t")) as url:
            await check(url)
    finally:
        await backend.aclose()
    with ViewerServer(viewer_app([tmp_path]), extra_hosts=("viewer.lan",)) as viewer:
        await check(viewer.url, ("viewer.lan:8790",))


@pytest.mark.parametrize(
    ("header", "name"),
    [("Example.ORG:8000", "example.org"), ("[::1]:80", "::1"), ("localhost.", "localhost"), ("::1", "::1")],
)
def test_host_names_are_read_as_browsers_send_them(header, name):
    assert host_name(header) == name


def test_the_cli_refuses_unsafe_or_malformed_guard_options_in_one_line(tmp_path):
    port = str(free_port())
    base = [sys.executable, "-m", "horizonrl.cli", "serve", "configs/calc.yaml", "--port", port]
    cases = {
        "--allow-weight-swaps-without-token is for a loopback --host": [
            "--host",
            "0.0.0.0",
            "--allow-weight-swaps-without-token",
        ],
        "is not a directory": ["--checkpoint-root", str(tmp_path / "missing")],
        "is not a host name": ["--allowed-host", "evil example/x"],
    }
    running = {
        says: subprocess.Popen(
            [*base, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for says, args in cases.items()
    }
    for says, proc in running.items():
        _, err = proc.communicate(timeout=120)
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (says, err[-500:])
