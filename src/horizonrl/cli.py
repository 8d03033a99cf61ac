"""The ``horizon`` command line.

User mistakes (a config typo, a wrong model path, an unknown env, a bad task line) print one clear
line and exit with status 2; no traceback wall.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from horizonrl.errors import ConfigError, HorizonError, file_error

app = typer.Typer(
    name="horizon",
    help="HorizonRL: train multi-turn, tool-using LLM agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="YAML recipe, e.g. configs/calc.yaml.")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides as key.sub=value, e.g. agent.max_turns=6.", show_default=False),
]

CheckpointOpt = Annotated[
    Path | None,
    typer.Option(
        help="The policy to load: a run directory (its policy/), a checkpoints/step_N directory, a "
        "policy or PEFT adapter directory, or a model directory.",
    ),
]


def report(label: str, style: str, message: object) -> None:
    """One line on stderr: a styled label, then ``message`` as plain text (user text such as a path
    or a YAML snippet is never read as rich markup, and the line is not wrapped)."""
    err_console.print(Text.assemble((label, style), " ", str(message)), soft_wrap=True, highlight=False)


def say(text: str) -> None:
    """A line on stdout that holds user text (paths, names): printed as is, never read as markup."""
    console.print(text, markup=False)


#: OS errors about a file the user named; outside a reader that names the file's role, the CLI still
#: turns them into one line
_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _user_error(exc: BaseException) -> HorizonError | None:
    if isinstance(exc, HorizonError):
        return exc
    if isinstance(exc, _FILE_ERRORS) and exc.filename:
        return file_error(exc.filename, "file", exc)
    if isinstance(exc, UnicodeDecodeError):
        return HorizonError(f"an input file is not UTF-8 text ({exc.reason}); save it as UTF-8")
    return None


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print user errors (HorizonError, and a named file that cannot be read) as one line on stderr
    and exit 2; Ctrl-C exits 130 quietly."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (HorizonError, *_FILE_ERRORS, UnicodeDecodeError) as exc:
            error = _user_error(exc)
            if error is None:
                raise
            report("error:", "bold red", error)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            report("interrupted:", "yellow", "records written so far are complete")
            raise typer.Exit(130) from None

    return wrapper


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output file that could not be written, before any model loads."""
    if path.is_dir():
        raise ConfigError(
            f"{option} {str(path)!r} is a directory; give a file path, e.g. {path / 'out.jsonl'}"
        )
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: {str(folder)!r} is a file, not a directory")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{option} {str(path)!r} cannot be written (permission denied); give another path")


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port} is out of range; valid ports: 1-65535")


def _flags_show_no_type() -> None:
    """typer (0.29) labels every flag in --help ``<bool>``, as if it took a value; show flags bare."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flag_aware", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flag_aware = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("success {task.fields[success]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    )


def _training_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    )


def _run_episodes(
    config: Any,
    tasks: list[Any],
    samples: int,
    concurrency: int,
    sampling: Any,
    checkpoint: Path | None,
    out: Path | None,
    label: str,
) -> tuple[list[Any], float, dict]:
    """Load the policy, run the episodes with a progress bar, stream records to ``out``."""
    from horizonrl.build import build_runtime, env_factory
    from horizonrl.rollout.runner import run_rollouts

    with console.status("loading model…"):
        runtime = build_runtime(config, checkpoint=checkpoint)
    sink = None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        sink = out.open("w", encoding="utf-8")
    solved = 0

    with _progress() as progress:
        bar = progress.add_task(label, total=len(tasks) * samples, success="0/0", status="")

        def on_trajectory(traj: Any) -> None:
            nonlocal solved
            solved += traj.success
            if sink is not None:
                sink.write(traj.to_json() + "\n")
                sink.flush()
            done = progress.tasks[bar].completed + 1
            progress.update(bar, advance=1, success=f"{solved}/{int(done)}")

        start = time.perf_counter()
        try:
            trajectories = asyncio.run(
                run_rollouts(
                    runtime.agent,
                    env_factory(config),
                    tasks,
                    samples,
                    concurrency,
                    sampling=sampling,
                    on_trajectory=on_trajectory,
                    mode=config.rollout.mode,
                    limits=config.rollout.limits(concurrency),
                    on_status=lambda status: progress.update(bar, status=str(status)),
                )
            )
        finally:
            if sink is not None:
                sink.close()
        elapsed = time.perf_counter() - start
    return trajectories, elapsed, runtime.engine.stats


@app.command()
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
    from horizonrl.build import make_tasks
    from horizonrl.config import load_config
    from horizonrl.report import results_table, transcript

    config = load_config(config_path, overrides)
    num = n if n is not None else config.rollout.num_tasks
    if num < 1:
        raise HorizonError(f"--n must be at least 1, got {num}")
    out = out if out is not None else config.run_dir / "rollouts.jsonl"
    check_output_file(out, "--out")
    tasks = make_tasks(config, config.rollout.split, num, config.rollout.seed)
    trajectories, elapsed, stats = _run_episodes(
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


@app.command("eval")
@user_errors
def eval_(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    checkpoint: CheckpointOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the eval trajectories here (JSONL).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the summary figures here.")] = None,
) -> None:
    """Success rate on the held-out split (fixed seed), with failure-mode counts."""
    from horizonrl.build import make_tasks
    from horizonrl.config import load_config
    from horizonrl.report import results_table
    from horizonrl.rollout.stats import summarize

    config = load_config(config_path, overrides)
    ev = config.eval
    out = out if out is not None else config.run_dir / "eval.jsonl"
    check_output_file(out, "--out")
    if json_out is not None:
        check_output_file(json_out, "--json")
    tasks = make_tasks(config, ev.split, ev.num_tasks, ev.seed)
    sampling = config.sampling.model_copy(update={"temperature": ev.temperature})
    trajectories, elapsed, stats = _run_episodes(
        config, tasks, 1, ev.concurrency, sampling, checkpoint, out, f"eval {config.env.name}/{ev.split}"
    )
    console.print(
        results_table(trajectories, escape(f"held-out eval · {len(tasks)} {ev.split} tasks · seed {ev.seed}"))
    )
    summary = summarize(trajectories) | {
        "wall_s": elapsed,
        "generated_tokens": stats.get("generated_tokens", 0),
    }
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
    say(f"success rate {summary['success_rate']:.1%} · {elapsed:.1f} s · records in {out}")


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
        self.progress.console.print(text, highlight=False, markup=False)


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


@app.command()
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
    from horizonrl.train.run import TrainingRun

    config = load_config(config_path, overrides)
    progress = _training_progress()
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


@app.command()
@user_errors
def compare(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    algorithms: Annotated[
        str,
        typer.Option(help="Comma-separated train.algorithm presets to run side by side."),
    ] = "grpo,dr_grpo,rloo,ppo",
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Rerun finished runs too (default: reuse them).")
    ] = False,
) -> None:
    """Run RL algorithms side by side from one starting policy on the same budget; table and plot."""
    from rich.table import Table

    from horizonrl.train.compare import compare as run_compare
    from horizonrl.train.compare import parse_algorithms

    names = parse_algorithms(algorithms)
    progress = _training_progress()

    def reporter(label: str, cfg: Any) -> _RichReporter:
        console.print(Text.assemble((label, "bold"), f": {cfg.run_dir}"))
        return _RichReporter(progress, cfg.train.steps)

    with progress:
        rows = run_compare(config_path, overrides or [], names, reporter, fresh=fresh)
    table = Table(title="algorithms side by side (held-out success)")
    for column in ("algorithm", "start", "final", "gain", "wall (s)"):
        table.add_column(column)
    for r in rows:
        gain = "–" if r["gain"] is None else f"{100 * r['gain']:+.0f} points"
        final = "–" if r["final_success"] is None else f"{r['final_success']:.0%}"
        start = "–" if r["start_success"] is None else f"{r['start_success']:.0%}"
        table.add_row(r["algorithm"], start, final, gain, f"{r['wall_s']:.0f}")
    console.print(table)
    root = Path(rows[0]["run_dir"]).parent
    say(f"comparison: {root}/comparison.md, comparison.json, comparison.png")


@app.command()
@user_errors
def sft(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Supervised warm start on demonstrations (sft.demos: the env's oracle or a JSONL of trajectories).

    Saves a LoRA adapter (or full weights) to output_dir/name/sft/, loadable with --checkpoint."""
    from horizonrl.build import apply_memory_settings, build_runtime, env_factory
    from horizonrl.config import load_config
    from horizonrl.models import load_base, make_trainable
    from horizonrl.policy import write_policy
    from horizonrl.tokens import pad_token_id
    from horizonrl.train.sft import gather_demos, read_demos, train_sft

    config = load_config(config_path, overrides)
    apply_memory_settings(config)
    cfg = config.sft
    if cfg.demos == "oracle":
        with console.status("generating oracle demonstrations…"):
            demos = gather_demos(config, build_runtime(config).agent, env_factory(config))
    else:
        demos = read_demos(cfg.demos, cfg.only_successful, cfg.num_demos)
    loaded = load_base(config.model)
    model, tokenizer = make_trainable(loaded.base, config.model), loaded.tokenizer
    pad = pad_token_id(tokenizer)
    steps = -(-len(demos) // cfg.batch_size) * cfg.epochs
    with _progress() as progress:
        bar = progress.add_task("sft", total=steps, success="-", status="")
        history = train_sft(
            model,
            demos,
            cfg,
            int(pad),
            seed=config.seed,
            autocast_dtype=config.train.autocast_dtype,
            on_step=lambda step, total, stats: progress.update(
                bar, advance=1, success=f"loss {stats['loss']:.3f}"
            ),
        )
    out = config.run_dir / "sft"
    if out.exists():
        shutil.rmtree(out)
    write_policy(
        out, model=model, tokenizer=tokenizer, base=loaded.identity, name="sft", description="horizon sft"
    )
    say(
        f"SFT on {len(demos)} demonstrations, {len(history)} steps, loss {history[0]['loss']:.3f} → "
        f"{history[-1]['loss']:.3f}; saved to {out} (evaluate: horizon eval CONFIG --checkpoint {out})"
    )


@app.command()
@user_errors
def dpo(config_path: ConfigArg, overrides: OverridesArg = None) -> None:
    """Direct preference optimization on chosen/rejected conversation pairs (dpo.pairs, JSONL).

    Saves a LoRA adapter (or full weights) to output_dir/name/dpo_adapter/ (dpo_model/), loadable with
    --checkpoint; per-step metrics go to dpo_metrics.jsonl. Format and keys: docs/dpo.md."""
    from horizonrl.build import apply_memory_settings
    from horizonrl.config import load_config
    from horizonrl.train.dpo import config_pairs, run_dpo

    config = load_config(config_path, overrides)
    apply_memory_settings(config)
    pairs = config_pairs(config)  # data errors before the progress bar
    progress = _training_progress()
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


@app.command()
@user_errors
def envs() -> None:
    """List registered envs and their tools."""
    from rich.table import Table

    from horizonrl.envs.registry import list_envs

    table = Table(title="registered envs", show_lines=True)
    table.add_column("env", style="bold")
    table.add_column("tools")
    table.add_column("options")
    for name, cls in list_envs().items():
        tools = "\n".join(
            f"{t.name}({', '.join(t.parameters.get('properties', {}))}): {t.description}"
            for t in cls(cls.Options()).tools
        )
        options = "\n".join(_option_default(k, f) for k, f in cls.Options.model_fields.items())
        table.add_row(Text(name), Text(tools), Text(options or "-"))
    console.print(table)


def _option_default(key: str, field: Any) -> str:
    """``key = default`` for an env option (a section's defaults as a mapping), or ``key (required)``."""
    if field.is_required():
        return f"{key} (required)"
    default = field.get_default(call_default_factory=True)
    if hasattr(default, "model_dump"):  # a section: its own keys, nested sections folded
        items = default.model_dump(mode="json").items()
        shown = ", ".join(f"{k}: {'{…}' if isinstance(v, dict) else repr(v)}" for k, v in items)
        return f"{key} = {{{shown}}}"
    return f"{key} = {default!r}"


sandbox_app = typer.Typer(
    help="Sandboxes: run a command in one, or serve them over HTTP.", no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("run")
@user_errors
def sandbox_run(
    command: Annotated[
        list[str], typer.Argument(help="The command (after --); one argument is a shell line.")
    ],
    template: Annotated[Path | None, typer.Option(help="Directory that seeds the workspace.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 60.0,
    memory_mib: Annotated[int, typer.Option(help="Memory limit of the sandbox.")] = 1024,
    processes: Annotated[int, typer.Option(help="Process limit of the sandbox.")] = 256,
    diff: Annotated[bool, typer.Option("--diff", help="Print the workspace diff afterwards.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ExecResult as JSON.")] = False,
) -> None:
    """Run one command in a fresh bubblewrap sandbox and print its result (exit status: the command's).

    Example: horizon sandbox run --template . -- 'cat /etc/shadow; ls /root; python3 -m pytest -q'
    """
    import shlex

    from horizonrl.sandbox import SandboxLimits, SandboxSpec
    from horizonrl.sandbox.bwrap import BwrapBackend

    line = command[0] if len(command) == 1 else shlex.join(command)
    spec = SandboxSpec(
        template=str(template) if template else None,
        limits=SandboxLimits(memory_mib=memory_mib, processes=processes),
    )

    async def go() -> tuple[Any, str]:
        backend = BwrapBackend()
        try:
            async with await backend.create(spec) as box:
                result = await box.exec(line, timeout=timeout)
                return result, (await box.diff() if diff else "")
        finally:
            await backend.aclose()

    result, patch = asyncio.run(go())
    if as_json:
        console.print_json(result.model_dump_json())
    else:
        typer.echo(result.stdout, nl=False)
        typer.echo(result.stderr, nl=False, err=True)
        flags = [name for name in ("truncated", "timed_out") if getattr(result, name)]
        err_console.print(
            f"[dim]exit {result.exit_code} · {result.duration * 1000:.0f} ms"
            + "".join(f" · {f}" for f in flags)
            + "[/]",
            highlight=False,
        )
    if patch:
        typer.echo(patch, nl=False)
    raise typer.Exit(result.exit_code if 0 <= result.exit_code < 256 else 1)


@sandbox_app.command("serve")
@user_errors
def sandbox_serve(
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HORIZON_SANDBOX_TOKEN", help="Bearer token clients must send.", show_default=False
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    templates: Annotated[Path | None, typer.Option(help="Directory of named workspace templates.")] = None,
    max_sandboxes: Annotated[int, typer.Option(help="Live sandboxes at once; more get HTTP 429.")] = 256,
    idle_ttl: Annotated[float, typer.Option(help="Seconds before an idle sandbox is reaped.")] = 900.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    max_request_mib: Annotated[int, typer.Option(help="Largest request body; bigger gets HTTP 413.")] = 16,
) -> None:
    """Serve bubblewrap sandboxes over HTTP (FastAPI; OpenAPI spec at /docs and /openapi.json)."""
    from horizonrl.sandbox.server import serve

    check_port(port)
    if not token:
        raise ConfigError("sandbox serve needs a token: --token TOKEN or the HORIZON_SANDBOX_TOKEN variable")
    if templates is not None and not templates.is_dir():
        raise ConfigError(f"--templates {str(templates)!r} is not a directory")
    serve(
        host,
        port,
        token,
        max_sandboxes=max_sandboxes,
        idle_ttl_s=idle_ttl,
        templates_dir=str(templates) if templates else None,
        log_level=log_level,
        max_request_bytes=max_request_mib * 1024 * 1024,
    )


swe_app = typer.Typer(help="SWE tasks: evaluate predictions in sandboxes.", no_args_is_help=True)
app.add_typer(swe_app, name="swe")
tasks_app = typer.Typer(help="Task factories and filters.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@swe_app.command("eval")
@user_errors
def swe_eval(
    predictions: Annotated[
        Path | None, typer.Argument(help="SWE-bench predictions JSONL (instance_id, model_patch).")
    ] = None,
    dataset: Annotated[Path | None, typer.Option(help="SWE dataset directory (default: shipped).")] = None,
    gold: Annotated[bool, typer.Option("--gold", help="Evaluate the dataset's own fixes.")] = False,
    empty: Annotated[bool, typer.Option("--empty", help="Evaluate empty patches.")] = False,
    split: Annotated[str, typer.Option(help="With --gold/--empty: train, test or all.")] = "all",
    workers: Annotated[int, typer.Option(help="Instances evaluated at once.")] = 2,
    out: Annotated[
        Path, typer.Option(help="Per-instance report (JSONL); the summary goes next to it.")
    ] = Path("runs/swe_eval/report.jsonl"),
) -> None:
    """Apply each prediction to a clean copy of its instance and run FAIL_TO_PASS and PASS_TO_PASS.

    Exit status: 0 when instances were evaluated; 1 when every one ended in error; 2 for bad input
    (an empty or missing predictions file, no valid line in it, an empty split, no test venv)."""
    from horizonrl.envs.swe.harness import (
        Prediction,
        check_setup,
        error_lines,
        evaluate_predictions,
        exit_status,
        gold_predictions,
        read_predictions,
        summarize,
        write_report,
    )
    from horizonrl.envs.swe.instances import Dataset

    data = Dataset(dataset) if dataset else Dataset.shipped()
    bad: list[Any] = []
    if gold or empty:
        preds = gold_predictions(data, split)
        if empty:
            preds = [
                Prediction(instance_id=p.instance_id, model_name_or_path="empty", model_patch="")
                for p in preds
            ]
    elif predictions is not None:
        preds, bad = read_predictions(predictions)
    else:
        raise HorizonError("give a predictions file, or --gold / --empty")
    if not preds and not bad:
        raise HorizonError(f"nothing to evaluate: split {split!r} of {data.root} has no instances")
    check_setup(data, preds)
    check_output_file(out, "--out")
    with _progress() as progress:
        bar = progress.add_task("swe eval", total=len(bad) + len(preds), success="0/0", status="")
        progress.update(bar, advance=len(bad), success=f"0/{len(bad)}", status="error" if bad else "")
        resolved = 0

        def on_report(report: Any) -> None:
            nonlocal resolved
            resolved += report.status == "resolved"
            done = progress.tasks[bar].completed + 1
            progress.update(bar, advance=1, success=f"{resolved}/{int(done)}", status=report.status)

        reports = bad + asyncio.run(evaluate_predictions(data, preds, workers, on_report))
    summary = summarize(reports)
    write_report(out, reports, summary)
    for line in error_lines(reports):
        report("error", "yellow", line)
    console.print_json(json.dumps(summary))
    say(f"report: {out} · summary: {out.with_suffix('.summary.json')}")
    code = exit_status(len(preds), reports)
    if code:
        why = "no valid prediction in the file" if code == 2 else "every instance ended in error"
        report("error:", "bold red", f"{why} (exit {code})")
        raise typer.Exit(code)


@tasks_app.command("build")
@user_errors
def tasks_build(
    sources: Annotated[list[str], typer.Argument(help="pypi:NAME[==VERSION] or package directories.")],
    out: Annotated[Path, typer.Option(help="Dataset directory to write or resume.")] = Path(
        "runs/swe_dataset"
    ),
    per_package: Annotated[int, typer.Option(help="Validated instances wanted per package.")] = 60,
    max_candidates: Annotated[int, typer.Option(help="Candidates tried per package at most.")] = 240,
    seed: Annotated[int, typer.Option(help="Seed of the candidate sample.")] = 0,
    workers: Annotated[int, typer.Option(help="Parallel sandboxes (default: cores).")] = 0,
) -> None:
    """Inject bugs into real packages and keep those with failing and passing tests (SWE-smith style)."""
    from horizonrl.tasks.factory import BuildConfig, build_dataset

    config = BuildConfig(
        sources=sources,
        out=out,
        per_package=per_package,
        max_candidates=max_candidates,
        seed=seed,
        **({"workers": workers} if workers else {}),
    )
    with _progress() as progress:
        bar = progress.add_task("tasks build", total=None, success="0/0", status="")
        kept = 0

        def on_outcome(package: str, outcome: Any) -> None:
            nonlocal kept
            kept += outcome.accepted
            done = progress.tasks[bar].completed + 1
            progress.update(
                bar, advance=1, success=f"{kept}/{int(done)}", status=escape(f"{package} {outcome.reason}")
            )

        reports = asyncio.run(build_dataset(config, on_outcome))
    from rich.table import Table

    table = Table(title=escape(f"SWE instances in {out}"))
    for column in ("package", "version", "validated", "tried", "yield", "baseline tests", "note"):
        table.add_column(column)
    for r in reports:
        rate = f"{r.accepted / r.tried:.0%}" if r.tried else "-"
        note = r.error or ", ".join(f"{k}: {v}" for k, v in r.rejected.items())
        cells = (r.name, r.version, str(r.accepted), str(r.tried), rate, str(r.baseline_tests), note)
        table.add_row(*map(Text, cells))
    console.print(table)


@tasks_app.command("filter")
@user_errors
def tasks_filter(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    k: Annotated[int, typer.Option("--k", help="Rollouts per task.")] = 4,
    min_rate: Annotated[float, typer.Option(help="Keep tasks solved at least this often.")] = 0.01,
    max_rate: Annotated[float, typer.Option(help="... and at most this often.")] = 0.99,
    n: Annotated[int | None, typer.Option("--n", help="Tasks to try (default: rollout.num_tasks).")] = None,
    out: Annotated[Path | None, typer.Option(help="Kept tasks (JSONL, for env.tasks_file).")] = None,
    checkpoint: CheckpointOpt = None,
) -> None:
    """Sample K rollouts per task with the config's policy; keep tasks whose success rate is in range."""
    from horizonrl.build import make_tasks
    from horizonrl.config import load_config
    from horizonrl.tasks.filter import filter_by_pass_rate

    if k < 1 or not 0.0 <= min_rate <= max_rate <= 1.0:
        raise HorizonError(
            f"need --k >= 1 and 0 <= --min-rate <= --max-rate <= 1 (got {k}, {min_rate}, {max_rate})"
        )
    config = load_config(config_path, overrides)
    out = out or config.run_dir / "filtered_tasks.jsonl"
    check_output_file(out, "--out")
    tasks = make_tasks(config, config.rollout.split, n or config.rollout.num_tasks, config.rollout.seed)
    trajectories, _, _ = _run_episodes(
        config, tasks, k, config.rollout.concurrency, None, checkpoint, None, f"filter {config.env.name}"
    )
    kept, rates = filter_by_pass_rate(tasks, trajectories, min_rate, max_rate)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(t.model_dump_json() + "\n" for t in kept))
    say(
        f"kept {len(kept)} of {len(tasks)} tasks with a success rate in [{min_rate}, {max_rate}] "
        f"over {k} rollouts each → {out} (use env.tasks_file={out})"
    )
    (out.with_suffix(".rates.json")).write_text(json.dumps(rates, indent=2))


def main() -> None:  # pragma: no cover - console-script shim
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
