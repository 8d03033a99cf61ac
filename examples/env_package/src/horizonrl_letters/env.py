"""``letters``: how many times does a letter occur in a word? One tool call, ``submit(count)``;
reward 1 for the right count. Tasks are generated from a seed; the oracle answers right."""

from __future__ import annotations

import random

from pydantic import Field

from horizonrl.envs import EnvOptions, ToolEnv, ToolResult, tool
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task

WORDS = ["banana", "letter", "mississippi", "committee", "balloon", "address", "coffee", "bookkeeper"]


class LettersOptions(EnvOptions):
    min_count: int = Field(1, ge=0, description="Ask only about letters that occur at least this often.")


class LettersOracle:
    """Counts the letter and answers in one call."""

    def act(self, task: Task, messages: list[Message]) -> str:
        count = task.data["word"].count(task.data["letter"])
        return f"I count {count}.\n{format_tool_call('submit', {'count': count})}"


class LettersEnv(ToolEnv[LettersOptions]):
    """Count a letter in a word; reward 1 for the right count."""

    name = "letters"
    Options = LettersOptions

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: LettersOptions) -> list[Task]:
        rng = random.Random(f"{split}-{seed}")
        tasks = []
        for i in range(n):
            word = rng.choice(WORDS)
            letters = sorted({c for c in word if word.count(c) >= options.min_count}) or sorted(set(word))
            data = {"word": word, "letter": rng.choice(letters)}
            tasks.append(Task(id=f"letters-{split}-{seed}-{i}", env=cls.name, split=split, data=data))
        return tasks

    @classmethod
    def oracle(cls, options: LettersOptions | None = None) -> LettersOracle:
        return LettersOracle()

    async def reset(self, task: Task) -> list[Message]:
        self.task = task
        self.metrics = {"success": 0.0}
        question = f"How many times does the letter {task.data['letter']!r} occur in {task.data['word']!r}?"
        return [
            Message(role="system", content="Count, then call submit with the count."),
            Message(role="user", content=question),
        ]

    @tool
    def submit(self, count: int) -> ToolResult:
        """Submit the count.

        Args:
            count: How many times the letter occurs.
        """
        right = count == self.task.data["word"].count(self.task.data["letter"])
        self.metrics["success"] = float(right)
        return ToolResult(content="correct" if right else "wrong", reward=float(right), done=True)
