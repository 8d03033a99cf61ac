"""The ``swe`` env: fix a real bug in a real package, CodeAct-style, rewarded by the package's tests.

Init (``reset``) starts a sandbox with the instance's buggy repository (a package snapshot with the
injected bug, committed) and shows the problem statement; the agent works with OpenHands' tools —
``execute_bash``, ``str_replace_editor`` (view/create/str_replace/insert/undo_edit) and ``finish``;
eval (``evaluate``) takes the workspace diff since the buggy commit, applies it to a clean copy and
runs FAIL_TO_PASS and PASS_TO_PASS there (:mod:`horizonrl.envs.swe.evaluate`): reward 1 only if all
pass, with per-test results and the apply outcome in the trajectory's metrics.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from pathlib import Path
from typing import Any

from pydantic import Field

from horizonrl.envs.base import EnvOptions, ToolEnv, ToolResult
from horizonrl.envs.observations import exec_observation
from horizonrl.envs.swe.editor import EDITOR_DESCRIPTION, Editor
from horizonrl.envs.swe.evaluate import SWERuntime
from horizonrl.envs.swe.instances import SHIPPED_DATASET, Dataset, SWEInstance
from horizonrl.envs.swe.testbed import diff_since
from horizonrl.envs.tools import tool
from horizonrl.errors import ConfigError
from horizonrl.sandbox.base import Sandbox, SandboxLimits
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository at /workspace. Explore the code and "
    "run the failing tests with execute_bash (e.g. `python -m pytest -q -x tests/`), edit files with "
    "str_replace_editor, and check that the tests pass. Change only the package's source, never the "
    "tests. When the fix is complete, call finish."
)


class SWEOptions(EnvOptions):
    """Options of the swe env (the ``env.options`` block)."""

    dataset: str | None = Field(None, description="A SWE dataset directory (default: the shipped one).")
    command_timeout_s: float = Field(60.0, gt=0, description="Seconds an execute_bash call may run.")
    observation_chars: int = Field(4000, ge=200, description="Longest tool output shown (head and tail).")
    eval_timeout_s: float = Field(600.0, gt=0, description="Seconds the evaluation's test run may take.")
    memory_mib: int = Field(2048, ge=64, description="Memory limit of the agent's sandbox.")


_RUNTIMES: weakref.WeakKeyDictionary[Any, dict[str, SWERuntime]] = weakref.WeakKeyDictionary()
_DATASETS: dict[str, Dataset] = {}


def load_dataset(path: str | None) -> Dataset:
    key = str(Path(path).resolve()) if path else str(SHIPPED_DATASET)
    if key not in _DATASETS:
        _DATASETS[key] = Dataset(Path(key))
    return _DATASETS[key]


def shared_runtime(dataset: Dataset) -> SWERuntime:
    """One runtime (test venv, sandbox backend) per dataset and event loop."""
    runtimes = _RUNTIMES.setdefault(asyncio.get_running_loop(), {})
    key = str(dataset.root)
    if key not in runtimes:
        runtimes[key] = SWERuntime(dataset)
    return runtimes[key]


def fix_edits(patch: str) -> list[tuple[str, str, str]]:
    """(path, old text, new text) per hunk of a unified diff: what an editor must replace."""
    edits: list[tuple[str, str, str]] = []
    path, old, new, in_hunk = "", [], [], False

    def flush() -> None:
        if in_hunk and (old or new):
            edits.append((path, "".join(old), "".join(new)))

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ b/"):
            flush()
            path, old, new, in_hunk = line[6:].rstrip("\n"), [], [], False
        elif line.startswith("@@"):
            flush()
            old, new, in_hunk = [], [], True
        elif in_hunk and line.startswith("\\"):
            continue
        elif in_hunk and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] in (" ", "-"):
                old.append(body)
            if line[0] in (" ", "+"):
                new.append(body)
    flush()
    return edits


class SWEOracle:
    """Scripted policy: apply the instance's fix hunk by hunk with str_replace_editor, then finish."""

    def act(self, task: Task, messages: list[Message]) -> str:
        instance = load_dataset(task.data.get("dataset")).get(task.data["instance_id"])
        edits = fix_edits(instance.patch)
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < len(edits):
            path, old, new = edits[turn]
            arguments = {"command": "str_replace", "path": path, "old_str": old, "new_str": new}
            return f"I fix {path}.\n{format_tool_call('str_replace_editor', arguments)}"
        return f"The fix is in place.\n{format_tool_call('finish', {})}"


class SWEEnv(ToolEnv[SWEOptions]):
    """Repository repair in a sandbox with CodeAct tools; reward 1 when the instance's tests pass."""

    name = "swe"
    Options = SWEOptions

    def __init__(self, options: SWEOptions | None = None) -> None:
        super().__init__(options)
        self.instance: SWEInstance | None = None
        self.box: Sandbox | None = None
        self.editor: Editor | None = None
        self.commit = ""

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        return ("train", "test", "all")

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: SWEOptions) -> list[Task]:
        """``n`` instances of ``split`` (by package), in a seeded order; all of them if ``n`` is larger."""
        if split not in cls.splits():
            raise ConfigError(
                f"unknown split {split!r} for env 'swe'; valid splits: {', '.join(cls.splits())}"
            )
        dataset = load_dataset(options.dataset)
        instances = sorted(dataset.split(split), key=lambda i: i.instance_id)
        random.Random(f"swe:{split}:{seed}").shuffle(instances)
        return [
            Task(
                id=i.instance_id,
                env=cls.name,
                split=split,
                data={"instance_id": i.instance_id, "dataset": options.dataset, "repo": i.repo},
            )
            for i in instances[:n]
        ]

    @classmethod
    def oracle(cls, options: SWEOptions | None = None) -> SWEOracle:
        return SWEOracle()

    async def reset(self, task: Task) -> list[Message]:
        dataset = load_dataset(task.data.get("dataset", self.options.dataset))
        self.instance = dataset.get(str(task.data.get("instance_id", task.id)))
        runtime = shared_runtime(dataset)
        limits = SandboxLimits(memory_mib=self.options.memory_mib, processes=512, output_bytes=256 * 1024)
        self.box, self.commit = await runtime.start(self.instance, limits)
        self.editor = Editor(self.box, max_output_chars=self.options.observation_chars)
        return [
            Message(role="system", content=SYSTEM_PROMPT),
            Message(role="user", content=self.instance.problem_statement),
        ]

    @tool
    async def execute_bash(self, command: str) -> str:
        """Run a shell command in /workspace and return its exit code and output.

        Args:
            command: One shell command line, e.g. "grep -rn 'def pluralize' ." or "python -m pytest -q -x".
        """
        assert self.box is not None and self.instance is not None
        runtime = shared_runtime(load_dataset(self.options.dataset))
        python_dir = f"{runtime.venv(self.instance)}/bin"
        line = f"export PATH={python_dir}:$PATH; {command}"  # `python` and `pytest` are the test venv's
        result = await self.box.exec(line, timeout=self.options.command_timeout_s)
        return exec_observation(result, self.options.observation_chars)

    async def str_replace_editor(
        self,
        command: str,
        path: str,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> str:
        assert self.editor is not None
        return await self.editor.run(command, path, file_text, old_str, new_str, insert_line, view_range)

    str_replace_editor.__doc__ = EDITOR_DESCRIPTION
    str_replace_editor = tool(str_replace_editor)  # type: ignore[assignment]

    @tool
    def finish(self) -> ToolResult:
        """Say the fix is complete and end the episode (the tests are then run on a clean copy)."""
        return ToolResult(content="Submitted.", done=True)

    async def evaluate(self) -> float:
        assert self.box is not None and self.instance is not None
        runtime = shared_runtime(load_dataset(self.options.dataset))
        patch = await diff_since(self.box, self.commit)
        report = await runtime.evaluate(self.instance, patch, timeout=self.options.eval_timeout_s)
        self.metrics = report.metrics()
        if report.status == "error":
            raise RuntimeError(f"evaluating {self.instance.instance_id} failed: {report.error}")
        return report.reward

    async def close(self) -> None:
        if self.box is not None:
            await self.box.close()
            self.box = None
