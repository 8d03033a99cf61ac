"""LLM-driven world generation with the coder role, every line of generated code run only inside
bubblewrap sandboxes.

theme → description → DSL (``world.yaml``) → code (``world.py``: the dynamics, the generator and the
planner) → self-repair (a YAML or schema error, a syntax error or an exception from a trial run
inside the sandbox goes back to the coder, within a bounded budget) → levels (generated and solved in
the sandbox) → validation (:mod:`.validate`) → archive. Every candidate is kept with a
``generated.json`` that records its stages, so a failed one can be read; a valid one is a world
package like the shipped ones (its code still runs only sandboxed).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from horizonrl.errors import ConfigError, HorizonError
from horizonrl.roles.base import RoleClient
from horizonrl.types import Message
from horizonrl.worlds.dsl import WorldSpec, parse_spec
from horizonrl.worlds.levels import make_levels
from horizonrl.worlds.package import WorldPackage, shipped_root
from horizonrl.worlds.runner import SandboxRunner, WorldCodeError
from horizonrl.worlds.validate import validate_world

FUNNEL = ("tried", "described", "dsl_valid", "executable", "levels_valid", "reliable")
"""The generation funnel's stages, in order: each counts the themes that got that far."""

SYSTEM = (
    "You design small, turn-based text worlds for training AI agents, and write them as code. Worlds "
    "are deterministic, have a level generator and an exact solver, and use only the Python standard "
    "library plus the module worldlib."
)


@dataclass
class Candidate:
    theme: str
    slug: str
    stages: dict[str, bool] = field(default_factory=dict)
    repairs: int = 0
    problems: list[str] = field(default_factory=list)
    unparsed_replies: int = 0
    timed_out: int = 0
    path: str = ""

    @property
    def reached(self) -> str:
        last = "tried"
        for stage in FUNNEL[1:]:
            if not self.stages.get(stage):
                break
            last = stage
        return last


def slugify(theme: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", theme.lower()).strip("_")[:32] or "world"
    return slug if slug[0].isalpha() else f"w_{slug}"


def fenced(reply: str, lang: str) -> str | None:
    """The first ```lang fenced block of a reply (or of any fence when no block names ``lang``)."""
    for pattern in (rf"```{lang}[^\n]*\n(.*?)```", r"```[a-zA-Z]*\n(.*?)```"):
        m = re.search(pattern, reply, re.S)
        if m:
            return m.group(1)
    return None


def example_world() -> dict[str, str]:
    """A shipped world shown to the coder: one that implements every method of worldlib.World."""
    root = shipped_root() / "keys_doors"
    return {name: (root / name).read_text(encoding="utf-8") for name in ("world.yaml", "world.py")}


def dsl_prompt(theme: str, description: str, name: str) -> str:
    ex = example_world()["world.yaml"]
    return (
        f"Theme: {theme}\nDescription: {description}\n\nWrite the world's DSL file, world.yaml, in the "
        f"same schema as this example (same sections and keys; `name` must be {name!r}):\n\n```yaml\n{ex}```"
        "\n\nReply with one ```yaml block."
    )


def code_prompt(spec_text: str) -> str:
    ex = example_world()["world.py"]
    return (
        f"The world's DSL:\n```yaml\n{spec_text}```\n\nWrite world.py for it, like this example for another "
        "world. Rules: subclass worldlib.World and bind WORLD; states and levels are JSON values (lists, not "
        "tuples); step(state, action, args) returns Outcome and raises ActionError for bad arguments; "
        "max_reward() solves the level exactly; oracle(state) returns the best next (action, args) from any "
        "state; generate(rng, params) draws a level with rng only; every action of the DSL is handled.\n\n"
        f"```python\n{ex}```\n\nReply with one ```python block."
    )


async def _ask(coder: RoleClient, messages: list[Message]) -> str:
    reply = await coder.chat(messages)
    messages.append(Message(role="assistant", content=reply))
    return reply


async def _until_valid(
    coder: RoleClient, messages: list[Message], lang: str, check: Any, cand: Candidate, budget: int
) -> Any:
    """Ask, check the fenced block, feed the error back; at most ``budget`` repairs in all."""
    while True:
        reply = await _ask(coder, messages)
        block = fenced(reply, lang)
        if block is None:
            cand.unparsed_replies += 1
            error = f"no ```{lang} block in the reply"
        else:
            try:
                return await check(block)
            except WorldCodeError as exc:
                cand.timed_out += int(exc.timed_out)
                error = str(exc)
            except HorizonError as exc:
                error = str(exc)
        cand.problems.append(error)
        if cand.repairs >= budget:
            return None
        cand.repairs += 1
        messages.append(
            Message(role="user", content=f"That failed: {error}\nFix it and reply with the whole file.")
        )


async def generate_world(
    theme: str, coder: RoleClient, out_dir: Path, *, max_repairs: int = 3, validate_steps: int = 40
) -> Candidate:
    """Take one theme through the pipeline; the candidate lands in ``out_dir/<slug>``."""
    cand = Candidate(theme=theme, slug=slugify(theme))
    root = out_dir / cand.slug
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    cand.path = str(root)
    (root / "generated.json").write_text("{}", encoding="utf-8")  # from here on: sandboxed only
    messages = [Message(role="system", content=SYSTEM)]
    try:
        await _pipeline(cand, coder, root, messages, max_repairs, validate_steps)
    finally:
        meta = {**asdict(cand), "reached": cand.reached, "transcript": [m.model_dump() for m in messages]}
        (root / "generated.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return cand


async def _pipeline(
    cand: Candidate, coder: RoleClient, root: Path, messages: list[Message], budget: int, steps: int
) -> None:
    messages.append(
        Message(
            role="user",
            content=f"Theme: {cand.theme}\nDescribe a world for this theme in one paragraph: the state, the "
            "actions, how reward is earned (binary: 1 on success, or cumulative), what the agent sees.",
        )
    )
    description = (await _ask(coder, messages)).strip()
    cand.stages["described"] = bool(description)
    if not description:
        cand.problems.append("empty description")
        return
    (root / "instruction.md").write_text(description + "\n", encoding="utf-8")

    async def check_dsl(block: str) -> tuple[WorldSpec, str]:
        try:
            data = yaml.safe_load(block)
        except yaml.YAMLError as exc:
            raise ConfigError(f"world.yaml is not valid YAML: {str(exc).splitlines()[0]}") from None
        if isinstance(data, dict):
            data["name"] = cand.slug
        spec = parse_spec(data, "world.yaml")
        return spec, yaml.safe_dump(spec.model_dump(exclude_defaults=False), sort_keys=False)

    messages.append(Message(role="user", content=dsl_prompt(cand.theme, description, cand.slug)))
    got = await _until_valid(coder, messages, "yaml", check_dsl, cand, budget)
    if got is None:
        return
    spec, spec_text = got
    (root / "world.yaml").write_text(spec_text, encoding="utf-8")
    cand.stages["dsl_valid"] = True

    package = WorldPackage(root)

    async def check_code(block: str) -> bool:
        (root / "world.py").write_text(block, encoding="utf-8")
        runner = SandboxRunner(package)
        try:  # a trial in the sandbox: a level, its solution, and a random episode
            level = (await runner.call({"op": "generate", "seed": 0, "params": spec.generator.params}))[
                "level"
            ]
            await runner.call({"op": "solve", "level": level, "max_steps": spec.termination.max_steps})
            actions = {n: a.model_dump() for n, a in spec.transition.actions.items()}
            agent = {"kind": "random", "seed": 0}
            cmd = {"op": "episode", "level": level, "max_steps": spec.termination.max_steps}
            await runner.call({**cmd, "actions": actions, "agent": agent})
        finally:
            await runner.aclose()
        return True

    messages.append(Message(role="user", content=code_prompt(spec_text)))
    if await _until_valid(coder, messages, "python", check_code, cand, budget) is None:
        return
    cand.stages["executable"] = True

    runner = SandboxRunner(package)
    try:
        levels = await make_levels(package, runner)
    except WorldCodeError as exc:
        cand.timed_out += int(exc.timed_out)
        cand.problems.append(f"levels: {exc}")
        return
    finally:
        await runner.aclose()
    for split, records in levels.items():
        package.write_levels(split, records)
    report = await validate_world(package, steps=steps, sandbox="always")
    cand.stages["levels_valid"] = report.execution.ok and report.levels.ok
    cand.stages["reliable"] = report.valid
    if not report.valid:
        cand.problems.append(report.first_problem())


def funnel(candidates: list[Candidate]) -> dict[str, int]:
    """How many candidates reached each stage."""
    order = {stage: i for i, stage in enumerate(FUNNEL)}
    return {stage: sum(order[c.reached] >= i for c in candidates) for stage, i in order.items()}
