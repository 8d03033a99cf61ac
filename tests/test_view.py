"""``horizon view``: the trajectory viewer on a small hand-made run, through a real server.

The run has two training steps, base and step evals sharing tasks, a line that does not parse, a
line still being written (no newline yet), step attribution, a MAST entry, a two-role episode and a
SWE-style edit. The API is checked with httpx against :class:`ViewerServer` (listing, paging, each
filter, live appends, compare, feedback, refusals); the pages with headless Chromium through
Playwright, which saves a screenshot of each page under ``test-output/view/``."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from horizonrl.cli import app as cli_app
from horizonrl.local_server import free_port
from horizonrl.types import Message, ToolCall, Trajectory
from horizonrl.view import ViewerServer, create_app
from horizonrl.view.lines import CompleteLines
from horizonrl.view.runinfo import run_status
from horizonrl.view.summary import LineSummary, summarize_full, summarize_line

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "test-output" / "view"
PATCH = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-return a-b\n+return a+b\n"
)


# ------------------------------------------------------------------ the run
def _messages(task: str, edit: bool) -> list[Message]:
    if edit:
        call = ToolCall(
            id="c1",
            name="str_replace_editor",
            arguments={"path": "calc.py", "old_str": "a - b", "new_str": "a + b"},
        )
        observation = f"The file calc.py was edited.\n{PATCH}"
    else:
        call = ToolCall(id="c1", name="calculator", arguments={"expression": "12 * 7"})
        observation = "84"
    return [
        Message(role="system", content="Use the calculator for every step."),
        Message(role="user", content=f"Task {task}: what is 12 times 7?"),
        Message(role="assistant", content="I compute 12 * 7.", tool_calls=[call]),
        Message(role="tool", content=observation, tool_call_id="c1", name=call.name),
        Message(role="assistant", content="The answer is 84."),
    ]


def make_traj(tokenizer: Any, tid: str, task: str, reward: float, **kw: Any) -> Trajectory:
    """A record whose token ids are the real SmolLM2 tokens of its text: the prompt, then the first
    assistant turn (trained), the observation (not trained) and the last turn (trained)."""
    messages = _messages(task, kw.pop("edit", False))
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = ids(messages[0].content + "\n" + messages[1].content)
    parts = [(ids(messages[2].content), 1), (ids(messages[3].content), 0), (ids(messages[4].content), 1)]
    response = [t for part, _ in parts for t in part]
    mask = [m for part, m in parts for _ in part]
    logprobs = [-0.05 * (i % 9) if m else 0.0 for i, m in enumerate(mask)]
    kw.setdefault("metrics", {"success": 1.0 if reward >= 1 else 0.0})
    return Trajectory(
        id=tid,
        task_id=task,
        group_id=task,
        env=kw.pop("env", "calc"),
        messages=messages,
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        logprobs=logprobs,
        reward=reward,
        turn_rewards=[0.0, reward],
        num_turns=2,
        finish=kw.pop("finish", "finished"),
        **kw,
    )


@dataclass
class Run:
    """The hand-made run: its directory and what was written where."""

    dir: Path
    lines: dict[str, list[Trajectory | str]] = field(default_factory=dict)
    partial: Trajectory | None = None

    def write(self, rel: str, rows: list[Trajectory | str]) -> None:
        path = self.dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write((row if isinstance(row, str) else row.to_json()) + "\n")
        self.lines.setdefault(rel, []).extend(rows)

    def records(self) -> list[Trajectory]:
        return [r for rows in self.lines.values() for r in rows if isinstance(r, Trajectory)]

    def total(self) -> int:
        return sum(len(rows) for rows in self.lines.values())

    def where(self, tid: str) -> tuple[str, int]:
        for rel, rows in self.lines.items():
            for i, row in enumerate(rows):
                if isinstance(row, Trajectory) and row.id == tid:
                    return rel, i
        raise KeyError(tid)


BAD_LINE = '{"schema_version": 1, "id": "broken", not json'


def build_run(folder: Path, tokenizer: Any) -> Run:
    run = Run(folder)
    (folder / "config.yaml").parent.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text("name: view_test\nmodel:\n  path: smollm2-135m\nenv:\n  name: calc\n")
    metrics = [
        {"step": 0, "eval/success": 0.0, "eval/success_low": 0.0, "eval/success_high": 0.43},
        {"step": 1, "reward_mean": 0.4, "success_rate": 0.3, "loss": 0.9, "approx_kl": 0.001, "entropy": 0.5,
         "rollout_s": 3.0, "update_s": 2.0, "wall_s": 5.0},
        {"step": 2, "reward_mean": 0.6, "success_rate": 0.5, "loss": 0.7, "approx_kl": 0.002, "entropy": 0.45,
         "rollout_s": 3.2, "update_s": 2.1, "wall_s": 10.3, "eval/success": 0.67, "eval/success_low": 0.3,
         "eval/success_high": 0.9},
    ]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + "{oops\n")
    step1 = [make_traj(tokenizer, f"t1-{i}", f"task-{i}", r) for i, r in enumerate([0.0, 1.0, 0.5, 1.0, 0.0])]
    step1[2] = make_traj(tokenizer, "t1-2", "task-2", 0.5, edit=True)
    step1[4] = make_traj(tokenizer, "t1-4", "task-4", 0.0, finish="turn_budget")
    step1.append(make_traj(tokenizer, "t1-5", "task-5", 0.25, env="shell", metrics={}))
    run.write("trajectories/step_000001.jsonl", step1)
    episode = [
        make_traj(tokenizer, f"ep-1/{role}", "task-9", 1.0, episode_id="ep-1", role=role)
        for role in ("generator", "verifier")
    ]
    step2 = [make_traj(tokenizer, f"t2-{i}", f"task-{i}", float(i % 2)) for i in range(4)]
    run.write("trajectories/step_000002.jsonl", [*step2, *episode, BAD_LINE])
    run.partial = make_traj(tokenizer, "t2-partial", "task-7", 1.0)
    with (folder / "trajectories/step_000002.jsonl").open("a") as f:
        f.write(run.partial.to_json())  # no newline: still being written
    run.write("eval/base.jsonl", [make_traj(tokenizer, f"e0-{i}", f"eval-{i}", 0.0) for i in range(3)])
    after = [make_traj(tokenizer, f"e2-{i}", f"eval-{i}", 1.0 if i < 2 else 0.0) for i in range(4)]
    run.write("eval/step_000002.jsonl", after)
    (folder / "attribution").mkdir()
    (folder / "attribution/step_000001.jsonl").write_text(
        json.dumps({"trajectory_id": "t1-1", "labels": ["GOOD", "BAD"]}) + "\n"
    )
    mode = {"steps": [1], "roles": ["agent"], "reasons": ["ran out of turns"], "sources": ["detector"]}
    (folder / "mast.json").write_text(
        json.dumps(
            {
                "version": "mast-1",
                "traces": [{"id": "t1-4", "trajectory_ids": ["t1-4"], "modes": {"1.5": mode}}],
            }
        )
    )
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer) -> Run:
    return build_run(tmp_path_factory.mktemp("runs") / "view_test", tokenizer)


@pytest.fixture(scope="module")
def server(run: Run) -> Iterator[ViewerServer]:
    with ViewerServer(create_app([run.dir.parent])) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: ViewerServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def items(api: httpx.Client, **params: Any) -> dict[str, Any]:
    res = api.get("/api/runs/view_test/trajectories", params=params)
    assert res.status_code == 200, res.text
    return res.json()


# ------------------------------------------------------------------ API
def test_runs_lists_the_run_with_its_counts(api: httpx.Client, run: Run) -> None:
    runs = api.get("/api/runs").json()
    assert [r["id"] for r in runs] == ["view_test"]
    row = runs[0]
    assert row["name"] == "view_test" and row["env"] == "calc" and row["model"] == "smollm2-135m"
    assert row["trajectories"] == run.total() == 20  # the partial line is not counted
    assert row["parse_errors"] == 1 and row["steps"] == 2
    assert row["status"] == "running"  # written just now, no finished summary
    assert row["success"] == 0.67 and row["success_from"] == "last eval"


def test_run_status_semantics() -> None:
    assert run_status(False, None, None) == "empty"
    assert run_status(True, None, 1000.0, now=1030.0) == "running"
    assert run_status(True, None, 1000.0, now=1100.0) == "stopped"
    assert run_status(True, {"finished": True}, 1000.0, now=1001.0) == "finished"
    assert run_status(True, {"finished": False}, 1000.0, now=1100.0) == "stopped"
    assert run_status(True, {"accuracy": 0.5}, 1000.0, now=1100.0) == "finished"  # an eval's summary


def test_metrics_series_and_bad_lines(api: httpx.Client) -> None:
    data = api.get("/api/runs/view_test/metrics").json()
    assert data["series"]["reward_mean"] == [[1, 0.4], [2, 0.6]]
    assert data["series"]["eval/success"] == [[0, 0.0], [2, 0.67]]
    assert {"loss", "approx_kl", "entropy", "rollout_s", "update_s", "wall_s"} <= data["series"].keys()
    assert data["bad_lines"] == 1 and data["rows"] == 3


def test_paging(api: httpx.Client, run: Run) -> None:
    first = items(api, limit=7)
    assert first["total"] == 20 and first["offset"] == 0 and len(first["items"]) == 7
    assert [s["id"] for s in first["items"][:6]] == [f"t1-{i}" for i in range(6)]
    rest = items(api, limit=7, offset=14)
    assert len(rest["items"]) == 6 and rest["items"][-1]["id"] == "e2-3"
    assert [f["lines"] for f in first["files"]] == [6, 7, 3, 4]
    assert api.get("/api/runs/view_test/trajectories", params={"limit": 501}).status_code == 422


def test_each_filter(api: httpx.Client, run: Run) -> None:
    recs = run.records()

    def total(**params: Any) -> int:
        return items(api, limit=500, **params)["total"]

    assert total(file="trajectories/step_000001.jsonl") == 6
    assert total(step="2") == 7 and total(step="eval:base") == 3
    assert total(finish="turn_budget") == 1 and total(finish="unparsed") == 1
    assert total(env="shell") == 1
    assert total(role="verifier") == 1
    assert total(min_reward=0.5) == sum(r.reward >= 0.5 for r in recs)
    assert total(max_reward=0.25) == sum(r.reward <= 0.25 for r in recs)
    assert total(success=True) == sum(r.success for r in recs)
    assert total(success=False) == 20 - sum(r.success for r in recs)
    assert total(q="T1-") == 6 and total(q="eval-1") == 2
    assert total(finish="finished", min_reward=1.0, file="eval/step_000002.jsonl") == 2


def test_a_line_that_does_not_parse_is_listed_and_shown(api: httpx.Client, run: Run) -> None:
    bad = items(api, finish="unparsed")["items"]
    assert len(bad) == 1 and bad[0]["parse_error"].startswith("not JSON") and bad[0]["index"] == 6
    shown = api.get("/api/runs/view_test/trajectory", params={"file": bad[0]["file"], "index": 6}).json()
    assert shown["parse_error"].startswith("not JSON") and shown["raw"] == BAD_LINE
    assert shown["record"] is None and shown["tokens"] == []


def test_trajectory_has_tokens_attribution_mast_and_episode(api: httpx.Client, run: Run) -> None:
    rel, index = run.where("t1-1")
    data = api.get("/api/runs/view_test/trajectory", params={"file": rel, "index": index}).json()
    record = Trajectory.model_validate(data["record"])
    assert record.id == "t1-1" and data["parse_error"] is None
    tokens = data["tokens"]
    assert [t["id"] for t in tokens] == record.prompt_ids + record.response_ids
    assert [t["mask"] for t in tokens] == [0] * len(record.prompt_ids) + record.loss_mask
    assert [t["logprob"] for t in tokens[len(record.prompt_ids) :]] == record.logprobs
    assert "".join(t["text"] for t in tokens[len(record.prompt_ids) :]).startswith("I compute 12 * 7.")
    assert data["tokenizer"]["note"] is None
    assert data["attribution"]["labels"] == ["GOOD", "BAD"]
    rel, index = run.where("t1-4")
    mast = api.get("/api/runs/view_test/trajectory", params={"file": rel, "index": index}).json()
    assert list(mast["mast"]["modes"]) == ["1.5"] and mast["mast_modes"]["1.5"]["name"]
    rel, index = run.where("ep-1/verifier")
    ep = api.get("/api/runs/view_test/trajectory", params={"file": rel, "index": index})
    roles = [(m["summary"]["role"], m["current"]) for m in ep.json()["episode"]]
    assert roles == [("generator", False), ("verifier", True)]


def test_unknown_run_file_index_and_path_escapes(api: httpx.Client) -> None:
    get = lambda run, **p: api.get(f"/api/runs/{run}/trajectory", params=p)  # noqa: E731
    assert get("nope", file="trajectories/step_000001.jsonl", index=0).status_code == 404
    missing = get("view_test", file="trajectories/step_000009.jsonl", index=0)
    assert missing.status_code == 404 and "step_000009" in missing.json()["detail"]
    assert get("view_test", file="trajectories/step_000001.jsonl", index=6).status_code == 404
    for escape in ("../view_test/metrics.jsonl", "/etc/passwd", "trajectories/../../x.jsonl"):
        res = get("view_test", file=escape, index=0)
        assert res.status_code == 400 and "not inside" in res.json()["detail"], escape
    assert api.get("/api/runs/nope/metrics").status_code == 404


def test_compare_before_and_after(api: httpx.Client) -> None:
    data = api.get("/api/runs/view_test/compare").json()
    assert (data["before"], data["after"]) == ("eval/base.jsonl", "eval/step_000002.jsonl")
    assert [t["task_id"] for t in data["tasks"]] == ["eval-0", "eval-1", "eval-2"]  # eval-3 is only after
    assert [t["change"] for t in data["tasks"]] == ["fixed", "fixed", "same"]
    assert data["totals"]["before_success"] == 0 and data["totals"]["fixed"] == 2
    pair = api.get("/api/runs/view_test/compare", params={"task_id": "eval-1"}).json()
    assert pair["before"]["record"]["id"] == "e0-1" and pair["after"]["record"]["id"] == "e2-1"
    assert api.get("/api/runs/view_test/compare", params={"task_id": "eval-3"}).status_code == 404


def _feedback_lines(run: Run) -> list[dict[str, Any]]:
    path = run.dir / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_feedback_is_appended_or_refused(api: httpx.Client, run: Run) -> None:
    before = len(_feedback_lines(run))
    res = api.post("/api/runs/view_test/feedback", json={"trajectory_id": "t1-3", "label": "down"})
    assert res.status_code == 200 and res.json()["ok"] is True
    line = _feedback_lines(run)[-1]
    assert len(_feedback_lines(run)) == before + 1
    assert (line["trajectory_id"], line["label"], line["source"]) == ("t1-3", "down", "viewer")
    unknown = api.post("/api/runs/view_test/feedback", json={"trajectory_id": "no-such-id", "label": "up"})
    assert unknown.status_code == 404 and "no-such-id" in unknown.json()["detail"]
    assert "view_test" in unknown.json()["detail"]
    assert (
        api.post("/api/runs/nope/feedback", json={"trajectory_id": "t1-3", "label": "up"}).status_code == 404
    )
    assert (
        api.post("/api/runs/view_test/feedback", json={"trajectory_id": "t1-3", "label": "meh"}).status_code
        == 422
    )
    assert len(_feedback_lines(run)) == before + 1


# ------------------------------------------------------------------ live reading
def test_a_run_being_written_shows_lines_as_they_complete(tmp_path: Path, tokenizer: Any) -> None:
    run = build_run(tmp_path / "live", tokenizer)
    with ViewerServer(create_app([run.dir])) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        rid = api.get("/api/runs").json()[0]["id"]
        step2 = {"file": "trajectories/step_000002.jsonl", "limit": 50}
        assert api.get(f"/api/runs/{rid}/trajectories", params=step2).json()["total"] == 7
        with (run.dir / "trajectories/step_000002.jsonl").open("a") as f:
            f.write("\n")  # the partial line is now complete
        page = api.get(f"/api/runs/{rid}/trajectories", params=step2).json()
        assert page["total"] == 8 and page["items"][-1]["id"] == "t2-partial"
        run.write("trajectories/step_000003.jsonl", [make_traj(tokenizer, "t3-0", "task-0", 1.0)])
        page = api.get(f"/api/runs/{rid}/trajectories", params={"step": "3"}).json()
        assert page["total"] == 1 and "trajectories/step_000003.jsonl" in [f["file"] for f in page["files"]]
        assert (
            api.post(f"/api/runs/{rid}/feedback", json={"trajectory_id": "t3-0", "label": "up"}).status_code
            == 200
        )
        (run.dir / "trajectories/step_000001.jsonl").write_text(
            make_traj(tokenizer, "new", "t", 0.0).to_json() + "\n"
        )
        page = api.get(f"/api/runs/{rid}/trajectories", params={"step": "1"}).json()
        assert [s["id"] for s in page["items"]] == ["new"]  # rewritten: read again from the start


def test_a_model_without_a_tokenizer_gives_token_ids_and_says_why(tmp_path: Path, tokenizer: Any) -> None:
    run = Run(tmp_path / "no_tokenizer")
    run.write("trajectories/step_000001.jsonl", [make_traj(tokenizer, "t", "task", 1.0)])
    (run.dir / "config.yaml").write_text("model:\n  path: /nonexistent/model\n")
    with ViewerServer(create_app([run.dir])) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        params = {"file": "trajectories/step_000001.jsonl", "index": 0}
        data = api.get("/api/runs/no_tokenizer/trajectory", params=params).json()
    record = Trajectory.model_validate(data["record"])
    assert [t["id"] for t in data["tokens"]] == record.prompt_ids + record.response_ids
    assert {t["text"] for t in data["tokens"]} == {None}
    assert "/nonexistent/model" in data["tokenizer"]["note"]


def test_complete_lines_reads_only_appended_bytes_and_notices_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"aa\nbb\ncc")
    lines = CompleteLines(path, tmp_path)
    assert lines.update().lines == [b"aa", b"bb"]
    assert lines.update().lines == []
    with path.open("ab") as f:
        f.write(b"c\n")
    new = lines.update()
    assert (new.lines, new.offsets, new.reset) == ([b"ccc"], [6], False)
    path.write_bytes(b"xx\nyy\nzzz\n")  # same size or more, different bytes
    new = lines.update()
    assert new.reset and new.lines == [b"xx", b"yy", b"zzz"]
    path.write_bytes(b"q\n")
    assert lines.update().reset


def test_fast_summary_matches_the_full_parse(run: Run) -> None:
    for rel in run.lines:
        for i, raw in enumerate((run.dir / rel).read_bytes().splitlines()):
            fast = summarize_line(raw, LineSummary(rel, i, 0, len(raw), None))
            full = summarize_full(raw, LineSummary(rel, i, 0, len(raw), None))
            fast.checked = full.checked
            assert fast == full
    wrong = run.records()[0].model_dump()
    wrong["finish"] = "gave_up"
    summary = summarize_line(json.dumps(wrong).encode(), LineSummary("f", 0, 0, 0, None))
    assert summary.id == "t1-0" and "finish" in (summary.parse_error or "")


# ------------------------------------------------------------------ CLI
def test_cli_missing_run_dir_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli_app, ["view", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0] and "folder of runs" in lines[0]


def _interrupt() -> None:
    raise KeyboardInterrupt


def test_cli_serves_an_empty_directory_and_prints_the_url(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("horizonrl.cli.view.wait_until_interrupted", _interrupt)  # Ctrl-C at once
    result = CliRunner().invoke(cli_app, ["view", str(tmp_path), "--port", str(free_port())])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:" in result.stdout and str(tmp_path) in result.stdout


def test_cli_port_in_use_is_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("horizonrl.cli.view.wait_until_interrupted", _interrupt)  # never hang
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_app, ["view", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "in use" in lines[0]


# ------------------------------------------------------------------ browser
def _chromium() -> tuple[Any, str]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed; `make setup` installs it (the dev extra)")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed; `make setup` installs it (Debian's chromium package)")
    return sync_playwright, executable


def test_browser_walks_every_page(server: ViewerServer, run: Run, tmp_path: Path) -> None:
    sync_playwright, executable = _chromium()
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        tid = page.get_by_test_id

        home = page.goto(f"{server.url}/#/")
        assert home is not None and "script-src 'self';" in home.headers["content-security-policy"]
        tid("run-row").first.wait_for()
        assert tid("run-row").count() == 1 and "view_test" in tid("run-row").inner_text()
        page.screenshot(path=SHOTS / "runs.png")

        tid("run-link").click()
        tid("traj-row").first.wait_for()
        assert tid("chart").count() >= 6 and page.locator("[data-testid=chart] svg path.line").count() >= 6
        eval_chart = tid("chart").filter(has_text="Eval success")  # its 95% interval: a band and whiskers
        assert eval_chart.locator("path.band").count() == 1
        assert eval_chart.locator("line.whisker").count() == 2
        assert tid("pager-count").inner_text() == "1–20 of 20"
        assert tid("traj-row").count() == 20
        tid("filter-finish").select_option("turn_budget")
        expect(tid("pager-count")).to_have_text("1–1 of 1")
        assert tid("traj-row").count() == 1
        tid("filter-clear").click()
        expect(tid("pager-count")).to_have_text("1–20 of 20")
        page.screenshot(path=SHOTS / "run.png")

        page.locator("[data-testid=traj-link]", has_text="t1-1").click()
        tid("token-view").wait_for()
        record = next(r for r in run.records() if r.id == "t1-1")
        assert tid("msg-system").count() == 1 and tid("msg-user").count() == 1
        assert tid("msg-assistant").count() == 2 and tid("msg-tool").count() == 1
        assert tid("tool-name").inner_text() == "calculator"
        assert tid("attribution").all_inner_texts() == ["GOOD", "BAD"]
        n, trained = len(record.prompt_ids) + len(record.response_ids), sum(record.loss_mask)
        assert tid("token-count").inner_text().startswith(f"{n} tokens · {trained} trained-on")
        assert page.locator("[data-testid=tokens] .tok").count() == n
        assert page.locator("[data-testid=tokens] .tok.m1").count() == trained
        assert "logprob" in (page.locator("[data-testid=tokens] .tok.m1").first.get_attribute("title") or "")
        page.screenshot(path=SHOTS / "trajectory.png", full_page=True)
        tid("fb-up").click()
        expect(tid("fb-status")).to_have_text(re.compile("^saved"))
        assert _feedback_lines(run)[-1] | {"time": 0} == {
            "trajectory_id": "t1-1", "label": "up", "source": "viewer", "time": 0,
            "client": "127.0.0.1", "authenticated": False,
        }  # fmt: skip

        def open_line(tid_: str) -> None:
            rel, index = run.where(tid_)
            page.goto(f"{server.url}/#/run/view_test/trajectory?file={rel}&index={index}")

        open_line("t1-2")
        tid("token-view").wait_for()
        assert page.locator(".dl.del").count() >= 2 and page.locator(".dl.add").count() >= 2
        assert page.locator(".dl.hunk").count() == 1
        open_line("t1-4")
        tid("mast-mode").wait_for()
        assert "1.5" in tid("mast-mode").inner_text()
        open_line("ep-1/generator")
        tid("episode").wait_for()
        assert tid("episode-col").count() == 2
        page.goto(f"{server.url}/#/run/view_test/trajectory?file=trajectories/step_000002.jsonl&index=6")
        tid("parse-error").wait_for()
        assert tid("parse-error-message").inner_text().startswith("not JSON")
        assert tid("raw-line").inner_text() == BAD_LINE

        page.goto(f"{server.url}/#/run/view_test?tab=compare")
        tid("compare-row").first.wait_for()
        assert tid("compare-row").count() == 3
        tid("compare-link").nth(1).click()
        tid("compare-before").wait_for()
        assert "e0-1" in tid("compare-before").inner_text() and "e2-1" in tid("compare-after").inner_text()
        page.screenshot(path=SHOTS / "compare.png")

        empty = tmp_path / "empty"
        empty.mkdir()
        with ViewerServer(create_app([empty])) as bare:  # live: a run appears, then grows
            page.goto(f"{bare.url}/#/")
            tid("empty-state").wait_for()
            assert "Nothing is written yet" in tid("empty-state").inner_text()
            fresh = Run(empty / "fresh")
            fresh.write("trajectories/step_000001.jsonl", run.records()[:2])
            tid("run-link").wait_for(timeout=10_000)
            tid("run-link").click()
            expect(tid("pager-count")).to_have_text("1–2 of 2")
            fresh.write("trajectories/step_000001.jsonl", run.records()[2:3])
            expect(tid("pager-count")).to_have_text("1–3 of 3", timeout=10_000)
        browser.close()
    assert errors == []
    print(f"screenshots: {os.path.relpath(SHOTS, Path.cwd())}/")
