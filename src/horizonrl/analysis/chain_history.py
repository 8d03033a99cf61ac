"""What a chat-chain trace says happened to its workspace's code, in order: the solution file's
writes, the runs of it (``run_examples``, ``run_python``) with their results, and the chain's own
checks, rebuilt from the steps and the chain's state
(:class:`~horizonrl.multiagent.chain_record.ChainFacts`) for the chain detectors.

A write is a ``write_file`` of solution.py the chain did not refuse, or a reply without tool calls
whose ```python block defines a function from a role the phase lets write (the chain writes that
block); a run's result is its observation's status line (``[exit code N]``, ``[timed out]``; exit
code 0 passes); a chain check counts right after the step it follows. A step that writes the
consensus marker runs none of its calls.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass

from horizonrl.analysis.trace import Step, Trace
from horizonrl.envs.humaneval.problems import code_block
from horizonrl.multiagent.chain_record import ChainFacts

CONSENSUS = "<INFO> Finished"
SOLUTION = "solution.py"
STATUS = re.compile(r"^\[(?:exit code (-?\d+)|timed out)\]", re.MULTILINE)
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
    return sorted(out, key=lambda e: e.at)  # stable: a step's calls keep their order


def writes(chain: ChainFacts, trace: Trace) -> list[Event]:
    """The writes of the solution file, in order."""
    return [e for e in events(chain, trace) if e.kind == "write"]


def latest_result(history: list[Event], until: tuple[int, int], runs: tuple[str, ...]) -> Event | None:
    """The last run or check with a result at or before ``until`` (``runs``: which calls count)."""
    done = [e for e in history if e.at <= until and e.passed is not None and e.kind in (*runs, "check")]
    return done[-1] if done else None


def defines(code: str) -> set[str] | None:
    """The functions ``code`` defines at its top level (None: it does not parse)."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return None
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
