"""Where a stream's tasks come from: the env's generator, a task file being appended to, or
self-questioning. Every source hands out batches of tasks with stream-unique ids (``ID@N``, N the
task's position in the stream) and has a small state that a checkpoint holds, so a resumed stream
continues where it stopped instead of repeating tasks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from horizonrl.errors import DataError
from horizonrl.io import read_appended_lines
from horizonrl.seeds import derive_seed
from horizonrl.types import Task


class TaskSource(Protocol):
    """Hands out the next tasks; ``state()``/``load()`` round-trip through a checkpoint."""

    def next_batch(self, n: int) -> list[Task]: ...

    def state(self) -> dict[str, Any]: ...

    def load(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> str: ...


def stream_task(task: Task, position: int) -> Task:
    """``task`` renamed for its place in the stream (ids stay unique however the source numbers them)."""
    return task.model_copy(update={"id": f"{task.id}@{position}"})


class GeneratorSource:
    """The env's own task generator: batch ``k`` is ``make_tasks(config.env, split, n, seed_k)``
    (:func:`horizonrl.envs.factory.make_tasks`) with a seed derived from the run seed and ``k``."""

    def __init__(self, config: Any, make_tasks: Callable[[Any, str, int, int], list[Task]]) -> None:
        self.config = config
        self.make_tasks = make_tasks
        self.split = config.stream.source.split
        self.batches = 0
        self.position = 0

    def next_batch(self, n: int) -> list[Task]:
        seed = derive_seed(self.config.seed, "stream", self.batches)
        tasks = self.make_tasks(self.config.env, self.split, n, seed)
        self.batches += 1
        out = [stream_task(t, self.position + i) for i, t in enumerate(tasks)]
        self.position += len(out)
        return out

    def state(self) -> dict[str, Any]:
        return {"batches": self.batches, "position": self.position}

    def load(self, state: dict[str, Any]) -> None:
        self.batches, self.position = int(state["batches"]), int(state["position"])

    def describe(self) -> str:
        return f"the {self.config.env.name} env's generator ({self.split} split)"


class FileSource:
    """A JSONL task file that keeps growing: new complete lines are read from where the last read
    stopped (a line without its newline yet is being written and waits). A line that is not a task,
    or a task for another env, is skipped and counted (``bad_lines``, with the last reason)."""

    def __init__(
        self,
        path: Path,
        env_names: set[str],
        poll_s: float = 1.0,
        max_wait_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.env_names = env_names
        self.poll_s, self.max_wait_s = poll_s, max_wait_s
        self.sleep = sleep
        self.on_wait = on_wait
        self.offset = 0
        self.line = 0
        self.position = 0
        self.bad_lines = 0
        self.last_error: str | None = None
        self.pending: list[Task] = []

    def _read(self) -> None:
        if self.path.is_dir():
            raise DataError(f"stream.source.path {str(self.path)!r} is a directory; give a JSONL task file")
        lines, self.offset = read_appended_lines(self.path, self.offset)
        for raw in lines:
            self.line += 1
            if not raw.strip():
                continue
            try:
                task = Task.model_validate_json(raw)
            except ValidationError as exc:
                self._bad(f"line {self.line}: not a task ({exc.errors()[0]['msg']})")
                continue
            if task.env not in self.env_names:
                self._bad(f"line {self.line}: task {task.id!r} is for env {task.env!r}")
                continue
            self.pending.append(task)

    def _bad(self, reason: str) -> None:
        self.bad_lines += 1
        self.last_error = f"{self.path}: {reason}; skipped"

    def next_batch(self, n: int) -> list[Task]:
        """Up to ``n`` tasks: waits for the first one as long as it takes, then at most
        ``max_wait_s`` more for the batch to fill."""
        first_seen: float | None = None
        while True:
            self._read()
            if self.pending and first_seen is None:
                first_seen = time.monotonic()
            full = len(self.pending) >= n
            waited = first_seen is not None and time.monotonic() - first_seen >= self.max_wait_s
            if full or waited:
                break
            if self.on_wait is not None:
                self.on_wait(f"waiting for tasks in {self.path} ({len(self.pending)} of {n})")
            self.sleep(self.poll_s)
        batch, self.pending = self.pending[:n], self.pending[n:]
        out = [stream_task(t, self.position + i) for i, t in enumerate(batch)]
        self.position += len(out)
        return out

    def state(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "line": self.line,
            "position": self.position,
            "bad_lines": self.bad_lines,
            "pending": [t.model_dump() for t in self.pending],
        }

    def load(self, state: dict[str, Any]) -> None:
        self.offset, self.line = int(state["offset"]), int(state["line"])
        self.position, self.bad_lines = int(state["position"]), int(state["bad_lines"])
        self.pending = [Task.model_validate(t) for t in state.get("pending", [])]

    def describe(self) -> str:
        return f"the task file {self.path} (followed as it grows)"


class SelfQuestioningSource:
    """Tasks the agent writes for itself: a self-questioning round (explore, synthesize, validate by
    replay) whenever the queue runs dry, each round with its own derived seed; a query already
    handed out is not handed out again."""

    def __init__(self, config: Any, roles: Any, question: Callable[..., Any] | None = None) -> None:
        if question is None:
            from horizonrl.evolve.questions import self_question as question
        self.config = config
        self.roles = roles
        self.question = question
        self.rounds = 0
        self.position = 0
        self.queue: list[Task] = []
        self.seen: set[str] = set()

    def _round(self) -> None:
        seed = derive_seed(self.config.seed, "stream_sq", self.rounds)
        config = self.config.model_copy(update={"seed": seed})
        self.rounds += 1
        fresh = []
        for task in self.question(config, self.roles).tasks:
            query = str(task.data.get("query", task.id))
            if query not in self.seen:
                self.seen.add(query)
                fresh.append(task)
        self.queue.extend(fresh)

    def next_batch(self, n: int) -> list[Task]:
        empty_rounds = 0
        while len(self.queue) < n:
            before = len(self.queue)
            self._round()
            empty_rounds = empty_rounds + 1 if len(self.queue) == before else 0
            if empty_rounds >= 3 and self.queue:
                break
            if empty_rounds >= 3:
                raise DataError(
                    f"self-questioning found no new task in 3 rounds on env {self.config.env.name!r}; "
                    "check the explore: block (explorer, synthesizer) or use another stream.source.kind"
                )
        batch, self.queue = self.queue[:n], self.queue[n:]
        out = [stream_task(t, self.position + i) for i, t in enumerate(batch)]
        self.position += len(out)
        return out

    def state(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "position": self.position,
            "queue": [t.model_dump() for t in self.queue],
            "seen": sorted(self.seen),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.rounds, self.position = int(state["rounds"]), int(state["position"])
        self.queue = [Task.model_validate(t) for t in state.get("queue", [])]
        self.seen = set(state.get("seen", []))

    def describe(self) -> str:
        return f"self-questioning on {self.config.env.name}"
