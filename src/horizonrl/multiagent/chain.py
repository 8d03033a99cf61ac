"""Chat chains as data: a ChatDev-style team declared in YAML and validated by pydantic.

A chain has **roles** (a system prompt, the tools the role may ever use, an optional LoRA adapter)
and **phases** run in order. A phase is a dialogue: its *instructor* speaks first, its *assistant*
answers, and they alternate until either writes the chain's consensus marker or the phase's
``max_turns`` run out. A phase says what its roles see: the task, the last messages of earlier phases
it ``sees``, the workspace files it ``reads`` (as they are when the phase starts) and, inside a loop,
the test report. It gives each role the tools it may call (``tools``: a subset of the role's own
tools and of the env's) and names the files its roles may write (``writes``).

A **loop** groups phases into cycles: before each cycle the chain runs its ``check`` tool itself
(the docstring's examples, say); a passing check ends the loop, a failing one starts a cycle whose
phases see its output as the test report; at most ``max_cycles`` cycles. That is the test-to-fix
flow: failures found by running the code go back to the roles that fix it.

Everything a user can get wrong is refused on load with one line naming it: a phase naming a missing
role, a dialogue or a loop without a cap, a role given a tool its own permissions or the env do not
have, a workspace path that is absolute or leaves the workspace, a phase seeing a later phase.
"""

from __future__ import annotations

import posixpath
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.errors import ConfigError
from horizonrl.yamlsafe import load_yaml

SHIPPED = ("software_company",)


def _workspace_path(path: str) -> str:
    """A path relative to the workspace, normalised; one that is absolute or leaves it is refused."""
    normal = posixpath.normpath(path)
    if path.startswith("/") or normal == ".." or normal.startswith("../") or normal in ("", "."):
        raise ValueError(
            f"workspace path {path!r} leaves the workspace; name a file inside it, e.g. solution.py"
        )
    return normal


class ChainRole(BaseModel):
    """One member of the team."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = Field(min_length=1, description="The role's system prompt.")
    tools: tuple[str, ...] = Field((), description="The tools the role may be given in any phase.")
    adapter: str | None = Field(None, description="The LoRA adapter this role samples from (None: base).")
    max_new_tokens: int = Field(384, ge=1, le=8192, description="Most tokens of one of its steps.")


class ChainPhase(BaseModel):
    """One dialogue of the chain (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    instructor: str = Field(min_length=1, description="The role that speaks first.")
    assistant: str = Field(min_length=1, description="The role that answers.")
    prompt: str = Field("", description="The phase's instruction, shown to both roles.")
    max_turns: int | None = Field(None, ge=1, le=64, description="Most turns (both roles' counted).")
    sees: tuple[str, ...] = Field((), description="Earlier phases whose last message the roles see.")
    reads: tuple[str, ...] = Field((), description="Workspace files shown to both roles at the start.")
    writes: tuple[str, ...] = Field((), description="Workspace files the phase's roles may write.")
    tools: dict[str, tuple[str, ...]] = Field(default_factory=dict, description="role -> tools it may call.")
    test_report: bool = Field(False, description="Show the loop's failing check output (in a loop only).")

    _paths = field_validator("reads", "writes")(lambda v: tuple(_workspace_path(p) for p in v))

    @property
    def roles(self) -> tuple[str, str]:
        return (self.instructor, self.assistant)


class ChainLoop(BaseModel):
    """Phases repeated until the chain's check passes, at most ``max_cycles`` times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loop: str = Field(min_length=1, description="The loop's name (its checks are recorded under it).")
    max_cycles: int | None = Field(None, ge=1, le=16, description="Most cycles (the loop's cap).")
    phases: tuple[ChainPhase, ...] = Field(min_length=1)


class ChatChain(BaseModel):
    """A whole chain (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    consensus: str = Field("<INFO> Finished", min_length=1, description="The marker that ends a phase.")
    solution: str = Field("solution.py", description="The workspace file the outcome is read from.")
    check: str | None = Field(None, description="The tool the chain runs itself to test the code.")
    max_tool_rounds: int = Field(2, ge=1, le=16, description="Most tool-calling steps in one turn.")
    roles: dict[str, ChainRole] = Field(min_length=1)
    phases: tuple[ChainPhase | ChainLoop, ...] = Field(min_length=1)

    _solution = field_validator("solution")(lambda v: _workspace_path(v))

    @model_validator(mode="after")
    def _check(self) -> ChatChain:
        seen: set[str] = set()
        for item in self.phases:
            loop = item if isinstance(item, ChainLoop) else None
            if loop is not None:
                if loop.max_cycles is None:
                    raise ValueError(f"loop {loop.loop!r} is a cycle with no cap; set its max_cycles")
                if self.check is None:
                    raise ValueError(
                        f"loop {loop.loop!r} needs the chain's check (a tool that runs the tests)"
                    )
            for phase in loop.phases if loop is not None else (item,):  # type: ignore[union-attr]
                self._check_phase(phase, seen, loop)
                seen.add(phase.name)
        return self

    def _check_phase(self, phase: ChainPhase, earlier: set[str], loop: ChainLoop | None) -> None:
        where = f"phase {phase.name!r}"
        if phase.name in earlier:
            raise ValueError(f"{where} is declared twice; phase names are unique")
        for role in phase.roles:
            if role not in self.roles:
                raise ValueError(f"{where} names missing role {role!r}; roles: {', '.join(self.roles)}")
        if phase.instructor == phase.assistant:
            raise ValueError(f"{where}: instructor and assistant are the same role; a dialogue has two")
        if phase.max_turns is None:
            raise ValueError(
                f"{where} is a cycle ({phase.instructor} <-> {phase.assistant}) with no cap; set max_turns"
            )
        for name in phase.sees:
            if name not in earlier:
                raise ValueError(
                    f"{where} sees {name!r}, which is not an earlier phase; earlier: {sorted(earlier)}"
                )
        if phase.test_report and loop is None:
            raise ValueError(f"{where} shows a test report, which only a loop's phases have")
        for role, tools in phase.tools.items():
            if role not in phase.roles:
                raise ValueError(
                    f"{where} gives tools to {role!r}, which is not one of its roles {phase.roles}"
                )
            allowed = self.roles[role].tools
            for tool in tools:
                if tool not in allowed:
                    raise ValueError(
                        f"{where} gives role {role!r} tool {tool!r}, which the role may not use "
                        f"(its tools: {', '.join(allowed) or 'none'})"
                    )

    # -- reading ---------------------------------------------------------------------------------
    def flat_phases(self) -> list[tuple[ChainPhase, ChainLoop | None]]:
        """Every phase with the loop it belongs to (None outside loops), in order."""
        out: list[tuple[ChainPhase, ChainLoop | None]] = []
        for item in self.phases:
            if isinstance(item, ChainLoop):
                out += [(p, item) for p in item.phases]
            else:
                out.append((item, None))
        return out

    def permissions(self) -> dict[str, dict[str, list[str]]]:
        """phase -> role -> the tools the phase gives the role (every role of every phase listed)."""
        return {
            p.name: {role: list(p.tools.get(role, ())) for role in p.roles} for p, _ in self.flat_phases()
        }

    def check_tools(self, env_tools: set[str], env: str) -> None:
        """Every tool the chain names must be one of the env's."""
        named = {t for r in self.roles.values() for t in r.tools} | ({self.check} if self.check else set())
        missing = sorted(named - env_tools)
        if missing:
            raise ConfigError(
                f"chain {self.name!r} names tool(s) {', '.join(missing)}, which env {env!r} does not have; "
                f"its tools: {', '.join(sorted(env_tools)) or 'none'}"
            )

    def with_adapters(self, adapters: dict[str, str]) -> ChatChain:
        """The chain with ``adapters[role]`` as each listed role's adapter."""
        unknown = sorted(set(adapters) - set(self.roles))
        if unknown:
            raise ConfigError(
                f"chain {self.name!r}: adapters given for unknown role(s) {', '.join(unknown)}; "
                f"roles: {', '.join(self.roles)}"
            )
        roles = {
            name: r.model_copy(update={"adapter": adapters[name]}) if name in adapters else r
            for name, r in self.roles.items()
        }
        return self.model_copy(update={"roles": roles})


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    return f"{key}: {msg}" if key else msg


def parse_chain(data: Any, source: str) -> ChatChain:
    """A chain from parsed YAML; anything invalid is a one-line ConfigError naming ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a chain is a mapping (name:, roles:, phases:, ...)")
    try:
        return ChatChain.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_first_error(exc)}") from None


def load_chain(name_or_path: str | Path) -> ChatChain:
    """A shipped chain by name (:data:`SHIPPED`) or a chain YAML file."""
    text: str
    if str(name_or_path) in SHIPPED:
        source = f"chain {name_or_path!r}"
        text = (resources.files("horizonrl.multiagent") / "chains" / f"{name_or_path}.yaml").read_text(
            "utf-8"
        )
    else:
        path = Path(name_or_path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(
                f"chain {str(name_or_path)!r} is neither a shipped chain "
                f"({', '.join(SHIPPED)}) nor a YAML file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the chain file ({exc})") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return parse_chain(data, source)
