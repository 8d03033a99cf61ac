"""What a chat-chain trace says happened to its workspace's code, in order: the solution file's
writes, the runs of it (``run_examples``, ``run_python``) with their results, and the chain's own
checks, rebuilt from the steps and the chain's state
(:class:`~horizonrl.multiagent.chain_record.ChainFacts`) for the chain detectors.

A write is a ``write_file`` of solution.py the chain did not refuse, or a reply without tool calls
whose ```python block defines a function from a role the phase lets write (the chain writes that
block); a run's result is its observation's status line (``[exit code N]``, ``[timed out]``; exit
code 0 passes); a chain check counts right after the step it follows. A step that writes the
consensus marker runs none of its calls. A write *changes* the code unless it writes the program the file
already holds (equal up to layout, comments and docstrings: ``normalize_code``).

A version's *outcome* is what the examples said of it: the first run of the examples or chain check
after it was written and before the next change (None when none ran). A version is *right* or
*wrong* by its outcome, and by the hidden tests when it stayed to the end: wrong code fails the
examples or the hidden tests.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass

from horizonrl.analysis.trace import Step, Trace
from horizonrl.envs.humaneval.problems import code_block, normalize_code
from horizonrl.multiagent.chain_record import ChainFacts

CONSENSUS = "<INFO> Finished"
SOLUTION = "solution.py"
STATUS = re.compile(r"^\[(?:exit code (-?\d+)|timed out)\]", re.MULTILINE)
RUNS = ("run_examples", "run_python")
REFUSAL = re.compile(r"^Error: (?:role '[^']*' may not call|phase '[^']*' writes only).*$", re.MULTILINE)


@dataclass
class Event:
    """What happened to the workspace's code: a write, a run of it, or a chain check."""

    at: tuple[int, int]  # (step, 0) for a step's own calls; (after_step, 1) for a chain check
    kind: str  # "write", "run_examples", "run_python" or "check"
    role: str = ""
    passed: bool | None = None
    code: str = ""
    final: bool = False  # the chain's final check
    changed: bool = False  # a write that changed the code (see the module doc)


def _args(raw: str) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _refused(step: Step, name: str, path: str = "") -> bool:
    """The chain refused a call of ``name`` in this step (not the role's tool, or not the phase's file)."""
    for line in REFUSAL.findall(step.observation):
        if re.search(rf"may not call {re.escape(name)}\b", line) or (path and repr(path) in line):
            return True
    return False


def _may_write(chain: ChainFacts, step: Step) -> bool:
    if not step.phase:
        return step.role == "programmer"
    return "write_file" in chain.allowed(step.phase, step.role)


def _step_events(chain: ChainFacts, step: Step) -> list[Event]:
    if CONSENSUS in step.text:  # the marker ends the turn before any call runs
        return []
    at = (step.index, 0)
    if not step.tool_calls:
        code = code_block(step.text)
        if code is not None and _may_write(chain, step):
            return [Event(at, "write", step.role, code=code)]
        return []
    events: list[Event] = []
    statuses = iter(STATUS.finditer(step.observation))
    for name, raw in step.tool_calls:
        args = _args(raw)
        if name == "write_file":
            path = str(args.get("path", SOLUTION))
            if path.removeprefix("/workspace/") == SOLUTION and not _refused(step, name, path):
                events.append(Event(at, "write", step.role, code=str(args.get("content", ""))))
        elif name in ("run_examples", "run_python") and not _refused(step, name):
            status = next(statuses, None)
            passed = None if status is None else status.group(1) == "0"
            events.append(Event(at, name, step.role, passed=passed))
    return events


def events(chain: ChainFacts, trace: Trace) -> list[Event]:
    """The workspace's history in order: each step's writes and runs, each chain check after its step."""
    checks = sorted(chain.checks, key=lambda c: c.after_step)
    out = [Event((c.after_step, 1), "check", passed=c.passed, final=c.phase == "final") for c in checks]
    for step in trace.steps:
        out += _step_events(chain, step)
    out.sort(key=lambda e: e.at)  # stable: a step's calls keep their order
    current = None
    for event in out:
        if event.kind == "write":
            event.changed = normalize_code(event.code) != current
            current = normalize_code(event.code)
    return out


def outcome(history: list[Event], index: int) -> bool | None:
    """What the examples said of the version the write ``history[index]`` wrote (module doc)."""
    for event in history[index + 1 :]:
        if event.kind == "write" and event.changed:
            return None
        if event.kind in ("run_examples", "check") and event.passed is not None:
            return event.passed
    return None


def stays(history: list[Event], index: int) -> bool:
    """The version the write ``history[index]`` wrote is the final code (no change after it)."""
    return not any(e.kind == "write" and e.changed for e in history[index + 1 :])


def judged(history: list[Event], index: int, chain: ChainFacts, success: bool) -> bool | None:
    """Whether the version the write ``history[index]`` wrote is right (module doc; None: nothing
    says): the final version (it stayed, or the final code is the same program) by the hidden tests
    when they failed it or the examples never ran on it, else by its outcome."""
    said = outcome(history, index)
    code = normalize_code(history[index].code)
    final = stays(history, index) or code == normalize_code(chain.final_code)
    if final and (not success or said is None):
        return success
    return said


def writes(chain: ChainFacts, trace: Trace) -> list[Event]:
    """The writes of the solution file, in order."""
    return [e for e in events(chain, trace) if e.kind == "write"]


def latest_result(history: list[Event], until: tuple[int, int], runs: tuple[str, ...]) -> Event | None:
    """The last run or check with a result at or before ``until`` (``runs``: which calls count)."""
    done = [e for e in history if e.at <= until and e.passed is not None and e.kind in (*runs, "check")]
    return done[-1] if done else None


def _parsed(code: str) -> ast.Module | None:
    """``code`` parsed (dedented first), None when it does not parse."""
    try:
        return ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return None


def defines(code: str) -> set[str] | None:
    """The functions ``code`` defines at its top level (None: it does not parse)."""
    tree = _parsed(code)
    if tree is None:
        return None
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def names(code: str) -> set[str]:
    """The identifiers ``code`` uses (functions, arguments, variables, attributes) of three
    characters or more (none when it does not parse)."""
    tree = _parsed(code)
    if tree is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        for field in ("id", "arg", "attr", "name"):
            value = getattr(node, field, None)
            if isinstance(value, str) and len(value) >= 3:
                found.add(value)
    return found


def turns(steps: list[Step]) -> list[list[Step]]:
    """``steps`` as turns: runs of one role's steps in one phase."""
    out: list[list[Step]] = []
    for step in steps:
        if out and (out[-1][0].role, out[-1][0].phase) == (step.role, step.phase):
            out[-1].append(step)
        else:
            out.append([step])
    return out


def changing_steps(trace: Trace) -> set[int]:
    """The steps of a chain trace that changed the code (none without the chain's state)."""
    if trace.chain is None:
        return set()
    return {e.at[0] for e in events(trace.chain, trace) if e.kind == "write" and e.changed}


def last_change(history: list[Event], until: tuple[int, int]) -> int | None:
    """The index in ``history`` of the last write that changed the code at or before ``until``."""
    done = [i for i, e in enumerate(history) if e.kind == "write" and e.changed and e.at <= until]
    return done[-1] if done else None


def ran_after(
    history: list[Event], after: int | None, until: tuple[int, int], start: tuple[int, int] = (-1, 0)
) -> bool:
    """A role ran the code (a run with a result) after the event ``history[after]`` (None: from the
    start), from ``start`` up to ``until``."""
    first = after + 1 if after is not None else 0
    return any(e.kind in RUNS and e.passed is not None and start <= e.at <= until for e in history[first:])


def stub(code: str, name: str) -> bool:
    """``code`` defines ``name`` with no statement but its docstring, ``pass`` or ``...``."""
    tree = _parsed(code)
    if tree is None:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return all(
                isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                for s in node.body
            )
    return False
