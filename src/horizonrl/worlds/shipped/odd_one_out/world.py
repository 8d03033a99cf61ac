"""odd_one_out: pick the item that breaks the rule the other four share (pattern, cumulative reward)."""

from __future__ import annotations

from worldlib import ActionError, Outcome, View, World

ATTRS = {"c": 4, "s": 4, "z": 2}  # colour, shape, size: term prefix -> number of values


def lone_out(items, key):
    """The index of the one item whose value on ``key`` differs from the other four's, or None."""
    values = [it[key] for it in items]
    odd = [i for i, v in enumerate(values) if values.count(v) == 1]
    return odd[0] if len(odd) == 1 and len(set(values)) == 2 else None


class OddOneOut(World):
    def initial_state(self):
        return {"round": 0, "score": 0}

    def step(self, state, action, args):
        i, rounds = args.get("index"), self.level["rounds"]
        if action != "pick" or not isinstance(i, int) or not 0 <= i < len(rounds[0]["items"]):
            raise ActionError(f"pick takes an index from 0 to {len(rounds[0]['items']) - 1}")
        r, right = state["round"], i == rounds[state["round"]]["odd"]
        state = {"round": r + 1, "score": state["score"] + int(right)}
        event = (
            f"Round {r + 1}: item {i} is {{right}}." if right else f"Round {r + 1}: item {i} is {{wrong}}."
        )
        return Outcome(state, reward=float(right), done=r + 1 == len(rounds), event=event)

    def view(self, state):
        rounds, r = self.level["rounds"], state["round"]
        facts = {"round": f"{min(r + 1, len(rounds))} of {len(rounds)}", "score": state["score"]}
        if r < len(rounds):
            for i, it in enumerate(rounds[r]["items"]):
                facts[f"item {i}"] = " ".join("{" + k + str(it[k]) + "}" for k in ("z", "c", "s"))
        return View(facts=facts)

    def max_reward(self):
        return float(len(self.level["rounds"]))

    def oracle(self, state):
        return "pick", {
            "index": self.level["rounds"][min(state["round"], len(self.level["rounds"]) - 1)]["odd"]
        }

    @classmethod
    def generate(cls, rng, params):
        rounds = []
        while len(rounds) < int(params.get("rounds", 5)):
            key = rng.choice(list(ATTRS))
            same, other = rng.sample(range(ATTRS[key]), 2)
            items = [{k: rng.randrange(n) for k, n in ATTRS.items()} for _ in range(5)]
            odd = rng.randrange(5)
            for i, it in enumerate(items):
                it[key] = other if i == odd else same
            if all(lone_out(items, k) is None for k in ATTRS if k != key):
                rounds.append({"rule": key, "odd": odd, "items": items})
        return {"rounds": rounds}


WORLD = OddOneOut
