"""`horizon compare`: RL algorithms side by side, from one starting policy, on the same budget.

The recipe's starting point — base eval, SFT warm start, start eval — runs once, in
``output_dir/name/start`` (a `horizon train` run with ``train.steps=0``). Each algorithm then runs as
its own `horizon train` in ``output_dir/name/<algorithm>``, started from that run (``--start-from``):
the same starting weights, the same training tasks in the same order, the same step count, tasks per
step and group size; only ``train.algorithm`` differs (plus whatever the recipe sets explicitly, which
applies to all). A run already finished is not repeated, so an interrupted comparison continues.

Written next to the runs: ``comparison.json`` (one row per algorithm), ``comparison.md`` (the same as
a Markdown table) and ``comparison.png`` (training reward, training success and held-out success per
step, one line per algorithm, the held-out success with its 95% interval).

Finished runs already on disk (or a recipe's seeds) are put side by side, with intervals and noise
verdicts, by :mod:`horizonrl.train.compare_runs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

from horizonrl.config import Algorithm, RunConfig, load_config
from horizonrl.errors import ConfigError
from horizonrl.io import atomic_path, write_text_atomic
from horizonrl.train.reporter import Reporter
from horizonrl.train.run import TrainingRun
from horizonrl.train.rundir import finished_summary
from horizonrl.train.tracking import draw_interval, read_metrics

START = "start"
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)


def parse_algorithms(text: str) -> list[str]:
    """``"grpo,rloo"`` -> ``["grpo", "rloo"]``; unknown or repeated names are a ConfigError naming the
    valid ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown or not names:
        raise ConfigError(
            f"--algorithms: unknown {', '.join(map(repr, unknown)) or 'empty list'}; valid: "
            + ", ".join(ALGORITHMS)
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"--algorithms: {text!r} names an algorithm twice")
    return names


def _config(path: str | Path, overrides: Sequence[str], root: Path, name: str, *extra: str) -> RunConfig:
    return load_config(path, [*overrides, f"output_dir={root}", f"name={name}", *extra])


def compare(
    config_path: str | Path,
    overrides: Sequence[str],
    algorithms: Sequence[str],
    reporter: Callable[[str, RunConfig], Reporter] | None = None,
    fresh: bool = False,
) -> list[dict[str, Any]]:
    """Run the shared start and every algorithm (skipping finished runs unless ``fresh``); return the
    table rows."""
    recipe = load_config(config_path, list(overrides))
    root = recipe.run_dir
    make_reporter = reporter or (lambda label, cfg: Reporter())
    start_cfg = _config(config_path, overrides, root, START, "train.steps=0")
    if fresh or finished_summary(start_cfg.run_dir) is None:
        TrainingRun(start_cfg, make_reporter(START, start_cfg), overwrite=True).run()
    rows = []
    for algorithm in algorithms:
        cfg = _config(config_path, overrides, root, algorithm, f"train.algorithm={algorithm}")
        summary = None if fresh else finished_summary(cfg.run_dir)
        if summary is None:
            run = TrainingRun(
                cfg, make_reporter(algorithm, cfg), overwrite=True, start_from=start_cfg.run_dir
            )
            summary = run.run()
        rows.append(_row(algorithm, cfg, summary))
    write_comparison(root, rows)
    return rows


def _row(algorithm: str, cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    records = [m for m in read_metrics(cfg.run_dir / "metrics.jsonl") if "reward_mean" in m]
    tc = cfg.train
    return {
        "algorithm": algorithm,
        "advantage": tc.advantage,
        "policy_loss": tc.policy_loss,
        "reduction": tc.reduction,
        "steps": summary["steps"],
        "start_success": summary["start_success"],
        "final_success": summary["final_success"],
        "gain": summary["gain_over_start"],
        "train_reward_first": records[0]["reward_mean"] if records else None,
        "train_reward_last": records[-1]["reward_mean"] if records else None,
        "train_success_mean": sum(m["success_rate"] for m in records) / len(records) if records else None,
        "wall_s": summary["wall_s"],
        "peak_rss_gib": summary["peak_rss_gib"],
        "run_dir": str(cfg.run_dir),
    }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    def pct(value: Any) -> str:
        return "–" if value is None else f"{100 * value:.0f}%"

    def points(value: Any) -> str:
        return "–" if value is None else f"{100 * value:+.0f}"

    def num(value: Any) -> str:
        return "–" if value is None else f"{value:.3f}"

    lines = [
        "| algorithm | advantage | policy loss | reduction | start | final | gain (points) "
        "| train reward first → last | train success (mean) | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['advantage']} | {r['policy_loss']} | {r['reduction']} "
            f"| {pct(r['start_success'])} | {pct(r['final_success'])} | {points(r['gain'])} "
            f"| {num(r['train_reward_first'])} → {num(r['train_reward_last'])} "
            f"| {pct(r['train_success_mean'])} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_comparison(root: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``comparison.json``, ``comparison.md`` and ``comparison.png`` in ``root`` (each atomically)."""
    write_text_atomic(root / "comparison.json", json.dumps(list(rows), indent=2) + "\n")
    write_text_atomic(root / "comparison.md", markdown_table(rows))
    plot_comparison(root, rows)


def plot_comparison(root: Path, rows: Sequence[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = root / "comparison.png"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    try:
        panels = (
            ("reward_mean", "training reward (mean)"),
            ("success_rate", "training success rate"),
            ("eval/success", "held-out success"),
        )
        for ax, (key, title) in zip(axes, panels, strict=True):
            for row in rows:
                records = read_metrics(Path(row["run_dir"]) / "metrics.jsonl")
                points = [(m["step"], m[key]) for m in records if m.get(key) is not None]
                if points:
                    steps, values = zip(*points, strict=True)
                    style = "o-" if key == "eval/success" else "-"
                    (line,) = ax.plot(steps, values, style, label=row["algorithm"])
                    draw_interval(ax, records, key, line.get_color(), label=None)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best")
        fig.tight_layout()
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
    finally:
        plt.close(fig)
    return out
