"""``horizon team``: training a chat chain's roles (``multiagent.chain``); `horizon eval` evaluates it."""

from __future__ import annotations

import typer

from horizonrl.cli.common import ConfigArg, OverridesArg, console, say, user_errors
from horizonrl.errors import ConfigError

app = typer.Typer(help="A chat chain's team: per-role training.", no_args_is_help=True)


@app.command("sft")
@user_errors
def sft(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Per-role SFT from oracle-derived demonstrations: the canonical-solution script plays the chain
    on sft.num_demos problems of sft.split; each role that acted gets its own LoRA adapter trained
    on its steps of the solved episodes (RUN_DIR/team/adapters/<role>/)."""
    from horizonrl.config import load_config
    from horizonrl.multiagent.team_train import run_team_sft, team_dir

    config = load_config(config_path, overrides)
    if config.multiagent.chain is None:
        raise ConfigError(
            "multiagent.chain is not set: name the chain to train, e.g. multiagent.chain=software_company"
        )
    with console.status("training…") as status:
        summary = run_team_sft(config, status=status.update)
    say(
        f"scripted team: {summary['solved_by_script']}/{summary['problems']} {config.sft.split} problems "
        f"solved in {summary['demos_s']:.1f} s · wrote {team_dir(config)}"
    )
    line = []
    for role, entry in summary["roles"].items():
        say(
            f"{role}: {entry['demos']} demonstrations, {entry['tokens_trained']} tokens, NLL "
            f"{entry['first_nll']:.3f} -> {entry['final_nll']:.3f} in {entry['train_s']:.0f} s"
            f" -> {entry['adapter']}"
        )
        line.append(f"multiagent.adapters.{role}={entry['adapter']}")
    if line:
        say(f"evaluate: horizon eval {config_path} {' '.join(line)}")


@app.command("rl")
@user_errors
def rl(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """RL of the team on its outcome reward: each step plays the chain train.group_size times on each
    of train.tasks_per_step problems of rollout.split; every role is updated on its own turns with
    its group-relative credit (the team's outcome less the MAST failures blamed on it, from
    train.failure_penalties), starting from multiagent.adapters.<role> or the base
    (RUN_DIR/team/rl_adapters/<role>/)."""
    from horizonrl.config import load_config
    from horizonrl.multiagent.team_rl import check_team_rl, run_team_rl

    config = load_config(config_path, overrides)
    check_team_rl(config)
    with console.status("training…") as status:
        summary = run_team_rl(config, status=status.update)
    for entry in summary["steps"]:
        roles = " · ".join(_role_figures(role, info) for role, info in entry["roles"].items())
        say(
            f"step {entry['step']}: solved {entry['solved']}/{entry['episodes']} · {entry['tokens']} "
            f"tokens · {entry['rollout_s']:.0f} s rollouts, {entry['update_s']:.0f} s updates · "
            f"role rewards: {roles}"
        )
    line = [f"multiagent.adapters.{role}={folder}" for role, folder in summary["adapters"].items()]
    if line:
        say(f"evaluate: horizon eval {config_path} {' '.join(line)}")
    else:
        say("no role had a signal to learn from: every problem's episodes scored the same")


def _role_figures(role: str, info: dict) -> str:
    """``cto -0.25 (blamed 1.2×3)``; ``[flat]`` when the role's groups gave no signal."""
    blamed = ", ".join(f"{m}×{n}" for m, n in sorted(info["blamed"].items()))
    return (
        f"{role} {info['reward_mean']:+.2f}"
        + (f" (blamed {blamed})" if blamed else "")
        + ("" if info["with_signal"] else " [flat]")
    )
