"""The viewer and stream feedback under abuse: symlinks out of a run directory (reading and writing),
paths that leave the run, feedback floods, oversized and spoofed bodies, requests without the token
or with a wrong one, the browser's cookie door, the security headers of every answer, and ``horizon
view`` asked to serve beyond this machine without a token (the real CLI in a subprocess).

Each case runs against a real :class:`ViewerServer` on 127.0.0.1 over real run directories in
``workdir``; no model is loaded (the runs name a model path that does not exist)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from abuse_probes import Case, Cases
from horizonrl.local_server import free_port
from horizonrl.run_paths import OutsideRunDir
from horizonrl.stream.feedback import Feedback, FeedbackReader, append_feedback
from horizonrl.types import Message, Trajectory
from horizonrl.view import ViewerServer, create_app

FAMILY = "viewer and streams"
TOKEN = "probe-token-0123456789"
NO_MODEL = "model:\n  path: /nonexistent/model\n"  # the token view never loads a tokenizer


def _traj(tid: str) -> str:
    return Trajectory(
        id=tid,
        task_id="task",
        group_id="task",
        env="calc",
        messages=[Message(role="user", content=f"question {tid}")],
        prompt_ids=[1, 2],
        response_ids=[3],
        loss_mask=[1],
        logprobs=[-0.5],
        reward=1.0,
        finish="finished",
    ).to_json()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _run(folder: Path, *ids: str) -> Path:
    _write(folder / "config.yaml", NO_MODEL)
    _write(folder / "trajectories/step_000001.jsonl", "".join(_traj(t) + "\n" for t in ids))
    return folder


def _first_line(res: httpx.Response) -> str:
    return f"{res.status_code} {res.text.splitlines()[0][:200] if res.text else ''}"


def _headers_ok(res: httpx.Response) -> bool:
    csp = res.headers.get("content-security-policy", "")
    return (
        "default-src 'self'" in csp
        and "script-src 'self';" in csp
        and "frame-ancestors 'none'" in csp
        and res.headers.get("x-content-type-options") == "nosniff"
        and res.headers.get("x-frame-options") == "DENY"
    )


def _links_out(c: Cases, workdir: Path) -> None:
    outside = workdir / "elsewhere"
    secret = _write(outside / "secret.jsonl", _traj("SECRET-TRAJECTORY") + "\n")
    summary = _write(outside / "summary.json", json.dumps({"name": "SECRET-NAME", "model": "SECRET-NAME"}))
    metrics = _write(outside / "metrics.jsonl", json.dumps({"step": 1, "secret_metric": 1.0}) + "\n")
    feedback = _write(outside / "feedback.jsonl", "")
    mast = _write(
        outside / "mast.json", json.dumps({"traces": [{"trajectory_ids": ["t0"], "modes": {"1.1": {}}}]})
    )
    attribution = _write(
        outside / "attr.jsonl", json.dumps({"trajectory_id": "t0", "labels": ["GOOD"]}) + "\n"
    )
    run = _run(workdir / "runs" / "linked", "t0", "t1")
    for rel, target in {
        "eval/leak.jsonl": secret,
        "summary.json": summary,
        "metrics.jsonl": metrics,
        "feedback.jsonl": feedback,
        "mast.json": mast,
        "attribution/step_000001.jsonl": attribution,
    }.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).symlink_to(target)
    _write(workdir / "swap_target.jsonl", _traj("SWAPPED-IN") + "\n")
    _write(run / "eval/base.jsonl", _traj("e0") + "\n")

    with ViewerServer(create_app([run.parent])) as srv, httpx.Client(base_url=srv.url, timeout=60) as api:
        texts: list[str] = []

        def get(path: str, **params: object) -> httpx.Response:
            res = api.get(path, params=params)
            texts.append(res.text)
            return res

        def listed() -> tuple[bool, str]:
            files = [f["file"] for f in get("/api/runs/linked/trajectories").json()["files"]]
            return "eval/leak.jsonl" not in files, f"files: {files}"

        def leak_page() -> tuple[bool, str]:
            res = get("/api/runs/linked/trajectory", file="eval/leak.jsonl", index=0)
            return res.status_code == 403 and "outside" in res.text, _first_line(res)

        def summary_read() -> tuple[bool, str]:
            row = get("/api/runs").json()[0]
            return row["name"] != "SECRET-NAME", f"name {row['name']!r}"

        def metrics_read() -> tuple[bool, str]:
            series = get("/api/runs/linked/metrics").json()["series"]
            return "secret_metric" not in series, f"series {sorted(series)}"

        def annotations() -> tuple[bool, str]:
            data = get("/api/runs/linked/trajectory", file="trajectories/step_000001.jsonl", index=0).json()
            return data["mast"] is None and data["attribution"] is None, (
                f"mast {data['mast']}, attribution {data['attribution']}"
            )

        def feedback_append() -> tuple[bool, str]:
            res = api.post("/api/runs/linked/feedback", json={"trajectory_id": "t0", "label": "up"})
            return res.status_code == 403 and feedback.read_text() == "", (
                f"{_first_line(res)}; outside file now {len(feedback.read_text())} bytes"
            )

        def escapes() -> tuple[bool, str]:
            codes = {
                f: get("/api/runs/linked/trajectory", file=f, index=0).status_code
                for f in ("../linked/config.yaml", "/etc/passwd", "eval/../../../elsewhere/secret.jsonl")
            }
            return all(code == 400 for code in codes.values()), f"{codes}"

        def swapped() -> tuple[bool, str]:
            get("/api/runs/linked/trajectories", file="eval/base.jsonl")  # indexed while a real file
            (run / "eval/base.jsonl").unlink()
            (run / "eval/base.jsonl").symlink_to(workdir / "swap_target.jsonl")
            res = get("/api/runs/linked/trajectory", file="eval/base.jsonl", index=0)
            return "SWAPPED-IN" not in res.text and res.status_code in (403, 404), _first_line(res)

        for name, fn in [
            ("a trajectory file symlinked out of the run is not listed", listed),
            ("a trajectory file symlinked out of the run is 403 on its page", leak_page),
            ("summary.json symlinked out is not read", summary_read),
            ("metrics.jsonl symlinked out is not read", metrics_read),
            ("mast.json and attribution symlinked out are not shown", annotations),
            ("POST feedback with feedback.jsonl symlinked out: 403, nothing appended there", feedback_append),
            ("'..' and absolute file paths: 400", escapes),
            ("a file swapped for a link out after indexing is not served", swapped),
        ]:
            c.check(name, fn)
        c.check(
            "no answer holds the outside files' content",
            lambda: (
                not any(s in t for t in texts for s in ("SECRET-TRAJECTORY", "SECRET-NAME", "secret_metric")),
                f"{len(texts)} answers read",
            ),
        )

    def stream_side() -> tuple[bool, str]:
        try:
            append_feedback(run, Feedback(trajectory_id="t0", label="up", source="synthetic"))
            return False, "append_feedback followed the link"
        except OutsideRunDir as exc:
            reader = FeedbackReader(run)
            got = reader.read_new()
            return got == [] and reader.refused is not None and feedback.read_text() == "", str(exc)

    c.check("the stream neither appends to nor reads a feedback.jsonl linked out", stream_side)


def _feedback_limits(c: Cases, workdir: Path) -> None:
    run = _run(workdir / "fb" / "r", "t0")
    with ViewerServer(create_app([run.parent])) as srv, httpx.Client(base_url=srv.url, timeout=60) as api:
        rating = {"trajectory_id": "t0", "label": "up"}
        answers = [api.post("/api/runs/r/feedback", json=rating) for _ in range(200)]
        codes = [a.status_code for a in answers]
        accepted, limited = codes.count(200), [a for a in answers if a.status_code == 429]

        def flood() -> tuple[bool, str]:
            retry = all(int(a.headers.get("retry-after", "0")) >= 1 for a in limited)
            return accepted <= 25 and len(limited) == 200 - accepted and retry, (
                f"{accepted}/200 accepted, {len(limited)} 429 with Retry-After: {retry}"
            )

        def attributed() -> tuple[bool, str]:
            rows = [json.loads(line) for line in (run / "feedback.jsonl").read_text().splitlines()]
            ok = rows and all(
                r.get("client") == "127.0.0.1"
                and r.get("authenticated") is False
                and time.time() - r["time"] < 600
                for r in rows
            )
            return bool(ok), f"{len(rows)} records, first {rows[0] if rows else None}"

        def oversized() -> tuple[bool, str]:
            body = json.dumps({"trajectory_id": "t0" * 500_000, "label": "up"})
            res = api.post("/api/runs/r/feedback", content=body, headers={"content-type": "application/json"})
            return res.status_code == 413 and "limit" in res.text and _headers_ok(res), _first_line(res)

        def spoofed() -> tuple[bool, str]:
            body = {**rating, "client": "10.9.9.9", "authenticated": True}
            other = httpx.Client(base_url=srv.url, transport=httpx.HTTPTransport(local_address="127.0.0.3"))
            with other:
                res = other.post("/api/runs/r/feedback", json=body)
            return res.status_code == 422, _first_line(res)

        def limited_headers() -> tuple[bool, str]:
            return bool(limited) and _headers_ok(limited[-1]), _first_line(limited[-1]) if limited else "none"

        c.check("200 feedback posts from one client: a burst accepted, the rest 429 + Retry-After", flood)
        c.check("each feedback record says who sent it (address, token) and when (server clock)", attributed)
        c.check("a 1 MB feedback body: 413 with the limit", oversized)
        c.check("a body that names its own sender: 422", spoofed)
        c.check("a 429 carries the security headers", limited_headers)


def _token(c: Cases, workdir: Path) -> None:
    run = _run(workdir / "tok" / "r", "t0")
    with (
        ViewerServer(create_app([run], token=TOKEN)) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as api,
    ):

        def anonymous() -> tuple[bool, str]:
            answers = {
                p: api.get(p) for p in ("/", "/static/app.js", "/api/runs", "/api/openapi.json", "/api/docs")
            }
            posted = api.post("/api/runs/r/feedback", json={"trajectory_id": "t0", "label": "up"})
            ok = (
                all(a.status_code == 401 and _headers_ok(a) for a in answers.values())
                and posted.status_code == 401
            )
            return ok and not (
                run / "feedback.jsonl"
            ).exists(), f"{ {p: a.status_code for p, a in answers.items()} }"

        def wrong() -> tuple[bool, str]:
            res = api.get("/api/runs", headers={"Authorization": "Bearer wrong-token-123"})
            return res.status_code == 401, _first_line(res)

        def bearer() -> tuple[bool, str]:
            res = api.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
            return res.status_code == 200, _first_line(res)

        def door() -> tuple[bool, str]:
            res = api.get(f"/?token={TOKEN}")
            cookie = res.headers.get("set-cookie", "")
            api.cookies.clear()
            ok = (
                res.status_code == 303
                and TOKEN not in res.headers.get("location", "")
                and "httponly" in cookie.lower()
                and "samesite=strict" in cookie.lower()
                and TOKEN not in cookie
            )
            name, _, value = cookie.split(";")[0].partition("=")
            good = api.get("/api/runs", headers={"Cookie": f"{name}={value}"}).status_code
            forged = api.get("/api/runs", headers={"Cookie": f"{name}={'f' * 64}"}).status_code
            wrong_door = api.get("/?token=not-the-token").status_code
            return ok and good == 200 and forged == 401 and wrong_door == 401, (
                f"{res.status_code} {cookie[:80]}; cookie {good}, forged {forged}, wrong ?token {wrong_door}"
            )

        def authenticated() -> tuple[bool, str]:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            res = api.post(
                "/api/runs/r/feedback", json={"trajectory_id": "t0", "label": "up"}, headers=headers
            )
            last = json.loads((run / "feedback.jsonl").read_text().splitlines()[-1])
            return res.status_code == 200 and last.get("authenticated") is True, f"{_first_line(res)}; {last}"

        c.check("with a token: requests without it are 401 (page, static, API, docs, feedback)", anonymous)
        c.check("with a token: a wrong Bearer token is 401", wrong)
        c.check("with a token: the right Bearer token is let in", bearer)
        c.check(
            "?token= sets an HttpOnly SameSite=Strict cookie (not the token) and drops it from the URL", door
        )
        c.check("feedback with the token is recorded as authenticated", authenticated)


def _headers(c: Cases, workdir: Path) -> None:
    run = _run(workdir / "hdr" / "r", "t0")
    with ViewerServer(create_app([run])) as srv, httpx.Client(base_url=srv.url, timeout=60) as api:

        def every_answer() -> tuple[bool, str]:
            paths = (
                "/",
                "/static/app.js",
                "/static/style.css",
                "/api/runs",
                "/api/runs/nope",
                "/static/nope.js",
            )
            bad = [p for p in paths if not _headers_ok(api.get(p))]
            return not bad, f"missing on {bad}" if bad else f"{len(paths)} answers"

        def docs() -> tuple[bool, str]:
            csp = api.get("/api/docs").headers.get("content-security-policy", "")
            return "'sha256-" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, csp[
                :120
            ]

        def no_inline() -> tuple[bool, str]:
            page = api.get("/").text
            inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) + re.findall(
                r"\sstyle=|\son\w+=", page
            )
            return not inline, f"inline in the page: {inline}"

        c.check("CSP, nosniff and frame denial on every answer (200 and 404)", every_answer)
        c.check("the API docs page allows its one inline script by hash only", docs)
        c.check("the page has no inline script, style or handler for the CSP to allow", no_inline)


def _cli(c: Cases, workdir: Path) -> None:
    folder = _run(workdir / "cli" / "r", "t0")
    env = {k: v for k, v in os.environ.items() if k != "HORIZON_VIEW_TOKEN"}
    horizon = [sys.executable, "-m", "horizonrl.cli", "view", str(folder)]

    def one_line(args: list[str], must: str) -> tuple[bool, str]:
        proc = subprocess.run([*horizon, *args], capture_output=True, text=True, timeout=120, env=env)
        lines = proc.stderr.strip().splitlines()
        ok = proc.returncode == 2 and len(lines) == 1 and must in lines[0] and "Traceback" not in proc.stderr
        return ok, f"exit {proc.returncode}: {proc.stderr.strip()[:200]}"

    port = str(free_port(""))
    c.check(
        "horizon view --host 0.0.0.0 without a token: one line, exit 2",
        lambda: one_line(["--host", "0.0.0.0", "--port", port], "--token"),
    )
    c.check(
        "horizon view --token with 3 characters: one line, exit 2",
        lambda: one_line(["--token", "abc", "--port", port], "at least"),
    )

    def guarded() -> tuple[bool, str]:
        proc = subprocess.Popen(
            [*horizon, "--host", "0.0.0.0", "--port", port],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "HORIZON_VIEW_TOKEN": TOKEN},
        )
        try:
            assert proc.stdout is not None
            out = proc.stdout.readline()
            if "http://" not in out:
                return False, f"no address printed: {out[:200]}"
            base = f"http://127.0.0.1:{port}"
            anonymous = httpx.get(f"{base}/api/runs", timeout=60).status_code
            allowed = httpx.get(f"{base}/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            return (
                anonymous == 401 and allowed.status_code == 200,
                f"without {anonymous}, with {allowed.status_code}",
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    c.check("horizon view --host 0.0.0.0 with HORIZON_VIEW_TOKEN: serves, and only with the token", guarded)


def probe(workdir: Path) -> list[Case]:
    c = Cases()
    for part in (_links_out, _feedback_limits, _token, _headers, _cli):
        part(c, workdir)
    return c.cases
