"""lights_out: toggle lights (each with its four neighbours) until the board is dark (pattern, binary)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World

N = 3


def toggled(board, r, c):
    rows = [list(row) for row in board]
    for dr, dc in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
        y, x = r + dr, c + dc
        if 0 <= y < N and 0 <= x < N:
            rows[y][x] = "." if rows[y][x] == "O" else "O"
    return ["".join(row) for row in rows]


def solution(board):
    """The fewest toggles (as [row, col] cells) that turn every light off, or None."""
    best = None
    for mask in range(1 << (N * N)):
        cells = [divmod(i, N) for i in range(N * N) if mask >> i & 1]
        if best is not None and len(cells) >= len(best):
            continue
        b = board
        for r, c in cells:
            b = toggled(b, r, c)
        if all(ch == "." for row in b for ch in row):
            best = cells
    return best


class LightsOut(World):
    def initial_state(self):
        return {"board": list(self.level["board"])}

    def step(self, state, action, args):
        r, c = args.get("row"), args.get("col")
        if action != "toggle" or not all(isinstance(v, int) and 0 <= v < N for v in (r, c)):
            raise ActionError(f"toggle takes a row and a col from 0 to {N - 1}")
        board = toggled(state["board"], r, c)
        if all(ch == "." for row in board for ch in row):
            return Outcome({"board": board}, reward=1.0, done=True, event="Every light is {.}.")
        return Outcome({"board": board})

    def view(self, state):
        return View(grid=state["board"])

    def max_reward(self):
        return 1.0 if solution(self.level["board"]) is not None else 0.0

    def oracle(self, state):
        cells = solution(state["board"]) or [(0, 0)]
        return "toggle", {"row": cells[0][0], "col": cells[0][1]}

    @classmethod
    def generate(cls, rng, params):
        board = ["." * N] * N
        for i in rng.sample(
            range(N * N), rng.randint(int(params.get("min_toggles", 2)), int(params.get("max_toggles", 4)))
        ):
            board = toggled(board, *divmod(i, N))
        return {"board": board}


WORLD = LightsOut
