"""Human-readable views of trajectories: transcripts and result tables (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from horizonrl.rollout.stats import failure_counts, summarize
from horizonrl.train.eval_records import success_estimate, task_outcomes
from horizonrl.types import Trajectory

_ROLE_STYLE = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}


def transcript(traj: Trajectory, show_system: bool = False, max_chars: int = 1200) -> Panel:
    """One trajectory as a panel: each message with its role, then the outcome."""
    parts: list[Text] = []
    for msg in traj.messages:
        if msg.role == "system" and not show_system:
            continue
        content = msg.content if len(msg.content) <= max_chars else msg.content[:max_chars] + " …"
        label = msg.role if msg.role != "tool" else f"tool:{msg.name or ''}"
        line = Text(f"{label:>10} │ ", style=f"bold {_ROLE_STYLE.get(msg.role, '')}")
        line.append(content)
        parts.append(line)
    outcome = "✔ solved" if traj.success else "✘ not solved"
    footer = Text(
        f"{outcome} · reward {traj.reward:g} · finish={traj.finish} · {traj.num_turns} turns · "
        f"{int(traj.metrics.get('model_tokens', 0))} model tokens",
        style="bold green" if traj.success else "bold red",
    )
    if traj.error:
        footer.append(f"\n{traj.error.strip().splitlines()[-1]}", style="red")
    return Panel(Group(*parts, footer), title=Text(traj.id), title_align="left")  # an id is text, not markup


def results_table(trajectories: Sequence[Trajectory], title: str) -> Table:
    """Success rate, reward, turns and failure-mode counts of a batch."""
    stats = summarize(trajectories)
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    n = len(trajectories)
    table.add_row("trajectories", str(n))
    if n:  # with its 95% interval over tasks (Wilson for one sample per task, else a bootstrap)
        rate = success_estimate(task_outcomes(trajectories))
        table.add_row("success rate", f"{rate} ({rate.method}, {rate.n} tasks)")
    else:
        table.add_row("success rate", f"{stats['success_rate']:.1%}")
    table.add_row("mean reward", f"{stats['reward_mean']:.3f}")
    if n:
        table.add_row("mean turns", f"{stats['turns_mean']:.2f}")
        table.add_row("mean model tokens", f"{stats['model_tokens_mean']:.1f}")
    for reason, count in failure_counts(trajectories).items():
        table.add_row(f"finish: {reason}", str(count))
    return table
