"""dark_room: find the treasure hidden out of sight in a room of wall blocks (navigation, binary reward)."""

from __future__ import annotations

from worldlib import (
    ActionError,
    Outcome,
    View,
    World,
    bfs_path,
    cell,
    floor_cells,
    grid_neighbours,
    moved,
    observe,
)


class DarkRoom(World):
    def initial_state(self):
        return {"pos": list(self.level["start"])}

    def _at_goal(self, pos):
        return list(pos) == self.level["treasure"]

    def step(self, state, action, args):
        if action != "move":
            raise ActionError(f"unknown action {action!r}; valid: move")
        nxt = moved(state["pos"], args.get("direction", ""))
        if cell(self.level["grid"], nxt) == "#":
            return Outcome(state, event="You bump into the {blocked}.")
        state = {"pos": list(nxt)}
        if self._at_goal(nxt):
            return Outcome(state, reward=1.0, done=True, event="You reached the {goal}.")
        return Outcome(state)

    def view(self, state):
        return View(grid=self.level["grid"], agent=tuple(state["pos"]))

    def _path(self, pos):
        return bfs_path(tuple(pos), self._at_goal, grid_neighbours(self.level["grid"]))

    def max_reward(self):
        return 1.0 if self._path(self.level["start"]) is not None else 0.0

    def oracle(self, state):
        path = self._path(state["pos"]) or ["north"]
        return "move", {"direction": path[0]}

    @classmethod
    def generate(cls, rng, params):
        size, blocks = int(params.get("size", 9)), int(params.get("blocks", 8))
        far = int(params.get("min_dist", 6))
        while True:
            grid = (
                [["#"] * size]
                + [["#"] + ["."] * (size - 2) + ["#"] for _ in range(size - 2)]
                + [["#"] * size]
            )
            for _ in range(blocks):
                r, c = rng.randint(1, size - 3), rng.randint(1, size - 3)
                grid[r][c] = grid[r + rng.randint(0, 1)][c + rng.randint(0, 1)] = "#"
            rows = ["".join(r) for r in grid]
            start = rng.choice(floor_cells(rows))
            seen = observe(View(grid=rows, agent=start), {"kind": "line_of_sight", "opaque": "#"}).grid
            hidden = [p for p in floor_cells(rows) if seen[p[0]][p[1]] == "?"]
            if not hidden:
                continue
            treasure = rng.choice(hidden)
            path = bfs_path(start, lambda p, goal=treasure: p == goal, grid_neighbours(rows))
            if path is not None and len(path) >= far:
                grid[treasure[0]][treasure[1]] = "T"
                return {"grid": ["".join(r) for r in grid], "start": list(start), "treasure": list(treasure)}


WORLD = DarkRoom
