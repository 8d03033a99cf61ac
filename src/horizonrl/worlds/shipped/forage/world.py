"""forage: gather good items and dodge bad ones within a short step budget (resource, cumulative)."""

from __future__ import annotations

from worldlib import DIRECTIONS, Outcome, View, World, bfs_path, cell, grid_neighbours, moved


class Forage(World):
    def initial_state(self):
        return {"pos": list(self.level["start"]), "eaten": [], "left": int(self.level["budget"])}

    def _grid(self, eaten):
        rows = [list(row) for row in self.level["grid"]]
        for i, (r, c, kind) in enumerate(self.level["items"]):
            if i not in eaten:
                rows[r][c] = kind
        return ["".join(row) for row in rows]

    def _move(self, pos, mask, direction):
        """(next pos, next mask, reward) for one move from ``pos`` with the items in ``mask`` eaten."""
        nxt = moved(pos, direction)
        if cell(self.level["grid"], nxt) == "#":
            return tuple(pos), mask, 0.0
        for i, (r, c, kind) in enumerate(self.level["items"]):
            if (r, c) == nxt and not mask >> i & 1:
                return nxt, mask | 1 << i, 1.0 if kind == "g" else -1.0
        return nxt, mask, 0.0

    def _done(self, mask, left):
        goods = [i for i, item in enumerate(self.level["items"]) if item[2] == "g"]
        return left <= 0 or all(mask >> i & 1 for i in goods)

    def step(self, state, action, args):
        mask = sum(1 << i for i in state["eaten"])
        pos, mask, reward = self._move(state["pos"], mask, args.get("direction", ""))
        left = int(state["left"]) - 1
        eaten = [i for i in range(len(self.level["items"])) if mask >> i & 1]
        state = {"pos": list(pos), "eaten": eaten, "left": left}
        event = {1.0: "You eat the {g}: +1.", -1.0: "You eat the {b}: -1.", 0.0: ""}[reward]
        return Outcome(state, reward=reward, done=self._done(mask, left), event=event)

    def view(self, state):
        return View(
            grid=self._grid(state["eaten"]), agent=tuple(state["pos"]), facts={"steps left": state["left"]}
        )

    def _best(self, pos, mask, left, memo):
        """The best total from here and the move that earns it."""
        if self._done(mask, left):
            return 0.0, "north"
        key = (pos, mask, left)
        if key not in memo:
            options = []
            for d in DIRECTIONS:
                nxt, nmask, r = self._move(pos, mask, d)
                options.append((r + self._best(nxt, nmask, left - 1, memo)[0], d))
            memo[key] = max(options, key=lambda o: o[0])
        return memo[key]

    def max_reward(self):
        return self._best(tuple(self.level["start"]), 0, int(self.level["budget"]), {})[0]

    def oracle(self, state):
        mask = sum(1 << i for i in state["eaten"])
        return "move", {"direction": self._best(tuple(state["pos"]), mask, int(state["left"]), {})[1]}

    @classmethod
    def generate(cls, rng, params):
        size, budget = int(params.get("size", 7)), int(params.get("budget", 14))
        while True:
            cells = [(r, c) for r in range(size) for c in range(size)]
            rng.shuffle(cells)
            walls = cells[: int(params.get("walls", 6))]
            grid = ["".join("#" if (r, c) in walls else "." for c in range(size)) for r in range(size)]
            start, rest = cells[len(walls)], cells[len(walls) + 1 :]
            if any(bfs_path(start, lambda p, q=q: p == q, grid_neighbours(grid)) is None for q in rest):
                continue
            goods = rng.randint(*params.get("good", [4, 5]))
            bads = rng.randint(*params.get("bad", [3, 4]))
            items = [[r, c, "g" if i < goods else "b"] for i, (r, c) in enumerate(rest[: goods + bads])]
            level = {"grid": grid, "start": list(start), "items": items, "budget": budget}
            best = cls(level).max_reward()
            if 2 <= best < goods:
                return level


WORLD = Forage
