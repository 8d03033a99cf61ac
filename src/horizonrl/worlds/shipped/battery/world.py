"""battery: reach the goal before the energy runs out, recharging on the way (resource, binary)."""

from __future__ import annotations

from worldlib import DIRECTIONS, Outcome, View, World, bfs_path, carve_maze, cell, floor_cells, moved


class Battery(World):
    def initial_state(self):
        return {"pos": list(self.level["start"]), "energy": int(self.level["energy"])}

    def _after(self, pos, energy, direction):
        """(next pos, next energy) for a move, or None for a wall (the step is wasted, no energy used)."""
        nxt = moved(pos, direction)
        code = cell(self.level["grid"], nxt)
        if code == "#":
            return None
        return nxt, int(self.level["capacity"]) if code == "C" else energy - 1

    def step(self, state, action, args):
        after = self._after(state["pos"], int(state["energy"]), args.get("direction", ""))
        if after is None:
            return Outcome(state, event="You bump into the {#}.")
        pos, energy = after
        state = {"pos": list(pos), "energy": energy}
        code = cell(self.level["grid"], pos)
        if code == "G":
            return Outcome(state, reward=1.0, done=True, event="You reached the {G}.")
        if code == "C":
            return Outcome(state, event="The {C} fills your {energy} to full.")
        if energy <= 0:
            return Outcome(state, done=True, event="Your {energy} ran out.")
        return Outcome(state)

    def view(self, state):
        facts = {"{energy}": f"{state['energy']} of {self.level['capacity']}"}
        return View(grid=self.level["grid"], agent=tuple(state["pos"]), facts=facts)

    def _path(self, pos, energy):
        grid = self.level["grid"]

        def neighbours(s):
            for d in DIRECTIONS:
                after = self._after(s[:2], s[2], d)
                if after and (after[1] > 0 or cell(grid, after[0]) == "G"):
                    yield d, (*after[0], after[1])

        return bfs_path((*pos, energy), lambda s: cell(grid, s[:2]) == "G", neighbours)

    def max_reward(self):
        return 1.0 if self._path(self.level["start"], int(self.level["energy"])) is not None else 0.0

    def oracle(self, state):
        path = self._path(state["pos"], int(state["energy"])) or ["north"]
        return "move", {"direction": path[0]}

    @classmethod
    def generate(cls, rng, params):
        h, w = int(params.get("height", 9)), int(params.get("width", 9))
        cap, energy = int(params.get("capacity", 12)), int(params.get("energy", 6))
        while True:
            grid = [list(row) for row in carve_maze(rng, h, w, float(params.get("loops", 0.2)))]
            cells = floor_cells(["".join(r) for r in grid])
            start, goal, *chargers = rng.sample(cells, 2 + int(params.get("chargers", 2)))
            grid[goal[0]][goal[1]] = "G"
            for r, c in chargers:
                grid[r][c] = "C"
            level = {
                "grid": ["".join(r) for r in grid],
                "start": list(start),
                "capacity": cap,
                "energy": energy,
            }
            plain = [row.replace("C", ".") for row in level["grid"]]
            direct = cls({**level, "grid": plain})._path(start, energy)
            path = cls(level)._path(start, energy)
            if direct is None and path is not None and 12 <= len(path) <= int(params.get("longest", 30)):
                return level


WORLD = Battery
