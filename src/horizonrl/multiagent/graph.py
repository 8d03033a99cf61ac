"""Role graphs: which roles a multi-agent episode has, what each one sees, and in which order they act.

A graph is a list of **phases** run in order. A phase is one role answering once (``gvr``'s
generator, verifier, refiner) or a conversation of two roles taking turns (a ChatDev phase: an
instructor and an assistant) until one of them writes the phase's consensus token or the phase's
turn cap is reached. A phase's **solution** (the last message of its ``output`` role) is all that
later phases see of it: a role's ``sees`` names the question and earlier phases, never a later one.
Roles that talk to each other within a phase form a cycle, so such a phase needs a turn cap.

Each role has a system prompt and a policy (``adapter``: the name of a LoRA adapter on the one base
model, or None for the base itself). Roles answer in text; they call no tools. A role may declare an
``output_schema`` (a JSON schema): its replies are then held to it by constrained decoding (MALT's
verifier with ``multiagent.structured``: a :class:`VerifierVerdict` object).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from horizonrl.errors import ConfigError
from horizonrl.roles.structured import output_schema

QUESTION = "question"


class RoleSpec(BaseModel):
    """One role of a graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The role's name (generator, verifier, instructor, ...).")
    system: str = Field(description="The role's system prompt.")
    adapter: str | None = Field(
        None, description="The LoRA adapter (by name) this role samples from; None: the base model."
    )
    sees: tuple[str, ...] = Field(
        (QUESTION,), description="What the role's prompt shows: 'question' and earlier phases, by name."
    )
    max_new_tokens: int = Field(256, ge=1, description="Most tokens of one of the role's turns.")
    output_schema: dict[str, Any] | None = Field(
        None, description="A JSON schema the role's replies are held to (constrained decoding); None: text."
    )


class VerifierVerdict(BaseModel):
    """MALT's verifier as a structured reply: the review first (the reasoning), then the verdict."""

    model_config = ConfigDict(extra="forbid")

    critique: str = Field(max_length=300, description="The steps rechecked and the one found wrong, if any.")
    verdict: Literal["correct", "incorrect"]


class Phase(BaseModel):
    """One step of a graph: one role answering once, or two roles in conversation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    roles: tuple[str, ...] = Field(min_length=1, max_length=2, description="One role, or two taking turns.")
    output: str | None = Field(None, description="The role whose last message is the phase's solution.")
    label: str | None = Field(None, description="How later roles' prompts introduce the solution.")
    max_turns: int | None = Field(
        None, ge=1, description="Most turns of a two-role phase (both roles' turns counted)."
    )
    consensus: str | None = Field(
        None, description="A token that, written by either role, ends the phase (e.g. <CONSENSUS>)."
    )

    @property
    def solution_role(self) -> str:
        return self.output or self.roles[-1]

    @property
    def heading(self) -> str:
        return self.label or f"{self.solution_role.capitalize()} ({self.name})"


class RoleGraph(BaseModel):
    """Roles and the phases they act in (see the module doc); validated on construction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    roles: tuple[RoleSpec, ...]
    phases: tuple[Phase, ...]
    answer_phase: str | None = Field(None, description="The phase whose solution is the final answer.")

    @model_validator(mode="after")
    def _check(self) -> RoleGraph:
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ConfigError(f"graph {self.name!r}: role names repeat: {', '.join(names)}")
        if QUESTION in names:
            raise ConfigError(f"graph {self.name!r}: {QUESTION!r} is what roles see, not a role name")
        phase_names = [p.name for p in self.phases]
        if not self.phases or len(set(phase_names)) != len(phase_names):
            raise ConfigError(f"graph {self.name!r}: phases must be non-empty with distinct names")
        earlier: set[str] = {QUESTION}
        for phase in self.phases:
            for role in phase.roles:
                if role not in names:
                    raise ConfigError(
                        f"graph {self.name!r}: phase {phase.name!r} names unknown role {role!r}; "
                        f"roles: {', '.join(names)}"
                    )
            if phase.output is not None and phase.output not in phase.roles:
                raise ConfigError(
                    f"graph {self.name!r}: phase {phase.name!r} output {phase.output!r} is not one of its "
                    f"roles ({', '.join(phase.roles)})"
                )
            if len(phase.roles) == 2 and phase.max_turns is None:
                raise ConfigError(
                    f"graph {self.name!r}: phase {phase.name!r} is a cycle ({' <-> '.join(phase.roles)} take "
                    "turns) without a turn cap; set its max_turns"
                )
            for role in phase.roles:
                for seen in self.role(role).sees:
                    if seen not in earlier:
                        later = seen in phase_names
                        raise ConfigError(
                            f"graph {self.name!r}: role {role!r} sees {seen!r}, which "
                            + (
                                "is not an earlier phase (a cycle across phases has no turn cap; "
                                "roles see the question and earlier phases only)"
                                if later
                                else f"is neither {QUESTION!r} nor a phase; phases: {', '.join(phase_names)}"
                            )
                        )
            earlier.add(phase.name)
        if self.answer_phase is not None and self.answer_phase not in phase_names:
            raise ConfigError(f"graph {self.name!r}: answer_phase {self.answer_phase!r} is not a phase")
        return self

    def role(self, name: str) -> RoleSpec:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)

    @property
    def final_phase(self) -> Phase:
        name = self.answer_phase or self.phases[-1].name
        return next(p for p in self.phases if p.name == name)

    def check_adapters(self, adapters: Iterable[str]) -> None:
        """Every role's adapter must be one of ``adapters`` (the ones the engine serves)."""
        known = set(adapters)
        for role in self.roles:
            if role.adapter is not None and role.adapter not in known:
                raise ConfigError(
                    f"graph {self.name!r}: role {role.name!r} names unknown adapter {role.adapter!r}; "
                    f"adapters: {', '.join(sorted(known)) or 'none (set multiagent.adapters)'}"
                )

    def with_adapters(self, adapters: Mapping[str, str]) -> RoleGraph:
        """The graph with ``adapters[role]`` as each listed role's adapter (others unchanged)."""
        unknown = sorted(set(adapters) - {r.name for r in self.roles})
        if unknown:
            raise ConfigError(
                f"graph {self.name!r}: adapters given for unknown role(s) {', '.join(unknown)}; "
                f"roles: {', '.join(r.name for r in self.roles)}"
            )
        roles = tuple(
            r.model_copy(update={"adapter": adapters[r.name]}) if r.name in adapters else r
            for r in self.roles
        )
        return self.model_copy(update={"roles": roles})


# ---------------------------------------------------------------------------------------------------
# shipped graphs

ANSWER_FORMAT = "End with a last line of the form 'Answer: <number>'."

GENERATOR = (
    "You solve math word problems. Work through the problem step by step, computing each quantity. "
    + ANSWER_FORMAT
)
VERIFIER = (
    "You check a proposed solution to a math word problem. Go through its steps, recompute each "
    "number and say which step is wrong, if any. End with 'Verdict: correct' or 'Verdict: incorrect'."
)
VERIFIER_STRUCTURED = (
    "You check a proposed solution to a math word problem. Go through its steps, recompute each "
    "number and say which step is wrong, if any. Reply with a JSON object: 'critique' (your check, "
    "step by step) and 'verdict' ('correct' or 'incorrect')."
)
REFINER = (
    "You write the final solution to a math word problem, given a first attempt and a review of it. "
    "Keep what the review confirms and fix what it finds wrong. " + ANSWER_FORMAT
)


def gvr(max_new_tokens: int = 256, structured: bool = False) -> RoleGraph:
    """MALT's generator -> verifier -> refiner: each role answers once; the verifier sees the
    question and the generation, the refiner all three. ``structured``: the verifier's reply is held
    to a :class:`VerifierVerdict` object (its verdict then read without parsing prose)."""
    return RoleGraph(
        name="gvr",
        roles=(
            RoleSpec(name="generator", system=GENERATOR, max_new_tokens=max_new_tokens),
            RoleSpec(
                name="verifier",
                system=VERIFIER_STRUCTURED if structured else VERIFIER,
                sees=(QUESTION, "generate"),
                max_new_tokens=max_new_tokens,
                output_schema=output_schema(VerifierVerdict) if structured else None,
            ),
            RoleSpec(
                name="refiner",
                system=REFINER,
                sees=(QUESTION, "generate", "verify"),
                max_new_tokens=max_new_tokens,
            ),
        ),
        phases=(
            Phase(name="generate", roles=("generator",), label="Proposed solution"),
            Phase(name="verify", roles=("verifier",), label="Review of the proposed solution"),
            Phase(name="refine", roles=("refiner",), label="Final solution"),
        ),
    )


CONSENSUS = "<CONSENSUS>"


def chat_chain(max_turns: int = 4, max_new_tokens: int = 192) -> RoleGraph:
    """A ChatDev-style chain for word problems: a *plan* phase (a planner instructs, a solver drafts
    the steps) and a *check* phase (a reviewer instructs, a solver answers), each a conversation that
    ends when either side writes <CONSENSUS> or after ``max_turns`` turns. Only the plan phase's
    solution (the solver's last message) passes to the check phase: its long-term memory."""
    solver = (
        "You are a careful solver of math word problems. Follow the instructions you are given, show the "
        f"computation, and write {CONSENSUS} when the instructor's request is met. " + ANSWER_FORMAT
    )
    return RoleGraph(
        name="chat_chain",
        roles=(
            RoleSpec(
                name="planner",
                system="You plan the solution of a math word problem: tell the solver which quantity to "
                f"compute next, one at a time. When the solver has the final number, write {CONSENSUS}.",
                max_new_tokens=max_new_tokens,
            ),
            RoleSpec(name="solver", system=solver, max_new_tokens=max_new_tokens),
            RoleSpec(
                name="reviewer",
                system="You review a solution to a math word problem: ask the solver to recheck any step "
                f"that looks wrong. When every step is right, write {CONSENSUS}.",
                sees=(QUESTION, "plan"),
                max_new_tokens=max_new_tokens,
            ),
            RoleSpec(name="checker", system=solver, sees=(QUESTION, "plan"), max_new_tokens=max_new_tokens),
        ),
        phases=(
            Phase(
                name="plan",
                roles=("planner", "solver"),
                output="solver",
                label="Solution drafted in the planning phase",
                max_turns=max_turns,
                consensus=CONSENSUS,
            ),
            Phase(
                name="check",
                roles=("reviewer", "checker"),
                output="checker",
                max_turns=max_turns,
                consensus=CONSENSUS,
            ),
        ),
    )
