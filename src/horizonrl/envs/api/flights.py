"""``flights``: the airline API world (:mod:`.flights_world`) as a tool env.

The env ships **no training tasks**: they come from self-questioning (synthesized into a task file,
``env.tasks_file=``). Its ``test`` split is a hand-written held-out set of 50 tasks
(``data/flights_heldout.jsonl``), each with a reference solution and an executable checker.

A task's ``data``: ``query`` (the user's request), ``checker`` (:mod:`.checker`, over
:data:`~.flights_world.STATE_SCHEMA`), ``reference_solution`` (a list of ``{name, arguments}``
tool calls that satisfies it) and optionally ``world_seed`` (0 by default). The reward is 1 when the
checker holds in the world's final state, else 0; the episode ends with ``finish``.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, ClassVar

from horizonrl.envs.api import data_text
from horizonrl.envs.api.checker import Check, CheckerError, holds, parse_checker
from horizonrl.envs.api.flights_world import STATE_SCHEMA, FlightsWorld, WorldError
from horizonrl.envs.base import EnvOptions, ToolEnv, ToolResult, tool_calls_with_results
from horizonrl.envs.tools import tool
from horizonrl.errors import ConfigError, DataError
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Message, Task, Trajectory

HELDOUT_FILE = "flights_heldout.jsonl"
PROFILE_FILE = "flights_profile.json"


@cache
def flights_profile() -> dict[str, Any]:
    """The world's environment profile (name, background, entities with attributes and
    operations, task preferences)."""
    return json.loads(data_text(PROFILE_FILE))


def heldout_tasks() -> list[Task]:
    text = data_text(HELDOUT_FILE)
    return [Task.model_validate_json(line) for line in text.splitlines() if line.strip()]


def system_prompt() -> str:
    return (
        f"{flights_profile()['background']}\n\nDo what the user asks with the tools, one or more calls per "
        "turn; read each result before the next step. When the request is done (or cannot be done), "
        "call finish with a short summary."
    )


class FlightsOptions(EnvOptions):
    #: the oracle's demonstrations quote, before a call, the result record an argument was copied
    #: from (``{"cabin": "business", …, "offer_id": "OF2"``): the choice of a record is then made
    #: by copying words of the request, and the id by copying the quote (docs/envs.md)
    quote_sources: bool = False


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _records(value: Any) -> list[dict[str, Any]]:
    """The JSON objects in a tool result: the result itself, or the objects a list holds."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, dict)]
    return []


def source_quote(arguments: dict[str, Any], request: str, observations: list[str]) -> str | None:
    """The text of the result record an argument's value was copied from, as the result printed it,
    up to and including that value (``{"cabin": "business", "departs": …, "offer_id": "OF2"``); the
    newest result that holds one wins. Only values the request does not spell out count (an offer
    id, not a city). None when no argument came from a result."""
    wanted = {v for v in arguments.values() if isinstance(v, str) and v and v not in request}
    for text in reversed(observations):
        try:
            result = json.loads(text)
        except ValueError:
            continue
        for record in _records(result):
            for key, value in record.items():
                if isinstance(value, str) and value in wanted:
                    printed, field = _json(record), f"{json.dumps(key)}: {json.dumps(value)}"
                    return printed[: printed.index(field) + len(field)]
    return None


class ReferenceOracle:
    """Scripted policy: the task's reference solution, one call per turn, then finish; with
    ``quote_sources`` each call whose argument came from an earlier result first quotes that record."""

    def __init__(self, quote_sources: bool = False) -> None:
        self.quote_sources = quote_sources

    def act(self, task: Task, messages: list[Message]) -> str:
        turn = sum(1 for m in messages if m.role == "assistant")
        calls = task.data.get("reference_solution") or []
        if turn >= len(calls):
            return format_tool_call("finish", {"summary": "done"})
        arguments = dict(calls[turn].get("arguments") or {})
        text = format_tool_call(calls[turn]["name"], arguments)
        if self.quote_sources:
            request = "\n".join(m.content for m in messages if m.role == "user")
            quote = source_quote(arguments, request, [m.content for m in messages if m.role == "tool"])
            if quote is not None:
                return f"{quote}\n{text}"
        return text


class FlightsEnv(ToolEnv[FlightsOptions]):
    """An airline API with hidden rules; reward 1 when the task's checker holds at the end."""

    name = "flights"
    Options = FlightsOptions

    def __init__(self, options: FlightsOptions | None = None) -> None:
        super().__init__(options)
        self.world = FlightsWorld.create(0)
        self.checker: Check | None = None
        self.task: Task | None = None

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: FlightsOptions) -> list[Task]:
        if split == "train":
            raise ConfigError(
                "env 'flights' ships no training tasks: synthesize them (horizon evolve questions) and "
                "pass the file as env.tasks_file=; its 'test' split is the 50 held-out tasks"
            )
        if split != "test":
            raise ConfigError(f"unknown split {split!r} for env 'flights'; valid splits: test")
        tasks = heldout_tasks()
        if n > len(tasks):
            raise ConfigError(f"env 'flights' has {len(tasks)} held-out tasks, {n} were asked for")
        return tasks[:n]

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        return ("test",)

    @classmethod
    def profile(cls) -> dict[str, Any]:
        """The hand-written environment profile (what self-questioning reads)."""
        return flights_profile()

    @classmethod
    def oracle(cls, options: FlightsOptions | None = None) -> ReferenceOracle:
        return ReferenceOracle(quote_sources=bool(options and options.quote_sources))

    #: the tools that change the world's state: an episode's answer is what they did
    write_tools: ClassVar[tuple[str, ...]] = ("book_ticket", "cancel_order", "add_passenger")

    @classmethod
    def answer_of(cls, trajectory: Trajectory) -> str | None:
        """What the episode did to the world: its calls of the writing tools that the world accepted
        (a result that is not an error), in order, as canonical JSON; ``"[]"`` when it changed
        nothing. Two samples that made the same changes agree whatever they looked up on the way."""
        writes = [
            [call.name, call.arguments]
            for call, result in tool_calls_with_results(trajectory)
            if call.name in cls.write_tools and result is not None and not result.startswith("Error")
        ]
        return _json(writes)

    #: the world's state schema (what checkers may name) and the fields a checker derived from a
    #: state change leaves out: ids and prices the world assigns, and the balance that follows them
    state_schema = STATE_SCHEMA
    assigned_fields: ClassVar[dict[str, tuple[str, ...]]] = {
        "orders": ("order_id", "price", "passenger_id"),
        "passengers": ("passenger_id",),
        "": ("balance",),
    }

    def world_state(self) -> dict[str, Any]:
        """The world's state as checkers read it."""
        return self.world.state()

    async def reset(self, task: Task) -> list[Message]:
        explore = bool(task.data.get("explore"))  # an exploration session: no checker, reward 0
        if "query" not in task.data or ("checker" not in task.data and not explore):
            raise DataError(f"flights task {task.id!r} needs data.query and data.checker")
        try:
            self.checker = None if explore else parse_checker(task.data["checker"], STATE_SCHEMA)
        except CheckerError as exc:
            raise DataError(f"flights task {task.id!r}: {exc}") from None
        self.task = task
        self.world = FlightsWorld.create(int(task.data.get("world_seed", 0)))
        self.metrics = {"success": 0.0, "world_errors": 0.0}
        return [
            Message(role="system", content=system_prompt()),
            Message(role="user", content=str(task.data["query"])),
        ]

    async def evaluate(self) -> float | None:
        ok = self.checker is not None and holds(self.checker, self.world.state())
        self.metrics["success"] = float(ok)
        return float(ok)

    def _call(self, operation: str, *args: Any) -> str:
        try:
            return _json(getattr(self.world, operation)(*args))
        except WorldError as exc:
            self.metrics["world_errors"] = self.metrics.get("world_errors", 0.0) + 1
            return f"Error: {exc}"

    # ------------------------------------------------------------------ tools
    @tool
    def search_flights(self, origin: str, destination: str, date: str) -> str:
        """Search the flights from one city to another on a date; lists bookable offers.

        Args:
            origin: The departure city, e.g. "Berlin".
            destination: The arrival city, e.g. "Paris".
            date: The date, YYYY-MM-DD.
        """
        return self._call("search_flights", origin, destination, date)

    @tool
    def book_ticket(self, offer_id: str, passenger_id: str = "") -> str:
        """Book a ticket.

        Args:
            offer_id: The offer to book.
            passenger_id: Who flies (the account holder when empty).
        """
        return self._call("book_ticket", offer_id, passenger_id)

    @tool
    def cancel_order(self, order_id: str) -> str:
        """Cancel an order.

        Args:
            order_id: The order, e.g. "O-1002".
        """
        return self._call("cancel_order", order_id)

    @tool
    def get_order(self, order_id: str) -> str:
        """Look up one order.

        Args:
            order_id: The order, e.g. "O-1002".
        """
        return self._call("get_order", order_id)

    @tool
    def list_orders(self) -> str:
        """List the account's orders."""
        return self._call("list_orders")

    @tool
    def list_passengers(self) -> str:
        """List the account's passengers."""
        return self._call("list_passengers")

    @tool
    def add_passenger(self, name: str, age: int) -> str:
        """Add a passenger to the account.

        Args:
            name: Full name.
            age: Age in years.
        """
        return self._call("add_passenger", name, age)

    @tool
    def get_balance(self) -> str:
        """The account balance in euros."""
        return self._call("get_balance")

    @tool
    def finish(self, summary: str = "") -> ToolResult:
        """End the session.

        Args:
            summary: What was done.
        """
        return ToolResult(content="Session ended.", done=True)
