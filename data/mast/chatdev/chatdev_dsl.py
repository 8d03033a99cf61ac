"""A small way of writing a software_company chain trace by hand: the steps each role took (text,
tool calls and what the tools answered) in the order they were taken, the chain's own example runs
and the hand labels. What follows from the chain's rules alone is filled in and checked here: the
phase spans and how each phase ended, the refusal a tool call outside the phase's permissions gets,
the write_file answer, solution.py as it stands after each step (a programmer's reply without tool
calls whose ```python block defines a function is written to it), the final code. What each role
said and every run's output (pasted from a real run of that code) are written out in the trace files.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from horizonrl.analysis.mast import MODE_IDS
from horizonrl.analysis.trace import TraceRecord
from horizonrl.envs.humaneval.problems import code_block
from horizonrl.multiagent.chain_record import ChainCheck, ChainFacts, ChainPhaseRun

MARKER = "<INFO> Finished"
SOLUTION = "solution.py"
PERMISSIONS: dict[str, dict[str, list[str]]] = {  # software_company.yaml, every role of every phase
    "design": {"ceo": [], "cto": []},
    "coding": {"cto": [], "programmer": ["write_file", "run_python"]},
    "code_review": {"reviewer": ["run_examples"], "programmer": ["write_file"]},
    "testing": {"tester": ["run_python"], "programmer": ["write_file", "run_examples"]},
}
PHASES = {  # name -> (instructor, assistant, max_turns, writes solution.py)
    "design": ("ceo", "cto", 2, False),
    "coding": ("cto", "programmer", 2, True),
    "code_review": ("reviewer", "programmer", 4, True),
    "testing": ("tester", "programmer", 2, True),
}
ORDER = ["design", "coding", "code_review"]
MAX_CYCLES = 2
MAX_TOOL_ROUNDS = 2


def code(text: str) -> str:
    """A source file written in a trace file (indented with it), as it is: dedented, one newline at
    the end."""
    return textwrap.dedent(text).strip("\n") + "\n"


def block(source: str) -> str:
    """``source`` in a ```python block, as a role writes it in a message."""
    return f"```python\n{source.rstrip()}\n```"


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]
    observation: str | None  # None: filled in by the chain's rules (write_file's answer, refusals)


def write(content: str, path: str = SOLUTION) -> Call:
    return Call("write_file", {"path": path, "content": content}, None)


def examples(observation: str | None = None) -> Call:
    """run_examples and its output (None: a call the phase refuses)."""
    return Call("run_examples", {}, observation)


def python(snippet: str, observation: str | None = None) -> Call:
    """run_python on a snippet and its output (None: a call the phase refuses)."""
    return Call("run_python", {"code": snippet}, observation)


@dataclass
class _Run:
    name: str
    cycle: int
    steps: list[int] = field(default_factory=list)
    closed: bool = False


class Chain:
    """One episode of the chain, written step by step (see the module doc)."""

    def __init__(self, trace_id: str, task_id: str, prompts: dict[str, tuple[str, str]]) -> None:
        self.id = trace_id
        self.task_id = task_id
        self.entry_point, self.prompt = prompts[task_id]
        self.solution = self.prompt  # the env seeds solution.py with the prompt
        self.steps: list[dict[str, Any]] = []
        self.runs: list[_Run] = []
        self.checks: list[ChainCheck] = []
        self.cycles = 0
        self.calls = 0
        self.done = False

    # -- the dialogue ---------------------------------------------------------------------------
    def phase(self, name: str) -> Chain:
        self._close_phase()
        expected = self._next_phase()
        if name != expected:  # also a phase after a check that did not come
            raise ValueError(f"{self.id}: phase {name!r} where the chain runs {expected!r}")
        if name == "testing":
            self.cycles += 1
        self.runs.append(_Run(name, self.cycles if name == "testing" else 0))
        return self

    def say(self, role: str, text: str, *calls: Call) -> Chain:
        """One step of ``role``: its text and the tool calls it made (run in order)."""
        if not self.runs or self.done:
            raise ValueError(f"{self.id}: a step outside a phase")
        run = self.runs[-1]
        phase = run.name
        instructor, assistant, _, writes = PHASES[phase]
        if role not in (instructor, assistant):
            raise ValueError(f"{self.id}: {role!r} takes no part in {phase!r}")
        if run.steps and MARKER in self.steps[run.steps[-1]]["text"]:
            raise ValueError(f"{self.id}: a step after {phase!r} ended by consensus")
        records, observations = [], []
        for call in calls:
            self.calls += 1
            records.append({"id": f"call_{self.calls}", "name": call.name, "arguments": call.arguments})
            observations.append(self._run_call(phase, role, call))
        if not calls and role == "programmer" and writes:
            found = code_block(text)
            if found is not None:
                self.solution = found
        self.steps.append(
            {
                "role": role,
                "text": text,
                "phase": phase,
                "tool_calls": records,
                "observation": "\n".join(observations),
            }
        )
        run.steps.append(len(self.steps) - 1)
        return self

    def _run_call(self, phase: str, role: str, call: Call) -> str:
        allowed = PERMISSIONS[phase][role]
        if call.name not in allowed:
            if call.observation is not None:
                raise ValueError(f"{self.id}: a refused call ({call.name}) is answered by the chain")
            return (
                f"Error: role '{role}' may not call {call.name} in phase '{phase}' "
                f"(it may call: {', '.join(allowed)})"
            )
        if call.name == "write_file":
            content = str(call.arguments["content"])
            if call.arguments.get("path", SOLUTION) != SOLUTION:
                raise ValueError(f"{self.id}: the traces write solution.py only")
            self.solution = content
            lines = len(content.splitlines())
            return f"Wrote {lines} line{'s' if lines != 1 else ''} to {SOLUTION}."
        if call.observation is None:
            raise ValueError(f"{self.id}: {call.name} needs its output written out")
        return call.observation

    # -- the chain's own runs -------------------------------------------------------------------
    def check(self, phase: str, output: str) -> Chain:
        """The chain running the docstring's examples itself (before a loop cycle, or 'final')."""
        self._close_phase()
        expected = self._next_phase()
        if phase == "final":
            if expected != "final":
                raise ValueError(f"{self.id}: the final check where the chain runs {expected!r}")
            self.done = True
        elif phase != "test_and_fix" or expected != "check":
            raise ValueError(f"{self.id}: a {phase!r} check where the chain runs {expected!r}")
        passed = output.startswith("[exit code 0]")
        after = len(self.steps) - 1
        self.checks.append(ChainCheck(after_step=after, phase=phase, passed=passed, output=output))
        return self

    def _next_phase(self) -> str:
        """What the chain runs next: a phase, 'check' (the loop's) or 'final'."""
        if len(self.runs) < len(ORDER):
            return ORDER[len(self.runs)]
        after_check = bool(self.checks) and self.checks[-1].after_step == len(self.steps) - 1
        if after_check and self.checks[-1].phase == "test_and_fix":
            return "final" if self.checks[-1].passed else "testing"
        return "check" if self.cycles < MAX_CYCLES else "final"

    def _close_phase(self) -> None:
        """Checks the last phase run by the chain's rules (turns, tool rounds, its end)."""
        if not self.runs or self.runs[-1].closed:
            return
        run = self.runs[-1]
        instructor, assistant, max_turns, _ = PHASES[run.name]
        turns: list[list[int]] = []
        for i in run.steps:
            step = self.steps[i]
            if turns and self.steps[turns[-1][-1]]["tool_calls"]:
                if step["role"] != self.steps[turns[-1][-1]]["role"]:
                    raise ValueError(f"{self.id}: step {i}: the role with tool calls takes the next step")
                turns[-1].append(i)
            else:
                turns.append([i])
        for n, turn in enumerate(turns):
            role = self.steps[turn[0]]["role"]
            if role != (instructor if n % 2 == 0 else assistant):
                raise ValueError(f"{self.id}: {run.name} turn {n + 1} is {role!r}'s; the roles alternate")
            if len(turn) > MAX_TOOL_ROUNDS + 1 or self.steps[turn[-1]]["tool_calls"]:
                raise ValueError(f"{self.id}: {run.name} turn {n + 1}: at most 2 tool rounds, then text")
            for i in turn[:-1]:
                if MARKER in self.steps[i]["text"]:
                    raise ValueError(f"{self.id}: step {i}: the marker belongs in a turn's last step")
        if not turns:
            raise ValueError(f"{self.id}: {run.name} has no turns")
        last = self.steps[turns[-1][-1]]
        if MARKER not in last["text"] and len(turns) != max_turns:
            raise ValueError(f"{self.id}: {run.name} ended after {len(turns)} turns without consensus")
        run.closed = True

    # -- the record -----------------------------------------------------------------------------
    def record(self, success: bool, modes: str, note: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trace (validated) and its labels: ``modes`` names the modes present, e.g. "1.3 3.2"."""
        if not self.done:
            raise ValueError(f"{self.id}: the chain ends with its final check")
        present = modes.split()
        unknown = sorted(set(present) - set(MODE_IDS))
        if unknown:
            raise ValueError(f"{self.id}: unknown mode(s) {unknown}")
        if not 4 <= len(self.steps) <= 25:
            raise ValueError(f"{self.id}: {len(self.steps)} steps; a trace has 4-25")
        phases = []
        for run in self.runs:
            last = self.steps[run.steps[-1]]
            consensus = MARKER in last["text"]
            phases.append(
                ChainPhaseRun(
                    name=run.name,
                    cycle=run.cycle,
                    roles=list(PHASES[run.name][:2]),
                    first_step=run.steps[0],
                    last_step=run.steps[-1],
                    ended="consensus" if consensus else "turn_cap",
                    consensus_by=last["role"] if consensus else None,
                )
            )
        facts = ChainFacts(
            chain="software_company",
            entry_point=self.entry_point,
            permissions=PERMISSIONS,
            phases=phases,
            checks=self.checks,
            final_code=self.solution,
        )
        trace = TraceRecord.model_validate(
            {
                "id": self.id,
                "env": "humaneval",
                "task": self.prompt,
                "steps": self.steps,
                "finish": "finished",
                "success": success,
                "reward": 1.0 if success else 0.0,
                "chain": facts.model_dump(),
                "note": note,
            }
        )
        labels = {"id": self.id, "modes": {m: int(m in present) for m in MODE_IDS}, "note": note}
        return trace.model_dump(mode="json"), labels
