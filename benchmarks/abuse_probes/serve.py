"""``horizon serve`` under abuse: weight swaps of paths anywhere on the server (``/root``, ``/etc``,
the project, a symlink or ``..`` out of the allowed root, a directory that is not a checkpoint) and
on a server without a token; JSON and schemas nested far too deep; malformed bodies that must be a
4xx and never a 500; requests for a Host the server does not answer to (DNS rebinding) on
``horizon serve``, the viewer and the sandbox server; streamed sessions used at the same time and
abandoned mid-stream; and the guard options given wrong to the real CLI.

The servers are real processes on 127.0.0.1 (``horizon serve`` with the tiny random model: the
SmolLM2 weights are never loaded; ``horizon sandbox serve``; the viewer on its thread)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from abuse_probes import Case, Cases
from horizonrl.local_server import free_port
from horizonrl.serve.server import serve_in_subprocess

FAMILY = "horizon serve"
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "probe-serve-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TINY = ["model.path=tiny-random", "model.dtype=float32", "name=calc", "sampling.max_new_tokens=8"]
USER = [{"role": "user", "content": "hi"}]
POST = {"model": "calc", "messages": USER, "max_tokens": 1}


def _shown(res: httpx.Response) -> str:
    return f"{res.status_code} {res.text[:240]}"


def _error(res: httpx.Response) -> dict:
    try:
        return res.json().get("error") or {
            "message": res.json().get("detail", ""),
            "code": res.json().get("code"),
        }
    except ValueError:
        return {"message": res.text, "code": None}


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def _listing(directory: str) -> list[str]:
    try:
        return [n for n in os.listdir(directory) if len(n) >= 4]
    except OSError:
        return []


def _weights(c: Cases, url: str, workdir: Path) -> None:
    allowed = workdir / "allowed"
    (allowed / "notes").mkdir(parents=True, exist_ok=True)
    (allowed / "notes" / "private-name.txt").write_text("x")
    (workdir / "outside").mkdir()
    (workdir / "outside" / "config.json").write_text("{}")
    (allowed / "link").symlink_to(workdir / "outside")

    def swap(checkpoint: str) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/horizon/weights", json={"checkpoint": checkpoint}, headers=AUTH, timeout=60
        )

    def refused_without_listing(checkpoint: str, names: list[str]) -> Callable[[], tuple[bool, str]]:
        def run() -> tuple[bool, str]:
            res = swap(checkpoint)
            message = _error(res).get("message", "")
            leaked = [n for n in names if n in message]
            ok = res.status_code == 403 and "is not under the allowed checkpoint roots" in message
            return ok and not leaked, _shown(res) + (f" leaked {leaked}" if leaked else "")

        return run

    c.check(
        "weights: /root is refused (403), no listing", refused_without_listing("/root", _listing("/root"))
    )
    c.check("weights: /etc is refused (403), no listing", refused_without_listing("/etc", _listing("/etc")))
    c.check(
        "weights: the project directory is refused (403), no listing",
        refused_without_listing(str(ROOT), ["pyproject", "src", "README", "tests"]),
    )
    c.check(
        "weights: '..' out of the allowed root is refused (403)",
        refused_without_listing(str(allowed / ".." / "outside"), ["config.json"]),
    )
    c.check(
        "weights: a symlink out of the allowed root is refused (403)",
        refused_without_listing(str(allowed / "link"), ["config.json"]),
    )

    def not_a_checkpoint(path: str) -> Callable[[], tuple[bool, str]]:
        def run() -> tuple[bool, str]:
            res = swap(path)
            message = _error(res).get("message", "")
            ok = res.status_code == 400 and "is not a checkpoint" in message and "private-name" not in message
            return ok, _shown(res)

        return run

    c.check(
        "weights: a directory under the root that is no checkpoint: 400, no file names",
        not_a_checkpoint(str(allowed / "notes")),
    )
    c.check("weights: a missing path under the root: 400", not_a_checkpoint(str(allowed / "missing")))

    def nul() -> tuple[bool, str]:
        res = swap(f"{allowed}/\x00/etc/passwd")
        return res.status_code == 400 and "is not a path" in _error(res).get("message", ""), _shown(res)

    c.check("weights: a path with a NUL byte: 400", nul)


def _depth(c: Cases, url: str) -> None:
    def post(body: bytes) -> httpx.Response:
        return httpx.post(f"{url}/v1/chat/completions", content=body, headers=AUTH, timeout=120)

    def refused(body: bytes, limit: str) -> Callable[[], tuple[bool, str]]:
        def run() -> tuple[bool, str]:
            res = post(body)
            return res.status_code == 400 and limit in _error(res).get("message", ""), _shown(res)

        return run

    deep_call = {
        **POST,
        "messages": [
            *USER,
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[" * 100_000}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "1"},
        ],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": _schema(40)}}
    cases = {
        "depth: a body nested 100k deep is a 400 naming the limit": (
            b"[" * 100_000 + b"]" * 100_000,
            "at most 100",
        ),
        "depth: a body nested 101 deep is a 400 naming the limit": (
            json.dumps({**POST, "metadata": {"x": _nested(100)}}).encode(),
            "at most 100",
        ),
        "depth: a 300-level tool schema is a 400 naming the limit": (
            json.dumps({**POST, "tools": _tool(_schema(300))}).encode(),
            "at most 100",
        ),
        "depth: a tool schema over 64 levels is a 400 naming the limit": (
            json.dumps({**POST, "tools": _tool(_schema(40))}).encode(),
            "at most 64",
        ),
        "depth: a response_format schema over 64 levels is a 400": (
            json.dumps({**POST, "response_format": fmt}).encode(),
            "at most 64",
        ),
        "depth: structured_outputs.json as a string 100k deep is a 400": (
            json.dumps({**POST, "structured_outputs": {"json": "[" * 100_000}}).encode(),
            "at most 64",
        ),
        "depth: tool call arguments 100k deep are a 400": (json.dumps(deep_call).encode(), "at most 100"),
        "json: an integer of 5000 digits is a 400": (
            b'{"max_tokens": ' + b"9" * 5000 + b"}",
            "not valid JSON",
        ),
        "json: a body that is not UTF-8 is a 400": (b'{"model": "\xff\xfe"}', "not valid JSON"),
        "json: a lone surrogate escape (no character) is a 400": (
            b'{"model": "calc", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "not valid JSON",
        ),
    }
    for name, (body, limit) in cases.items():
        c.check(name, refused(body, limit))

    def within() -> tuple[bool, str]:
        res = post(json.dumps({**POST, "tools": _tool(_schema(30))}).encode())
        return res.status_code == 200, _shown(res)

    c.check("depth: a 30-level tool schema (within the bound) is answered", within)

    malformed = {
        "messages a string": {**POST, "messages": "hi"},
        "no messages": {**POST, "messages": []},
        "n = 1e999": {**POST, "n": 1e999},
        "temperature NaN": {**POST, "temperature": float("nan")},
        "max_tokens -1": {**POST, "max_tokens": -1},
        "max_tokens 2**63": {**POST, "max_tokens": 2**63},
        "an empty stop": {**POST, "stop": [""]},
        "a tool without function": {**POST, "tools": [{}]},
        "an image part": {**POST, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "a tool_choice naming no tool": {
            **POST,
            "tool_choice": {"type": "function", "function": {"name": "x"}},
        },
        "structured_outputs regex 10k parentheses": {
            **POST,
            "structured_outputs": {"regex": "(" * 10_000 + ")" * 10_000},
        },
        "structured_outputs grammar garbage": {**POST, "structured_outputs": {"grammar": "start: (((" * 500}},
        "a prompt of token ids out of range": {"model": "calc", "prompt": [10**9], "max_tokens": 1},
        "a prompt of negative token ids": {"model": "calc", "prompt": [-5], "max_tokens": 1},
    }

    def never_500() -> tuple[bool, str]:
        bad = []
        for what, body in malformed.items():
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            text = json.dumps(body, allow_nan=True)
            res = httpx.post(f"{url}{path}", content=text.encode(), headers=AUTH, timeout=120)
            if not 400 <= res.status_code < 500:
                bad.append(f"{what}: {_shown(res)}")
        return not bad, "; ".join(bad) or f"{len(malformed)} malformed bodies, all 4xx"

    c.check("malformed bodies are 4xx with the reason, never a 500", never_500)


def _sessions(c: Cases, url: str) -> None:
    async def run() -> tuple[bool, str]:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as http:

            async def stream(session: str, max_tokens: int, leave: bool) -> str:
                body = {**POST, "max_tokens": max_tokens, "user": session, "stream": True}
                async with http.stream("POST", "/v1/chat/completions", json=body) as res:
                    text = ""
                    async for line in res.aiter_lines():
                        text += line
                        if leave:
                            break
                    return text

            await asyncio.gather(*(stream(f"s{i}", 6, False) for i in range(4)), stream("gone", 4000, True))
            again = await http.post("/v1/chat/completions", json={**POST, "user": "gone"})
            return again.status_code == 200, _shown(again)

    c.check(
        "sessions: concurrent streams and one abandoned mid-stream; the session answers again",
        lambda: asyncio.run(asyncio.wait_for(run(), 120)),
    )


def _host_refused(url: str, path: str = "/health") -> tuple[bool, str]:
    """A request for a rebound name is 400 ``host_not_allowed`` with the reason; one for localhost
    is not refused for its Host (the viewer may still want its token: 401 is fine)."""
    res = httpx.get(f"{url}{path}", headers={"Host": "rebound.attacker.example"}, timeout=60)
    ok = res.status_code == 400 and "host_not_allowed" in res.text and "--allowed-host" in res.text
    fine = httpx.get(f"{url}{path}", headers={"Host": "localhost"}, timeout=60)
    answered = fine.status_code < 500 and "host_not_allowed" not in fine.text
    return ok and answered, f"{_shown(res)} / localhost: {fine.status_code}"


def _hosts(c: Cases, url: str, workdir: Path) -> None:
    c.check("host: horizon serve refuses a rebound Host (400), answers localhost", lambda: _host_refused(url))

    def viewer() -> tuple[bool, str]:
        from horizonrl.view import ViewerServer, create_app

        with ViewerServer(create_app([workdir])) as srv:
            return _host_refused(srv.url, "/api/info")

    c.check("host: the viewer refuses a rebound Host (400), answers localhost", viewer)

    def sandbox() -> tuple[bool, str]:
        from horizonrl.sandbox.server import serve_in_subprocess as sandbox_server

        state = workdir / "sandbox-state"
        state.mkdir()
        with sandbox_server(str(state)) as (sandbox_url, _):
            return _host_refused(sandbox_url)

    c.check("host: the sandbox server refuses a rebound Host (400), answers localhost", sandbox)


def _no_token(c: Cases, workdir: Path) -> None:
    target = workdir / "runs-no-token"
    target.mkdir()
    overrides = [*TINY, f"output_dir={target}"]
    config = str(ROOT / "configs" / "calc.yaml")
    with serve_in_subprocess(config, overrides, checkpoint_roots=[str(workdir)]) as (url, _):

        def refused() -> tuple[bool, str]:
            res = httpx.post(f"{url}/v1/horizon/weights", json={"checkpoint": str(target)}, timeout=60)
            return res.status_code == 403 and _error(res).get("code") == "weight_swaps_need_token", _shown(
                res
            )

        c.check("weights: a server without --token refuses every swap (403)", refused)


def _cli(c: Cases, workdir: Path) -> None:
    base = [sys.executable, "-m", "horizonrl.cli", "serve", "configs/calc.yaml", "--port", str(free_port())]
    cases = {
        "cli: --allow-weight-swaps-without-token with --host 0.0.0.0 is refused in one line": (
            ["--host", "0.0.0.0", "--allow-weight-swaps-without-token"],
            "loopback --host",
        ),
        "cli: a --checkpoint-root that does not exist is refused in one line": (
            ["--checkpoint-root", str(workdir / "missing")],
            "is not a directory",
        ),
        "cli: an --allowed-host that is no host name is refused in one line": (
            ["--allowed-host", "evil example/x"],
            "is not a host name",
        ),
    }
    running = {
        name: (
            subprocess.Popen(
                [*base, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ),
            says,
        )
        for name, (args, says) in cases.items()
    }
    for name, (proc, says) in running.items():

        def run(proc: subprocess.Popen[str] = proc, says: str = says) -> tuple[bool, str]:
            _, err = proc.communicate(timeout=120)
            lines = err.strip().splitlines()
            return proc.returncode == 2 and len(lines) == 1 and says in lines[
                0
            ], f"exit {proc.returncode}: {err[-300:]}"

        c.check(name, run)


def probe(workdir: Path) -> list[Case]:
    c = Cases()
    (workdir / "allowed").mkdir(parents=True, exist_ok=True)
    overrides = [*TINY, f"output_dir={workdir / 'runs'}"]
    with serve_in_subprocess(
        str(ROOT / "configs" / "calc.yaml"),
        overrides,
        token=TOKEN,
        checkpoint_roots=[str(workdir / "allowed")],
    ) as (url, _):
        _weights(c, url, workdir)
        _depth(c, url)
        _sessions(c, url)
        _hosts(c, url, workdir)
    _no_token(c, workdir)
    _cli(c, workdir)
    return c.cases
