"""The MAST failure taxonomy (Cemri et al., "Why Do Multi-Agent LLM Systems Fail?", 2025) as data:
14 failure modes in 3 categories, with definitions in our own words. Versioned: labels, verdicts and
reports record the version they were made under.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

TAXONOMY_VERSION = "mast-1"


class FailureMode(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    category: str
    definition: str


CATEGORIES = {
    "FC1": "specification and system design",
    "FC2": "inter-agent misalignment",
    "FC3": "task verification",
}

MODES: tuple[FailureMode, ...] = (
    FailureMode(
        id="1.1",
        name="disobey task specification",
        category="FC1",
        definition="The agent does not do what the task asks, or breaks one of its stated constraints "
        "(wrong quantity answered, a required format or tool ignored, an explicit rule broken).",
    ),
    FailureMode(
        id="1.2",
        name="disobey role specification",
        category="FC1",
        definition="An agent acts outside its role: a verifier that rewrites the solution instead of "
        "checking it, an assistant that gives instructions, a role that does another role's job.",
    ),
    FailureMode(
        id="1.3",
        name="step repetition",
        category="FC1",
        definition="The same step (the same tool call, or the same message) is repeated without new "
        "information making it necessary, so the episode makes no progress.",
    ),
    FailureMode(
        id="1.4",
        name="loss of conversation history",
        category="FC1",
        definition="The agent acts as if earlier turns had not happened: it forgets results it already "
        "obtained, or contradicts facts established earlier in the episode.",
    ),
    FailureMode(
        id="1.5",
        name="unaware of termination conditions",
        category="FC1",
        definition="The agent does not recognise when it should stop: it keeps going after the task is "
        "done, or never finishes within the turn or token budget.",
    ),
    FailureMode(
        id="2.1",
        name="conversation reset",
        category="FC2",
        definition="A role restarts the dialogue from the beginning (restates the task or its opening "
        "message) and the progress made so far is lost.",
    ),
    FailureMode(
        id="2.2",
        name="fail to ask for clarification",
        category="FC2",
        definition="Faced with ambiguous or missing information, an agent guesses instead of asking "
        "(the user, or another role) for what it needs.",
    ),
    FailureMode(
        id="2.3",
        name="task derailment",
        category="FC2",
        definition="The conversation drifts away from the task's goal to something else (an unrelated "
        "problem, a different question, chatter).",
    ),
    FailureMode(
        id="2.4",
        name="information withholding",
        category="FC2",
        definition="An agent has information another role needs (a result, an error it saw) and does not "
        "pass it on.",
    ),
    FailureMode(
        id="2.5",
        name="ignored other agent's input",
        category="FC2",
        definition="An agent disregards what another role said: a review's correction is not applied, an "
        "instruction is not followed, a reported error is not acted on.",
    ),
    FailureMode(
        id="2.6",
        name="reasoning-action mismatch",
        category="FC2",
        definition="What an agent does differs from what its own reasoning says it will do (it computes "
        "one thing and submits another, states a plan and calls a different tool).",
    ),
    FailureMode(
        id="3.1",
        name="premature termination",
        category="FC3",
        definition="The episode ends (an answer is submitted, a phase declared done) before the "
        "information needed was gathered or the result was checked, and the result is wrong.",
    ),
    FailureMode(
        id="3.2",
        name="no or incomplete verification",
        category="FC3",
        definition="A result is never checked, or only superficially (a verifier that restates the "
        "answer without recomputing it), so an error goes unnoticed.",
    ),
    FailureMode(
        id="3.3",
        name="incorrect verification",
        category="FC3",
        definition="A check is made but reaches the wrong verdict: a wrong result is declared correct, or "
        "a correct one wrong.",
    ),
)

MODE_IDS: tuple[str, ...] = tuple(m.id for m in MODES)
BY_ID = {m.id: m for m in MODES}


def mode(mode_id: str) -> FailureMode:
    try:
        return BY_ID[mode_id]
    except KeyError:
        raise KeyError(f"unknown MAST mode {mode_id!r}; valid ids: {', '.join(MODE_IDS)}") from None


def category_of(mode_id: str) -> str:
    return BY_ID[mode_id].category
