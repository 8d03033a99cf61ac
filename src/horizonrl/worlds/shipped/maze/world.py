"""maze: walk through a walled maze to the exit (navigation, binary reward)."""

from __future__ import annotations

from worldlib import WalkToGoal, carve_maze, floor_cells


class Maze(WalkToGoal):
    goal_key = "exit"

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
