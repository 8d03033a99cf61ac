"""A scripted team from a task's canonical solution: what each role of a chat chain would say and do
when the team works well, for demonstrations (per-role SFT) and to prove a chain and its env end to end.

The script reads only the chain's permissions and the role's own view: a role whose phase gives it
``write_file`` writes the canonical solution and says so; a role that may run the chain's check runs
it, then approves with the consensus marker when it passed (or names the failure when not); an
instructor opens its phase with the phase's instruction; any other assistant answers with the plan
the docstring gives and agrees.
"""

from __future__ import annotations

from horizonrl.errors import HorizonError
from horizonrl.multiagent.chain import ChainPhase, ChatChain
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task


def _summary(task: Task) -> str:
    """The first sentence of the task's docstring."""
    prompt = str(task.data.get("prompt", ""))
    for quote in ('"""', "'''"):
        if quote in prompt:
            doc = prompt.split(quote)[1].strip()
            first = " ".join(doc.split(">>>")[0].split())
            return first.split(". ")[0].rstrip(".") + "."
    return f"implement {task.data.get('entry_point', 'the function')} as its docstring says."


class TeamOracle:
    """See the module doc; ``chain`` is the chain the script plays."""

    def __init__(self, chain: ChatChain) -> None:
        self.chain = chain

    def act(self, role: str, phase: ChainPhase, task: Task, messages: list[Message]) -> str:
        canonical = task.data.get("canonical_solution")
        if not isinstance(canonical, str):
            raise HorizonError(f"task {task.id!r} has no canonical_solution: the scripted team needs one")
        entry = str(task.data.get("entry_point", "the function"))
        tools = phase.tools.get(role, ())
        mine = [m for m in messages if m.role == "assistant"]
        last_result = messages[-1].content if messages and messages[-1].role == "tool" else None
        done = self.chain.consensus
        if "write_file" in tools and self.chain.solution in phase.writes:
            if last_result is None and not any(m.tool_calls for m in mine):
                code = f"{task.data['prompt']}{canonical}".rstrip() + "\n"
                call = format_tool_call("write_file", {"path": self.chain.solution, "content": code})
                return f"I write the complete function {entry} to {self.chain.solution}.\n{call}"
            return f"The complete function {entry} is in {self.chain.solution}. {done}"
        if self.chain.check is not None and self.chain.check in tools and role == phase.instructor:
            if last_result is not None:
                if "[exit code 0]" in last_result:
                    return f"The examples pass; {entry} is correct. {done}"
                return f"The examples fail:\n{last_result[:400]}\nFix {entry} so that they pass."
            return f"Checking {entry} against the examples.\n{format_tool_call(self.chain.check, {})}"
        if role == phase.instructor:
            if mine:
                return f"Agreed. {done}"
            return f"{phase.prompt} The function is {entry}: {_summary(task)}"
        return f"Plan for {entry}: {_summary(task)} Follow the docstring's examples exactly."
