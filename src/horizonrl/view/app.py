"""The viewer's HTTP app: a JSON API under ``/api`` and the single-page front end from ``static/``.

Every request first reads what was written since the last one (new runs, appended trajectory and
metrics lines), so a page that polls shows a run as it is written. Lists are paged; only the
trajectory page reads a whole record. A line that does not parse is listed and shown with its error.

No file outside a run directory is read or written (a symlink leading out is 403, never followed);
with a token every request must carry it, feedback is limited per client and bounded in size, and
every answer carries a strict Content-Security-Policy (:mod:`horizonrl.view.access`).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from horizonrl.asgi import RequestGate, detail_refusal
from horizonrl.run_paths import OutsideRunDir, is_inside
from horizonrl.stream.feedback import FEEDBACK_FILE, Feedback, Label, append_feedback
from horizonrl.view.access import ViewerGuard, docs_csp
from horizonrl.view.annotations import MastCache, attribution_for, feedback_for, mode_names
from horizonrl.view.catalog import Catalog, RunState
from horizonrl.view.compare import before_after, pair_totals, task_pairs
from horizonrl.view.index import FileIndex
from horizonrl.view.query import TrajectoryQuery, facets, file_rows, page, select
from horizonrl.view.ratelimit import RateLimiter
from horizonrl.view.summary import LineSummary
from horizonrl.view.tokens import DEFAULT_MODEL, TokenizerCache, token_view

STATIC_DIR = Path(__file__).parent / "static"
MAX_LIMIT = 500
#: how much of a line that does not parse is sent back to be shown
RAW_LIMIT = 100_000
#: the largest request body the viewer reads (its only body is a feedback rating, ~100 bytes)
MAX_BODY_BYTES = 8192
#: feedback each client may send: this many at once, then this many a minute (more: 429)
FEEDBACK_BURST = 20
FEEDBACK_PER_MINUTE = 30


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither; a record may hold them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class FiniteJSON(JSONResponse):
    """JSON that browsers parse (non-finite floats become null), never cached: a run changes."""

    def __init__(self, content: Any, status_code: int = 200, **kwargs: Any) -> None:
        super().__init__(content, status_code, **kwargs)
        self.headers["Cache-Control"] = "no-store"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except ValueError:
            text = json.dumps(_finite(content), ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8")


class FeedbackRequest(BaseModel):
    """A thumbs up or down on one trajectory of the run."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str = Field(min_length=1, max_length=1000)
    label: Label


def _file_index(state: RunState, file: str) -> FileIndex:
    """The run's trajectory file named by a relative path; 400 for a path that leaves the run
    directory, 403 for a symlink that leads out of it, 404 for one that is not a trajectory file."""
    norm = posixpath.normpath(file.replace("\\", "/"))
    if file.startswith("/") or norm == ".." or norm.startswith("../") or ":" in file.split("/")[0]:
        raise HTTPException(
            400, f"file {file!r} is not inside run {state.id!r}; give a path relative to the run"
        )
    index = state.index.files.get(norm)
    if index is None and not is_inside(state.path, state.path / norm):
        raise HTTPException(
            403, f"{file!r} of run {state.id!r} leads outside the run directory (a symlink); not served"
        )
    if index is None:
        raise HTTPException(404, f"run {state.id!r} has no trajectory file {file!r}")
    return index


def _line(index: FileIndex, state: RunState, position: int) -> LineSummary:
    if not 0 <= position < len(index.summaries):
        raise HTTPException(
            404,
            f"{index.rel} of run {state.id!r} has {len(index.summaries)} complete lines; no line {position}",
        )
    return index.summaries[position]


def _check_page(state: RunState, rows: Sequence[LineSummary]) -> None:
    """Check the shown lines against the full schema (the index parsed only their summary fields)."""
    for summary in rows:
        if not summary.checked:
            state.index.read(summary)


def _entry(state: RunState, summary: LineSummary) -> dict[str, Any]:
    """A line for the page: its summary, its record, its error, and its text when it is not JSON."""
    raw, record, error = state.index.read(summary)
    out: dict[str, Any] = {"summary": summary.to_dict(), "record": record, "parse_error": error}
    if error is not None and record is None:
        text = raw.decode("utf-8", errors="replace")
        out["raw"] = text[:RAW_LIMIT]
        out["raw_truncated"] = len(text) > RAW_LIMIT
    return out


def _episode(state: RunState, index: FileIndex, summary: LineSummary) -> list[dict[str, Any]]:
    """Every role's trajectory of this line's episode in the same file, in file order."""
    if not summary.episode_id:
        return []
    members = [s for s in index.summaries if s.episode_id == summary.episode_id]
    return [{**_entry(state, s), "current": s.index == summary.index} for s in members]


_MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def _static_assets() -> dict[str, tuple[bytes, str, str]]:
    """The front end's files, read once: ``name -> (bytes, media type, etag)``."""
    out = {}
    for path in sorted(STATIC_DIR.iterdir()):
        if path.suffix in _MEDIA_TYPES:
            data = path.read_bytes()
            out[path.name] = (data, _MEDIA_TYPES[path.suffix], f'"{hashlib.sha256(data).hexdigest()[:16]}"')
    return out


def _asset(assets: dict[str, tuple[bytes, str, str]], name: str, request: Request) -> Response:
    """A front-end file from memory; the browser revalidates it (304 when unchanged)."""
    if name not in assets:
        raise HTTPException(404, f"no static file {name!r}")
    data, media_type, etag = assets[name]
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=f"{media_type}; charset=utf-8", headers=headers)


def create_app(
    paths: Sequence[Path],
    *,
    token: str | None = None,
    feedback_burst: int = FEEDBACK_BURST,
    feedback_per_minute: float = FEEDBACK_PER_MINUTE,
) -> FastAPI:
    """The viewer of the runs in (or below) ``paths``. ``token``: every request must carry it
    (:mod:`horizonrl.view.access`); feedback: ``feedback_burst`` at once per client, then
    ``feedback_per_minute`` a minute."""
    catalog = Catalog(paths)
    tokenizers = TokenizerCache()
    mast = MastCache()
    limiter = RateLimiter(feedback_per_minute, feedback_burst)
    app = FastAPI(
        title="HorizonRL trajectory viewer",
        default_response_class=FiniteJSON,
        docs_url=None,
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )

    def run(run_id: str) -> RunState:
        state = catalog.get(run_id)
        if state is None:
            raise HTTPException(404, f"no run {run_id!r} under {', '.join(map(str, catalog.paths))}")
        state.refresh()
        return state

    def model_of(state: RunState) -> tuple[str, str | None]:
        named = state.model()
        note = None if named else f"the run names no model; decoded with the default {DEFAULT_MODEL!r}"
        return named or DEFAULT_MODEL, note

    def policy_dir(state: RunState) -> Path | None:
        """The run's saved tokenizer (``policy/``), unless it leads out of the run directory."""
        policy = state.path / "policy"
        return policy if is_inside(state.path, policy) else None

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        """The paths this viewer shows."""
        return {"paths": [str(p) for p in catalog.paths]}

    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        """One row per run, the latest updated first: name, env, model, status, steps, success,
        trajectories, last update."""
        states = catalog.discover()
        for state in states:
            state.refresh()
        rows = [state.info() for state in states]
        return sorted(rows, key=lambda row: -(row["updated"] or 0))  # the latest first

    @app.get("/api/runs/{run_id}")
    def run_info(run_id: str) -> dict[str, Any]:
        """One run's row of ``/api/runs``."""
        return run(run_id).info()

    @app.get("/api/runs/{run_id}/metrics")
    def metrics(run_id: str) -> dict[str, Any]:
        """``series[key]``: ``[[step, value], ...]`` from metrics.jsonl; ``bad_lines``: lines that
        did not parse."""
        state = run(run_id)
        m = state.metrics
        return {"run": state.id, "series": m.series, "rows": m.rows, "bad_lines": m.bad_lines}

    @app.get("/api/runs/{run_id}/trajectories")
    def trajectories(
        run_id: str,
        file: str | None = None,
        finish: str | None = None,
        env: str | None = None,
        role: str | None = None,
        step: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        success: bool | None = None,
        q: str | None = None,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    ) -> dict[str, Any]:
        """One page of the run's trajectory summaries that pass the filters, and the total."""
        state = run(run_id)
        tokenizers.warm(model_of(state)[0], policy_dir(state))  # the trajectory page needs it next
        everything = state.summaries()
        query = TrajectoryQuery(file, finish, env, role, step, min_reward, max_reward, success, q)
        rows = select(everything, query)
        shown = page(rows, offset, limit)
        _check_page(state, shown)
        return {
            "total": len(rows),
            "offset": offset,
            "limit": limit,
            "all": len(everything),
            "files": state.derived("files", lambda: file_rows(state.summaries(), state.index.files)),
            "facets": state.derived("facets", lambda: facets(state.summaries())),
            "items": [s.to_dict() for s in shown],
        }

    @app.get("/api/runs/{run_id}/trajectory")
    def trajectory(run_id: str, file: str, index: Annotated[int, Query(ge=0)]) -> dict[str, Any]:
        """The whole record of one line, its tokens decoded one by one, and what is known about it:
        attribution labels, MAST modes, feedback, and the other roles of its episode."""
        state = run(run_id)
        file_index = _file_index(state, file)
        summary = _line(file_index, state, index)
        out: dict[str, Any] = {"run": state.id, "file": file_index.rel, "index": index}
        out.update(_entry(state, summary))
        out["prev"] = index - 1 if index > 0 else None
        out["next"] = index + 1 if index + 1 < len(file_index.summaries) else None
        record = out["record"]
        model, note = model_of(state)
        out["tokenizer"] = {"model": model, "note": note}
        out["tokens"] = []
        if record is not None and out["parse_error"] is None:
            decode, why_not = tokenizers.get(model, policy_dir(state))
            out["tokenizer"]["note"] = why_not or note
            out["tokens"] = token_view(record, decode)
        tid = summary.id
        out["attribution"] = attribution_for(state.path, summary.step, tid) if tid else None
        out["mast"] = mast.entry(state.path, tid) if tid else None
        out["mast_modes"] = mode_names(out["mast"])
        out["feedback"] = feedback_for(state.path, tid) if tid else None
        out["episode"] = _episode(state, file_index, summary)
        return out

    @app.get("/api/runs/{run_id}/compare")
    def compare(run_id: str, task_id: str | None = None) -> dict[str, Any]:
        """Without ``task_id``: the eval tasks in both the "before" and the "after" eval file, with
        reward and success in each. With it: that task's two trajectories."""
        state = run(run_id)
        chosen = before_after({rel: f.path for rel, f in state.index.files.items()})
        if chosen is None:
            if task_id is not None:
                raise HTTPException(404, f"run {state.id!r} has no before/after eval files to compare")
            return {"before": None, "after": None, "tasks": [], "totals": pair_totals([])}
        before, after = (state.index.files[rel] for rel in chosen)
        rows = task_pairs(before.summaries, after.summaries)
        if task_id is None:
            return {"before": before.rel, "after": after.rel, "tasks": rows, "totals": pair_totals(rows)}
        row = next((r for r in rows if r["task_id"] == task_id), None)
        if row is None:
            raise HTTPException(
                404, f"task {task_id!r} is not in both {before.rel} and {after.rel} of {state.id!r}"
            )
        return {
            "task_id": task_id,
            "before": {
                "file": before.rel,
                "index": row["before"]["index"],
                **_entry(state, _line(before, state, row["before"]["index"])),
            },
            "after": {
                "file": after.rel,
                "index": row["after"]["index"],
                **_entry(state, _line(after, state, row["after"]["index"])),
            },
        }

    @app.post("/api/runs/{run_id}/feedback")
    def feedback(run_id: str, body: Annotated[FeedbackRequest, Body()], request: Request) -> dict[str, Any]:
        """Append a thumbs up or down for one of the run's trajectories to its feedback.jsonl, with
        who sent it (the client's address, whether it carried the token) and when. Each client may
        send ``feedback_burst`` at once, then ``feedback_per_minute`` a minute: more is 429."""
        client = request.client.host if request.client else "unknown"
        wait = limiter.take(client)
        if wait:
            raise HTTPException(
                429,
                f"too much feedback from {client}: at most {feedback_burst} at once, then "
                f"{feedback_per_minute:g} a minute; try again in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        state = run(run_id)
        if state.index.find_id(body.trajectory_id) is None:
            raise HTTPException(404, f"run {state.id!r} has no trajectory with id {body.trajectory_id!r}")
        rating = Feedback(
            trajectory_id=body.trajectory_id,
            label=body.label,
            source="viewer",
            client=client,
            authenticated=token is not None,
        )
        try:
            append_feedback(state.path, rating)
        except OutsideRunDir as exc:
            raise HTTPException(403, f"feedback is not saved: {exc}") from None
        except OSError as exc:
            raise HTTPException(503, f"feedback could not be saved: {exc.strerror or exc}") from None
        return {"ok": True, "trajectory_id": body.trajectory_id, "label": body.label, "file": FEEDBACK_FILE}

    assets = _static_assets()

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str, request: Request) -> Response:
        return _asset(assets, name, request)

    @app.get("/", include_in_schema=False)
    async def home(request: Request) -> Response:
        return _asset(assets, "index.html", request)

    @app.get("/api/docs", include_in_schema=False)
    async def docs() -> Response:
        page = get_swagger_ui_html(openapi_url="/api/openapi.json", title=f"{app.title} - API")
        page.headers["Content-Security-Policy"] = docs_csp(bytes(page.body))
        return page

    app.add_middleware(
        RequestGate,
        token=None,
        max_request_bytes=MAX_BODY_BYTES,
        public_paths=set(),
        refuse=detail_refusal,
        too_large_hint='send {"trajectory_id": ..., "label": "up" | "down"}',
    )
    app.add_middleware(ViewerGuard, token=token)  # outermost: its headers go on every answer
    return app
