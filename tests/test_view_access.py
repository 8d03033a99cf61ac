"""The viewer under abuse, through a real server on 127.0.0.1: symlinks out of a run directory are
never followed (reading or writing), a token guards every request (Bearer or the cookie a browser
gets from ``?token=``), feedback is limited per client, bounded in size and says who sent it, every
answer carries a strict Content-Security-Policy, and ``horizon view`` refuses to serve beyond this
machine without a token."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from horizonrl.cli import app as cli_app
from horizonrl.local_server import free_port
from horizonrl.types import Message, Trajectory
from horizonrl.view import ViewerServer, create_app
from horizonrl.view.ratelimit import RateLimiter

TOKEN = "s3cret-viewer-token"


def _traj(tid: str, task: str = "task") -> Trajectory:
    return Trajectory(
        id=tid,
        task_id=task,
        group_id=task,
        env="calc",
        messages=[Message(role="user", content=f"question of {tid}")],
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        loss_mask=[1, 1],
        logprobs=[-0.1, -0.2],
        reward=1.0,
        finish="finished",
    )


def _write(path: Path, *lines: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def make_run(folder: Path) -> Path:
    """A run with two trajectories (``t0``, ``t1``)."""
    _write(folder / "config.yaml", "name: guarded")
    _write(folder / "trajectories/step_000001.jsonl", _traj("t0").to_json(), _traj("t1").to_json())
    return folder


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, httpx.Client]]:
    run = make_run(tmp_path / "runs" / "r")
    with (
        ViewerServer(create_app([run.parent], feedback_burst=3)) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        yield run, client


def _feedback(run: Path) -> list[dict]:
    path = run / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------ paths stay inside the run
def test_a_symlink_out_of_the_run_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    secret = _write(outside / "secret.jsonl", _traj("SECRET").to_json())
    elsewhere_summary = _write(outside / "summary.json", json.dumps({"name": "LEAKED", "model": "LEAKED"}))
    elsewhere_metrics = _write(outside / "metrics.jsonl", json.dumps({"step": 1, "leaked": 1.0}))
    elsewhere_feedback = _write(
        outside / "feedback.jsonl", json.dumps({"trajectory_id": "t0", "label": "up"})
    )
    attribution = _write(outside / "attr.jsonl", json.dumps({"trajectory_id": "t0", "labels": ["GOOD"]}))
    mast = _write(outside / "mast.json", json.dumps({"traces": [{"trajectory_ids": ["t0"], "modes": {}}]}))
    before = elsewhere_feedback.read_bytes()
    run = make_run(tmp_path / "runs" / "linked")
    _write(run / "config.yaml", "model:\n  path: /nonexistent/model")  # no tokenizer to load
    links = {
        "summary.json": elsewhere_summary,
        "metrics.jsonl": elsewhere_metrics,
        "feedback.jsonl": elsewhere_feedback,
        "mast.json": mast,
        "eval/leak.jsonl": secret,
        "attribution/step_000001.jsonl": attribution,
    }
    for rel, target in links.items():
        (run / rel).parent.mkdir(exist_ok=True)
        (run / rel).symlink_to(target)
    (run / "eval" / "alias.jsonl").symlink_to("../trajectories/step_000001.jsonl")  # stays inside: fine

    with ViewerServer(create_app([run.parent])) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        row = api.get("/api/runs").json()[0]
        assert row["name"] == "linked"  # summary.json leads out: absent
        page = api.get("/api/runs/linked/trajectories", params={"limit": 500})
        files = [f["file"] for f in page.json()["files"]]
        assert files == ["trajectories/step_000001.jsonl", "eval/alias.jsonl"]
        assert api.get("/api/runs/linked/metrics").json()["series"] == {}
        leak = api.get("/api/runs/linked/trajectory", params={"file": "eval/leak.jsonl", "index": 0})
        assert leak.status_code == 403 and "outside the run directory" in leak.json()["detail"]
        shown = api.get("/api/runs/linked/trajectory", params={"file": "eval/alias.jsonl", "index": 0})
        assert shown.status_code == 200 and shown.json()["record"]["id"] == "t0"
        data = shown.json()
        assert data["attribution"] is None and data["mast"] is None and data["feedback"] is None
        posted = api.post("/api/runs/linked/feedback", json={"trajectory_id": "t0", "label": "down"})
        assert posted.status_code == 403 and "feedback.jsonl" in posted.json()["detail"]
        everything = page.text + leak.text + shown.text + api.get("/api/runs").text
    assert "SECRET" not in everything and "LEAKED" not in everything
    assert elsewhere_feedback.read_bytes() == before  # nothing appended outside


# ------------------------------------------------------------------ feedback
def test_feedback_is_limited_per_client_and_says_who_sent_it(served: tuple[Path, httpx.Client]) -> None:
    run, api = served
    sent = time.time()
    answers = [
        api.post("/api/runs/r/feedback", json={"trajectory_id": "t0", "label": "up"}).status_code
        for _ in range(5)
    ]
    assert answers == [200, 200, 200, 429, 429]  # a burst of 3, then 30 a minute
    refused = api.post("/api/runs/r/feedback", json={"trajectory_id": "t0", "label": "up"})
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "too much feedback from 127.0.0.1" in refused.json()["detail"]
    lines = _feedback(run)
    assert len(lines) == 3
    assert {(r["client"], r["authenticated"], r["source"]) for r in lines} == {("127.0.0.1", False, "viewer")}
    assert all(sent - 1 <= r["time"] <= time.time() + 1 for r in lines)  # the server's clock
    other = httpx.Client(base_url=str(api.base_url), transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with other:  # another client has its own bucket
        assert (
            other.post("/api/runs/r/feedback", json={"trajectory_id": "t1", "label": "down"}).status_code
            == 200
        )
    assert _feedback(run)[-1]["client"] == "127.0.0.2"


def test_a_token_bucket_refills_and_forgets_the_oldest_client() -> None:
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=2, max_clients=2, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    now[0] = 1.0
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
    limiter.take("b"), limiter.take("c")  # "a" is forgotten: at most 2 clients remembered
    assert limiter.take("a") == 0.0


def test_a_body_over_the_limit_or_a_bad_one_is_refused(served: tuple[Path, httpx.Client]) -> None:
    run, api = served
    huge = api.post(
        "/api/runs/r/feedback",
        content=json.dumps({"trajectory_id": "t0" * 50_000, "label": "up"}),
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413 and "8192 bytes" in huge.json()["detail"]
    extra = api.post("/api/runs/r/feedback", json={"trajectory_id": "t0", "label": "up", "client": "spoofed"})
    assert extra.status_code == 422  # who sent it is the server's to say
    assert _feedback(run) == []


# ------------------------------------------------------------------ the token
def test_a_token_guards_every_request_and_a_browser_gets_a_cookie(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r")
    with (
        ViewerServer(create_app([run], token=TOKEN)) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as api,
    ):
        for path in ("/", "/static/app.js", "/api/runs", "/api/openapi.json", "/api/docs"):
            res = api.get(path)
            assert res.status_code == 401 and "no token was sent" in res.json()["detail"], path
            assert res.headers["content-security-policy"].startswith("default-src 'self'")
        wrong = api.get("/api/runs", headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert api.get("/api/runs", headers=bearer).json()[0]["id"] == "r"
        assert api.get("/?token=nope").status_code == 401
        door = api.get(f"/?token={TOKEN}&x=1")
        assert door.status_code == 303 and door.headers["location"] == "/?x=1"
        cookie = door.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and TOKEN not in cookie
        api.cookies.clear()  # each request below says which cookie it carries
        name, value = cookie.split(";")[0].split("=", 1)
        assert api.get("/", headers={"Cookie": f"{name}={value}"}).status_code == 200
        assert api.get("/api/runs", headers={"Cookie": f"{name}={'0' * 64}"}).status_code == 401
        rating = {"trajectory_id": "t0", "label": "up"}
        liked = api.post("/api/runs/r/feedback", json=rating, headers={"Cookie": f"{name}={value}"})
        assert liked.status_code == 200
    assert _feedback(run)[-1]["authenticated"] is True


def test_every_answer_carries_the_security_headers(served: tuple[Path, httpx.Client]) -> None:
    _, api = served
    for path in ("/", "/static/app.js", "/api/runs", "/api/runs/nope", "/api/runs/r/trajectories?limit=0"):
        headers = api.get(path).headers
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    docs = api.get("/api/docs").headers["content-security-policy"]  # Swagger UI: its CDN, its one script
    assert "'sha256-" in docs and "unsafe-inline" not in docs and "frame-ancestors 'none'" in docs


# ------------------------------------------------------------------ the CLI
def _interrupt() -> None:
    raise KeyboardInterrupt


def test_cli_needs_a_token_to_serve_beyond_this_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("horizonrl.cli.view.wait_until_interrupted", _interrupt)  # never hang
    monkeypatch.delenv("HORIZON_VIEW_TOKEN", raising=False)
    port = str(free_port(""))
    bare = CliRunner().invoke(cli_app, ["view", str(tmp_path), "--host", "0.0.0.0", "--port", port])
    assert bare.exit_code == 2
    lines = bare.stderr.strip().splitlines()
    assert len(lines) == 1 and "--token" in lines[0] and "HORIZON_VIEW_TOKEN" in lines[0]
    short = CliRunner().invoke(cli_app, ["view", str(tmp_path), "--token", "abc", "--port", port])
    assert (
        short.exit_code == 2 and "at least 8" in short.stderr and len(short.stderr.strip().splitlines()) == 1
    )
    env = {"HORIZON_VIEW_TOKEN": TOKEN}
    served = CliRunner().invoke(
        cli_app, ["view", str(tmp_path), "--host", "0.0.0.0", "--port", port], env=env
    )
    assert served.exit_code == 0, served.output
    assert "token required" in served.stdout and TOKEN not in served.stdout


# ------------------------------------------------------------------ a browser with the token
def test_a_browser_opens_a_guarded_viewer_through_the_token_link(tmp_path: Path) -> None:
    from test_view import _chromium

    sync_playwright, executable = _chromium()
    run = make_run(tmp_path / "r")
    errors: list[str] = []
    with ViewerServer(create_app([run], token=TOKEN)) as srv, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(f"{srv.url}/?token={TOKEN}#/")
        page.get_by_test_id("run-row").first.wait_for()
        assert TOKEN not in page.url and page.url.endswith("/#/")
        assert "r" in page.get_by_test_id("run-row").inner_text()
        stranger = browser.new_page()  # another context: no cookie
        answer = stranger.goto(f"{srv.url}/")
        assert answer is not None and answer.status == 401
        browser.close()
    assert errors == []
