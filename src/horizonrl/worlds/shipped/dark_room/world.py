"""dark_room: find the treasure hidden out of sight in a room of wall blocks (navigation, binary reward)."""

from __future__ import annotations

from worldlib import View, WalkToGoal, bfs_path, floor_cells, grid_neighbours, observe, walled_room


class DarkRoom(WalkToGoal):
    goal_key = "treasure"

    @classmethod
    def generate(cls, rng, params):
        size, blocks = int(params.get("size", 9)), int(params.get("blocks", 8))
        far = int(params.get("min_dist", 6))
        while True:
            grid = walled_room(size, size)
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
