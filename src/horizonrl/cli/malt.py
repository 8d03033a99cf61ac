"""``horizon malt``: MALT's tree sampling and role-wise training of a generator -> verifier -> refiner."""

from __future__ import annotations

from typing import Annotated

import typer

from horizonrl.cli.common import MAX_ROUNDS, ConfigArg, OverridesArg, check_range, console, say, user_errors

app = typer.Typer(
    help="MALT: sample generator -> verifier -> refiner trees, then train each role (SFT, then DPO; "
    "or online GRPO on tree advantages).",
    no_args_is_help=True,
)


@app.command("sample")
@user_errors
def sample(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Build the n-ary tree of every training question (n generations, n verifications of each, n
    refinements of each verification), reward the leaves with the task's answer, propagate values,
    threshold them and write per-role SFT sets and sibling DPO pairs to RUN_DIR/malt/."""
    from horizonrl.config import load_config
    from horizonrl.multiagent.run import malt_dir, run_malt_sample

    config = load_config(config_path, overrides)
    mc = config.multiagent.malt
    with console.status("sampling trees…") as status:
        done = 0

        def on_tree(tree: object) -> None:
            nonlocal done
            done += 1
            status.update(f"sampling trees… {done}/{mc.questions} questions")

        report = run_malt_sample(config, status=status.update, on_tree=on_tree)
    pairs = ", ".join(f"{r} {report[f'{r}_pairs']}" for r in ("generator", "verifier", "refiner"))
    say(
        f"{report['questions']} trees, {report['leaves']} leaves ({report['leaf_accuracy']:.1%} correct, "
        f"{report['leaves_per_minute']:.0f} leaves/min) · pairs: {pairs} · "
        f"{report['questions_all_leaves_tied']} questions with every leaf tied · wrote {malt_dir(config)}"
    )


@app.command("train")
@user_errors
def train(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Train each role on what `horizon malt sample` wrote: a LoRA adapter per role, SFT on its positive
    nodes, then DPO (dpo.beta) on its sibling pairs for multiagent.malt.dpo_roles."""
    from horizonrl.config import load_config
    from horizonrl.multiagent.run import run_malt_train

    config = load_config(config_path, overrides)
    with console.status("training…") as status:
        summary = run_malt_train(config, status=status.update)
    overrides_line = []
    for role, entry in summary["roles"].items():
        if "adapter" in entry:
            counts = f"{entry['sft_examples']} SFT examples, {entry['dpo_pairs']} DPO pairs"
            say(f"{role}: {counts} -> {entry['adapter']}")
            overrides_line.append(f"multiagent.adapters.{role}={entry['adapter']}")
        else:
            say(f"{role}: {entry['skipped']}")
    if overrides_line:
        say(f"evaluate: horizon eval {config_path} {' '.join(overrides_line)}")


@app.command("online")
@user_errors
def online(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    rounds: Annotated[int, typer.Option(help="Rounds of tree sampling and updates.")] = 4,
) -> None:
    """The online variant: rounds of tree sampling with the current adapters, each followed by a GRPO
    update of every role where a node's advantage is its tree value minus its siblings' mean (no
    critic); multiagent.malt.questions trees in all, as the offline recipe samples."""
    check_range("--rounds", rounds, 1, MAX_ROUNDS)
    from horizonrl.config import load_config
    from horizonrl.multiagent.online import run_malt_online

    config = load_config(config_path, overrides)
    with console.status("online MALT…") as status:
        summary = run_malt_online(config, rounds, status=status.update)
    for entry in summary["rounds"]:
        say(f"round {entry['round']}: {entry['questions']} trees, leaf accuracy {entry['leaf_accuracy']:.1%}")
    line = " ".join(f"multiagent.adapters.{role}={path}" for role, path in summary["adapters"].items())
    say(f"evaluate: horizon eval {config_path} {line}")
