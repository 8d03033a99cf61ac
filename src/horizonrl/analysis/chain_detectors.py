"""Deterministic MAST detectors for chat-chain traces: a ChatDev-style team (CEO, CTO, programmer,
reviewer, tester) writing one function in a sandbox workspace, whose trace carries the chain's state
(:class:`~horizonrl.multiagent.chain_record.ChainFacts`: phase runs, the tools each phase gives each
role, the chain's own example runs, the final code and the entry point).

Each detector takes a trace and returns a :class:`Verdict`; on a trace without the chain's state it
returns present=False (not applicable), except the second rule of 3.2, which reads any trace. What
happened to the workspace's code (writes, runs, checks) comes from :mod:`.chain_history`.
"""

from __future__ import annotations

import itertools
import keyword
import re

from horizonrl.analysis.chain_history import (
    CONSENSUS,
    REFUSAL,
    SOLUTION,
    STATUS,
    Event,
    defines,
    events,
    latest_result,
    writes,
)
from horizonrl.analysis.trace import Step, Trace
from horizonrl.analysis.verdict import Verdict
from horizonrl.envs.humaneval.problems import code_block

VERIFYING = ("review", "verif", "check", "test", "critic")
_FAILURE = re.compile(r"Traceback|Failed example|\w*Error\b")
_ASKS_CHANGE = re.compile(r"\b(?:fix|change|wrong|error|fail|should|instead|missing)", re.IGNORECASE)
_REPORTS_FAILURE = re.compile(
    r"fail|error|exception|traceback|timed out|\bwrong\b|\bexpected\b|\bgot\b", re.I
)
_WRITE_CLAIM = re.compile(
    r"\bI(?:'ve| have)?\s+(?:now\s+|just\s+|already\s+)?"
    r"(?:written|wrote|updated|fixed|rewritten|rewrote|corrected)\b"
)
_PASS_CLAIM = re.compile(
    r"\b(?:tests?|examples?)\s+(?:now\s+|all\s+)?pass(?:es|ed)?\b"
    r"|\bpass(?:es)?\s+all\s+(?:the\s+)?(?:tests|examples)\b",
    re.IGNORECASE,
)
_WRONG_CLAIM = re.compile(r"\b(?:incorrect|bugs?|buggy|fails)\b", re.IGNORECASE)
_HEDGE = re.compile(  # words that make a claim a wish, a question or a negation
    r"\b(?:make sure|ensure|until|so that|should|must|needs?|if|whether|verify|check|let me|let's|will|"
    r"would|could|can|once|not|no|nothing|without|any)\b|n't|\?",
    re.IGNORECASE,
)


def _absent(mode: str) -> Verdict:
    return Verdict(mode=mode, present=False)


def _found(mode: str, steps: list[int], role: str | None, reason: str) -> Verdict:
    return Verdict(mode=mode, present=True, steps=sorted(set(steps)), role=role, reason=reason)


def _is_verifier(role: str) -> bool:
    return any(word in role.lower() for word in VERIFYING)


def _claims(pattern: re.Pattern[str], text: str) -> bool:
    """``text`` (outside code blocks) makes the claim plainly: no hedge earlier in its sentence."""
    prose = re.sub(r"```.*?(?:```|\Z)", " ", text, flags=re.DOTALL)
    for match in pattern.finditer(prose):
        start = max(prose.rfind(c, 0, match.start()) for c in ".!\n")
        end = min([i for i in (prose.find(c, match.end()) for c in ".!\n") if i >= 0] or [len(prose)])
        if not _HEDGE.search(prose[start + 1 : end]):
            return True
    return False


def _turn_before(trace: Trace, step: Step) -> list[Step]:
    """The steps of ``step``'s turn up to it (a turn's earlier steps are its tool rounds)."""
    turn = [step]
    for prev in reversed(trace.steps[: step.index]):
        if prev.role != step.role or prev.phase != step.phase:
            break
        turn.insert(0, prev)
    return turn


def disobey_task_specification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None or not chain.entry_point or not chain.final_code.strip():
        return _absent("1.1")
    defined = defines(chain.final_code)
    if defined is not None and chain.entry_point in defined:
        return _absent("1.1")
    written = writes(chain, trace)
    last = written[-1] if written else None
    why = "does not parse" if defined is None else f"does not define {chain.entry_point}()"
    return _found("1.1", [last.at[0]] if last else [], last.role if last else None, f"the final code {why}")


def disobey_role_specification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("1.2")
    for step in trace.steps:
        if not step.phase:
            continue
        allowed = chain.allowed(step.phase, step.role)
        for name, _ in step.tool_calls:
            if name not in allowed:
                why = f"{step.role} called {name}, which phase {step.phase} does not give it"
                return _found("1.2", [step.index], step.role, why)
        if "write_file" not in allowed and code_block(step.text) is not None:
            why = f"{step.role} wrote the code, which phase {step.phase} does not let it write"
            return _found("1.2", [step.index], step.role, why)
    return _absent("1.2")


def loss_of_conversation_history(trace: Trace) -> Verdict:
    if trace.chain is None:
        return _absent("1.4")
    versions = [(e, " ".join(e.code.split())) for e in writes(trace.chain, trace)]
    for k, (write, code) in enumerate(versions):
        for j in range(k - 1):
            if versions[j][1] == code and any(other != code for _, other in versions[j + 1 : k]):
                steps = [versions[j][0].at[0], write.at[0]]
                why = f"step {write.at[0]} reverts {SOLUTION} to the version of step {steps[0]}"
                return _found("1.4", steps, write.role, why)
    return _absent("1.4")


def unaware_of_termination(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("1.5")
    history = events(chain, trace)
    for run in chain.phases:
        if run.ended != "turn_cap" or run.last_step < 0:
            continue
        state = [
            e for e in history if e.at < (run.last_step, 0) and e.kind in ("write", "run_examples", "check")
        ]
        state = [e for e in state if e.kind == "write" or e.passed is not None]
        if state and state[-1].passed:
            role = trace.steps[run.last_step].role if run.last_step < len(trace.steps) else None
            why = f"phase {run.name} ran to its turn cap after the examples had passed"
            return _found("1.5", [max(state[-1].at[0], 0), run.last_step], role, why)
    return _absent("1.5")


def _signature_names(trace: Trace, entry_point: str) -> set[str]:
    """The identifiers of the task's signature: the entry point, its parameters and their types."""
    names = {entry_point} if entry_point else set()
    name = re.escape(entry_point) if entry_point else r"\w+"
    match = re.search(rf"def\s+({name})\s*\((.*?)\)\s*(?:->\s*([^:\n]+))?:", trace.task, re.DOTALL)
    if match:
        words = re.findall(r"[A-Za-z_]\w*", " ".join(g or "" for g in match.groups()))
        names |= {w for w in words if len(w) > 1 and not keyword.iskeyword(w)} | {match.group(1)}
    return names


def _mentions(text: str, names: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text, re.IGNORECASE) for n in names)


def task_derailment(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.3")
    names = _signature_names(trace, chain.entry_point)
    for step in trace.steps:
        if names and not step.tool_calls and len(step.text) >= 200 and not _mentions(step.text, names):
            why = (
                f"{step.role} writes {len(step.text)} characters about neither the function nor its arguments"
            )
            return _found("2.3", [step.index], step.role, why)
    for write in writes(chain, trace) if chain.entry_point else []:
        defined = defines(write.code)
        if defined is None:
            defined = set(re.findall(r"^def\s+(\w+)", write.code, re.MULTILINE))
        if defined and chain.entry_point not in defined:
            why = f"the code written defines {', '.join(sorted(defined))} but not {chain.entry_point}"
            return _found("2.3", [write.at[0]], write.role, why)
    return _absent("2.3")


def information_withholding(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.4")
    for step in trace.steps:
        seen = REFUSAL.sub("", step.observation)
        bad = [s for s in STATUS.finditer(seen) if s.group(1) != "0"]
        if not bad and not _FAILURE.search(seen):
            continue
        after = trace.steps[step.index + 1] if step.index + 1 < len(trace.steps) else None
        if after is not None and after.role == step.role and after.phase == step.phase:
            continue  # the role steps again and can still report it
        failing = {chain.entry_point} - {""}
        failing |= set(re.findall(r", in (\w+)\s*$", seen, re.MULTILINE))
        failing |= set(re.findall(r"Failed example:\s+(\w+)\(", seen))
        if not _REPORTS_FAILURE.search(step.text) and not _mentions(step.text, failing):
            why = f"{step.role} ends its turn on a failed run without telling the other role about it"
            return _found("2.4", [step.index], step.role, why)
    return _absent("2.4")


def ignored_input(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.5")
    for run in chain.phases:
        if (
            len(run.roles) != 2
            or run.first_step < 0
            or "write_file" not in chain.allowed(run.name, run.roles[1])
        ):
            continue
        instructor, assistant = run.roles
        steps = trace.steps[run.first_step : run.last_step + 1]
        turns: list[list[Step]] = []  # the phase's turns: runs of one role's steps
        for step in steps:
            if turns and turns[-1][0].role == step.role:
                turns[-1].append(step)
            else:
                turns.append([step])
        for asked, answer in itertools.pairwise(turns[1:]):
            said = asked[-1]  # the text the assistant reads
            if said.role != instructor or answer[0].role != assistant or not _ASKS_CHANGE.search(said.text):
                continue
            if not any(s.tool_calls or code_block(s.text) is not None for s in answer):
                why = f"{assistant} answers {instructor}'s request for a change without changing anything"
                return _found("2.5", [said.index, answer[-1].index], assistant, why)
    return _absent("2.5")


def _false_pass(history: list[Event], step: Step) -> Event | None:
    """The failed run or check ``step`` claims passed, if it claims a pass."""
    if not _claims(_PASS_CLAIM, step.text):
        return None
    latest = latest_result(history, (step.index, 0), ("run_examples", "run_python"))
    return latest if latest is not None and not latest.passed else None


def reasoning_action_mismatch(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.6")
    history = events(chain, trace)
    for step in trace.steps:
        if _claims(_WRITE_CLAIM, step.text):
            turn = _turn_before(trace, step)
            wrote = any(n == "write_file" for s in turn for n, _ in s.tool_calls)
            if not wrote and not any(code_block(s.text) is not None for s in turn):
                why = f"{step.role} says it wrote the code but wrote nothing"
                return _found("2.6", [step.index], step.role, why)
        failed = _false_pass(history, step)
        if failed is not None:
            why = f"{step.role} says the examples pass after a failed run"
            return _found("2.6", [max(failed.at[0], 0), step.index], step.role, why)
    return _absent("2.6")


def premature_termination(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None or trace.success:
        return _absent("3.1")
    history = events(chain, trace)
    for run in chain.phases:
        if run.ended != "consensus" or run.last_step < 0:
            continue
        if chain.permissions.get(run.name) and not any(
            "run_examples" in tools for tools in chain.permissions[run.name].values()
        ):
            continue  # a phase that cannot run the examples accepts no checked work
        before = [e for e in history if e.at <= (run.last_step, 0)]
        wrote = [i for i, e in enumerate(before) if e.kind == "write"]
        if not wrote:
            continue
        since = before[wrote[-1] + 1 :]
        if not any(e.passed and e.kind in ("run_examples", "check") for e in since):
            why = f"phase {run.name} ended by consensus on code no passing run had checked"
            return _found("3.1", [run.last_step], run.consensus_by, why)
    return _absent("3.1")


def _restating(trace: Trace, role: str) -> bool:
    """Every turn of a verifying role restates: no tool call, no number, no code from the solution."""
    steps = [s for s in trace.steps if s.role == role]
    lines = [ln.strip() for ln in (trace.chain.final_code if trace.chain else "").splitlines()]
    code = [ln for ln in lines if len(ln) >= 10]
    return bool(steps) and all(
        not s.tool_calls and not re.search(r"\d|`", s.text) and not any(ln in s.text for ln in code)
        for s in steps
    )


def no_verification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is not None:
        history = events(chain, trace)
        last = max((i for i, e in enumerate(history) if e.kind == "write"), default=None)
        if last is not None:
            after = history[last + 1 :]
            runs = [
                e
                for e in after
                if e.kind in ("run_examples", "run_python") or (e.kind == "check" and not e.final)
            ]
            if not runs:
                write = history[last]
                why = f"the code written at step {write.at[0]} was never run before the end"
                return _found("3.2", [write.at[0]], write.role, why)
    for role in trace.roles:
        if _is_verifier(role) and _restating(trace, role):
            steps = [s.index for s in trace.steps if s.role == role]
            return _found("3.2", steps, role, f"{role} only restates: no run, no number, no code checked")
    return _absent("3.2")


def incorrect_verification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("3.3")
    if not trace.success:
        for run in chain.phases:
            if run.ended == "consensus" and run.consensus_by and _is_verifier(run.consensus_by):
                why = f"{run.consensus_by} approved ({CONSENSUS}) code that fails the hidden tests"
                return _found("3.3", [run.last_step], run.consensus_by, why)
    history = events(chain, trace)
    for step in trace.steps:
        if not _is_verifier(step.role):
            continue
        failed = _false_pass(history, step)
        if failed is not None:
            return _found("3.3", [step.index], step.role, f"{step.role} says the examples pass; they failed")
        latest = latest_result(history, (step.index, 0), ("run_examples",))
        changed = latest is not None and any(
            e.kind == "write" and latest.at < e.at <= (step.index, 0) for e in history
        )
        if (
            trace.success
            and latest is not None
            and latest.passed
            and not changed
            and _claims(_WRONG_CLAIM, step.text)
        ):
            why = f"{step.role} calls passing code wrong, and the code passes the hidden tests"
            return _found("3.3", [step.index], step.role, why)
    return _absent("3.3")
