"""sokoban: push the one box onto the target in a small walled room (planning, binary reward)."""

from __future__ import annotations

from worldlib import DIRECTIONS, ActionError, Outcome, View, World, bfs_path, cell, moved, walled_room


class Sokoban(World):
    def initial_state(self):
        return {"pos": list(self.level["start"]), "box": list(self.level["box"])}

    def _push(self, pos, box, direction):
        """The next (pos, box) after walking ``direction``, or None when the walk is blocked."""
        nxt = moved(pos, direction)
        if cell(self.level["grid"], nxt) == "#":
            return None
        if nxt != tuple(box):
            return nxt, tuple(box)
        beyond = moved(box, direction)
        if cell(self.level["grid"], beyond) == "#":
            return None
        return nxt, beyond

    def _solved(self, node):
        return list(node[1]) == self.level["target"]

    def _moves(self, node):
        for name in DIRECTIONS:
            nxt = self._push(node[0], node[1], name)
            if nxt is not None:
                yield name, nxt

    def step(self, state, action, args):
        if action != "move":
            raise ActionError(f"unknown action {action!r}; valid: move")
        nxt = self._push(state["pos"], state["box"], args.get("direction", ""))
        if nxt is None:
            return Outcome(state, event="You cannot move that way: the {blocked} or the {box} is in the way.")
        state = {"pos": list(nxt[0]), "box": list(nxt[1])}
        if self._solved(nxt):
            return Outcome(state, reward=1.0, done=True, event="The {box} is on the {goal}.")
        return Outcome(state)

    def view(self, state):
        rows = [list(row) for row in self.level["grid"]]
        rows[state["box"][0]][state["box"][1]] = "B"
        return View(grid=["".join(r) for r in rows], agent=tuple(state["pos"]))

    def _path(self, state):
        return bfs_path((tuple(state["pos"]), tuple(state["box"])), self._solved, self._moves)

    def max_reward(self):
        return 1.0 if self._path(self.initial_state()) is not None else 0.0

    def oracle(self, state):
        path = self._path(state) or ["north"]
        return "move", {"direction": path[0]}

    @classmethod
    def generate(cls, rng, params):
        size, walls = int(params.get("size", 7)), int(params.get("walls", 4))
        lo, hi = int(params.get("min_len", 4)), int(params.get("max_len", 20))
        while True:
            grid = walled_room(size, size)
            for _ in range(walls):
                grid[rng.randint(1, size - 2)][rng.randint(1, size - 2)] = "#"
            free = [(r, c) for r in range(size) for c in range(size) if grid[r][c] == "."]
            start, box, target = rng.sample(free, 3)
            grid[target[0]][target[1]] = "T"
            level = {
                "grid": ["".join(r) for r in grid],
                "start": list(start),
                "box": list(box),
                "target": list(target),
            }
            world = cls(level)
            path = world._path(world.initial_state())
            if path is not None and lo <= len(path) <= hi:
                return level


WORLD = Sokoban
