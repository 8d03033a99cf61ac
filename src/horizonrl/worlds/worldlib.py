"""The world side of a layered world: the three layers' base pieces and the command protocol.

Standard library only, and importable as the top-level module ``worldlib``: a world's code
(``world.py``) writes ``from worldlib import World, Outcome, ActionError`` and this file is copied
beside it into the world's sandbox, so the same code runs in the trainer process (shipped worlds)
and inside bubblewrap (generated worlds) without the rest of HorizonRL.

The layers (AutoEnv's factorisation of an environment):

- **BaseEnv** — :class:`World`: the level's state, the actions, the transition, the reward and
  termination (``initial_state``, ``step``), a level generator (``generate``), the level's
  maximum reward (``max_reward``) and a planner (``oracle``). States are JSON values, so a world
  can run as a stateless process between steps.
- **ObsEnv** — :func:`observe`: an observation policy applied to the world's :class:`View` (what
  there is to see): ``full``, ``radius`` (cells within Chebyshev distance r of the agent),
  ``line_of_sight`` (cells a straight ray reaches past no opaque cell) or ``mask`` (a seeded random
  share of cells and facts hidden each step).
- **SkinEnv** — :func:`render`: text from an observed view and a skin (a glyph and a name for each
  cell code and term). An inverse skin swaps what things are called, never what they do.
"""

from __future__ import annotations

import json
import random
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

UNSEEN = "?"


class ActionError(Exception):
    """An action the world refuses (bad arguments, an illegal move): the agent sees the message as an
    error observation; the state does not change, but the step counts."""


@dataclass
class Outcome:
    """What one action did: the next state, the reward it earned, whether the episode is over, and
    an event line (a template whose ``{term}`` fields the skin names)."""

    state: Any
    reward: float = 0.0
    done: bool = False
    event: str = ""


@dataclass
class View:
    """What there is to see in a state before the observation policy: an optional grid (rows of
    one-character cell codes), the agent's cell, and facts (name → value; string values may hold
    ``{term}`` fields)."""

    grid: list[str] | None = None
    agent: tuple[int, int] | None = None
    facts: dict[str, Any] = field(default_factory=dict)


class World(ABC):
    """Base class of a world's dynamics (the BaseEnv layer). A subclass implements every abstract
    method (one that does not cannot be instantiated); ``level`` is one generated level (a JSON
    object)."""

    def __init__(self, level: dict[str, Any]) -> None:
        self.level = level

    @abstractmethod
    def initial_state(self) -> Any:
        """The level's start state (a JSON value)."""

    @abstractmethod
    def step(self, state: Any, action: str, args: dict[str, Any]) -> Outcome:
        """Apply one action; raise :class:`ActionError` for one the world refuses."""

    @abstractmethod
    def view(self, state: Any) -> View:
        """What there is to see in ``state``, before the observation policy."""

    @abstractmethod
    def max_reward(self) -> float:
        """The most reward an episode of this level can earn (computed by solving the level)."""

    @abstractmethod
    def oracle(self, state: Any) -> tuple[str, dict[str, Any]]:
        """The planner's next action from ``state`` (one that keeps the maximum reachable)."""

    @classmethod
    @abstractmethod
    def generate(cls, rng: random.Random, params: dict[str, Any]) -> dict[str, Any]:
        """A new level drawn with ``rng``; ``params`` come from the DSL's ``generator.params``."""


# ---------------------------------------------------------------- helpers for grid worlds

DIRECTIONS = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}


def moved(pos: Any, direction: str) -> tuple[int, int]:
    """The cell one step from ``pos`` in ``direction``; ActionError for an unknown direction."""
    if direction not in DIRECTIONS:
        raise ActionError(f"unknown direction {direction!r}; valid: {', '.join(DIRECTIONS)}")
    dr, dc = DIRECTIONS[direction]
    return (int(pos[0]) + dr, int(pos[1]) + dc)


def cell(grid: list[str], pos: Any) -> str:
    """The code at ``pos``, or ``#`` outside the grid."""
    r, c = int(pos[0]), int(pos[1])
    if 0 <= r < len(grid) and 0 <= c < len(grid[r]):
        return grid[r][c]
    return "#"


def bfs_path(start: Any, is_goal: Any, neighbours: Any, limit: int = 200_000) -> list[Any] | None:
    """A shortest list of moves from ``start`` to a state where ``is_goal(state)`` holds;
    ``neighbours(state)`` yields ``(move, next_state)`` with hashable states. None when unreachable."""
    from collections import deque

    if is_goal(start):
        return []
    parents: dict[Any, Any] = {start: None}
    queue = deque([start])
    while queue and len(parents) < limit:
        state = queue.popleft()
        for move, nxt in neighbours(state):
            if nxt in parents:
                continue
            parents[nxt] = (state, move)
            if is_goal(nxt):
                path = []
                while parents[nxt] is not None:
                    nxt, mv = parents[nxt]
                    path.append(mv)
                return path[::-1]
            queue.append(nxt)
    return None


def grid_neighbours(grid: list[str], blocked: str = "#") -> Any:
    """``neighbours`` for :func:`bfs_path` over cells: the four moves into cells not in ``blocked``."""

    def neighbours(pos: tuple[int, int]) -> Any:
        for name in DIRECTIONS:
            nxt = moved(pos, name)
            if cell(grid, nxt) not in blocked:
                yield name, nxt

    return neighbours


def carve_maze(rng: random.Random, height: int, width: int, loops: float = 0.0) -> list[str]:
    """A maze of ``#`` walls and ``.`` floor (odd height and width; cells at odd coordinates are
    floor), carved by a randomized depth-first search; ``loops`` knocks out that share of the
    remaining inner walls so that more than one route exists."""
    rows = [["#"] * width for _ in range(height)]
    start = (1, 1)
    rows[1][1] = "."
    stack = [start]
    while stack:
        r, c = stack[-1]
        options = [
            (r + 2 * dr, c + 2 * dc, dr, dc)
            for dr, dc in DIRECTIONS.values()
            if 0 < r + 2 * dr < height - 1
            and 0 < c + 2 * dc < width - 1
            and rows[r + 2 * dr][c + 2 * dc] == "#"
        ]
        if not options:
            stack.pop()
            continue
        nr, nc, dr, dc = rng.choice(options)
        rows[r + dr][c + dc] = "."
        rows[nr][nc] = "."
        stack.append((nr, nc))
    inner = [
        (r, c)
        for r in range(1, height - 1)
        for c in range(1, width - 1)
        if rows[r][c] == "#" and ((r % 2 == 1) != (c % 2 == 1))
    ]
    for r, c in rng.sample(inner, int(len(inner) * loops)):
        rows[r][c] = "."
    return ["".join(row) for row in rows]


def walled_room(height: int, width: int) -> list[list[str]]:
    """An empty room: floor ``.`` inside a border of ``#`` walls, as rows of mutable cells."""
    inner = [["#"] + ["."] * (width - 2) + ["#"] for _ in range(height - 2)]
    return [["#"] * width, *inner, ["#"] * width]


def floor_cells(grid: list[str], code: str = ".") -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == code]


class WalkToGoal(World):
    """Dynamics shared by worlds where the agent walks a fixed grid to one goal cell: ``move``
    through floor, a bump at walls, reward 1 and the end at the goal; the planner is a breadth-first
    search. A subclass names the level's goal key (``goal_key``) and writes ``generate``; its level
    holds ``grid``, ``start`` and the goal cell."""

    goal_key = "goal"

    def initial_state(self) -> Any:
        return {"pos": list(self.level["start"])}

    def _at_goal(self, pos: Any) -> bool:
        return list(pos) == list(self.level[self.goal_key])

    def step(self, state: Any, action: str, args: dict[str, Any]) -> Outcome:
        nxt = moved(state["pos"], args.get("direction", ""))
        if cell(self.level["grid"], nxt) == "#":
            return Outcome(state, event="You bump into the {blocked}.")
        state = {"pos": list(nxt)}
        if self._at_goal(nxt):
            return Outcome(state, reward=1.0, done=True, event="You reached the {goal}.")
        return Outcome(state)

    def view(self, state: Any) -> View:
        return View(grid=self.level["grid"], agent=tuple(state["pos"]))

    def _path(self, pos: Any) -> list[Any] | None:
        return bfs_path(tuple(pos), self._at_goal, grid_neighbours(self.level["grid"]))

    def max_reward(self) -> float:
        return 1.0 if self._path(self.level["start"]) is not None else 0.0

    def oracle(self, state: Any) -> tuple[str, dict[str, Any]]:
        path = self._path(state["pos"]) or ["north"]
        return "move", {"direction": path[0]}


# ---------------------------------------------------------------- ObsEnv: observation policies


def _hide_grid(grid: list[str], keep: Any) -> list[str]:
    return ["".join(c if keep(r, k) else UNSEEN for k, c in enumerate(row)) for r, row in enumerate(grid)]


def _visible(grid: list[str], agent: tuple[int, int], r: int, c: int, opaque: str) -> bool:
    """Whether a straight ray from the agent's cell centre to (r, c) passes no opaque cell."""
    ar, ac = agent
    steps = max(abs(r - ar), abs(c - ac)) * 4
    for i in range(1, steps):
        y = round(ar + (r - ar) * i / steps)
        x = round(ac + (c - ac) * i / steps)
        if (y, x) in ((ar, ac), (r, c)):
            continue
        if grid[y][x] in opaque:
            return False
    return True


def observe(view: View, policy: dict[str, Any], step: int = 0, seed: int = 0) -> View:
    """The part of ``view`` the policy shows. ``policy``: ``{"kind": "full"}``,
    ``{"kind": "radius", "radius": r}``, ``{"kind": "line_of_sight", "opaque": "#"}`` or
    ``{"kind": "mask", "p": 0.3}`` (hidden cells read ``?``; hidden facts are left out)."""
    kind = policy.get("kind", "full")
    if kind == "full":
        return view
    grid, agent, facts = view.grid, view.agent, dict(view.facts)
    if kind in ("radius", "line_of_sight") and (grid is None or agent is None):
        return view  # nothing spatial to hide: the facts are the observation
    if kind == "radius":
        rad = int(policy.get("radius", 2))
        assert grid is not None and agent is not None
        grid = _hide_grid(grid, lambda r, c: max(abs(r - agent[0]), abs(c - agent[1])) <= rad)
    elif kind == "line_of_sight":
        opaque = str(policy.get("opaque", "#"))
        assert grid is not None and agent is not None
        full = grid
        grid = _hide_grid(full, lambda r, c: _visible(full, agent, r, c, opaque))
    elif kind == "mask":
        rng = random.Random(f"{seed}:{step}")
        p = float(policy.get("p", 0.3))
        if grid is not None:
            grid = _hide_grid(grid, lambda r, c: (r, c) == agent or rng.random() >= p)
        facts = {k: v for k, v in facts.items() if rng.random() >= p}
    else:
        raise ValueError(f"unknown observation policy {kind!r}; valid: full, radius, line_of_sight, mask")
    return View(grid=grid, agent=agent, facts=facts)


# ---------------------------------------------------------------- SkinEnv: rendering


_TERM = re.compile(r"\{([^{}\n]{1,40})\}")


def fill(template: str, names: dict[str, str]) -> str:
    """``template`` with each ``{term}`` replaced by the skin's name for it (unknown terms stay)."""
    return _TERM.sub(lambda m: str(names.get(m.group(1), m.group(0))), template)


def render(view: View, skin: dict[str, Any], step: int, max_steps: int, event: str = "") -> str:
    """Text for an observed view: the step count, the map with its legend, the facts and the event."""
    glyphs: dict[str, str] = skin.get("glyphs", {})
    names: dict[str, str] = skin.get("names", {})
    lines = [f"Step {step}/{max_steps}."]
    if event:
        lines.append(fill(event, names))
    if view.grid is not None:
        rows = [list(row) for row in view.grid]
        if view.agent is not None:
            r, c = view.agent
            rows[r][c] = "@"
        used = sorted({ch for row in rows for ch in row})
        legend = ", ".join(f"{glyphs.get(ch, ch)} {names.get(ch, 'you' if ch == '@' else ch)}" for ch in used)
        lines.append(f"Map (row 0 at the top; {legend}):")
        lines += ["".join(glyphs.get(ch, ch) for ch in row) for row in rows]
        if view.agent is not None:
            lines.append(f"You are at row {view.agent[0]}, column {view.agent[1]}.")
    for key, value in view.facts.items():
        text = fill(value, names) if isinstance(value, str) else json.dumps(value)
        lines.append(f"{fill(key, names)}: {text}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the command protocol


def _as_action(value: Any) -> tuple[str, dict[str, Any]]:
    name, args = value
    return str(name), dict(args)


def run_command(world_cls: type[World], cmd: dict[str, Any]) -> dict[str, Any]:
    """One request to a world, as the host process inside a sandbox and the in-process runner both
    answer it. ``cmd["op"]`` is one of:

    - ``generate`` (``seed``, ``params``) → ``{"level"}``
    - ``solve`` (``level``) → ``{"max_reward", "plan"}``: the planner run from the start to the end
    - ``reset`` (``level``, ``obs``, ``skin``, ``max_steps``) → ``{"state", "text"}``
    - ``step`` (``level``, ``state``, ``t``, ``action``, ``args``, ``obs``, ``skin``, ``max_steps``)
      → ``{"state", "reward", "done", "text", "error"}``
    - ``oracle`` (``level``, ``state``) → ``{"action"}``
    - ``episode`` (``level``, ``max_steps``, ``actions``, ``agent``) → ``{"reward", "steps",
      "action_errors"}``: a whole episode of a scripted agent run inside the world process
      (:func:`play`), so that validation costs one call per episode
    """
    op = cmd["op"]
    if op == "generate":
        rng = random.Random(cmd["seed"])
        return {"level": world_cls.generate(rng, dict(cmd.get("params") or {}))}
    world = world_cls(cmd["level"])
    if op == "solve":
        return solve(world, int(cmd.get("max_steps", 100)))
    if op == "oracle":
        return {"action": list(world.oracle(cmd["state"]))}
    if op == "episode":
        return play(world, cmd["agent"], cmd["actions"], int(cmd["max_steps"]))
    seed = int(cmd.get("seed", 0))
    if op == "reset":
        state = world.initial_state()
        seen = observe(world.view(state), cmd.get("obs") or {}, 0, seed)
        return {"state": state, "text": render(seen, cmd.get("skin") or {}, 0, int(cmd["max_steps"]))}
    if op == "step":
        t = int(cmd["t"]) + 1
        try:
            out = world.step(cmd["state"], str(cmd["action"]), dict(cmd.get("args") or {}))
        except ActionError as exc:
            out = Outcome(state=cmd["state"])
            error = str(exc)
        else:
            error = ""
        done = out.done or t >= int(cmd["max_steps"])
        seen = observe(world.view(out.state), cmd.get("obs") or {}, t, seed)
        text = render(seen, cmd.get("skin") or {}, t, int(cmd["max_steps"]), out.event)
        if error:
            text = f"Error: {fill(error, (cmd.get('skin') or {}).get('names', {}))}\n{text}"
        return {"state": out.state, "reward": float(out.reward), "done": done, "text": text, "error": error}
    raise ValueError(f"unknown op {op!r}")


def solve(world: World, max_steps: int) -> dict[str, Any]:
    """Run the planner from the level's start; its plan and the reward it earns."""
    state, total, plan = world.initial_state(), 0.0, []
    for _ in range(max_steps):
        action, args = _as_action(world.oracle(state))
        plan.append([action, args])
        out = world.step(state, action, args)
        state, total = out.state, total + float(out.reward)
        if out.done:
            break
    return {"max_reward": world.max_reward(), "plan": plan, "plan_reward": total}


def random_action(rng: random.Random, actions: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A uniformly random action with arguments drawn from each parameter's schema (``actions``:
    name → ``{"params": {name: {"type", "enum", "minimum", "maximum"}}}``)."""
    name = rng.choice(sorted(actions))
    args: dict[str, Any] = {}
    for key, p in (actions[name].get("params") or {}).items():
        if p.get("enum"):
            args[key] = rng.choice(p["enum"])
        elif p.get("type") == "integer":
            lo = p.get("minimum") if p.get("minimum") is not None else 0
            hi = p.get("maximum") if p.get("maximum") is not None else 9
            args[key] = rng.randint(lo, hi)
        else:
            args[key] = rng.choice(["a", "b", "north", "1"])
    return name, args


def play(world: World, agent: dict[str, Any], actions: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """One episode of a scripted agent: ``{"kind": "random", "seed"}`` (uniform over actions and
    arguments), ``{"kind": "epsilon", "eps", "seed"}`` (the planner, but a random action with
    probability ``eps``) or ``{"kind": "plan", "plan"}`` (a fixed list of actions)."""
    rng = random.Random(agent.get("seed", 0))
    state, total, errors, t = world.initial_state(), 0.0, 0, 0
    plan = list(agent.get("plan") or [])
    while t < max_steps:
        kind = agent["kind"]
        if kind == "plan":
            if t >= len(plan):
                break
            action, args = _as_action(plan[t])
        elif kind == "random" or (kind == "epsilon" and rng.random() < float(agent.get("eps", 0.5))):
            action, args = random_action(rng, actions)
        else:
            action, args = _as_action(world.oracle(state))
        t += 1
        try:
            out = world.step(state, action, args)
        except ActionError:
            errors += 1
            continue
        state, total = out.state, total + float(out.reward)
        if out.done:
            break
    return {"reward": total, "steps": t, "action_errors": errors}


def main() -> None:
    """The host process inside a sandbox (``python -I -c "import worldlib; worldlib.main()" < cmd.json``
    with the world's directory first on ``sys.path``): one command in, one JSON answer out."""
    cmd = json.load(sys.stdin)
    import world

    try:
        result = {"ok": run_command(world.WORLD, cmd)}
    except Exception as exc:
        import traceback

        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}
    json.dump(result, sys.stdout)
