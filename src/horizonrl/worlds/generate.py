"""LLM-driven world generation with the coder role, every line of generated code run only inside
bubblewrap sandboxes.

theme → description → DSL (``world.yaml``, a structured reply: see below) → code (``world.py``: the
dynamics, the generator and the planner) → self-repair (a schema error, a syntax error or an
exception from a trial run inside the sandbox goes back to the coder, within a bounded budget) →
levels (generated and solved in the sandbox) → validation (:mod:`.validate`) → archive. Every
candidate is kept with a ``generated.json`` that records its stages, so a failed one can be read; a
valid one is a world package like the shipped ones (its code still runs only sandboxed).

The DSL is asked for with ``coder.structured`` as a :class:`WorldDraft`: the DSL's content with every
mapping written as a list of named entries (actions, their parameters, the state's keys, the skin's
terms, the generator's parameters), because a mapping with free keys has no strict JSON schema (an
``openai`` endpoint's strict mode and the engine's enforcement both close every object). The draft
is a simplified subset that is valid by construction where a schema can say so: ``reward.kind`` is
``axes.reward``; the skin is one list of terms, each with its aligned and inverse name, so both
variants cover the same codes; the observation's radius, opaque cells and mask share, the level
seed and the level counts take the DSL's defaults; strings, lists and numbers are bounded so that a
reply held to the schema ends within :data:`DSL_MAX_TOKENS`. :func:`draft_to_spec` turns it into the
DSL (a list's entries are keyed by name: a repeated name's later entry is dropped and noted in the
candidate's ``notes``) and ``world.yaml`` is written from the validated spec. A reply that is no
draft (an endpoint that ignores the schema, ``roles.coder.structured: parse``) is read as before:
its ```yaml block, in the DSL's own schema.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from horizonrl.errors import ConfigError, HorizonError
from horizonrl.roles.base import RoleClient
from horizonrl.types import Message
from horizonrl.worlds.dsl import SKILLS, WorldSpec, parse_spec
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


#: the most tokens of the coder's DSL reply (the draft's bounds keep a reply held to it below this)
DSL_MAX_TOKENS = 2048

Ident = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,23}$")]


def _text(limit: int, description: str = "") -> Any:
    return Annotated[str, Field(min_length=1, max_length=limit, description=description or None)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DraftParam(_Closed):
    name: Ident
    type: Literal["string", "integer"]
    description: _text(80)  # type: ignore[valid-type]
    enum: list[_text(16)] | None = Field(  # type: ignore[valid-type]
        None, min_length=1, max_length=6, description="string: the values it may take"
    )
    minimum: int | None = Field(None, ge=-1000, le=1000, description="integer: the least value")
    maximum: int | None = Field(None, ge=-1000, le=1000, description="integer: the largest value")


class DraftAction(_Closed):
    name: Ident = Field(description="The action's name, a lower-case identifier (it becomes a tool).")
    description: _text(120)  # type: ignore[valid-type]
    params: list[DraftParam] = Field(default_factory=list, max_length=2)


class DraftStateKey(_Closed):
    key: Ident
    holds: _text(80, "What the state's key holds.")  # type: ignore[valid-type]


class DraftTerm(_Closed):
    term: _text(16, "A cell code of the map (one character) or a term the world's text uses.")  # type: ignore[valid-type]
    glyph: str | None = Field(
        None, min_length=1, max_length=1, description="How a cell code is drawn; null for a term."
    )
    name: _text(16, "What the term is called (the aligned skin).")  # type: ignore[valid-type]
    inverse: _text(16, "What the inverse skin calls it (against the usual meaning).")  # type: ignore[valid-type]


class DraftLevelParam(_Closed):
    name: Ident
    value: (
        Annotated[int, Field(ge=-1000, le=1000)]
        | Annotated[float, Field(ge=-1000, le=1000)]
        | Annotated[list[Annotated[int, Field(ge=-1000, le=1000)]], Field(max_length=6)]
        | Annotated[list[_text(16)], Field(max_length=6)]  # type: ignore[valid-type]
    )


class WorldDraft(_Closed):
    """A world's DSL as the coder writes it (see the module's docstring)."""

    description: _text(400, "One paragraph: what the world is and how it is won.")  # type: ignore[valid-type]
    skill: Literal[SKILLS]  # type: ignore[valid-type]
    reward: Literal["binary", "cumulative"]
    observation: Literal["full", "partial"] = Field(description="Does the agent see the whole state?")
    observation_policy: Literal["full", "radius", "line_of_sight", "mask"] = Field(
        description="What the agent is shown each turn."
    )
    state: list[DraftStateKey] = Field(min_length=1, max_length=4)
    actions: list[DraftAction] = Field(min_length=1, max_length=4)
    skin: list[DraftTerm] = Field(min_length=1, max_length=12)
    max_steps: int = Field(ge=1, le=200)
    level_params: list[DraftLevelParam] = Field(default_factory=list, max_length=6)


def _first_of_each(kind: str, entries: list[Any], key: str, notes: list[str]) -> list[Any]:
    """``entries`` with a later one whose ``key`` is taken dropped (noted in ``notes``)."""
    seen: set[str] = set()
    out = []
    for entry in entries:
        name = getattr(entry, key)
        if name in seen:
            notes.append(f"a repeated {kind} {name!r} was dropped")
            continue
        seen.add(name)
        out.append(entry)
    return out


def draft_to_spec(draft: WorldDraft, name: str, notes: list[str] | None = None) -> dict[str, Any]:
    """The DSL document (``world.yaml``'s mapping) a draft describes, named ``name``. The lists are
    keyed by their names: the first entry of a name counts and a repeat is dropped, each drop noted
    in ``notes`` (a schema cannot hold list items to distinct names, and a small model repeats
    itself)."""
    notes = notes if notes is not None else []
    actions = _first_of_each("action", draft.actions, "name", notes)
    params = {a.name: _first_of_each(f"parameter of {a.name}", a.params, "name", notes) for a in actions}
    state = _first_of_each("state key", draft.state, "key", notes)
    skin = _first_of_each("skin term", draft.skin, "term", notes)
    levels = _first_of_each("level parameter", draft.level_params, "name", notes)
    glyphs = {t.term: t.glyph for t in skin if t.glyph is not None}
    return {
        "name": name,
        "description": draft.description,
        "axes": {"skill": draft.skill, "reward": draft.reward, "observation": draft.observation},
        "state_template": {k.key: k.holds for k in state},
        "observation": {"default": draft.observation_policy},
        "reward": {"kind": draft.reward},
        "transition": {
            "actions": {
                a.name: {
                    "description": a.description,
                    "params": {
                        p.name: p.model_dump(exclude={"name"}, exclude_none=True) for p in params[a.name]
                    },
                }
                for a in actions
            }
        },
        "skin": {
            "default": "aligned",
            "variants": {
                "aligned": {"glyphs": glyphs, "names": {t.term: t.name for t in skin}},
                "inverse": {"glyphs": glyphs, "names": {t.term: t.inverse for t in skin}},
            },
        },
        "termination": {"max_steps": draft.max_steps},
        "generator": {"params": {p.name: p.value for p in levels}},
    }


def draft_of(spec: WorldSpec) -> WorldDraft:
    """The draft of a DSL document (its default skin's glyphs and names, and the inverse skin's
    names where it has one), for showing the coder an example."""
    variants = spec.skin.variants
    aligned = variants[spec.skin.default]
    inverse = variants.get("inverse", aligned)
    terms = list(dict.fromkeys([*aligned.glyphs, *aligned.names]))
    return WorldDraft(
        description=" ".join(spec.description.split()),
        skill=spec.axes.skill,
        reward=spec.axes.reward,
        observation=spec.axes.observation,
        observation_policy=spec.observation.default,
        state=[DraftStateKey(key=k, holds=v) for k, v in spec.state_template.items()],
        actions=[
            DraftAction(
                name=n,
                description=a.description,
                params=[DraftParam(name=pn, **p.model_dump()) for pn, p in a.params.items()],
            )
            for n, a in spec.transition.actions.items()
        ],
        skin=[
            DraftTerm(
                term=t,
                glyph=aligned.glyphs.get(t),
                name=aligned.names.get(t, t),
                inverse=inverse.names.get(t, aligned.names.get(t, t)),
            )
            for t in terms
        ],
        max_steps=spec.termination.max_steps,
        level_params=[DraftLevelParam(name=k, value=v) for k, v in spec.generator.params.items()],
    )


@dataclass
class Candidate:
    theme: str
    slug: str
    stages: dict[str, bool] = field(default_factory=dict)
    repairs: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was changed in an accepted reply (a repeat dropped)
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


def example_draft() -> str:
    """The shipped example world as a :class:`WorldDraft`, in JSON."""
    data = yaml.safe_load(example_world()["world.yaml"])
    return draft_of(parse_spec(data, "world.yaml")).model_dump_json()


def dsl_prompt(theme: str, description: str, name: str) -> str:
    return (
        f"Theme: {theme}\nDescription: {description}\n\nWrite the DSL of the world {name!r} as one JSON "
        "object with these fields: description (one paragraph: what the world is and how it is won); "
        f"skill (one of {', '.join(SKILLS)}); reward (binary: 1 on success, or cumulative); observation "
        "(full or partial: does the agent see the whole state); observation_policy (full, radius, "
        "line_of_sight or mask); state (each key of the state and what it holds); actions (each with a "
        "name, a description and its params: name, type string or integer, description, and an enum "
        "or a minimum and maximum); skin (each cell code or term, its glyph when it is a cell code, its "
        "name, and its inverse name, which says the opposite of the usual meaning); max_steps; "
        "level_params (what the level generator is given: sizes, counts, ranges). This example is "
        f"another world:\n\n{example_draft()}\n\nReply with the JSON object only."
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
    coder: RoleClient,
    messages: list[Message],
    lang: str,
    check: Any,
    cand: Candidate,
    budget: int,
    schema: type[BaseModel] | None = None,
) -> Any:
    """Ask, check the reply (a ``schema`` object when one is asked for, else or failing that the
    fenced block), feed the error back; at most ``budget`` repairs in all."""
    while True:
        if schema is None:
            block: Any = fenced(await _ask(coder, messages), lang)
            why = ""
        else:
            reply = await coder.structured(messages, schema, max_tokens=DSL_MAX_TOKENS)
            messages.append(Message(role="assistant", content=reply.text))
            block = reply.value if reply.value is not None else fenced(reply.text, lang)
            why = f"the reply is no {schema.__name__} ({reply.error}) and has "
        if block is None:
            cand.unparsed_replies += 1
            error = f"{why or ''}no ```{lang} block in the reply"
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

    async def check_dsl(block: WorldDraft | str) -> tuple[WorldSpec, str]:
        notes: list[str] = []
        if isinstance(block, WorldDraft):
            data: Any = draft_to_spec(block, cand.slug, notes)
        else:
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError as exc:
                raise ConfigError(f"world.yaml is not valid YAML: {str(exc).splitlines()[0]}") from None
            if isinstance(data, dict):
                data["name"] = cand.slug
        spec = parse_spec(data, "world.yaml")
        cand.notes.extend(notes)
        return spec, yaml.safe_dump(spec.model_dump(exclude_defaults=False), sort_keys=False)

    messages.append(Message(role="user", content=dsl_prompt(cand.theme, description, cand.slug)))
    got = await _until_valid(coder, messages, "yaml", check_dsl, cand, budget, WorldDraft)
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
