"""maze: walk through a walled maze to the exit (navigation, binary reward)."""

from __future__ import annotations

from worldlib import Outcome, View, World, bfs_path, carve_maze, cell, floor_cells, grid_neighbours, moved


class Maze(World):
    def initial_state(self):
        return {"pos": list(self.level["start"])}

    def _at_exit(self, pos):
        return list(pos) == list(self.level["exit"])

    def step(self, state, action, args):
        nxt = moved(state["pos"], args.get("direction", ""))
        if cell(self.level["grid"], nxt) == "#":
            return Outcome(state, event="You bump into the {blocked}.")
        state = {"pos": list(nxt)}
        if self._at_exit(nxt):
            return Outcome(state, reward=1.0, done=True, event="You reached the {goal}.")
        return Outcome(state)

    def view(self, state):
        return View(grid=self.level["grid"], agent=tuple(state["pos"]))

    def _path(self, pos):
        return bfs_path(tuple(pos), self._at_exit, grid_neighbours(self.level["grid"]))

    def max_reward(self):
        return 1.0 if self._path(self.level["start"]) is not None else 0.0

    def oracle(self, state):
        path = self._path(state["pos"]) or ["north"]
        return "move", {"direction": path[0]}

    @classmethod
    def generate(cls, rng, params):
        h, w = int(params.get("height", 9)), int(params.get("width", 9))
        grid = [list(row) for row in carve_maze(rng, h, w, float(params.get("loops", 0.0)))]
        cells = floor_cells(["".join(r) for r in grid])
        start = cells[0]
        far = max(cells, key=lambda p: abs(p[0] - start[0]) + abs(p[1] - start[1]) + rng.random())
        grid[far[0]][far[1]] = "E"
        return {"grid": ["".join(r) for r in grid], "start": list(start), "exit": list(far)}


WORLD = Maze
