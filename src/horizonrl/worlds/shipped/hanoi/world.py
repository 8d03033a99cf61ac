"""hanoi: move the tower of disks to the goal peg, never a larger disk on a smaller (planning, binary)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World, bfs_path

PEGS = 3


def _moves(node):
    for a in range(PEGS):
        for b in range(PEGS):
            if a != b and node[a] and (not node[b] or node[b][-1] > node[a][-1]):
                pegs = [list(p) for p in node]
                pegs[b].append(pegs[a].pop())
                yield (a, b), tuple(tuple(p) for p in pegs)


class Hanoi(World):
    def initial_state(self):
        pegs = [[] for _ in range(PEGS)]
        pegs[self.level["start"]] = list(range(self.level["disks"], 0, -1))
        return {"pegs": pegs}

    def _solved(self, node):
        return len(node[self.level["goal"]]) == self.level["disks"]

    def step(self, state, action, args):
        if action != "move_disk":
            raise ActionError(f"unknown action {action!r}; valid: move_disk")
        a, b = args.get("from_peg"), args.get("to_peg")
        if a not in range(PEGS) or b not in range(PEGS) or a == b:
            raise ActionError("from_peg and to_peg must be two different {peg} numbers 0, 1 or 2.")
        pegs = [list(p) for p in state["pegs"]]
        if not pegs[a]:
            raise ActionError(f"{{peg}} {a} holds no {{disk}}.")
        if pegs[b] and pegs[b][-1] < pegs[a][-1]:
            raise ActionError(
                f"A larger {{disk}} cannot go onto a smaller one ({pegs[a][-1]} onto {pegs[b][-1]})."
            )
        pegs[b].append(pegs[a].pop())
        state = {"pegs": pegs}
        event = f"You moved {{disk}} {pegs[b][-1]} from {{peg}} {a} to {{peg}} {b}."
        if self._solved(pegs):
            return Outcome(state, reward=1.0, done=True, event=event + " The tower stands on the {goal}.")
        return Outcome(state, event=event)

    def view(self, state):
        facts = {f"{{peg}} {i}": " ".join(map(str, p)) or "empty" for i, p in enumerate(state["pegs"])}
        facts["{goal}"] = f"{{peg}} {self.level['goal']}"
        return View(facts=facts)

    def _path(self, state):
        return bfs_path(tuple(tuple(p) for p in state["pegs"]), self._solved, _moves)

    def max_reward(self):
        return 1.0 if self._path(self.initial_state()) is not None else 0.0

    def oracle(self, state):
        a, b = (self._path(state) or [(0, 1)])[0]
        return "move_disk", {"from_peg": a, "to_peg": b}

    @classmethod
    def generate(cls, rng, params):
        start, goal = rng.sample(range(PEGS), 2)
        return {"disks": int(params.get("disks", 4)), "start": start, "goal": goal}


WORLD = Hanoi
