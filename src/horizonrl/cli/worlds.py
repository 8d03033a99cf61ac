"""``horizon worlds``: list, show, validate, level and generate layered worlds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import MAX_ROUNDS, check_range, console, say, user_errors

app = typer.Typer(
    help="Layered worlds (AutoEnv): list, show, validate, write levels, generate new ones.",
    no_args_is_help=True,
)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A recipe whose roles block serves the explorer / coder role.")
]


@app.command("list")
@user_errors
def list_() -> None:
    """The shipped worlds with their axes (skill, reward, observation) and skins."""
    from horizonrl.worlds.package import open_world, shipped_names

    for name in shipped_names():
        s = open_world(name).summary()
        say(
            f"{s['name']:16} {s['skill']:10} {s['reward']:10} {s['observation']:7} "
            f"obs={s['observation_policy']:13} skins={','.join(s['skins'])}"
        )


@app.command("show")
@user_errors
def show(
    world: Annotated[str, typer.Argument(help="A shipped world's name or a world directory.")],
    skin: Annotated[str | None, typer.Option(help="Render with this skin (default: the world's).")] = None,
    observation: Annotated[str | None, typer.Option(help="full, radius, line_of_sight or mask.")] = None,
    level: Annotated[int, typer.Option(help="Which training level to render.")] = 0,
) -> None:
    """A world's summary, instruction, tools and first observation."""
    from horizonrl.types import Task
    from horizonrl.worlds.env import WorldEnv, WorldOptions
    from horizonrl.worlds.package import open_world

    package = open_world(world)
    say(json.dumps(package.summary()))
    options = WorldOptions(world=world, skin=skin, observation=observation)  # type: ignore[arg-type]

    async def first() -> tuple[Any, Any]:
        env = WorldEnv(options)
        try:
            task = Task(
                id="show", env="world", split="train", data={"world": world, "split": "train", "index": level}
            )
            return await env.reset(task), env.tools
        finally:
            await env.close()

    messages, tools = asyncio.run(first())
    for m in messages:
        say(f"[{m.role}]\n{m.content}")
    say("[tools] " + ", ".join(t.name for t in tools))


def _role_client(config: Path | None, role: str, **embedded: Any) -> Any:
    """The client of ``role``: as the recipe's roles block says (loading the policy when the role's
    backend is ``policy``), or the embedded model in this process when no recipe is given
    (``embedded``: that role config's other fields, e.g. max_tokens)."""
    from horizonrl.roles import Roles
    from horizonrl.roles.config import RoleConfig, RolesConfig

    if config is None:
        roles = RolesConfig(**{role: RoleConfig(backend="local", path="smollm2-135m", **embedded)})
        return Roles(roles).get(role)
    from horizonrl.config import load_config

    cfg = load_config(config, [])
    engine = tokenizer = None
    if cfg.roles.for_role(role).backend == "policy":
        from horizonrl.train.runtime import build_runtime

        runtime = build_runtime(cfg)
        engine, tokenizer = runtime.engine, runtime.tokenizer
    return Roles(cfg.roles, engine, tokenizer).get(role)


@app.command("validate")
@user_errors
def validate(
    world: Annotated[str | None, typer.Argument(help="A shipped world's name or a world directory.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Validate every shipped world.")] = False,
    steps: Annotated[int, typer.Option(help="Random-agent steps of the execution stage.")] = 60,
    react_steps: Annotated[
        int, typer.Option(help="Steps of the ReAct agent (the explorer role; 0 skips it).")
    ] = 6,
    config: ConfigOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the reports as JSON here.")] = None,
) -> None:
    """Three stages per world: execution (random and ReAct agents in a sandbox), levels (regenerated,
    solved, replayed), reliability (planner ≥ random on every level). Ends with valid=N/M; exits 1
    when any world fails."""
    check_range("--steps", steps, 1, MAX_ROUNDS)
    check_range("--react-steps", react_steps, 0, MAX_ROUNDS)
    from horizonrl.errors import ConfigError
    from horizonrl.worlds.package import open_world, shipped_names
    from horizonrl.worlds.validate import validate_world

    if all_ == (world is not None):
        raise ConfigError("give one WORLD or --all (e.g. horizon worlds validate maze)")
    names = shipped_names() if all_ else [str(world)]
    packages = [open_world(n) for n in names]
    client = _role_client(config, "explorer", max_tokens=96) if react_steps > 0 else None
    reports = []
    for package in packages:
        with console.status(f"validating {package.name}…"):
            report = asyncio.run(validate_world(package, steps=steps, react=client, react_steps=react_steps))
        reports.append(report)
        rel = report.reliability.figures
        verdict = "valid" if report.valid else f"INVALID ({report.first_problem()})"
        say(
            f"{package.name:16} {verdict}  planner={rel.get('planner', 0):.2f} "
            f"random={rel.get('random', 0):.2f} eps_planner={rel.get('epsilon_planner', 0):.2f}"
        )
    if out is not None:
        out.write_text(json.dumps([r.to_dict() for r in reports], indent=1), encoding="utf-8")
    valid = sum(r.valid for r in reports)
    say(f"valid={valid}/{len(reports)}")
    if valid < len(reports):
        raise typer.Exit(1)


@app.command("levels")
@user_errors
def levels(
    world: Annotated[str, typer.Argument(help="A world directory (or a shipped world's name).")],
) -> None:
    """(Re)write a world's levels: draw each split's levels from the generator and solve each."""
    from horizonrl.worlds.levels import make_levels
    from horizonrl.worlds.package import open_world
    from horizonrl.worlds.runner import make_runner

    package = open_world(world)

    async def go() -> dict[str, Any]:
        runner = make_runner(package)
        try:
            return await make_levels(package, runner)
        finally:
            await runner.aclose()

    made = asyncio.run(go())
    for split, records in made.items():
        package.write_levels(split, records)
        say(f"{split}: {len(records)} levels, max rewards {[r.max_reward for r in records]}")


@app.command("new")
@user_errors
def new(
    themes: Annotated[list[str], typer.Argument(help="One or more themes, e.g. 'a lighthouse keeper'.")],
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option(help="Where candidates are written.")] = Path("runs/worlds_new"),
    repairs: Annotated[int, typer.Option(help="Self-repair rounds per theme (all stages together).")] = 3,
) -> None:
    """Generate worlds with the coder role: theme → description → DSL → code → self-repair → levels
    → validation, all generated code inside sandboxes. Prints the funnel."""
    check_range("--repairs", repairs, 0, 100)
    from horizonrl.worlds.generate import funnel, generate_world

    coder = _role_client(config, "coder")
    out.mkdir(parents=True, exist_ok=True)
    candidates = []
    for theme in themes:
        with console.status(f"generating {theme!r}…"):
            cand = asyncio.run(generate_world(theme, coder, out, max_repairs=repairs))
        candidates.append(cand)
        why = f" ({cand.problems[-1][:120]})" if cand.problems and cand.reached != "reliable" else ""
        say(f"{cand.slug:24} reached={cand.reached} repairs={cand.repairs}{why}")
    counts = funnel(candidates)
    (out / "funnel.json").write_text(json.dumps(counts), encoding="utf-8")
    say(" ".join(f"{k}={v}" for k, v in counts.items()))
