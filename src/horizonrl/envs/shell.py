"""The ``shell`` env: small file and text tasks solved with shell commands in a real sandbox.

Each episode gets its own sandbox (bubblewrap on this machine; a sandbox server or Docker by
``env.options.sandbox`` alone): the rollout's init stage creates it and writes the task's files into
/workspace, the agent calls ``execute_bash`` and then ``finish``, and the eval stage scores the
workspace by running the task's check command in the same sandbox (reward 1 if it exits 0).

Task families (generated deterministically from split, seed and index): write a file with a given
line, count matching lines, sum a column of numbers, change a setting in a config file, and move
files between directories. ``data`` holds ``prompt``, ``files`` (path -> text), ``check`` (a shell
command) and ``solution`` (the oracle's command).
"""

from __future__ import annotations

import random
import shlex
from typing import Any

from pydantic import Field

from horizonrl.envs.base import EnvOptions, ToolEnv, ToolResult
from horizonrl.envs.observations import exec_observation
from horizonrl.envs.tools import tool
from horizonrl.errors import ConfigError, DataError
from horizonrl.sandbox import RemoteSandboxConfig, SandboxConfig, SandboxSpec, shared_backend
from horizonrl.sandbox.base import Sandbox
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task

SYSTEM_PROMPT = (
    "You work in a Linux shell inside /workspace. Run commands with the execute_bash tool (one "
    "command line per call; each call starts in /workspace) and inspect the results. When the task "
    "is done, call finish."
)
_WORDS = [
    "amber",
    "basil",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lumen",
    "maple",
    "nimbus",
    "onyx",
    "pepper",
    "quartz",
    "raven",
    "saffron",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
]


class ShellOptions(EnvOptions):
    """Options of the shell env (the ``env.options`` block)."""

    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Where the sandboxes run (bwrap, remote, docker)."
    )
    command_timeout_s: float = Field(30.0, gt=0, description="Seconds an execute_bash call may run.")
    observation_chars: int = Field(
        2000, ge=100, description="Longest command output shown to the model (head and tail kept)."
    )


def _write_line(rng: random.Random) -> dict[str, Any]:
    name, word = f"{rng.choice(_WORDS)}.txt", rng.choice(_WORDS) + str(rng.randint(10, 99))
    return {
        "prompt": f"Create a file named {name} in /workspace whose only line is: {word}",
        "files": {},
        "check": f'[ "$(cat {name})" = {shlex.quote(word)} ]',
        "solution": f"echo {word} > {name}",
    }


def _count_lines(rng: random.Random) -> dict[str, Any]:
    word = rng.choice(_WORDS)
    lines = [" ".join(rng.sample(_WORDS, 4)) for _ in range(rng.randint(8, 30))]
    count = sum(word in line.split() for line in lines)
    return {
        "prompt": f"How many lines of notes.txt contain the word '{word}'? Write the number to answer.txt.",
        "files": {"notes.txt": "\n".join(lines) + "\n"},
        "check": f'[ "$(tr -d "[:space:]" < answer.txt)" = "{count}" ]',
        "solution": f"grep -cw {word} notes.txt > answer.txt",
    }


def _sum_numbers(rng: random.Random) -> dict[str, Any]:
    numbers = [rng.randint(-500, 5000) for _ in range(rng.randint(5, 25))]
    return {
        "prompt": "numbers.txt holds one integer per line. Write their sum to answer.txt.",
        "files": {"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
        "check": f'[ "$(tr -d "[:space:]" < answer.txt)" = "{sum(numbers)}" ]',
        "solution": "awk '{s += $1} END {print s}' numbers.txt > answer.txt",
    }


def _set_config(rng: random.Random) -> dict[str, Any]:
    keys = rng.sample(["host", "port", "workers", "timeout", "retries", "level"], 4)
    values = {k: str(rng.randint(1, 9000)) for k in keys}
    target, new = keys[rng.randrange(4)], str(rng.randint(1, 9000))
    text = "[server]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    expected = text.replace(f"{target} = {values[target]}\n", f"{target} = {new}\n")
    return {
        "prompt": f"In settings.ini, change the value of {target} to {new}; leave every other line as it is.",
        "files": {"settings.ini": text},
        "check": f"printf %s {shlex.quote(expected)} | cmp -s - settings.ini",
        "solution": f"sed -i 's/^{target} = .*/{target} = {new}/' settings.ini",
    }


def _move_files(rng: random.Random) -> dict[str, Any]:
    ext, other = rng.sample(["log", "csv", "tmp", "bak"], 2)
    moving = [f"{w}.{ext}" for w in rng.sample(_WORDS, rng.randint(2, 5))]
    staying = [f"{w}.{other}" for w in rng.sample(_WORDS, 2)]
    files = {f"inbox/{name}": f"{name}\n" for name in moving + staying}
    expected = " ".join(sorted(moving))
    return {
        "prompt": f"Move every .{ext} file from inbox/ into a new directory archive/; leave the other files.",
        "files": files,
        "check": (
            f'[ "$(cd archive && ls | tr "\\n" " ")" = "{expected} " ] && '
            f'[ "$(ls inbox | wc -l)" = "{len(staying)}" ]'
        ),
        "solution": f"mkdir -p archive && mv inbox/*.{ext} archive/",
    }


FAMILIES = (_write_line, _count_lines, _sum_numbers, _set_config, _move_files)


class ShellOracle:
    """Scripted policy: run the task's solution command, then finish."""

    def act(self, task: Task, messages: list[Message]) -> str:
        if not any(m.role == "assistant" for m in messages):
            command = task.data["solution"]
            return f"I will run: {command}\n{format_tool_call('execute_bash', {'command': command})}"
        return f"Done.\n{format_tool_call('finish', {})}"


class ShellEnv(ToolEnv[ShellOptions]):
    """File and text tasks in a sandboxed shell; reward 1 when the task's check passes."""

    name = "shell"
    Options = ShellOptions

    def __init__(self, options: ShellOptions | None = None) -> None:
        super().__init__(options)
        self.task: Task | None = None
        self.box: Sandbox | None = None
        if isinstance(self.options.sandbox, RemoteSandboxConfig):
            self.options.sandbox.resolved_token()  # a token that cannot be read fails here, not per episode

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: ShellOptions) -> list[Task]:
        if split not in cls.splits():
            raise ConfigError(f"unknown split {split!r} for env 'shell'; valid splits: train, test")
        tasks = []
        for i in range(n):
            rng = random.Random(f"shell:{split}:{seed}:{i}")
            data = FAMILIES[i % len(FAMILIES)](rng)
            tasks.append(Task(id=f"shell-{split}-{i:06d}", env=cls.name, split=split, data=data))
        return tasks

    @classmethod
    def oracle(cls, options: ShellOptions | None = None) -> ShellOracle:
        return ShellOracle()

    async def reset(self, task: Task) -> list[Message]:
        for key in ("prompt", "check"):
            if not isinstance(task.data.get(key), str):
                raise DataError(f"shell task {task.id!r} needs data.{key} (a string)")
        self.task = task
        backend = shared_backend(self.options.sandbox)
        self.box = await backend.create(SandboxSpec(limits=self.options.sandbox.limits))
        for path, text in dict(task.data.get("files", {})).items():
            await self.box.write_file(path, str(text).encode())
        return [
            Message(role="system", content=SYSTEM_PROMPT),
            Message(role="user", content=task.data["prompt"]),
        ]

    @tool
    async def execute_bash(self, command: str) -> str:
        """Run a shell command in /workspace and return its exit code and output.

        Args:
            command: One shell command line, e.g. "ls -la" or "grep -c error log.txt > answer.txt".
        """
        assert self.box is not None
        result = await self.box.exec(command, timeout=self.options.command_timeout_s)
        return exec_observation(result, self.options.observation_chars)

    @tool
    def finish(self) -> ToolResult:
        """Say the task is done and end the episode (the workspace is then checked)."""
        return ToolResult(content="Submitted.", done=True)

    async def evaluate(self) -> float:
        assert self.box is not None and self.task is not None
        result = await self.box.exec(self.task.data["check"], timeout=60)
        return 1.0 if result.ok else 0.0

    async def close(self) -> None:
        if self.box is not None:
            await self.box.close()
            self.box = None
