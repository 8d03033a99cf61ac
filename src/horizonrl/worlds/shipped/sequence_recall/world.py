"""sequence_recall: see a colour sequence once, then press it back from memory (memory, binary reward)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World


class SequenceRecall(World):
    def initial_state(self):
        return {"entered": 0}

    def step(self, state, action, args):
        colour, seq = args.get("color"), self.level["seq"]
        if action != "press" or colour not in self.level["colors"]:
            raise ActionError(f"press takes a colour: {', '.join(self.level['colors'])}")
        if colour != seq[state["entered"]]:
            return Outcome({"entered": state["entered"] + 1}, done=True, event=f"{colour} is {{wrong}}.")
        n = state["entered"] + 1
        if n == len(seq):
            return Outcome({"entered": n}, reward=1.0, done=True, event="The whole sequence is {right}.")
        return Outcome({"entered": n}, event=f"{colour} is {{right}}.")

    def view(self, state):
        if state["entered"] == 0:
            return View(facts={"sequence": " ".join(self.level["seq"]), "length": len(self.level["seq"])})
        return View(
            facts={"sequence": "(hidden)", "entered": state["entered"], "length": len(self.level["seq"])}
        )

    def max_reward(self):
        return 1.0

    def oracle(self, state):
        return "press", {"color": self.level["seq"][min(state["entered"], len(self.level["seq"]) - 1)]}

    @classmethod
    def generate(cls, rng, params):
        colors = list(params.get("colors", ["red", "green", "blue", "yellow", "purple"]))
        n = rng.randint(int(params.get("min_len", 4)), int(params.get("max_len", 5)))
        return {"colors": colors, "seq": [rng.choice(colors) for _ in range(n)]}


WORLD = SequenceRecall
