"""The trajectory viewer on a run of 10,000 trajectories of realistic size: what a page costs, paged,
against loading every summary at once.

Builds the run in a temporary directory: step files of 100 trajectories each and a base and a last
eval file of 50, copied from the real records in ``runs/calc_signals/trajectories/`` (~10 KB a line,
mostly token ids) with new ids, rewards and finish reasons, or synthesized ~600-token records when
that run is absent; and a metrics.jsonl of one line per step. Then measures, side by side:

- the index's line parse: the full ``json.loads`` + schema check of every line against the fast
  head/tail parse the index keeps (``index_full_parse_s``, ``index_fast_parse_s``);
- through a real :class:`ViewerServer`: the cold first request, which builds the index
  (``cold_first_request_s``); the warm run page's API requests, ``/api/runs`` + metrics + the first
  page of 50 (``warm_run_page_api_ms`` p50); the trajectory page's request (``trajectory_api_ms``
  p50 over 20 lines, tokens decoded); and, for comparison, every summary at once (500 a request, the
  API's cap: ``all_summaries_api_s``);
- in headless Chromium (Playwright, Debian's ``chromium``): navigating to the run page until the
  first table row shows (``browser_run_page_s``), to a trajectory page until its token view shows
  (``browser_trajectory_page_s``), and rendering all 10,000 summaries as one table
  (``browser_all_rows_s``).

Prints ``name=value`` lines, ``all_vs_paged_browser`` (all rows at once over the paged run page)
last. ``--screenshots DIR`` instead saves one screenshot of each page (1280x800) of the viewer on
the real runs in ``runs/`` (a small synthesized run when there are none).

    python benchmarks/view.py [--quick] [--trajectories 10000] [--screenshots DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from horizonrl.types import FINISH_REASONS, Message, Trajectory
from horizonrl.view import ViewerServer, create_app
from horizonrl.view.summary import LineSummary, summarize_full, summarize_line

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "runs" / "calc_signals"
PER_STEP = 100
RUN = "bench"


def source_records(rng: random.Random) -> list[dict[str, Any]]:
    """Real trajectory records to copy, or synthesized ~600-token ones."""
    files = sorted((SOURCE / "trajectories").glob("step_*.jsonl"))
    if files:
        lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line]
        return [json.loads(line) for line in lines]
    out = []
    for i in range(64):
        prompt = [rng.randrange(49152) for _ in range(420)]
        response = [rng.randrange(49152) for _ in range(180)]
        messages = [
            Message(role="system", content="Solve the arithmetic word problem with the calculator. " * 4),
            Message(role="user", content=f"Problem {i}: there are {rng.randrange(9999)} books in a library."),
            Message(role="assistant", content="First, I compute 1366 * 81.\n<tool_call>..."),
            Message(role="tool", content=str(rng.randrange(99999)), tool_call_id="c", name="calculator"),
            Message(role="assistant", content="So the answer is 110646."),
        ]
        traj = Trajectory(
            id=f"syn-{i}",
            task_id=f"syn-{i}",
            group_id=f"syn-{i}",
            env="calc",
            messages=messages,
            prompt_ids=prompt,
            response_ids=response,
            loss_mask=[1] * len(response),
            logprobs=[-rng.random() for _ in response],
            finish="finished",
        )
        out.append(json.loads(traj.to_json()))
    return out


EVAL_TASKS = 50


def build_run(folder: Path, n: int, rng: random.Random) -> int:
    """Write the benchmark run: ``n`` trajectory lines, of which two eval files of EVAL_TASKS."""
    records = source_records(rng)
    n_train = max(1, n - 2 * EVAL_TASKS)
    steps = max(1, -(-n_train // PER_STEP))
    (folder / "trajectories").mkdir(parents=True)
    (folder / "config.yaml").write_text(f"name: {RUN}\nmodel:\n  path: smollm2-135m\nenv:\n  name: calc\n")
    metrics = []
    written = 0
    for step in range(1, steps + 1):
        lines = []
        for i in range(PER_STEP if step < steps else n_train - PER_STEP * (steps - 1)):
            rec = dict(records[(step * PER_STEP + i) % len(records)])
            rec["id"] = f"s{step}-{i}"
            rec["reward"] = round(rng.random() * 1.5, 3)
            rec["finish"] = "finished" if rng.random() < 0.8 else rng.choice(FINISH_REASONS)
            rec["metrics"] = {**rec.get("metrics", {}), "success": float(rec["reward"] > 1.0)}
            lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
        (folder / "trajectories" / f"step_{step:06d}.jsonl").write_text("".join(lines), encoding="utf-8")
        written += len(lines)
        metrics.append(
            {"step": step, "reward_mean": rng.random(), "success_rate": rng.random(), "loss": rng.random(),
             "approx_kl": rng.random() / 100, "entropy": rng.random(), "rollout_s": 30 + rng.random(),
             "update_s": 30 + rng.random(), "wall_s": 60.0 * step}
        )  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "eval").mkdir()
    for label in ("base", f"step_{steps:06d}"):
        evals = [dict(r, id=f"{label}-{i}", task_id=f"eval-{i}") for i, r in enumerate(records[:EVAL_TASKS])]
        (folder / "eval" / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    return written + 2 * EVAL_TASKS


def parse_costs(folder: Path) -> tuple[float, float, int]:
    """Seconds to summarize every trajectory line by the full parse and by the fast one, and the
    lines' bytes."""
    files = sorted(folder.glob("trajectories/*.jsonl")) + sorted(folder.glob("eval/*.jsonl"))
    lines = [raw for f in files for raw in f.read_bytes().splitlines() if raw]
    timings = []
    for summarize in (summarize_full, summarize_line):
        start = time.perf_counter()
        for i, raw in enumerate(lines):
            summarize(raw, LineSummary("f", i, 0, len(raw), None))
        timings.append(time.perf_counter() - start)
    return timings[0], timings[1], sum(map(len, lines))


def p50_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def browser() -> tuple[Any, Any]:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        raise SystemExit("chromium is not installed: `make setup` installs it (Debian's chromium package)")
    pw = sync_playwright().start()
    return pw, pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])


ALL_ROWS_JS = """async (run) => {
  const start = performance.now();
  const rows = [];
  for (let offset = 0; ; offset += 500) {
    const page = await (await fetch(`api/runs/${run}/trajectories?limit=500&offset=${offset}`)).json();
    rows.push(...page.items);
    if (offset + 500 >= page.total) break;
  }
  const body = rows.map((s) => `<tr><td>${s.step}</td><td><a href="#">${s.id}</a></td><td>${s.task_id}</td>` +
    `<td>${s.env}</td><td>${s.finish}</td><td>${s.reward}</td><td>${s.num_turns}</td><td>${s.success}</td></tr>`);
  document.getElementById("main").innerHTML = `<table class="grid"><tbody>${body.join("")}</tbody></table>`;
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  return [rows.length, (performance.now() - start) / 1000];
}"""


def measure(folder: Path, lines: int) -> None:
    full_s, fast_s, size = parse_costs(folder)
    print(f"trajectories={lines}")
    print(f"run_mib={size / 2**20:.1f}")
    print(f"index_full_parse_s={full_s:.3f}")
    print(f"index_fast_parse_s={fast_s:.3f}")
    with ViewerServer(create_app([folder])) as server, httpx.Client(base_url=server.url, timeout=120) as api:
        start = time.perf_counter()
        assert api.get("/api/runs").json()[0]["trajectories"] == lines
        print(f"cold_first_request_s={time.perf_counter() - start:.3f}")
        base = f"/api/runs/{RUN}"
        page50 = lambda: api.get(f"{base}/trajectories", params={"limit": 50}).raise_for_status()  # noqa: E731
        parts = {
            "runs": p50_ms(lambda: api.get("/api/runs").raise_for_status(), 20),
            "metrics": p50_ms(lambda: api.get(f"{base}/metrics").raise_for_status(), 20),
            "page50": p50_ms(page50, 20),
        }
        for name, ms in parts.items():
            print(f"warm_{name}_api_ms={ms:.1f}")
        print(f"warm_run_page_api_ms={sum(parts.values()):.1f}")
        first = {"file": "trajectories/step_000001.jsonl", "index": 0}
        start = time.perf_counter()
        api.get(f"{base}/trajectory", params=first).raise_for_status()
        print(f"trajectory_api_first_s={time.perf_counter() - start:.3f}")  # loads the tokenizer
        picks = iter(range(1, 21))
        detail = lambda: api.get(  # noqa: E731
            f"{base}/trajectory", params={"file": "trajectories/step_000002.jsonl", "index": next(picks)}
        ).raise_for_status()
        print(f"trajectory_api_ms={p50_ms(detail, 20):.1f}")
        start = time.perf_counter()
        total = 0
        for offset in range(0, lines, 500):
            page = api.get(f"{base}/trajectories", params={"limit": 500, "offset": offset}).json()
            total += len(page["items"])
        assert total == lines
        print(f"all_summaries_api_s={time.perf_counter() - start:.3f}")

        pw, chromium = browser()
        try:
            loads, details, alls = [], [], []
            for _ in range(3):
                page = chromium.new_page(viewport={"width": 1280, "height": 800})
                start = time.perf_counter()
                page.goto(f"{server.url}/#/run/{RUN}")
                page.get_by_test_id("traj-row").first.wait_for()
                loads.append(time.perf_counter() - start)
                start = time.perf_counter()
                page.goto(f"{server.url}/#/run/{RUN}/trajectory?file=trajectories/step_000003.jsonl&index=7")
                page.get_by_test_id("token-view").wait_for()
                details.append(time.perf_counter() - start)
                page.goto(f"{server.url}/#/")  # the runs page: no run page polls while all rows load
                page.get_by_test_id("run-row").first.wait_for()
                count, seconds = page.evaluate(ALL_ROWS_JS, RUN)
                assert count == lines
                alls.append(seconds)
                page.close()
        finally:
            chromium.close()
            pw.stop()
    run_page, all_rows = statistics.median(loads), statistics.median(alls)
    print(f"browser_run_page_s={run_page:.3f}")
    print(f"browser_trajectory_page_s={statistics.median(details):.3f}")
    print(f"browser_all_rows_s={all_rows:.3f}")
    print(f"all_vs_paged_browser={all_rows / run_page:.1f}")


def pages_to_shoot(api: httpx.Client, run: str) -> list[tuple[str, str, str]]:
    """``(file name, page, the element that shows it is ready)`` for each page of the viewer."""
    shots = [("view_runs.png", "#/", "run-row"), ("view_run.png", f"#/run/{run}", "traj-row")]
    good = api.get(f"/api/runs/{run}/trajectories", params={"success": "true", "limit": 1}).json()["items"]
    if good:
        where = urlencode({"file": good[0]["file"], "index": good[0]["index"]})
        shots.append(("view_trajectory.png", f"#/run/{run}/trajectory?{where}", "token-view"))
    tasks = api.get(f"/api/runs/{run}/compare").json()["tasks"]
    task = next((t for t in tasks if t["change"] == "fixed"), tasks[0] if tasks else None)
    if task:
        which = urlencode({"task": task["task_id"]})
        shots.append(("view_compare.png", f"#/run/{run}/compare?{which}", "compare-before"))
    return shots


def screenshots(out: Path, rng: random.Random) -> None:
    """One screenshot per page of the viewer on the real runs in runs/ (else a small built run)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if SOURCE.is_dir():
            paths, run = [Path(os.path.relpath(ROOT / "runs"))], SOURCE.name
        else:
            build_run(Path(tmp) / RUN, 300, rng)
            paths, run = [Path(tmp)], RUN
        with ViewerServer(create_app(paths)) as server, httpx.Client(base_url=server.url, timeout=60) as api:
            shots = pages_to_shoot(api, run)
            pw, chromium = browser()
            try:
                page = chromium.new_page(viewport={"width": 1280, "height": 800})
                for name, hash_, ready in shots:
                    page.goto(f"{server.url}/{hash_}")
                    page.get_by_test_id(ready).first.wait_for()
                    if ready == "token-view":
                        page.get_by_test_id("jump-response").click()  # show the trained-on tokens
                    page.wait_for_timeout(300)
                    page.screenshot(path=out / name)
                    print(f"screenshot={out / name}")
            finally:
                chromium.close()
                pw.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 trajectories instead of 10,000")
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--screenshots", type=Path, help="save a screenshot of each page here and stop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.screenshots is not None:
        screenshots(args.screenshots, rng)
        return
    n = 1_000 if args.quick else args.trajectories
    if n < 1:
        parser.error("--trajectories must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / RUN
        lines = build_run(folder, n, rng)
        print(f"source={'runs/calc_signals' if SOURCE.is_dir() else 'synthesized'}")
        measure(folder, lines)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
