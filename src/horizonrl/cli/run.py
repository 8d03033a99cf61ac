"""The commands that run a policy: ``rollout``, ``eval``, ``train``, ``sft``, ``dpo``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress

from horizonrl.cli.common import (
    MAX_TASKS,
    CheckpointOpt,
    ConfigArg,
    OverridesArg,
    check_output_file,
    check_range,
    console,
    episode_progress,
    say,
    training_progress,
    user_errors,
)
from horizonrl.errors import HorizonError


def run_episodes(
    config: Any,
    tasks: list[Any],
    samples: int,
    concurrency: int,
    sampling: Any,
    checkpoint: Path | None,
    out: Path | None,
    label: str,
    scripted: Any = None,
) -> tuple[list[Any], float, dict]:
    """Load the policy, run the episodes with a progress bar, stream records to ``out``; with
    ``scripted`` (an env's oracle) that policy writes the turns instead of the model."""
    from horizonrl.serve.external import episode_agent
    from horizonrl.train.runtime import build_runtime
    from horizonrl.train.sampler import sample_episodes

    with console.status("loading model…"):
        runtime = build_runtime(config, checkpoint=checkpoint)
    workdir = config.run_dir / "external"
    player = episode_agent(config, runtime.engine, runtime.tokenizer, runtime.agent, workdir)

    with episode_progress() as progress:
        bar = progress.add_task(label, total=len(tasks) * samples, success="0/0", status="")
        start = time.perf_counter()
        trajectories = sample_episodes(
            player,
            runtime.backend.env_factory(),
            tasks,
            samples,
            concurrency,
            sampling=sampling,
            mode=config.rollout.mode,
            limits=config.rollout.limits(concurrency),
            out=out,
            on_done=lambda solved, done: progress.update(bar, advance=1, success=f"{solved}/{done}"),
            on_status=lambda status: progress.update(bar, status=status),
            policy=scripted,
        )
        elapsed = time.perf_counter() - start
        stats = runtime.engine.stats
        runtime.close()
    return trajectories, elapsed, stats


@user_errors
def rollout(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    n: Annotated[
        int | None, typer.Option("--n", help="Number of tasks (default: rollout.num_tasks).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write trajectory records here (JSONL).")] = None,
    show: Annotated[int, typer.Option(help="Print this many transcripts.")] = 2,
    checkpoint: CheckpointOpt = None,
) -> None:
    """Sample trajectories on the config's env; print transcripts, success rate and failure modes."""
    if n is not None:
        check_range("--n", n, 1, MAX_TASKS)
    check_range("--show", show, 0)
    from horizonrl.config import load_config
    from horizonrl.envs.factory import make_tasks
    from horizonrl.report import results_table, transcript

    config = load_config(config_path, overrides)
    num = n if n is not None else config.rollout.num_tasks
    out = out if out is not None else config.run_dir / "rollouts.jsonl"
    check_output_file(out, "--out")
    tasks = make_tasks(config.env, config.rollout.split, num, config.rollout.seed)
    trajectories, elapsed, stats = run_episodes(
        config,
        tasks,
        config.rollout.samples_per_task,
        config.rollout.concurrency,
        None,
        checkpoint,
        out,
        f"rollout {config.env.name}",
    )
    for traj in trajectories[:show]:
        console.print(transcript(traj))
    title = f"{config.env.name} · {config.rollout.split} split · {config.model.path}"
    console.print(results_table(trajectories, escape(title)))
    tokens = stats.get("generated_tokens", 0)
    say(
        f"wrote {len(trajectories)} records to {out} · {elapsed:.1f} s · "
        f"{tokens / max(elapsed, 1e-9):.0f} generated tokens/s"
    )


@user_errors
def eval_(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    checkpoint: CheckpointOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the eval trajectories here (JSONL).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the summary figures here.")] = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="Who plays: 'model' (the config's model or --checkpoint) or 'oracle' (the env's "
            "scripted oracle through the same agent loop: a check of the env's tasks and rewards).",
        ),
    ] = "model",
) -> None:
    """Success rate on the held-out split (fixed seed), with failure-mode counts.

    A suite file (top-level suite:, a list of recipes) evaluates the policy on each and writes one table."""
    from horizonrl.config.suite import is_suite

    if is_suite(config_path):
        from horizonrl.cli.suite import eval_suite

        return eval_suite(config_path, overrides, checkpoint, out, json_out, policy, evaluate=eval_)
    from horizonrl.cli.evaluate import (
        check_sampled,
        concurrency_note,
        eval_chain,
        eval_graph,
        sampled_figures,
    )
    from horizonrl.config import load_config
    from horizonrl.envs.factory import eval_tasks, oracle_policy
    from horizonrl.report import results_table
    from horizonrl.rollout.eval_k import success_line
    from horizonrl.rollout.stats import summarize

    config = load_config(config_path, overrides)
    ev = config.eval
    env_cls, metrics = check_sampled(config)  # maj@k of an env without answers: before anything loads
    out = out if out is not None else config.run_dir / "eval.jsonl"
    check_output_file(out, "--out")
    if json_out is not None:
        check_output_file(json_out, "--json")
    if policy not in ("model", "oracle"):
        raise HorizonError(f"--policy {policy!r}: expected 'model' or 'oracle'")
    if policy == "oracle" and checkpoint is not None:
        raise HorizonError("--policy oracle plays the env's scripted oracle; drop --checkpoint")
    scripted = oracle_policy(config.env) if policy == "oracle" else None
    tasks = eval_tasks(config.env, ev.split, ev.num_tasks, ev.seed, ev.tasks)
    if config.multiagent.graph is not None:
        if scripted is not None or checkpoint is not None:
            raise HorizonError(
                "a role graph (multiagent.graph) plays with multiagent.adapters, one per role; drop "
                "--policy oracle / --checkpoint"
            )
        eval_graph(config, tasks, json_out)
        return
    if config.multiagent.chain is not None:
        if checkpoint is not None:
            raise HorizonError(
                "a chat chain (multiagent.chain) plays with multiagent.adapters, one per role; "
                "drop --checkpoint"
            )
        eval_chain(config, tasks, json_out, oracle=scripted is not None)
        return
    if (note := concurrency_note(config)) is not None:
        say(note)
    sampling = config.sampling.model_copy(update={"temperature": ev.temperature})
    n = ev.samples_per_task
    trajectories, elapsed, stats = run_episodes(
        config,
        tasks,
        n,
        ev.concurrency,
        sampling,
        checkpoint,
        out,
        f"eval {config.env.name}/{ev.split}" + (" · oracle" if scripted else ""),
        scripted=scripted,
    )
    sampled = f" · {n} samples each at temperature {ev.temperature:g}" if n > 1 else ""
    title = f"held-out eval · {len(tasks)} {ev.split} tasks · seed {ev.seed}{sampled}"
    console.print(results_table(trajectories, escape(title)))
    summary = summarize(trajectories) | {
        "wall_s": elapsed,
        "generated_tokens": stats.get("generated_tokens", 0),
    }
    summary |= sampled_figures(list(trajectories), tasks, config, env_cls, metrics)
    if config.env.name == "world":
        from horizonrl.worlds.report import breakdown_lines, world_breakdown

        summary["worlds"] = world_breakdown(trajectories, tasks)
        for line in breakdown_lines(summary["worlds"]):
            say(line)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    say(f"{success_line(summary)} · {elapsed:.1f} s · records in {out}")


class _RichReporter:
    """Draws a training run: one bar for the steps (reward, success, loss) and one for the stage."""

    def __init__(self, progress: Progress, total_steps: int) -> None:
        self.progress = progress
        self.overall = progress.add_task("train", total=max(total_steps, 1), info="")
        self.current = progress.add_task("", total=None, info="")
        self.done = 0
        self.info = ""

    def stage(self, name: str, total: int | None = None) -> None:
        self.done = 0
        self.info = ""
        self.progress.reset(self.current, total=total, description=name, info="")

    def status(self, text: str) -> None:
        self.progress.update(self.current, info=f"{self.info} · {text}" if self.info else text)

    def advance(self, **fields: Any) -> None:
        if "step" in fields:
            reward, success, loss = fields["reward"], fields["success"], fields["loss"]
            info = f"reward {reward:.2f} · success {success:.0%} · loss {loss:+.4f}"
            self.progress.update(self.overall, completed=fields["step"], info=info)
            return
        self.done += 1
        self.info = ""
        if "success" in fields:
            self.info = f"success {fields['success']}/{self.done}"
        elif "loss" in fields:
            self.info = f"loss {fields['loss']:.3f}"
        self.progress.update(self.current, advance=1, info=self.info)

    def message(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, markup=False, soft_wrap=True)


def _summary_table(summary: dict[str, Any]) -> Any:
    from rich.table import Table

    def pct(value: Any) -> str:
        return "-" if value is None else f"{value:.1%}"

    table = Table(
        title=escape(
            f"held-out success · {summary['eval_tasks']} {summary['env']} tasks · {summary['model']}"
        )
    )
    table.add_column("policy")
    table.add_column("success", justify="right")
    table.add_row("base model", pct(summary["base_success"]))
    table.add_row("RL start (after SFT)" if summary.get("sft") else "RL start", pct(summary["start_success"]))
    table.add_row(f"after RL ({summary['steps']} steps)", pct(summary["final_success"]))
    gain = summary.get("gain_over_start")
    table.add_row("gain over RL start", "-" if gain is None else f"{gain * 100:+.1f} points")
    table.add_row("wall time", f"{summary['wall_s']:.0f} s")
    table.add_row("peak resident memory", f"{summary['peak_rss_gib']:.2f} GiB")
    return table


@user_errors
def train(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in output_dir/name from its latest checkpoint.")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Start afresh: once the config, model and env have loaded, move an existing "
            "output_dir/name to output_dir/.trash (the 3 most recently moved runs are kept there).",
        ),
    ] = False,
    start_from: Annotated[
        Path | None,
        typer.Option(
            "--start-from",
            help="Reuse another run's starting point (base eval, SFT, start eval; its step-0 "
            "checkpoint) and only run RL: for comparing RL settings from the same policy.",
        ),
    ] = None,
) -> None:
    """Train the policy with RL (after an optional SFT warm start); evals, checkpoints, metrics, curves.

    The algorithm is train.algorithm (grpo, dr_grpo, dapo, rloo, reinforce_pp, ppo, gspo, ...)."""
    from horizonrl.config import load_config

    run_training(load_config(config_path, overrides), resume, overwrite, start_from)


def run_training(
    config: Any, resume: bool = False, overwrite: bool = False, start_from: Path | None = None
) -> None:
    """A training run with the live progress display, then its summary table and stage times."""
    from horizonrl.train.run import TrainingRun

    progress = training_progress()
    with progress:
        reporter = _RichReporter(progress, config.train.steps)
        summary = TrainingRun(
            config, reporter, resume=resume, overwrite=overwrite, start_from=start_from
        ).run()
    console.print(_summary_table(summary))
    stages = summary.get("wall_s_by_stage") or {}
    if stages:
        console.print(
            "time by stage: " + " · ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in stages.items())
        )
    say(f"run directory: {config.run_dir} (metrics.jsonl, tb/, curves.png, checkpoints/, summary.json)")


@user_errors
def sft(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Supervised warm start on demonstrations (sft.demos: the env's oracle or a JSONL of trajectories).

    Saves a LoRA adapter (or full weights) to output_dir/name/sft/, loadable with --checkpoint."""
    from horizonrl.config import load_config
    from horizonrl.engine.factory import apply_memory_settings
    from horizonrl.envs.factory import env_factory
    from horizonrl.models import load_base
    from horizonrl.policy import write_policy_atomic
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.run_lock import hold_run_dir
    from horizonrl.train.runtime import build_runtime
    from horizonrl.train.sft import gather_demos, read_demos, sft_stage, sft_steps

    config = load_config(config_path, overrides)
    with hold_run_dir(config.run_dir):  # one writer: refused before anything loads
        apply_memory_settings(config.engine)
        cfg = config.sft
        if cfg.demos == "oracle":
            with console.status("generating oracle demonstrations…"):
                demos = gather_demos(config, build_runtime(config).agent, env_factory(config.env))
        else:
            demos = read_demos(cfg.demos, cfg.only_successful, cfg.num_demos)
        loaded = load_base(config.model)
        tokenizer = loaded.tokenizer
        pad = pad_token_id(tokenizer)
        with episode_progress() as progress:
            bar = progress.add_task("sft", total=sft_steps(len(demos), cfg), success="-", status="")
            model, history = sft_stage(
                loaded.base,
                config.model,
                demos,
                cfg,
                int(pad),
                seed=config.seed,  # no init_seed: the adapters initialise from torch's RNG as it stands
                autocast_dtype=config.train.autocast_dtype,
                on_step=lambda step, total, stats: progress.update(
                    bar, advance=1, success=f"loss {stats['loss']:.3f}"
                ),
            )
        out = config.run_dir / "sft"
        write_policy_atomic(
            out, model=model, tokenizer=tokenizer, base=loaded.identity, name="sft", description="horizon sft"
        )
        say(
            f"SFT on {len(demos)} demonstrations, {len(history)} steps, loss {history[0]['loss']:.3f} → "
            f"{history[-1]['loss']:.3f}; saved to {out} (evaluate: horizon eval CONFIG --checkpoint {out})"
        )


@user_errors
def dpo(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Direct preference optimization on chosen/rejected conversation pairs (dpo.pairs, JSONL).

    Saves a LoRA adapter (or full weights) to output_dir/name/dpo_adapter/ (dpo_model/), loadable with
    --checkpoint; per-step metrics go to dpo_metrics.jsonl. Format and keys: docs/dpo.md."""
    from horizonrl.config import load_config
    from horizonrl.engine.factory import apply_memory_settings
    from horizonrl.train.dpo import config_pairs, run_dpo

    config = load_config(config_path, overrides)
    apply_memory_settings(config.engine)
    pairs = config_pairs(config)  # data errors before the progress bar
    progress = training_progress()
    with progress:
        bar = progress.add_task("dpo", total=None, info="")

        def on_step(step: int, total: int, stats: dict[str, float]) -> None:
            info = f"loss {stats['loss']:.3f} · reward accuracy {stats['reward_accuracy']:.0%}"
            progress.update(bar, total=total, completed=step, description="dpo", info=info)

        summary = run_dpo(config, on_step, lambda text: progress.update(bar, description=text), pairs)
    before, after = summary["before"], summary["after"]
    say(
        f"DPO on {summary['pairs']} pairs, {summary['steps']} steps ({summary['epochs']} epochs, "
        f"beta {summary['beta']}): loss {summary['first_loss']:.3f} → {summary['final_loss']:.3f} · "
        f"{summary['train_s']:.0f} s\n"
        f"on the training pairs: reward accuracy {before['reward_accuracy']:.0%} → "
        f"{after['reward_accuracy']:.0%}, reward margin {before['reward_margin']:+.3f} → "
        f"{after['reward_margin']:+.3f}, chosen more likely than rejected {before['prefers_chosen']:.0%} → "
        f"{after['prefers_chosen']:.0%}\n"
        f"saved to {summary['saved']} (evaluate: horizon eval CONFIG --checkpoint {summary['saved']}); "
        f"metrics: {summary['metrics']}"
    )
