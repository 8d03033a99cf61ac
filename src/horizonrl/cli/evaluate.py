"""What `horizon eval` reports beside the episodes: the checks of a sampled eval made before any model
loads (:func:`check_sampled`), its figures with their intervals in the summary and on the terminal
(:func:`sampled_figures`), and the eval of a role graph (:func:`eval_graph`) or a chat chain
(:func:`eval_chain`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from horizonrl.cli.common import console, say
from horizonrl.errors import ConfigError


def check_sampled(config: Any) -> tuple[type, list[str]]:
    """The env's class and the metrics a sampled eval reports (``eval.metrics``, or all the env
    supports); maj@k asked of an env without answers is a ConfigError. A role graph always has its
    final answers; its episodes per task are ``eval.majority_vote`` or ``eval.samples_per_task``."""
    from horizonrl.envs.base import Env
    from horizonrl.envs.registry import get_env_class
    from horizonrl.rollout.eval_k import METRICS, choose_metrics

    ev = config.eval
    if config.multiagent.graph is not None:
        n = ev.samples_per_task
        if n > 1 and ev.majority_vote not in (1, n):
            raise ConfigError(
                f"a role graph runs eval.majority_vote ({ev.majority_vote}) episodes per task, but "
                f"eval.samples_per_task is {n}: set one of them (or both to the same number)"
            )
        return Env, list(METRICS) if ev.metrics is None else [m for m in METRICS if m in ev.metrics]
    env_cls = get_env_class(config.env.name)
    return env_cls, choose_metrics(ev.metrics, env_cls)


def concurrency_note(config: Any) -> str | None:
    """A note when ``eval.concurrency`` keeps a task's samples from running together."""
    ev = config.eval
    if ev.samples_per_task > ev.concurrency:
        return (
            f"note: eval.concurrency {ev.concurrency} < eval.samples_per_task {ev.samples_per_task}: a "
            "task's samples do not all run (and batch) together; raise eval.concurrency to at least that"
        )
    return None


def sampled_figures(
    trajectories: list[Any], tasks: list[Any], config: Any, env_cls: type, metrics: list[str]
) -> dict[str, Any]:
    """The summary's figures of the eval (:func:`horizonrl.rollout.eval_k.eval_report`, with the
    env's name and the temperature), its lines printed."""
    from horizonrl.rollout.eval_k import eval_report, gather, report_lines

    ev = config.eval
    report = eval_report(gather(trajectories, tasks, env_cls), ev.ks(), metrics, seed=ev.seed)
    for line in report_lines(report):
        say(line)
    return {"env": config.env.name, **report, "temperature": ev.temperature}


def eval_graph(config: Any, tasks: list[Any], json_out: Path | None) -> None:
    """`horizon eval` of a role graph: MV@k over whole episodes, accuracy after each phase, and the
    sampled eval's figures over the episodes."""
    from horizonrl.multiagent.run import run_graph_eval
    from horizonrl.rollout.eval_k import report_lines, success_line

    ev = config.eval
    if ev.samples_per_task > 1:  # the episodes per task of a graph
        config = config.model_copy(
            update={"eval": ev.model_copy(update={"majority_vote": ev.samples_per_task})}
        )
        ev = config.eval
    out_dir = config.run_dir / "graph_eval"
    with console.status("loading…") as status:
        done = 0

        def on_done(record: Any) -> None:
            nonlocal done
            done += 1
            status.update(f"eval {config.multiagent.graph} · {done}/{len(tasks) * ev.majority_vote} episodes")

        summary = run_graph_eval(config, tasks, out_dir, status=status.update, on_done=on_done)
    phases = " · ".join(
        f"after {k.removeprefix('accuracy_after_')} {v:.1%}"
        for k, v in summary.items()
        if k.startswith("accuracy_after_")
    )
    verdicts = "".join(
        f" · {k.removeprefix('verdicts_')}: {v} verdicts stated, "
        f"{summary['verdict_accuracy_' + k.removeprefix('verdicts_')]:.1%} right"
        for k, v in summary.items()
        if k.startswith("verdicts_")
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    for line in report_lines(summary):
        say(line)
    say(
        f"{config.multiagent.graph} on {len(tasks)} {ev.split} tasks · MV@{ev.majority_vote} success rate "
        f"{summary['success_rate']:.1%} · per episode {phases}{verdicts} · {success_line(summary)} · "
        f"{summary['wall_s']:.1f} s · records in {out_dir}"
    )


def eval_chain(config: Any, tasks: list[Any], json_out: Path | None, oracle: bool = False) -> None:
    """`horizon eval` of a chat chain: pass@1 (pass@k for several samples per task) with intervals,
    tokens per solved problem, how each phase ended (``oracle``: the canonical-solution script plays
    the team)."""
    from horizonrl.multiagent.team_run import run_chain_eval
    from horizonrl.rollout.eval_k import report_lines, success_line

    ev = config.eval
    out_dir = config.run_dir / "chain_eval"
    total = len(tasks) * ev.samples_per_task
    with console.status("loading…") as status:
        done = 0

        def on_done(record: Any) -> None:
            nonlocal done
            done += 1
            status.update(f"eval {config.multiagent.chain} · {done}/{total} episodes")

        summary = run_chain_eval(config, tasks, out_dir, status=status.update, on_done=on_done, oracle=oracle)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    for line in report_lines(summary):
        say(line)
    phases = " · ".join(f"{name} consensus {p['consensus']:.0%}" for name, p in summary["phases"].items())
    per_solved = summary["tokens_per_solved"]
    say(
        f"{summary['chain']}{' (oracle)' if oracle else ''} on {len(tasks)} {ev.split} tasks · "
        f"{success_line(summary)} · "
        f"{summary['generated_tokens']} tokens ("
        + (f"{per_solved:.0f} per solved problem" if per_solved else "none solved")
        + f") · {phases} · {summary['errors']} errors · {summary['wall_s']:.1f} s · records in {out_dir}"
    )
