"""What an eval reports from n samples per task, each figure with a 95% interval.

One sample per task (the default, greedy): the success rate with a Wilson interval (the tasks are
independent trials). n > 1 samples per task (``eval.samples_per_task``), per task its passes ``c``
of ``n``, its rewards and (for an env that says which answers agree, :meth:`Env.answer_of`) its
answers, from which:

- ``pass@k``: the chance that one of k samples solves the task, by the unbiased estimator (Chen et
  al. 2021) from all n;
- ``avg@n``: the mean success over the n samples (it equals the unbiased pass@1);
- ``best@k``: the expected best reward of k samples, unbiased in the same way (order statistics of
  the n rewards);
- ``maj@k``: the chance that the majority vote of k samples' answers is right (the mean over
  k-subsets of the n).

Each is a mean over tasks of a per-task value, with the percentile bootstrap interval over tasks
(the samples of one task are not independent; 2000 resamples, the same draws for every figure);
a rate that is 0 (or 1) on every task, where a bootstrap has no width, gets the Wilson interval over
tasks instead. The same figures are given per task group (:meth:`Env.task_group`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from horizonrl.envs.base import Env
from horizonrl.errors import ConfigError
from horizonrl.stats import Estimate, best_at_k, bootstrap_means, maj_at_k, pass_at_k, wilson
from horizonrl.types import Task, Trajectory

#: what a sampled eval can report, in the order it prints them
METRICS: tuple[str, ...] = ("pass", "avg", "best", "maj")
RESAMPLES = 2000
WILSON_NOTE = "95% Wilson interval over tasks"
BOOTSTRAP_NOTE = (
    f"95% percentile bootstrap interval over tasks ({RESAMPLES} resamples; Wilson over tasks for a rate "
    "that is 0 or 1 on every task)"
)


@dataclass
class TaskSamples:
    """One task's samples: whether each solved it, its reward and its answer (None: no answer stated;
    ``answers`` is None when the env has no answers)."""

    task_id: str
    group: str | None
    successes: list[bool]
    rewards: list[float]
    answers: list[str | None] | None = None

    @property
    def n(self) -> int:
        return len(self.successes)

    @property
    def passes(self) -> int:
        return sum(self.successes)


def default_ks(n: int) -> list[int]:
    """The k reported of n samples by default: the powers of 2 below n, and n."""
    return [*(2**i for i in range(n.bit_length()) if 2**i < n), n]


def choose_metrics(asked: Sequence[str] | None, env_cls: type[Env]) -> list[str]:
    """The metrics a sampled eval reports: ``asked`` (``eval.metrics``) or, when None, every one the
    env supports. Asking ``maj`` of an env without answers is a ConfigError naming it."""
    has_answers = env_cls.has_answers()
    if asked is None:
        return [m for m in METRICS if m != "maj" or has_answers]
    if "maj" in asked and not has_answers:
        raise ConfigError(
            f"eval.metrics asks maj@k, but env {env_cls.name!r} cannot say which answers agree (it has no "
            "answer hook, Env.answer_of; calc, flights and bfcl have one); drop maj from eval.metrics"
        )
    return [m for m in METRICS if m in asked]


def gather(
    trajectories: Sequence[Trajectory], tasks: Sequence[Task], env_cls: type[Env]
) -> list[TaskSamples]:
    """The records grouped by task, in task order (a task without records is left out); answers
    read by the env's :meth:`Env.answer_of` when it has one."""
    by_task: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        by_task.setdefault(traj.task_id, []).append(traj)
    answers = env_cls.has_answers()
    out = []
    for task in tasks:
        records = by_task.get(task.id)
        if not records:
            continue
        out.append(
            TaskSamples(
                task.id,
                env_cls.task_group(task),
                [t.success for t in records],
                [t.reward for t in records],
                [env_cls.answer_of(t) for t in records] if answers else None,
            )
        )
    return out


def _columns(
    samples: Sequence[TaskSamples], ks: Sequence[int], metrics: Sequence[str], seed: int
) -> dict[str, list[float]]:
    """Per metric, its value on each task."""
    n = min(s.n for s in samples)
    columns: dict[str, list[float]] = {}
    for metric in metrics:
        if metric == "avg":
            columns[f"avg@{n}"] = [s.passes / s.n for s in samples]
            continue
        if metric == "maj" and any(s.answers is None for s in samples):
            continue
        for k in ks:
            if k > n:
                raise ValueError(f"{metric}@{k} needs {k} samples per task; a task has {n}")
            if metric == "pass":
                columns[f"pass@{k}"] = [pass_at_k(s.n, s.passes, k) for s in samples]
            elif metric == "best":
                columns[f"best@{k}"] = [best_at_k(s.rewards, k) for s in samples]
            elif metric == "maj":
                columns[f"maj@{k}"] = [maj_at_k(s.answers or [], s.successes, k, seed=seed) for s in samples]
    return columns


def estimates(
    samples: Sequence[TaskSamples], ks: Sequence[int], metrics: Sequence[str], seed: int = 0
) -> dict[str, Estimate]:
    """The figures over ``samples``' tasks: ``success`` with its Wilson interval when every task has
    one sample, else every metric at every k with bootstrap intervals over tasks."""
    if not samples:
        return {}
    tasks = len(samples)
    if all(s.n == 1 for s in samples):
        return {"success": wilson(sum(s.passes for s in samples), tasks)}
    figures = bootstrap_means(_columns(samples, ks, metrics, seed), resamples=RESAMPLES, seed=seed)
    for name, e in figures.items():  # every task 0 (or 1): a bootstrap has no width, Wilson does
        if not name.startswith("best@") and e.low == e.high and e.value in (0.0, 1.0):
            figures[name] = wilson(e.value * tasks, tasks)
    return figures


def _as_dicts(figures: dict[str, Estimate]) -> dict[str, dict[str, Any]]:
    return {name: e.as_dict() for name, e in figures.items()}


def eval_report(
    samples: Sequence[TaskSamples], ks: Sequence[int], metrics: Sequence[str], seed: int = 0
) -> dict[str, Any]:
    """The eval's figures as a summary holds them: ``samples_per_task``, ``tasks``, the method of
    the intervals (``interval``), each estimate under its name (``success`` for one sample per
    task; ``pass@k``, ``avg@n``, ``best@k``, ``maj@k`` for more: value, low, high, n, method), the
    same per task group (``groups``) and each task's samples (``per_task``: what a comparison of two
    evals on the same tasks pairs)."""
    n = min((s.n for s in samples), default=0)  # every task has n records (a failed episode's too)
    groups: dict[str, list[TaskSamples]] = {}
    for s in samples:
        if s.group is not None:
            groups.setdefault(s.group, []).append(s)
    return {
        "samples_per_task": n,
        "tasks": len(samples),
        "interval": WILSON_NOTE if n <= 1 else BOOTSTRAP_NOTE,
        **_as_dicts(estimates(samples, ks, metrics, seed)),
        "groups": {
            name: {"tasks": len(members), **_as_dicts(estimates(members, ks, metrics, seed))}
            for name, members in sorted(groups.items())
        },
        "per_task": [asdict(s) for s in samples],
    }


def _figures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The estimates of a report (or of one of its groups), by name."""
    return {name: e for name, e in report.items() if name == "success" or _METRIC_NAME.match(name)}


_METRIC_NAME = re.compile(r"^(pass|avg|best|maj)@\d+$")


def _shown(name: str, e: dict[str, Any]) -> str:
    """``pass@4 41.0% [33.2, 48.9]``; a reward (best@k) as a number."""
    if name.startswith("best@"):
        return f"{name} {e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"
    return f"{name} {100 * e['value']:.1f}% [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


_EXPLAINED = {
    "pass": "unbiased estimator, Chen et al. 2021",
    "avg": "mean success over the samples",
    "best": "expected best reward of k samples, unbiased",
    "maj": "majority vote of k samples' answers",
}


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as printed lines: for n samples one line per metric (every k) and the method of
    the intervals; then, when the tasks fall in more than one group, a line per group (a
    single-sample eval: its success rate; its headline, :func:`success_line`, carries the overall
    interval)."""
    n, figures = report["samples_per_task"], _figures(report)
    if not figures:
        return []
    lines = []
    if n > 1:
        for metric in METRICS:
            names = [name for name in figures if name.split("@")[0] == metric]
            if names:
                shown = " · ".join(_shown(name, figures[name]) for name in names)
                lines.append(f"{shown} ({_EXPLAINED[metric]})")
        lines.append(f"intervals: {report['interval']}, {report['tasks']} tasks × {n} samples")
    headline = ["success"] if n <= 1 else list(dict.fromkeys(["pass@1", f"pass@{n}", f"maj@{n}"]))
    groups = report["groups"] if len(report["groups"]) > 1 else {}  # one group: the overall figures
    for name, group in groups.items():
        shown = " · ".join(_shown(h, group[h]) for h in headline if h in group)
        lines.append(f"group {name} ({group['tasks']} tasks): {shown}")
    return lines


def success_line(report: dict[str, Any]) -> str:
    """The headline: ``success rate 32.0% [23.7, 41.6] (95% Wilson interval over 100 tasks)``; for
    n samples the mean success over them (avg@n) with its bootstrap interval."""
    n, tasks = report["samples_per_task"], report["tasks"]
    if not tasks:
        return "success rate - (no tasks)"
    e = report.get("success") if n <= 1 else report.get(f"avg@{n}")
    if e is None:  # avg not asked: the plain rate over every sample, no interval
        rate = sum(sum(t["successes"]) for t in report["per_task"]) / sum(
            len(t["successes"]) for t in report["per_task"]
        )
        return f"success rate {rate:.1%} over {tasks} tasks × {n} samples"
    label = "success rate" if n <= 1 else f"success rate (avg@{n})"
    how = "Wilson" if n <= 1 else "bootstrap"
    return (
        f"{label} {100 * e['value']:.1f}% [{100 * e['low']:.1f}, {100 * e['high']:.1f}] "
        f"(95% {how} interval over {e['n']} tasks)"
    )
