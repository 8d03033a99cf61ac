"""Deterministic detectors for the MAST modes our records can show without a judge.

- **1.1 disobey task specification**: the agent loop ended the episode as malformed — the model
  ignored the required answer format (tool-call markup) past the allowed number of turns.
- **1.3 step repetition**: a role repeats a tool call it already made with the same arguments, a
  message repeats an earlier one verbatim (whichever role wrote them: a refiner copying the review),
  or the agent loop stopped the episode as a loop. On a chat-chain trace only with nothing changed
  in between: a write that changes the code makes the calls after it new, and is itself progress
  (restoring an earlier version, writing out dictated code), never a repeat.
- **1.5 unaware of termination conditions**: the episode ran out of turns or context without
  finishing, or a role's turn was cut off by its token budget.
- **3.1 premature termination**: the episode finished with a wrong result and no step before the
  last one verified anything: no turn of a verifying role (verifier, reviewer, checker), no call of a
  checking tool (tests, verify, check), no call that took the submitted answer as an input.
- **2.1 conversation reset**: a role starts over — a later turn repeats its own opening turn, or
  restates the whole task. On a chat-chain trace: after the code was first written, a role repeats
  the dialogue's opening message or restates the whole task (a role repeating its own earlier turn
  there, such as its code, is 1.3).

A chat-chain trace (a ChatDev-style team whose trace carries the chain's state) gets the detectors of
:mod:`horizonrl.analysis.chain_detectors` as well: 1.2, 1.4, 2.3, 2.4, 2.5, 2.6 and 3.3 from the
chain's permissions, writes, runs and checks, and 3.2 (a trace without the chain's state gets its
restating-review rule); for 1.1, 1.5 and 3.1 a mode is present when the rule above or the chain's
rule finds it. 2.2 is left to the annotator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from horizonrl.analysis import chain_detectors as chain
from horizonrl.analysis.chain_history import changing_steps
from horizonrl.analysis.trace import Step, Trace
from horizonrl.analysis.verdict import Verdict

_VERIFYING_ROLES = ("verif", "review", "check", "critic")
_CHECKING_TOOLS = ("test", "verify", "check")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def step_repetition(trace: Trace) -> Verdict:
    seen: dict[tuple[str, str], int] = {}
    changed = changing_steps(trace)
    for step in trace.steps:
        keys = [(step.role, f"call:{name}:{args}") for name, args in step.tool_calls]
        if not step.tool_calls and _norm(step.text):  # a message repeated verbatim, by any role
            keys = [("", f"text:{_norm(step.text)}")]
        if step.index in changed:  # new code: calls are new, and writing it out is progress
            seen = {key: at for key, at in seen.items() if key[1].startswith("text:")}
        for key in keys:
            if key in seen and step.index not in changed:
                what = key[1].split(":", 2)
                shown = f"the call {what[1]}({what[2]})" if what[0] == "call" else "the same message"
                return Verdict(
                    mode="1.3",
                    present=True,
                    steps=[seen[key], step.index],
                    role=step.role,
                    reason=f"step {step.index} repeats {shown} of step {seen[key]}",
                )
            seen[key] = step.index
    if trace.finish == "loop":
        last = trace.steps[-1].index if trace.steps else 0
        return Verdict(
            mode="1.3", present=True, steps=[last], reason="the agent loop stopped a repeating episode"
        )
    return Verdict(mode="1.3", present=False)


def disobey_task_specification(trace: Trace) -> Verdict:
    if trace.finish == "malformed":
        last = trace.steps[-1] if trace.steps else None
        return Verdict(
            mode="1.1",
            present=True,
            steps=[last.index] if last else [],
            role=last.role if last else None,
            reason="the episode ended malformed: the required call format was not followed",
        )
    return Verdict(mode="1.1", present=False)


def unaware_of_termination(trace: Trace) -> Verdict:
    if trace.finish in ("turn_budget", "context_overflow"):
        last = trace.steps[-1] if trace.steps else None
        return Verdict(
            mode="1.5",
            present=True,
            steps=[last.index] if last else [],
            role=last.role if last else None,
            reason=f"no finish within the budget (finish: {trace.finish})",
        )
    return Verdict(mode="1.5", present=False)


def _submitted(step: Step) -> list[str]:
    """The values a final step submits: its tool calls' argument values (e.g. finish(answer=...)),
    else the numbers it states last."""
    values: list[str] = []
    for _, args in step.tool_calls:
        try:
            values += [str(v) for v in json.loads(args).values() if str(v).strip()]
        except (ValueError, AttributeError):
            continue
    if not values:
        values = re.findall(r"-?\d[\d,]*(?:\.\d+)?", step.text)[-1:]
    return values


def _verifies(step: Step, submitted: list[str]) -> bool:
    """A step checks the result: a verifying role's turn, a checking tool's call, or a call that takes
    the submitted answer as an input (e.g. recomputing 8694 - 689 after obtaining 8694)."""
    if any(word in step.role.lower() for word in _VERIFYING_ROLES):
        return True
    if any(any(word in name.lower() for word in _CHECKING_TOOLS) for name, _ in step.tool_calls):
        return True
    return any(
        v and re.search(rf"(?<![\d.]){re.escape(v)}(?![\d])", args)
        for _, args in step.tool_calls
        for v in submitted
    )


def premature_termination(trace: Trace) -> Verdict:
    if trace.finish != "finished" or trace.success or not trace.steps:
        return Verdict(mode="3.1", present=False)
    final = trace.steps[-1]
    submitted = _submitted(final)
    if any(_verifies(step, submitted) for step in trace.steps[:-1]):
        return Verdict(mode="3.1", present=False)
    return Verdict(
        mode="3.1",
        present=True,
        steps=[final.index],
        role=final.role,
        reason="finished with a wrong result, with no verification step before it",
    )


def conversation_reset(trace: Trace) -> Verdict:
    if trace.chain is not None:
        return chain.conversation_reset(trace)
    first: dict[str, int] = {}
    task = _norm(trace.task)
    for step in trace.steps:
        text = _norm(step.text)
        if step.role not in first:
            first[step.role] = step.index
            continue
        opening = _norm(trace.steps[first[step.role]].text)
        if len(opening) >= 20 and text == opening:
            return Verdict(
                mode="2.1",
                present=True,
                steps=[step.index],
                role=step.role,
                reason=f"step {step.index} repeats the role's opening turn (step {first[step.role]})",
            )
        if len(task) >= 30 and task in text:
            return Verdict(
                mode="2.1", present=True, steps=[step.index], role=step.role, reason="restates the whole task"
            )
    return Verdict(mode="2.1", present=False)


def _either(*rules: Callable[[Trace], Verdict]) -> Callable[[Trace], Verdict]:
    """A mode found by any of ``rules`` (the first that finds it gives the verdict)."""

    def detector(trace: Trace) -> Verdict:
        verdicts = [rule(trace) for rule in rules]
        return next((v for v in verdicts if v.present), verdicts[0])

    return detector


DETECTORS: dict[str, Callable[[Trace], Verdict]] = {
    "1.1": _either(disobey_task_specification, chain.disobey_task_specification),
    "1.2": chain.disobey_role_specification,
    "1.3": step_repetition,
    "1.4": chain.loss_of_conversation_history,
    "1.5": _either(unaware_of_termination, chain.unaware_of_termination),
    "2.1": conversation_reset,
    "2.3": chain.task_derailment,
    "2.4": chain.information_withholding,
    "2.5": chain.ignored_input,
    "2.6": chain.reasoning_action_mismatch,
    "3.1": _either(premature_termination, chain.premature_termination),
    "3.2": chain.no_verification,
    "3.3": chain.incorrect_verification,
}


def detect(trace: Trace, modes: list[str] | None = None) -> dict[str, Verdict]:
    """Every detector's verdict on ``trace`` (only ``modes`` where given)."""
    return {m: fn(trace) for m, fn in DETECTORS.items() if modes is None or m in modes}
