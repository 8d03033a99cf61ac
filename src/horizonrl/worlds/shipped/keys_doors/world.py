"""keys_doors: pick up the key, pass the locked door and reach the exit (planning, binary reward)."""

from __future__ import annotations

from worldlib import DIRECTIONS, ActionError, Outcome, View, World, bfs_path, cell, moved, walled_room


class KeysDoors(World):
    def initial_state(self):
        return {"pos": list(self.level["start"]), "key": False}

    def _moves(self, node):
        r, c, key = node
        grid = self.level["grid"]
        if not key and [r, c] == self.level["key"]:
            yield ("pick_up", None), (r, c, True)
        for name in DIRECTIONS:
            nr, nc = moved((r, c), name)
            ch = cell(grid, (nr, nc))
            if ch != "#" and (ch != "D" or key):
                yield ("move", name), (nr, nc, key)

    def step(self, state, action, args):
        pos, key = state["pos"], state["key"]
        if action == "pick_up":
            if key or pos != self.level["key"]:
                raise ActionError("There is no {key} here to pick up.")
            return Outcome({"pos": pos, "key": True}, event="You pick up the {key}.")
        if action != "move":
            raise ActionError(f"unknown action {action!r}; valid: move, pick_up")
        nxt = moved(pos, args.get("direction", ""))
        ch = cell(self.level["grid"], nxt)
        if ch == "#":
            return Outcome(state, event="You bump into the {blocked}.")
        if ch == "D" and not key:
            return Outcome(state, event="The {door} is shut: you need the {key}.")
        state = {"pos": list(nxt), "key": key}
        if ch == "E":
            return Outcome(state, reward=1.0, done=True, event="You reached the {goal}.")
        return Outcome(state)

    def view(self, state):
        grid = self.level["grid"]
        if state["key"]:
            grid = [row.replace("k", ".") for row in grid]
        return View(
            grid=grid,
            agent=tuple(state["pos"]),
            facts={"carrying": "the {key}" if state["key"] else "nothing"},
        )

    def _path(self, state):
        r, c = state["pos"]
        return bfs_path(
            (r, c, bool(state["key"])), lambda n: cell(self.level["grid"], n[:2]) == "E", self._moves
        )

    def max_reward(self):
        return 1.0 if self._path(self.initial_state()) is not None else 0.0

    def oracle(self, state):
        path = self._path(state) or [("move", "north")]
        action, direction = path[0]
        return (action, {}) if direction is None else (action, {"direction": direction})

    @classmethod
    def generate(cls, rng, params):
        size, blocks = int(params.get("size", 9)), int(params.get("blocks", 6))
        while True:
            grid = walled_room(size, size)
            wall = rng.randint(3, size - 4)
            for r in range(1, size - 1):
                grid[r][wall] = "#"
            grid[rng.randint(1, size - 2)][wall] = "D"
            for _ in range(blocks):
                grid[rng.randint(1, size - 2)][rng.randint(1, size - 2)] = "#"
            left = [(r, c) for r in range(1, size - 1) for c in range(1, wall) if grid[r][c] == "."]
            right = [
                (r, c) for r in range(1, size - 1) for c in range(wall + 1, size - 1) if grid[r][c] == "."
            ]
            if len(left) < 2 or not right:
                continue
            start, key = rng.sample(left, 2)
            exit_ = rng.choice(right)
            grid[key[0]][key[1]], grid[exit_[0]][exit_[1]] = "k", "E"
            level = {"grid": ["".join(r) for r in grid], "start": list(start), "key": list(key)}
            if cls(level).max_reward() == 1.0:
                return level


WORLD = KeysDoors
