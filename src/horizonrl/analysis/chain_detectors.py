"""Deterministic MAST detectors for chat-chain traces: a ChatDev-style team (CEO, CTO, programmer,
reviewer, tester) writing one function in a sandbox workspace, whose trace carries the chain's state
(:class:`~horizonrl.multiagent.chain_record.ChainFacts`: phase runs, the tools each phase gives each
role, the chain's own example runs, the final code and the entry point).

Each detector takes a trace and returns a :class:`Verdict`; on a trace without the chain's state it
returns present=False (not applicable), except the restating-review rule of 3.2, which reads only
traces without it. What happened to the workspace's code (writes, changes, runs, checks, which
version was right or wrong) comes from :mod:`.chain_history`; how a turn's text is read (plain
claims, named code, a run's details, talk off the task) from :mod:`.chain_text`. A *turn* is a run
of one role's steps in one phase; a *verifying* role reviews, tests or checks; a *verdict* is a
verifying role's consensus marker or plain approval ("is correct", "looks good", "works" …).

- 1.1: the final code does not define the asked-for function, does not parse, or defines it
  without a body (only its docstring, ``pass`` or ``...``).
- 1.2: a role calls a tool its phase does not give it, or writes a code block defining a function
  where its phase does not let it write.
- 1.4: a write puts back a version the examples had failed, or replaces a right version with a wrong
  one that nobody asked for (the instructor's last turn names no code the new version uses).
- 1.5: the test-and-fix cycles ran out (the last one ended on its turn cap) with the final check
  failing; or a reviewing or testing phase ran to its turn cap when the work was done and no fix was
  asked for (no fail, wrong, bug, missing, should … from its instructor): the examples had passed a
  full turn before its end with no failure after, or the check after it passed, nothing in it had
  failed on the current code and its last two turns changed nothing.
- 2.1 (:func:`conversation_reset`, called by :mod:`.detectors`): after the code was first written, a
  role repeats the dialogue's opening message or restates the whole task.
- 2.3: a turn of talk (12 words or more, no number, code or formula, not a closing with the marker)
  shares no content word with the task, the code or the job; written code defines functions but not
  the asked-for one, or adds a command line (``__main__``, ``argparse``, ``sys.argv``, ``input()``)
  the task does not ask for.
- 2.4: a turn whose last run failed (or which calls its run's output wrong) ends without passing on
  any detail the run showed (a value, an error name, a failed call, a printed line) or a diagnosis
  naming the code; a role that changes the code after its run owes no report.
- 2.5: an instructor asks for a change or for code, and the assistant, which may write, answers with
  neither a tool call nor a code block, or writes back the code the file already holds.
- 2.6: a turn says "I have written/fixed …" without a write (an echo of an earlier message is 1.3,
  not a claim), says it will run the examples and runs nothing, says it uses a code expression its
  own write lacks ("I will use range(n + 1)" and ``range(n)``), or says the tests pass after a
  failed run.
- 3.1: a phase that can run the examples ended by consensus while nothing in it had run the code
  since its last change, and that code was wrong (even if a later cycle repaired it).
- 3.2: the final code was never run after its last change (only the final check ran it), or a
  verdict came with nothing run on the code since its last change.
- 3.3: a verdict on wrong code, a verifying role saying the examples pass after they failed, or a
  verifying role calling the final, passing code of a passed episode wrong.
"""

from __future__ import annotations

import itertools
import re

from horizonrl.analysis import chain_text as text
from horizonrl.analysis.chain_history import (
    CONSENSUS,
    REFUSAL,
    RUNS,
    STATUS,
    Event,
    defines,
    events,
    judged,
    last_change,
    latest_result,
    names,
    outcome,
    ran_after,
    stub,
    turns,
    writes,
)
from horizonrl.analysis.trace import Step, Trace
from horizonrl.analysis.verdict import Verdict
from horizonrl.envs.humaneval.problems import code_block, normalize_code

VERIFYING = ("review", "verif", "check", "test", "critic")
_FAILURE = re.compile(r"Traceback|Failed example|\w*Error\b")
_ASKS_CHANGE = re.compile(
    r"\b(?:fix|change|wrong|error|fail|should|instead|missing|please|write)", re.IGNORECASE
)
_SCRIPT = re.compile(r"__name__\s*==|\bargparse\b|\bsys\.argv\b|\binput\(")


def _absent(mode: str) -> Verdict:
    return Verdict(mode=mode, present=False)


def _found(mode: str, steps: list[int], role: str | None, reason: str) -> Verdict:
    return Verdict(mode=mode, present=True, steps=sorted(set(steps)), role=role, reason=reason)


def _is_verifier(role: str) -> bool:
    return any(word in role.lower() for word in VERIFYING)


def _turn_of(trace: Trace, step: Step) -> list[Step]:
    return next(t for t in turns(trace.steps) if step in t)


def _verdict(step: Step) -> bool:
    return _is_verifier(step.role) and (CONSENSUS in step.text or text.claims(text.APPROVAL, step.text))


def disobey_task_specification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None or not chain.entry_point or not chain.final_code.strip():
        return _absent("1.1")
    defined = defines(chain.final_code)
    entry = chain.entry_point
    if defined is not None and entry in defined and not stub(chain.final_code, entry):
        return _absent("1.1")
    written = writes(chain, trace)
    last = written[-1] if written else None
    why = "does not parse" if defined is None else f"does not define {entry}()"
    why = f"defines {entry}() without a body" if defined and entry in defined else why
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


def _asked_for(trace: Trace, write: Event) -> bool:
    """The instructor's last turn before ``write`` names code the written version uses."""
    step = trace.steps[write.at[0]]
    before = [s for s in trace.steps[: step.index] if s.phase == step.phase and s.role != step.role]
    if not before:
        return False
    code = text.squeeze(write.code)
    return any(term in code for s in _turn_of(trace, before[-1]) for term in text.code_terms(s.text))


def loss_of_conversation_history(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("1.4")
    history = events(chain, trace)
    for i, write in enumerate(history):
        if write.kind != "write" or not write.changed:
            continue
        code = normalize_code(write.code)
        for j, old in enumerate(history[:i]):
            if old.kind == "write" and normalize_code(old.code) == code and outcome(history, j) is False:
                why = f"step {write.at[0]} puts back the version of step {old.at[0]}, which had failed"
                return _found("1.4", [old.at[0], write.at[0]], write.role, why)
        before = next((j for j in range(i - 1, -1, -1) if history[j].kind == "write"), None)
        if (
            before is not None
            and judged(history, before, chain, trace.success)
            and judged(history, i, chain, trace.success) is False
            and not _asked_for(trace, write)
        ):
            was = history[before].at[0]
            why = f"step {write.at[0]} replaces the right version of step {was} with a wrong one"
            return _found("1.4", [was, write.at[0]], write.role, why)
    return _absent("1.4")


def unaware_of_termination(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("1.5")
    history = events(chain, trace)
    runs = [r for r in chain.phases if r.last_step >= 0]
    finals = [c for c in chain.checks if c.phase == "final"]
    if runs and runs[-1].cycle >= 1 and runs[-1].ended == "turn_cap" and finals and not finals[-1].passed:
        role = trace.steps[runs[-1].last_step].role if runs[-1].last_step < len(trace.steps) else None
        why = "the test-and-fix cycles ran out on their turn cap with the examples still failing"
        return _found("1.5", [runs[-1].last_step], role, why)
    for run in runs:
        if run.ended != "turn_cap" or not run.roles or not _is_verifier(run.roles[0]):
            continue
        if not 0 <= run.first_step <= run.last_step < len(trace.steps):
            continue
        phase = turns(trace.steps[run.first_step : run.last_step + 1])
        end, role = (run.last_step, 0), trace.steps[run.last_step].role
        inside = [i for i, e in enumerate(history) if (run.first_step, 0) <= e.at <= end]
        failed = [i for i in inside if history[i].kind in RUNS and history[i].passed is False]
        for k, turn in enumerate(phase[:-1]):  # the examples passed a full turn before the end
            steps = {s.index for s in turn}
            passed = [i for i in inside if history[i].kind == "run_examples" and history[i].passed]
            passed = [i for i in passed if history[i].at[0] in steps]
            asked = [s.text for t in phase[k + 1 :] if t[0].role == run.roles[0] for s in t]
            fix = any(text.DEFECT.search(said) for said in asked)  # a real fix under way
            if passed and not fix and not any(i > passed[-1] for i in failed):
                why = f"phase {run.name} ran to its turn cap after the examples had passed"
                return _found("1.5", [history[passed[-1]].at[0], run.last_step], role, why)
        change = last_change(history, end)
        after = latest_result(history, (run.last_step, 1), ("run_examples",))
        last_two = {s.index for t in phase[-2:] for s in t}
        idle = not any(history[i].changed and history[i].at[0] in last_two for i in inside)
        idle = idle and not any(
            text.DEFECT.search(s.text) for t in phase[-2:] if t[0].role == run.roles[0] for s in t
        )
        failed = [i for i in failed if change is None or i > change]
        if after is not None and after.passed and not failed and idle:
            why = f"phase {run.name} ran to its turn cap on right code, its last turns changing nothing"
            return _found("1.5", [run.last_step], role, why)
    return _absent("1.5")


def conversation_reset(trace: Trace) -> Verdict:
    """2.1 on a chain trace: after the first write, a role repeats the opening message or the task."""
    chain = trace.chain
    if chain is None or not trace.steps:
        return _absent("2.1")
    history = events(chain, trace)
    first = next((e.at for e in history if e.kind == "write"), None)
    opening = " ".join(trace.steps[0].text.split()).lower()
    task = " ".join(trace.task.split()).lower()
    for step in trace.steps[1:]:
        said = " ".join(step.text.split()).lower()
        if first is None or (step.index, 0) <= first:
            continue
        if len(opening) >= 20 and said == opening:
            why = f"step {step.index} repeats the opening message (step 0) after the code was written"
            return _found("2.1", [0, step.index], step.role, why)
        if len(task) >= 30 and task in said:
            return _found("2.1", [step.index], step.role, "restates the whole task")
    return _absent("2.1")


def task_derailment(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.3")
    written = writes(chain, trace)
    posted = [code_block(s.text) or "" for s in trace.steps]
    vocabulary = text.topic(trace.task, chain.final_code, *posted, *(w.code for w in written))
    for step in trace.steps:
        talk = not step.tool_calls and code_block(step.text) is None
        closing = CONSENSUS in step.text  # a closing remark is no drift
        if talk and not closing and text.off_topic(step.text, vocabulary):
            why = f"{step.role} talks about neither the task nor the code"
            return _found("2.3", [step.index], step.role, why)
    for write in written if chain.entry_point else []:
        defined = defines(write.code)
        if defined is None:
            defined = set(re.findall(r"^def\s+(\w+)", write.code, re.MULTILINE))
        if defined and chain.entry_point not in defined:
            why = f"the code written defines {', '.join(sorted(defined))} but not {chain.entry_point}"
            return _found("2.3", [write.at[0]], write.role, why)
        if _SCRIPT.search(write.code) and not _SCRIPT.search(trace.task):
            why = "the code written adds a command line the task does not ask for"
            return _found("2.3", [write.at[0]], write.role, why)
    return _absent("2.3")


def information_withholding(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.4")
    history = events(chain, trace)
    for turn in turns(trace.steps):
        ran = [k for k, s in enumerate(turn) if any(n in RUNS for n, _ in s.tool_calls)]
        if not ran:
            continue
        mine = [i for i, e in enumerate(history) if e.at[1] == 0 and e.at[0] in {s.index for s in turn}]
        last_run = max((i for i in mine if history[i].kind in RUNS), default=-1)
        if any(history[i].changed for i in mine if i > last_run):
            continue  # the role acted on what it saw: it changed the code
        seen = REFUSAL.sub("", turn[ran[-1]].observation)
        said = " ".join(s.text for s in turn[ran[-1] + 1 :])
        shown = text.details(seen, chain.entry_point)
        written = [names(e.code) for e in history[: last_run + 1] if e.kind == "write"]
        code_names = set().union(*written) - {chain.entry_point}
        failed = any(s.group(1) != "0" for s in STATUS.finditer(seen)) or bool(_FAILURE.search(seen))
        called_wrong = bool(shown) and bool(text.REPORTS_FAILURE.search(said))
        if (failed or called_wrong) and not text.passes_on(said, shown, code_names):
            step = turn[-1]
            why = f"{step.role} saw a failing run and passes on nothing of what it showed"
            return _found("2.4", [turn[ran[-1]].index, step.index], step.role, why)
    return _absent("2.4")


def ignored_input(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.5")
    history = events(chain, trace)
    for run in chain.phases:
        if (
            len(run.roles) != 2
            or run.first_step < 0
            or "write_file" not in chain.allowed(run.name, run.roles[1])
        ):
            continue
        instructor, assistant = run.roles
        for asked, answer in itertools.pairwise(turns(trace.steps[run.first_step : run.last_step + 1])):
            said = asked[-1]  # the text the assistant reads
            if said.role != instructor or answer[0].role != assistant or not _ASKS_CHANGE.search(said.text):
                continue
            steps = {s.index for s in answer}
            rewrote = [e for e in history if e.kind == "write" and e.at[0] in steps]
            if not any(s.tool_calls or code_block(s.text) is not None for s in answer):
                why = f"{assistant} answers {instructor}'s request without changing anything"
                return _found("2.5", [said.index, answer[-1].index], assistant, why)
            if rewrote and not any(e.changed for e in rewrote):
                why = f"{assistant} answers {instructor}'s request with the code unchanged"
                return _found("2.5", [said.index, rewrote[0].at[0]], assistant, why)
    return _absent("2.5")


def _false_pass(history: list[Event], step: Step) -> Event | None:
    """The failed run or check ``step`` claims passed, if it claims a pass."""
    if not text.claims(text.PASS_CLAIM, step.text):
        return None
    latest = latest_result(history, (step.index, 0), RUNS)
    return latest if latest is not None and not latest.passed else None


def reasoning_action_mismatch(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("2.6")
    history = events(chain, trace)
    said_before: set[str] = set()
    for step in trace.steps:
        turn = _turn_of(trace, step)
        echo = " ".join(step.text.split()) in said_before
        said_before.add(" ".join(step.text.split()))
        wrote = [e for e in history if e.kind == "write" and e.at[0] in {s.index for s in turn}]
        if text.claims(text.WRITE_CLAIM, step.text) and not echo:
            upto = [s.index for s in turn if s.index <= step.index]
            if not any(e.at[0] in upto for e in wrote):
                why = f"{step.role} says it wrote the code but wrote nothing"
                return _found("2.6", [step.index], step.role, why)
        runs = [n for s in turn if s.index >= step.index for n, _ in s.tool_calls if n in RUNS]
        if text.RUN_PLAN.search(text.prose(step.text)) and not echo and not runs:
            why = f"{step.role} says it will run the code and runs nothing"
            return _found("2.6", [step.index], step.role, why)
        code = "".join(text.squeeze(e.code) for e in wrote)
        missing = [t for t in text.own_uses(step.text, chain.entry_point) if wrote and t not in code]
        if missing:
            why = f"{step.role} says it uses {missing[0]}, which the code it wrote lacks"
            return _found("2.6", [step.index], step.role, why)
        failed = _false_pass(history, step)
        if failed is not None:
            why = f"{step.role} says the examples pass after a failed run"
            return _found("2.6", [max(failed.at[0], 0), step.index], step.role, why)
    return _absent("2.6")


def premature_termination(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("3.1")
    history = events(chain, trace)
    for run in chain.phases:
        if run.ended != "consensus" or run.last_step < 0:
            continue
        if chain.permissions.get(run.name) and not any(
            "run_examples" in tools for tools in chain.permissions[run.name].values()
        ):
            continue  # a phase that cannot run the examples accepts no checked work
        change = last_change(history, (run.last_step, 0))
        if change is None:
            continue
        ran = ran_after(history, change, (run.last_step, 0), (run.first_step, 0))
        if not ran and judged(history, change, chain, trace.success) is False:
            why = f"phase {run.name} ended by consensus on wrong code nothing in it had run"
            return _found("3.1", [run.last_step], run.consensus_by, why)
    return _absent("3.1")


def _restating(trace: Trace, role: str) -> bool:
    """Every turn of a verifying role restates: no tool call, no number, no code."""
    steps = [s for s in trace.steps if s.role == role]
    return bool(steps) and all(not s.tool_calls and not re.search(r"\d|`", s.text) for s in steps)


def no_verification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        for role in trace.roles:
            if _is_verifier(role) and _restating(trace, role):
                steps = [s.index for s in trace.steps if s.role == role]
                return _found("3.2", steps, role, f"{role} only restates: no run, no number, no code checked")
        return _absent("3.2")
    history = events(chain, trace)
    last = last_change(history, (len(trace.steps), 2))
    if last is not None:
        runs = [e for e in history[last + 1 :] if e.kind in RUNS or (e.kind == "check" and not e.final)]
        if not runs:
            write = history[last]
            why = f"the code written at step {write.at[0]} was never run before the end"
            return _found("3.2", [write.at[0]], write.role, why)
    for step in trace.steps:
        change = last_change(history, (step.index, 0))
        if _verdict(step) and not ran_after(history, change, (step.index, 0)):
            why = f"{step.role} gives its verdict with nothing run on the code since its last change"
            return _found("3.2", [step.index], step.role, why)
    return _absent("3.2")


def incorrect_verification(trace: Trace) -> Verdict:
    chain = trace.chain
    if chain is None:
        return _absent("3.3")
    history = events(chain, trace)
    final = normalize_code(chain.final_code)
    for step in trace.steps:
        if not _is_verifier(step.role):
            continue
        change = last_change(history, (step.index, 0))
        right = None if change is None else judged(history, change, chain, trace.success)
        if _verdict(step) and right is False:
            why = f"{step.role} approves code that is wrong"
            return _found("3.3", [step.index], step.role, why)
        failed = _false_pass(history, step)
        if failed is not None:
            return _found("3.3", [step.index], step.role, f"{step.role} says the examples pass; they failed")
        latest = latest_result(history, (step.index, 0), ("run_examples",))
        if (
            trace.success
            and change is not None
            and normalize_code(history[change].code) == final
            and latest is not None
            and latest.passed
            and any(e is latest for e in history[change + 1 :])
            and text.claims(text.WRONG_CLAIM, step.text)
        ):
            why = f"{step.role} calls passing code wrong, and the code passes the hidden tests"
            return _found("3.3", [step.index], step.role, why)
    return _absent("3.3")
